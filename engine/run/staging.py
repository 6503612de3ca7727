"""Runs whose folder is a URI (``s3://...``): run into a local staging folder, mirror it there."""
from __future__ import annotations

import posixpath
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from engine.config.schema import ExperimentConfig
from engine.loop.callbacks import CallbackLike
from engine.results.storage import (
    DirectoryMirror,
    MirrorCallback,
    StorageError,
    check_writable,
    open_storage,
)


def run_to_storage(run: Callable, cfg: ExperimentConfig, uri: str, callbacks: list[CallbackLike] | None,
                   command: list[str]) -> str:
    """``run(cfg, folder, callbacks, command)`` into a local staging folder, mirrored to ``uri``
    (every ``output.upload_every_s``
    seconds, after checkpoints and when the run ends, also on failure); returns ``uri``.

    The staging folder is removed once the finished run is uploaded; if the last upload fails
    it is kept and the error names it."""
    remote = open_storage(uri, cfg.output.storage_options)
    check_writable(remote)
    staging = Path(tempfile.mkdtemp(prefix="hetsim-run-")) / posixpath.basename(remote.path)
    mirror = DirectoryMirror(staging, remote)
    try:
        run(cfg, staging, [*(callbacks or []), MirrorCallback(mirror, cfg.output.upload_every_s)],
                       command)
    finally:
        try:
            mirror.sync()
        except Exception as err:
            raise StorageError(f"uploading the run folder to {uri} failed ({err}); the local copy "
                               f"is in {staging}") from err
    shutil.rmtree(staging.parent, ignore_errors=True)
    return uri
