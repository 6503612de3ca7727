"""Run folders: claiming a fresh one, and telling whether an existing one may be resumed."""
from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import logging
import os
import platform
import shutil
import threading
import time
from pathlib import Path

from engine.config.schema import ExperimentConfig, dump_config, expand_path
from engine.errors import UserError
from engine.results.manifest import claim_manifest, method_label, process_identity, read_manifest
from engine.storage.locations import is_uri, open_storage

log = logging.getLogger("hetsim")


def make_run_dir(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> Path | str:
    """Create and claim a fresh run folder: ``run_dir`` (``-o``), else
    ``<output.dir>/<output.name>``, else ``<output.dir>/<method>-<dataset>-<time>`` (method: the algorithm, or
    an asynchronous run's mode, e.g. ``fedbuff``: :func:`~engine.results.manifest.method_label`).

    Claiming is atomic (an exclusive ``mkdir``, then an exclusive create of ``manifest.json``),
    so two runs started in the same instant never share a folder: an automatic name gets a
    ``-2``, ``-3``, ... suffix; a name the user gave is refused if it holds a run, unless
    ``output.overwrite: true`` (then the old run is deleted first), or unless that run was killed
    during its start-up (it holds nothing). This process then holds the folder's lock
    (:func:`hold_run_folder`); the folder holds the ``starting`` manifest and ``config.yaml``.
    When the folder is a URI (``s3://...``) the URI is returned unclaimed:
    :func:`run_to_storage` stages it locally.
    """
    out = cfg.output
    if run_dir is not None and is_uri(str(run_dir)):
        return str(run_dir)
    if run_dir is not None:
        return _with_config(_claim_named(Path(expand_path(str(run_dir))), out.overwrite, "folder"), cfg)
    if is_uri(out.dir):
        base = open_storage(out.dir, out.storage_options)
        name = out.name or f"{_method(cfg)}-{cfg.dataset.name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
        if base.child(name).exists("manifest.json") and not out.overwrite:
            raise FileExistsError(
                f"run folder {base.child(name).uri} already exists; choose another output.name or set "
                "output.overwrite: true")
        return base.child(name).uri
    base = Path(out.dir)
    if out.name:
        return _with_config(_claim_named(base / out.name, out.overwrite, "output.name"), cfg)
    base.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    stem = f"{_method(cfg)}-{cfg.dataset.name}-{stamp}"
    for i in range(1, 10_000):
        path = base / (stem if i == 1 else f"{stem}-{i}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        hold_run_folder(path)
        if claim_manifest(path):
            return _with_config(path, cfg)
        release_run_folder(path)
    raise FileExistsError(f"no free run folder name {stem}-N under {base}")


def _method(cfg: ExperimentConfig) -> str:
    """The method part of a run folder's name: the algorithm, or the asynchronous mode."""
    return method_label(cfg.algorithm.name, cfg.asynchronous.mode if cfg.asynchronous else None)


def _with_config(path: Path, cfg: ExperimentConfig) -> Path:
    """The config goes in at once, so that a run killed during its start-up (a Ray run's takes
    seconds) leaves a folder that says how to start it again."""
    dump_config(cfg, path / "config.yaml")
    return path


def _claim_named(path: Path, overwrite: bool, field: str) -> Path:
    if path.exists() and not path.is_dir():  # field: output.name, or "folder" (-o, run_dir=)
        raise FileExistsError(f"{path} is a file, not a run folder; give a folder"
                              + (f" (choose another {field})" if field != "folder" else ""))
    path.mkdir(parents=True, exist_ok=True)
    had_lock_file = (path / LOCK_FILE).exists()
    hold_run_folder(path)  # before looking inside: a live run's folder is never touched
    try:
        contents = [p for p in path.iterdir() if p.name != LOCK_FILE]
        if contents and not _killed_during_startup(path):
            if not overwrite:
                raise FileExistsError(
                    f"run folder {path} already exists; choose another {field} or set "
                    "output.overwrite: true to replace it")
            if not (path / "manifest.json").exists():
                raise FileExistsError(
                    f"{path} is not empty and holds no hetsim run (no manifest.json); refusing to "
                    "delete it for output.overwrite; choose another folder")
        for p in contents:  # an overwritten run, or the leftovers of a start-up that was killed
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        if not claim_manifest(path):
            raise FileExistsError(f"run folder {path} was just claimed by another run; choose another {field}")
    except BaseException:
        if not had_lock_file:  # a refused folder is left as it was found
            with contextlib.suppress(OSError):
                (path / LOCK_FILE).unlink()
        release_run_folder(path)
        raise
    return path


def _killed_during_startup(path: Path) -> bool:
    """A folder left by a run killed before its first round: a ``starting`` manifest whose
    process is gone, and at most the config beside it. It holds nothing to keep."""
    names = {p.name for p in path.iterdir()} - {LOCK_FILE}
    if "manifest.json" not in names or not names <= {"manifest.json", "config.yaml"}:
        return False
    try:
        manifest = read_manifest(path)
    except (OSError, ValueError):
        return False
    return manifest.get("status") == "starting" and not _loop_alive(manifest)


class RunStateError(RuntimeError):
    """A run folder is in a state that does not allow the request (finished, still running)."""


class RunFolderBusy(RunStateError, UserError):
    """Another process holds the run folder's lock: it is running or resuming that run (a
    :class:`UserError`: also where it is raised outside a run, claiming a folder for ``-o``)."""


# The folder lock: ``flock`` on a file in the run folder, held by the process that claims or
# resumes the run until the run ends (the OS drops it when that process dies, even by kill -9).
# A pid in the manifest alone cannot tell a live run from a reused pid; the lock can.
LOCK_FILE = ".hetsim.lock"
_held: dict[str, tuple[int, int]] = {}  # real path -> (fd, thread that took it)
_NO_FLOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)  # e.g. some network mounts
_held_guard = threading.Lock()


def hold_run_folder(path: str | Path) -> None:
    """Take the lock of run folder ``path`` for this process (a no-op if it holds it already);
    :class:`RunFolderBusy` at once, naming the holder, if another process has it. Released by
    :func:`release_run_folder`, :func:`release_thread_folders`, or when the process ends."""
    key = os.path.realpath(path)
    with _held_guard:
        if key in _held:
            return
        fd = os.open(os.path.join(key, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_text(fd)
            os.close(fd)
            raise RunFolderBusy(
                f"run folder {path} is in use by {holder}; two processes must not run one folder "
                "at once: wait for it to end (or stop it), then try again") from None
        except OSError as err:
            os.close(fd)
            if err.errno not in _NO_FLOCK:
                raise
            log.warning("hetsim: warning: the file system of %s has no file locks (%s): two "
                        "processes resuming this run at once are not kept apart", path, err.strerror)
            return
        except BaseException:
            os.close(fd)
            raise
        me = process_identity()
        note = {**me, "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        text = (json.dumps(note) + "\n").encode()
        os.pwrite(fd, text, 0)  # then cut what an earlier holder's longer note left: never empty
        os.ftruncate(fd, len(text))
        _held[key] = (fd, threading.get_ident())


def _holder_text(fd: int, wait_s: float = 2.0) -> str:
    """Who holds the lock, from its note; the holder writes it just after it takes the lock, so
    an empty note, or a dead process's left from an earlier run, is read again for ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            note = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
            if note["host"] != platform.node() or _alive(note):
                return f"pid {note['pid']} on {note['host']} since {note['since']}"
        except (OSError, ValueError, KeyError, TypeError):  # not written yet
            pass
        if time.monotonic() > deadline:
            return "another process"
        time.sleep(0.05)


def _alive(note: dict) -> bool:
    """Whether the note's process runs on this host (its pid and start time: a pid is reused)."""
    try:
        return process_identity(int(note["pid"]))["pid_start"] == note.get("pid_start")
    except (OSError, ValueError):
        return False


def release_run_folder(path: str | Path) -> None:
    """Give up this process's lock of run folder ``path`` (if it holds it)."""
    with _held_guard:
        held = _held.pop(os.path.realpath(path), None)
    if held is not None:
        os.close(held[0])  # closing the only descriptor drops the flock


def release_thread_folders() -> None:
    """Give up the folder locks this thread took: its run has ended (the caller's run scope,
    :func:`engine.run.signals.interrupt_signals`, calls this on the way out)."""
    me = threading.get_ident()
    with _held_guard:
        mine = [key for key, (_, owner) in _held.items() if owner == me]
        fds = [_held.pop(key)[0] for key in mine]
    for fd in fds:
        os.close(fd)


def check_not_in_use(path: str | Path) -> None:
    """:class:`RunFolderBusy` if another process holds ``path``'s lock; nothing is kept held. A
    resume asks this before it reads the folder's files, which a live run may be writing (a part
    file half written reads as damaged); :func:`check_can_resume` then takes the lock for good."""
    with _held_guard:
        held_here = os.path.realpath(path) in _held
    if not held_here:
        hold_run_folder(path)
        release_run_folder(path)


def check_can_resume(path: Path) -> None:
    """Refuse to resume ``path`` unless this process may: it takes the folder's lock (held until
    the resumed run ends) and then reads the manifest again, so that the status it checks cannot
    change under it (a run that another resume just finished is refused as finished)."""
    hold_run_folder(path)
    try:
        _check_status(path)
    except BaseException:
        release_run_folder(path)
        raise


def _check_status(path: Path) -> None:
    manifest = read_manifest(path)
    status = manifest.get("status")
    if status == "finished":
        raise RunStateError(f"{path} finished all its rounds: nothing to resume")
    if status in ("running", "starting") and manifest.get("host") == platform.node():
        deadline = time.monotonic() + 10.0  # a killed run's Ray workers take a moment to go
        while _loop_alive(manifest) and time.monotonic() < deadline:
            time.sleep(0.2)
            manifest = read_manifest(path)  # a run just ending writes its last status
        if manifest.get("status") == "finished":
            raise RunStateError(f"{path} finished all its rounds: nothing to resume")
        if manifest.get("status") in ("running", "starting") and _loop_alive(manifest):
            raise RunStateError(f"{path} is still being run by process {manifest.get('pid')} on this "
                                "host; stop it first")
    if manifest.get("status") == "starting":  # killed before its first round: nothing to continue
        raise RunStateError(
            f"{path} was killed during its start-up, before its first round: there is nothing to "
            f"resume; start it again in the same folder with: hetsim run -c {path / 'config.yaml'} "
            f"-o {path}")


def _loop_alive(manifest: dict) -> bool:
    """The manifest's round-loop process is alive on this host. With ``pid_start`` recorded the
    pid counts only if its start time matches (a pid the OS gave to another process since does
    not); without it, only a Python or Ray process counts."""
    pid = manifest.get("pid", manifest.get("loop_pid"))
    if manifest.get("host") != platform.node() or not isinstance(pid, int) or pid <= 0:
        return False
    start = manifest.get("pid_start")
    if isinstance(start, int):
        return _not_zombie(pid) and process_identity(pid)["pid_start"] == start
    return our_process_alive(pid)


def _not_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie has finished


def our_process_alive(pid: int) -> bool:
    """A live hetsim run loop (a Python process or a Ray worker) with this pid."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if not _not_zombie(pid):
        return False
    return b"python" in cmdline or b"ray::" in cmdline or b"hetsim" in cmdline
