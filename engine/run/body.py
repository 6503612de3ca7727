"""The body of a run, in whichever process hosts the round loop (the CLI's, or a Ray driver
actor's): build the simulation, keep the manifest, record rounds, checkpoint, close the folder.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import time
import traceback
from pathlib import Path

from engine.checkpoint.folder import CHECKPOINTS, CheckpointCallback, list_checkpoints, prune_checkpoints
from engine.checkpoint.format import CheckpointError
from engine.checkpoint.snapshot import restore_checkpoint
from engine.clients.device import check_device_request
from engine.config.schema import ExperimentConfig, dump_config
from engine.execution.inprocess import InProcessExecutor
from engine.loop.callbacks import CallbackLike, RoundRecord, RunCallback, RunContext, around_recorder
from engine.loop.simulation import Simulation
from engine.results.manifest import SCHEMA_VERSION, ManifestKeeper, process_identity, read_manifest, utc_now
from engine.results.tables import RunWriter
from engine.trace import mark


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("hetsim", "torch", "torchvision", "numpy", "pandas", "pyarrow", "ray", "pydantic"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def make_executor(cfg: ExperimentConfig):
    if cfg.executor.kind == "ray":
        from engine.ray.executor import RayExecutor  # Ray: imported for Ray runs only

        return RayExecutor(cfg)
    # One torch thread by default: on 2 cores, small models train as fast with 1 thread as
    # with 2, and 2 threads slow down ~7x as soon as another process competes for a core.
    return InProcessExecutor(threads=cfg.executor.threads_per_actor or 1)


class RunRecorder(RunCallback):
    """Appends every round's rows to the run folder's Parquet parts; compacts them at the end.

    Fault rows (a client host died and was replaced) go to ``faults.parquet`` and are counted
    in the manifest (``faults``); the :class:`ManifestKeeper` writes it at the end of the round.
    """

    def __init__(self, writer):
        self.writer = writer

    def on_round_end(self, run: RunContext, record: RoundRecord) -> None:
        self.writer.append("rounds", [record.row])
        self.writer.append("clients", record.client_rows)
        for name, rows in record.extra_tables.items():
            self.writer.append(name, rows)
        if record.extra_tables.get("faults"):
            run.info["faults"] = run.info.get("faults", 0) + len(record.extra_tables["faults"])

    def on_run_end(self, run: RunContext, status: str) -> None:
        self.writer.finalize()


def execute_run(
    cfg: ExperimentConfig,
    path: Path,
    callbacks: list[CallbackLike] | None,
    command: list[str],
    executor=None,
    resume: bool = False,
    allow_config_change: bool = False,
    warnings: list[str] | None = None,
) -> Path:
    """The body of a run, in whichever process hosts the round loop.

    ``executor`` defaults to the one ``cfg.executor`` names (see :func:`make_executor`).
    ``resume``: continue the run in ``path`` from its newest checkpoint (see :func:`resume_run`,
    which checks the config first); ``allow_config_change``: that checkpoint may come from another
    config (:func:`engine.checkpoint.snapshot.restore_checkpoint`; Population Based Training).
    """
    mark("run: begins")
    check_device_request(cfg)
    path = Path(path)
    writer = RunWriter(path)
    if resume:
        manifest, resume_entry = _resumed_manifest(path, command)
    else:
        shutil.rmtree(path / CHECKPOINTS, ignore_errors=True)  # an overwritten run's: not ours
        manifest = _new_manifest(cfg, command, warnings)
    dump_config(cfg, path / "config.yaml")  # on resume: result-neutral fields may have changed
    keeper = ManifestKeeper(path, manifest)
    keeper.start()
    wall0 = time.perf_counter()
    recorder = RunRecorder(writer)
    sim = None
    try:
        executor = executor if executor is not None else make_executor(cfg)
        sim = Simulation(cfg, executor)
        mark("run: simulation built")
        if not resume:
            profiles = sim.profiles.to_frame()
            if sim.conditions is not None:
                profiles = profiles.assign(**sim.conditions.columns())
            writer.write_table("profiles", profiles)
        sim.start()
        mark("run: executor started")
        manifest["executor"] = {**sim.executor.describe(), "eval_device": sim.eval_device.type}
        manifest["num_clients"] = sim.data.num_clients
        if resume:
            _restore_for_resume(sim, path, writer, manifest, resume_entry, allow_config_change)
        keeper.write()
        run = RunContext(cfg, path, first_round=sim.next_round, simulation=sim, info=manifest)
        cbs = around_recorder(callbacks, recorder)
        cbs.insert(cbs.index(recorder) + 1, CheckpointCallback(cfg, writer))
        manifest["status"] = sim.run([*cbs, keeper], run)
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
        late = sim.executor.drain_faults() if sim is not None else []
        if late:  # a host died after the last round's record (e.g. while checkpointing)
            writer.append("faults", late)
            manifest["faults"] = manifest.get("faults", 0) + len(late)
        writer.finalize()  # idempotent: also covers a failure before the loop started
        keeper.write()
        mark("run: folder complete")
    return path


def _new_manifest(cfg: ExperimentConfig, command: list[str], warnings: list[str] | None) -> dict:
    return {
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


def _resumed_manifest(path: Path, command: list[str]) -> tuple[dict, dict]:
    """The manifest of a run being resumed (running again, in this process), and the entry
    its ``resumes`` list gets once the checkpoint is restored."""
    manifest = read_manifest(path)
    entry = {
        "at": utc_now(),
        "previous_status": manifest.get("status"),
        "previous_error": manifest.get("error"),
        "command": command,
        "host": platform.node(),
    }
    for key in ("error", "finished"):
        manifest.pop(key, None)
    manifest.update(status="running", **process_identity(), loop_pid=os.getpid())
    return manifest, entry


def _restore_for_resume(sim: Simulation, path: Path, writer: RunWriter, manifest: dict, entry: dict,
                        allow_config_change: bool = False) -> None:
    """Load the newest checkpoint into ``sim`` and cut the tables back to it."""
    ckpt, meta = None, None
    for _, candidate in reversed(list_checkpoints(path)):  # newest first; one that fails to
        try:                                               # load (cut by a power loss) is skipped
            meta = restore_checkpoint(sim, candidate, allow_config_change=allow_config_change)
            ckpt = candidate
            break
        except (CheckpointError, OSError, RuntimeError, ValueError) as err:
            entry.setdefault("skipped", []).append({"checkpoint": candidate.name, "error": str(err)})
    if ckpt is None and entry.get("skipped"):
        raise CheckpointError(
            f"no checkpoint of {path} could be restored ({entry['skipped']}); remove "
            f"{path / CHECKPOINTS} to rerun it from round 0")
    entry["from_round"] = sim.next_round
    entry["checkpoint"] = f"{CHECKPOINTS}/{ckpt.name}" if ckpt is not None else None
    entry["rows_dropped"] = writer.rewind(sim.next_round, meta["tables"] if meta else None)
    prune_checkpoints(path, sim.cfg.checkpoint.keep, newer_than=sim.next_round)
    sim.executor.recovery_checkpoint = ckpt
    manifest.setdefault("resumes", []).append(entry)


