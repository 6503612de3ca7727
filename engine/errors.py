"""The error classes a user can cause and fix, and the classifier of environment failures.

The command line (:mod:`hetsim.cli`) prints the message of a :class:`UserError` (and of a few
built-in ones: a missing file, a folder that exists) and exits with status 2, without a
traceback; anything else is a bug and exits 1 with the traceback written to a log file.
Every message names the field (or file and line), the value and what is allowed.

Most errors live next to the code that raises them (``YamlError`` in
:mod:`engine.config.yamlio`, ``RayConnectError`` in :mod:`engine.ray.cluster`, ...); the ones
several layers raise are here. :func:`storage_fault` tells a full disk, a read-only mount or a
permission problem from a bug, whichever library reported it.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from hardware_profiles.errors import PluginError, UserError  # in the lowest layer, which raises them too

__all__ = ["UserError", "ConfigError", "PluginError", "CorruptRunFolderError", "EnvironmentFault",
           "StorageFault", "storage_fault"]


class ConfigError(UserError, ValueError):
    """An invalid experiment configuration; the message lists every problem found."""


class CorruptRunFolderError(UserError, ValueError):
    """A run folder's manifest, config or checkpoints are damaged or inconsistent."""


class EnvironmentFault(UserError):
    """The machine, not the input, stopped the work (a full disk, a read-only mount, ...); the
    message names what failed, where, and how to continue once the cause is removed."""


class StorageFault(EnvironmentFault):
    """Writing a file failed because of its file system: no space, quota, read-only, permission.

    The message: what failed and where, then (:meth:`set_state`) what state that left, then the
    remedy and, for a run folder, the resume command."""

    def __init__(self, message: str, path: str | Path | None = None, code: int | None = None,
                 remedy: str = "", run_dir: str | Path | None = None):
        self.base, self.path, self.code, self.remedy, self.run_dir = message, path, code, remedy, run_dir
        super().__init__(self._text(None))

    def _text(self, state: str | None) -> str:
        parts = [self.base, state]
        if self.remedy and self.run_dir is not None:
            parts.append(f"{self.remedy} and resume with `hetsim run --resume {self.run_dir}`")
        elif self.remedy:
            parts.append(f"{self.remedy} and try again")
        return "; ".join(p for p in parts if p)

    def set_state(self, state: str) -> None:
        """Say what the failure left behind (e.g. the run folder is marked failed)."""
        if hasattr(self, "base"):  # not after unpickling, which keeps only the message
            self.args = (self._text(state),)


# errno -> (what happened, what to do before resuming)
_CAUSES = {
    errno.ENOSPC: ("no space left on the device", "free space"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space or raise the quota"),
    errno.EFBIG: ("the file is too large for the file system", "free space or use another folder"),
    errno.EROFS: ("the file system is read-only", "make it writable again"),
    errno.EACCES: ("permission denied", "fix the folder's permissions"),
    errno.EPERM: ("operation not permitted", "fix the folder's permissions"),
}
# torch.save reports a failed write as RuntimeError("[enforce fail at inline_container.cc...")
_TORCH_WRITE = ("inline_container", "PytorchStreamWriter", "file write failed")
LOW_SPACE_BYTES = 1 << 20  # less than this free after a failed write: the disk was full


def _errno_of(err: BaseException) -> int | None:
    seen = 0
    while err is not None and seen < 10:  # the OSError may be the cause of a library's error
        if isinstance(err, OSError) and err.errno in _CAUSES:
            return err.errno
        err = err.__cause__ or err.__context__
        seen += 1
    return None


def _existing(path: Path) -> Path | None:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return None


def _attribute(target: Path) -> int | None:
    """Why writing below ``target`` may have failed, asked of its file system."""
    base = _existing(target)
    if base is None:
        return None
    try:
        if os.statvfs(base).f_flag & os.ST_RDONLY:
            return errno.EROFS
        if shutil.disk_usage(base).free < LOW_SPACE_BYTES:
            return errno.ENOSPC
    except OSError:
        return None
    if not os.access(base if base.is_dir() else base.parent, os.W_OK):
        return errno.EACCES
    return None


def storage_fault(err: BaseException, what: str, target: str | Path, run_dir: str | Path | None = None,
                  round_: int | None = None) -> StorageFault | None:
    """A :class:`StorageFault` for ``err`` if it was the file system's doing, else None.

    ``what``: what was being written ("the checkpoint after round 3"); ``target``: the path
    written to (a path the error names is preferred); ``run_dir``: the run folder, for the
    resume command. An ``OSError`` (or one behind a library's error) with ENOSPC, EDQUOT,
    EFBIG, EROFS, EACCES or EPERM counts; so does torch's write failure when the target's file
    system is now read-only, (almost) full or not writable.
    """
    if isinstance(err, StorageFault):
        return err
    code = _errno_of(err)
    filename = getattr(err, "filename", None) if isinstance(err, OSError) else None
    named = isinstance(filename, (str, os.PathLike)) and ".tmp" not in Path(filename).name
    path = Path(filename) if named else Path(target)  # not an atomic write's temporary name
    if code is None and isinstance(err, RuntimeError) and any(w in str(err) for w in _TORCH_WRITE):
        code = _attribute(path)
    if code is None:
        return None
    cause, remedy = _CAUSES[code]
    where = f" in round {round_}" if round_ is not None and "round" not in what else ""
    return StorageFault(f"{cause} while writing {what}{where} ({path})", path, code, remedy, run_dir)
