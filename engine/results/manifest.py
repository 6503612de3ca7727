"""``manifest.json``: the one API that reads and writes a run's manifest.

The manifest says what a run is (seed, method, versions, command) and where it stands
(``status``, rounds done, errors, resumes). Every writer goes through this module: a run's
loop process keeps it with a :class:`ManifestKeeper` (all writes under one lock, with a
heartbeat); whoever must close a run whose loop process died (the CLI after a driver-actor
death or Ctrl+C, a sweep trial) changes fields with :func:`update_manifest`. Each write
replaces the file atomically (:mod:`engine.atomic`), so a reader never sees half of one.
:func:`run_status` tells a crashed run (process gone, heartbeat stale) from a live one.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import threading
from pathlib import Path
from typing import Any

from engine.atomic import write_json_atomic
from engine.errors import CorruptRunFolderError, StorageFault, storage_fault
from engine.loop.callbacks import RoundRecord, RunCallback, RunContext

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1
HEARTBEAT_S = 30.0  # a running run rewrites manifest.json's heartbeat at least this often
STALE_AFTER_S = 5 * HEARTBEAT_S  # ... so a run silent for longer is reported as crashed



def method_label(algorithm: str, asynchronous_mode: str | None = None) -> str:
    """How a run's method is named (its folder, its summary): the algorithm for synchronous
    rounds; for an asynchronous run its mode, e.g. ``fedbuff`` (clients training with FedAvg,
    the mode's own method) or ``fedbuff-fedprox``."""
    if not asynchronous_mode:
        return algorithm
    return asynchronous_mode if algorithm == "fedavg" else f"{asynchronous_mode}-{algorithm}"


def method_cell(config: dict[str, Any]) -> str:
    """A run's method in a table of runs or trials, from its config: ``fedprox`` for synchronous
    rounds, ``fedbuff, async`` (``fedbuff-fedprox, async``) for an asynchronous run."""
    algorithm = (config.get("algorithm") or {}).get("name") or "?"
    asynchronous = config.get("asynchronous")
    mode = asynchronous.get("mode") if isinstance(asynchronous, dict) else None
    return f"{method_label(algorithm, mode)}, async" if mode else algorithm


_locks: dict[str, threading.Lock] = {}  # one per manifest path: writers in one process take turns
_locks_guard = threading.Lock()


def _lock(path: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(str(path.resolve()), threading.Lock())


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_identity(pid: int | None = None) -> dict[str, Any]:
    """What manifest.json records of the process writing a run: pid, its start, the host."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "pid_start": _start_ticks(pid), "host": platform.node()}


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """The manifest of ``run_dir``: OSError if it is missing or unreadable,
    :class:`CorruptRunFolderError` (a ValueError) if it is not a JSON object."""
    path = Path(run_dir) / MANIFEST
    return parse_manifest(path.read_text(errors="replace"), path, run_dir)


def parse_manifest(text: str, where: str | Path, run_dir: str | Path) -> dict[str, Any]:
    """``text`` (the manifest read from ``where``) as a manifest, or :class:`CorruptRunFolderError`
    saying what is wrong and what to do."""
    try:
        manifest = json.loads(text)
    except ValueError as err:
        raise CorruptRunFolderError(
            f"{where} is damaged ({'empty' if not text.strip() else f'not valid JSON: {err}'}; was it "
            f"cut by a full disk or a power loss?); restore it, or start the run again with "
            f"`hetsim run -c {_config_of(run_dir)}`") from None
    if not isinstance(manifest, dict):
        raise CorruptRunFolderError(
            f"{where} holds a JSON {type(manifest).__name__}, not a manifest (a JSON object); restore "
            f"it, or start the run again with `hetsim run -c {_config_of(run_dir)}`")
    return manifest


def _config_of(run_dir: str | Path) -> str:
    return f"{str(run_dir).rstrip('/')}/config.yaml"  # a URI stays a URI (not Path's s3:/)


def write_manifest(run_dir: str | Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest of ``run_dir`` with ``manifest``, atomically."""
    path = Path(run_dir) / MANIFEST
    with _lock(path):
        write_json_atomic(path, manifest)


def update_manifest(run_dir: str | Path, **fields: Any) -> dict[str, Any]:
    """Set ``fields`` in the manifest of ``run_dir`` (an unreadable one starts empty); returns it."""
    path = Path(run_dir) / MANIFEST
    with _lock(path):
        try:
            manifest = read_manifest(run_dir)
        except (OSError, ValueError):
            manifest = {}
        manifest.update(fields)
        write_json_atomic(path, manifest)
    return manifest


def claim_manifest(run_dir: str | Path) -> bool:
    """Create the ``starting`` manifest of a new run folder, exclusively: False if another
    process created one first (two runs never share a folder)."""
    try:
        fd = os.open(Path(run_dir) / MANIFEST, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump({"schema_version": SCHEMA_VERSION, "status": "starting", **process_identity()}, f)
    return True


def _alive(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return start is None or _start_ticks(pid) in (None, start)


def run_status(manifest: dict[str, Any]) -> str:
    """The manifest's status, or ``crashed`` for a run that says ``running`` (or ``starting``)
    but whose process is gone (same host) or whose heartbeat stopped (any host)."""
    status = manifest.get("status", "?")
    if status not in ("running", "starting"):
        return status
    pid = manifest.get("pid")
    if manifest.get("host") == platform.node() and isinstance(pid, int):
        return status if _alive(pid, manifest.get("pid_start")) else "crashed"
    beat = manifest.get("heartbeat")
    if beat:
        age = (dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(beat)).total_seconds()
        if age > STALE_AFTER_S:
            return "crashed"
    return status


class ManifestKeeper(RunCallback):
    """Owns ``manifest.json`` while the run lives: every write stamps a heartbeat, after every
    round and every ``interval`` seconds from a thread, so that ``hetsim show`` can tell a
    crashed run (process gone, heartbeat stale) from a live one."""

    def __init__(self, run_dir: str | Path, manifest: dict, interval: float = HEARTBEAT_S):
        self.run_dir, self.manifest, self.interval = Path(run_dir), manifest, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self, round_: int | None = None) -> None:
        """Write the manifest (after round ``round_``); a full or read-only disk raises a
        :class:`StorageFault`."""
        path = self.run_dir / MANIFEST
        with _lock(path):
            self.manifest["heartbeat"] = utc_now()
            try:
                write_json_atomic(path, self.manifest)
            except Exception as err:
                fault = storage_fault(err, "manifest.json", path, self.run_dir, round_)
                if fault is None:
                    raise
                raise fault from err

    def start(self) -> None:
        self.write()
        self._thread = threading.Thread(target=self._beat, name="hetsim-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.write()
            except StorageFault:  # a full disk: the round's own write reports it
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def on_round_end(self, run: RunContext, record: RoundRecord) -> None:
        self.manifest["rounds_done"] = record.round + 1
        self.write(record.round)
