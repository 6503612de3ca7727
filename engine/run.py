"""Run one experiment into a run folder: the glue between config, simulation and results."""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import platform
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path

from engine.callbacks import CallbackLike, RunCallback, RunContext, around_recorder
from engine.config import ExperimentConfig, dump_config, expand_path
from engine.results import HEARTBEAT_S, SCHEMA_VERSION, RunWriter, process_identity, utc_now
from engine.simulation import RoundRecord, Simulation

log = logging.getLogger("hetsim")


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("hetsim", "torch", "torchvision", "numpy", "pandas", "pyarrow", "ray", "pydantic"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def make_run_dir(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> Path:
    """Create and claim a fresh run folder: ``run_dir`` (``-o``), else
    ``<output.dir>/<output.name>``, else ``<output.dir>/<algorithm>-<dataset>-<time>``.

    Claiming is atomic (an exclusive ``mkdir``, then an exclusive create of ``manifest.json``),
    so two runs started in the same instant never share a folder: an automatic name gets a
    ``-2``, ``-3``, ... suffix; a name the user gave is refused if it holds a run, unless
    ``output.overwrite: true`` (then the old run is deleted first).
    """
    out = cfg.output
    if run_dir is not None:
        return _claim_named(Path(expand_path(str(run_dir))), out.overwrite, "-o")
    base = Path(out.dir)
    if out.name:
        return _claim_named(base / out.name, out.overwrite, "output.name")
    base.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    stem = f"{cfg.algorithm.name}-{cfg.dataset.name}-{stamp}"
    for i in range(1, 10_000):
        path = base / (stem if i == 1 else f"{stem}-{i}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        if _claim(path):
            return path
    raise FileExistsError(f"no free run folder name {stem}-N under {base}")


def _claim_named(path: Path, overwrite: bool, field: str) -> Path:
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{field}: {path} is a file, not a run folder")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"run folder {path} already exists; choose another {field} or set "
                "output.overwrite: true to replace it")
        if not (path / "manifest.json").exists():
            raise FileExistsError(
                f"{path} is not empty and holds no hetsim run (no manifest.json); refusing to "
                "delete it for output.overwrite; choose another folder")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    if not _claim(path):
        raise FileExistsError(f"run folder {path} was just claimed by another run; choose another {field}")
    return path


def _claim(path: Path) -> bool:
    """Exclusively create the folder's manifest (False if another process got there first)."""
    try:
        fd = os.open(path / "manifest.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump({"schema_version": SCHEMA_VERSION, "status": "starting", **process_identity()}, f)
    return True


def make_executor(cfg: ExperimentConfig):
    if cfg.executor.kind == "ray":
        from engine.ray_executor import RayExecutor

        return RayExecutor(cfg)
    from engine.executor import InProcessExecutor

    # One torch thread by default: on 2 cores, small models train as fast with 1 thread as
    # with 2, and 2 threads slow down ~7x as soon as another process competes for a core.
    return InProcessExecutor(threads=cfg.executor.threads_per_actor or 1)


class RunRecorder(RunCallback):
    """Appends every round's rows to the run folder's Parquet parts; compacts them at the end."""

    def __init__(self, writer: RunWriter):
        self.writer = writer

    def on_round_end(self, run: RunContext, record: RoundRecord) -> None:
        self.writer.append("rounds", [record.row])
        self.writer.append("clients", record.client_rows)
        for name, rows in record.extra_tables.items():
            self.writer.append(name, rows)

    def on_run_end(self, run: RunContext, status: str) -> None:
        self.writer.finalize()


class ManifestKeeper(RunCallback):
    """Owns ``manifest.json`` while the run lives: every write goes through one lock and stamps
    a heartbeat, written after every round and every ``interval`` seconds by a thread, so that
    ``hetsim show`` can tell a crashed run (process gone, heartbeat stale) from a live one."""

    def __init__(self, writer: RunWriter, manifest: dict, interval: float = HEARTBEAT_S):
        self.writer, self.manifest, self.interval = writer, manifest, interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self) -> None:
        with self._lock:
            self.manifest["heartbeat"] = utc_now()
            self.writer.write_json("manifest.json", self.manifest)

    def start(self) -> None:
        self.write()
        self._thread = threading.Thread(target=self._beat, name="hetsim-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def on_round_end(self, run: RunContext, record: RoundRecord) -> None:
        self.manifest["rounds_done"] = record.round + 1
        self.write()


def run_experiment(
    cfg: ExperimentConfig,
    run_dir: str | Path | None = None,
    callbacks: list[CallbackLike] | None = None,
    command: list[str] | None = None,
) -> Path:
    """Validate ``cfg``, create its run folder, run it; returns the folder's path.

    Validation (:func:`engine.validate.validate_experiment`) comes first, so a config error
    leaves no folder behind; its warnings are logged and recorded in ``manifest.json``. The
    folder is ``run_dir`` or one named from ``cfg.output`` (:func:`make_run_dir`).
    ``callbacks`` (:mod:`engine.callbacks`) see every finished round and may add metrics or
    stop the run. With ``executor.kind: ray`` the round loop runs inside a driver actor (pinned
    to this node, so the run folder is written here) and ``callbacks`` run in this process on
    the rounds it relays. Rows are appended every round; on failure the manifest records the
    error and every finished round stays readable with :func:`engine.results.load_run`.
    """
    path, warnings = prepare_run(cfg, run_dir)
    return run_in_folder(cfg, path, callbacks, command, warnings)


def prepare_run(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> tuple[Path, list[str]]:
    """Validate ``cfg`` (nothing is written if it fails), log its warnings, then create and
    claim the run folder. Returns the folder and the warnings (for the manifest)."""
    from engine.validate import validate_experiment

    warnings = validate_experiment(cfg, run_dir)
    for text in warnings:
        log.warning("hetsim: warning: %s", text)
    return make_run_dir(cfg, run_dir), warnings


def run_in_folder(
    cfg: ExperimentConfig,
    path: Path,
    callbacks: list[CallbackLike] | None = None,
    command: list[str] | None = None,
    warnings: list[str] | None = None,
) -> Path:
    """Run a validated ``cfg`` into ``path``, a folder the caller owns (e.g. a sweep trial's)."""
    command = command if command is not None else sys.argv
    if cfg.executor.kind == "ray":
        from engine.driver_actor import run_on_driver_actor

        return run_on_driver_actor(cfg, path, callbacks or [], command, warnings)
    return execute_run(cfg, path, callbacks, command, warnings=warnings)


def execute_run(
    cfg: ExperimentConfig,
    path: Path,
    callbacks: list[CallbackLike] | None,
    command: list[str],
    executor=None,
    warnings: list[str] | None = None,
) -> Path:
    """The body of a run, in whichever process hosts the round loop.

    ``executor`` defaults to the one ``cfg.executor`` names (see :func:`make_executor`).
    """
    path = Path(path)
    writer = RunWriter(path)
    dump_config(cfg, path / "config.yaml")
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "status": "running",
        "seed": cfg.seed,
        "algorithm": cfg.algorithm.name,
        "dataset": cfg.dataset.name,
        "started": utc_now(),
        "command": command,
        **process_identity(),  # the round loop's process: the driver actor's under Ray
        "loop_pid": os.getpid(),  # (= pid; kept for readers of schema 1)
        "warnings": list(warnings or []),
        "versions": versions(),
    }
    keeper = ManifestKeeper(writer, manifest)
    keeper.start()
    wall0 = time.perf_counter()
    recorder = RunRecorder(writer)
    try:
        executor = executor if executor is not None else make_executor(cfg)
        sim = Simulation(cfg, executor)
        writer.write_table("profiles", sim.profiles.to_frame())
        sim.start()
        manifest["executor"] = sim.executor.describe()
        manifest["num_clients"] = sim.data.num_clients
        run = RunContext(cfg, path, first_round=sim.next_round, simulation=sim, info=manifest)
        manifest["status"] = sim.run([*around_recorder(callbacks, recorder), keeper], run)
        if sim.stop is not None:
            manifest["error"] = sim.stop.message
        manifest["sim_time_s"] = sim.sim_time_s
    except BaseException as err:  # record, then re-raise: nothing finished is lost
        manifest["status"] = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        manifest["error"] = "".join(traceback.format_exception_only(type(err), err)).strip()
        raise
    finally:
        keeper.stop()
        manifest["finished"] = utc_now()
        manifest["wall_s"] = time.perf_counter() - wall0
        writer.finalize()  # idempotent: also covers a failure before the loop started
        keeper.write()
    return path
