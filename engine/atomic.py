"""Files that appear whole or not at all: the one way hetsim writes a file atomically.

The content goes to a temporary file beside the target (its name holds ``.tmp``, which the
object-storage mirror skips), which is then renamed over the target. Readers, including
other processes and a resumed run after ``kill -9``, see the old file or the new one, never
half of one. Not fsynced: a process crash cannot cut a file, only a power loss can, and the
run folders and checkpoints are built to fall back then (docs/checkpoints.md).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """``write(file)`` into a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """``obj`` as indented JSON (values JSON cannot hold are written as their ``str``)."""
    data = json.dumps(obj, indent=2, default=str).encode()
    write_atomic(path, lambda f: f.write(data))
