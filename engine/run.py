"""Run one experiment into a run folder: the glue between config, simulation and results."""
from __future__ import annotations

import datetime as dt
import os
import platform
import posixpath
import sys
import time
import traceback
from pathlib import Path

from engine.callbacks import CallbackLike, RunCallback, RunContext, around_recorder
from engine.config import ExperimentConfig, dump_config
from engine.results import RunWriter, SCHEMA_VERSION
from engine.simulation import RoundRecord, Simulation
from engine.storage import (DirectoryMirror, MirrorCallback, StorageError, check_writable, is_uri,
                            open_storage)


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("hetsim", "torch", "torchvision", "numpy", "pandas", "pyarrow", "ray", "pydantic"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def make_run_dir(cfg: ExperimentConfig) -> Path | str:
    """``<output.dir>/<output.name or algorithm-dataset-time>``; a URI when output.dir is one."""
    out = cfg.output
    if is_uri(out.dir):
        base = open_storage(out.dir, out.storage_options)
        name = out.name or f"{cfg.algorithm.name}-{cfg.dataset.name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
        if base.child(name).exists("manifest.json") and not out.overwrite:
            raise FileExistsError(
                f"run folder {base.child(name).uri} already exists; choose another output.name or set "
                "output.overwrite=true")
        return base.child(name).uri
    base = Path(out.dir)
    if out.name:
        path = base / out.name
        if path.exists() and any(path.iterdir()) and not out.overwrite:
            raise FileExistsError(
                f"run folder {path} already exists; choose another output.name or set output.overwrite=true"
            )
        return path
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    stem = f"{cfg.algorithm.name}-{cfg.dataset.name}-{stamp}"
    path, i = base / stem, 1
    while path.exists():
        i += 1
        path = base / f"{stem}-{i}"
    return path


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


def run_experiment(
    cfg: ExperimentConfig,
    run_dir: str | Path | None = None,
    callbacks: list[CallbackLike] | None = None,
    command: list[str] | None = None,
) -> Path | str:
    """Run ``cfg`` and write its run folder; returns the folder's path.

    ``callbacks`` (:mod:`engine.callbacks`) see every finished round and may add metrics or
    stop the run. With ``executor.kind: ray`` the round loop runs inside a driver actor (pinned
    to this node, so the run folder is written here) and ``callbacks`` run in this process on
    the rounds it relays. Rows are appended every round; on failure the manifest records the
    error and every finished round stays readable with :func:`engine.results.load_run`.
    A URI ``run_dir`` (or ``output.dir``), e.g. ``s3://bucket/runs/x``, is run through a local
    staging folder (:func:`run_to_storage`) and the URI is returned.
    """
    target = run_dir if run_dir is not None else make_run_dir(cfg)
    command = command if command is not None else sys.argv
    if is_uri(target):
        return run_to_storage(cfg, str(target), callbacks, command)
    path = Path(target)
    if cfg.executor.kind == "ray":
        from engine.driver_actor import run_on_driver_actor

        return run_on_driver_actor(cfg, path, callbacks or [], command)
    return execute_run(cfg, path, callbacks, command)


def run_to_storage(cfg: ExperimentConfig, uri: str, callbacks: list[CallbackLike] | None,
                   command: list[str]) -> str:
    """Run into a local staging folder and mirror it to ``uri`` (every ``output.upload_every_s``
    seconds, after checkpoints and when the run ends, also on failure); returns ``uri``.

    The staging folder is removed once the finished run is uploaded; if the last upload fails
    it is kept and the error names it."""
    import shutil
    import tempfile

    remote = open_storage(uri, cfg.output.storage_options)
    check_writable(remote)
    staging = Path(tempfile.mkdtemp(prefix="hetsim-run-")) / posixpath.basename(remote.path)
    mirror = DirectoryMirror(staging, remote)
    try:
        run_experiment(cfg, staging, [*(callbacks or []), MirrorCallback(mirror, cfg.output.upload_every_s)],
                       command)
    finally:
        try:
            mirror.sync()
        except Exception as err:
            raise StorageError(f"uploading the run folder to {uri} failed ({err}); the local copy "
                               f"is in {staging}") from err
    shutil.rmtree(staging.parent, ignore_errors=True)
    return uri


def execute_run(
    cfg: ExperimentConfig,
    path: Path,
    callbacks: list[CallbackLike] | None,
    command: list[str],
    executor=None,
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
        "started": dt.datetime.now(dt.timezone.utc).isoformat(),
        "command": command,
        "host": platform.node(),
        "versions": versions(),
    }
    writer.write_json("manifest.json", manifest)
    wall0 = time.perf_counter()
    recorder = RunRecorder(writer)
    try:
        executor = executor if executor is not None else make_executor(cfg)
        sim = Simulation(cfg, executor)
        writer.write_table("profiles", sim.profiles.to_frame())
        sim.start()
        manifest["executor"] = sim.executor.describe()
        manifest["loop_pid"] = os.getpid()  # the driver actor's process under the Ray executor
        manifest["num_clients"] = sim.data.num_clients
        run = RunContext(cfg, path, first_round=sim.next_round, simulation=sim, info=manifest)
        manifest["status"] = sim.run(around_recorder(callbacks, recorder), run)
        if sim.stop is not None:
            manifest["error"] = sim.stop.message
        manifest["sim_time_s"] = sim.sim_time_s
    except BaseException as err:  # record, then re-raise: nothing finished is lost
        manifest["status"] = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        manifest["error"] = "".join(traceback.format_exception_only(type(err), err)).strip()
        raise
    finally:
        manifest["finished"] = dt.datetime.now(dt.timezone.utc).isoformat()
        manifest["wall_s"] = time.perf_counter() - wall0
        writer.finalize()  # idempotent: also covers a failure before the loop started
        writer.write_json("manifest.json", manifest)
    return path
