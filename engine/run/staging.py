"""Runs whose folder is a URI (``s3://...``): run into a local staging folder, mirror it there."""
from __future__ import annotations

import posixpath
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from engine.config.schema import ExperimentConfig
from engine.loop.callbacks import CallbackLike, RunCallback
from engine.storage.locations import (
    DirectoryMirror,
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


class MirrorCallback(RunCallback):
    """A round-loop callback that syncs a :class:`DirectoryMirror` at most every ``every_s``
    seconds (0: after every round) and after rounds that wrote a checkpoint."""

    def __init__(self, mirror: DirectoryMirror, every_s: float = 0.0):
        self.mirror = mirror
        self.every_s = every_s
        self._last = time.monotonic()
        self._checkpoints = 0

    def on_round_end(self, run, record) -> None:
        checkpoints = self.mirror.local_dir / "checkpoints"
        count = sum(1 for _ in checkpoints.iterdir()) if checkpoints.is_dir() else 0
        if time.monotonic() - self._last >= self.every_s or count != self._checkpoints:
            self.mirror.sync()
            self._last, self._checkpoints = time.monotonic(), count
