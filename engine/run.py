"""Run one experiment into a run folder: the glue between config, simulation and results."""
from __future__ import annotations

import datetime as dt
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from engine.callbacks import CallbackLike, RoundRecord, RunCallback, RunContext, around_recorder
from engine.config import ExperimentConfig, dump_config
from engine.trace import mark

# The loop's modules (torch, pandas) are imported by execute_run, in the process that runs the
# loop: the caller of a Ray run only starts the driver actor and relays rounds.


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("hetsim", "torch", "torchvision", "numpy", "pandas", "pyarrow", "ray", "pydantic"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def make_run_dir(cfg: ExperimentConfig) -> Path:
    out = cfg.output
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

    def __init__(self, writer):
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
) -> Path:
    """Run ``cfg`` and write its run folder; returns the folder's path.

    ``callbacks`` (:mod:`engine.callbacks`) see every finished round and may add metrics or
    stop the run. With ``executor.kind: ray`` the round loop runs inside a driver actor (pinned
    to this node, so the run folder is written here) and ``callbacks`` run in this process on
    the rounds it relays. Rows are appended every round; on failure the manifest records the
    error and every finished round stays readable with :func:`engine.results.load_run`.
    """
    path = Path(run_dir) if run_dir is not None else make_run_dir(cfg)
    command = command if command is not None else sys.argv
    if cfg.executor.kind == "ray":
        from engine.driver_actor import run_on_driver_actor

        return run_on_driver_actor(cfg, path, callbacks or [], command)
    return execute_run(cfg, path, callbacks, command)


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
    mark("run: begins")
    from engine.results import SCHEMA_VERSION, RunWriter
    from engine.simulation import Simulation

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
        mark("run: simulation built")
        writer.write_table("profiles", sim.profiles.to_frame())
        sim.start()
        mark("run: executor started")
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
        mark("run: folder complete")
    return path
