"""The body of a run, in whichever process hosts the round loop (the CLI's, or a Ray driver
actor's): build the simulation, keep the manifest, record rounds, checkpoint, close the folder.
"""
from __future__ import annotations

import importlib.metadata as md
import logging
import os
import platform
import shutil
import time
import traceback
from pathlib import Path

import numpy as np
import pyarrow as pa

from engine.checkpoint.folder import (
    CHECKPOINTS,
    CheckpointCallback,
    check_damaged_tables,
    list_checkpoints,
    prune_checkpoints,
    rebuilds,
)
from engine.checkpoint.snapshot import read_meta, restore_checkpoint
from engine.clients.device import check_device_request
from engine.clients.format import CheckpointError
from engine.config.schema import ExperimentConfig, dump_config
from engine.errors import CorruptRunFolderError, StorageFault, storage_fault
from engine.execution.inprocess import InProcessExecutor
from engine.loop.callbacks import CallbackLike, RoundRecord, RunCallback, RunContext, around_recorder
from engine.loop.simulation import Simulation
from engine.loop.timing import make_simulation
from engine.plugin_transport import describe_plugins
from engine.results.manifest import SCHEMA_VERSION, ManifestKeeper, process_identity, read_manifest, utc_now
from engine.results.tables import HISTORY_TABLES, RunWriter, read_table, set_aside
from engine.trace import mark
from hardware_profiles.sampler import TABLE_COLUMNS

log = logging.getLogger("hetsim")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("hetsim", "torch", "torchvision", "numpy", "pandas", "pyarrow", "ray", "pydantic"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def make_executor(cfg: ExperimentConfig):
    if cfg.clock.mode == "timing_only":  # nothing trains: the simulation answers for its clients
        return None
    if cfg.executor.kind == "ray":
        from engine.ray.executor import RayExecutor  # Ray: imported for Ray runs only

        return RayExecutor(cfg)
    return InProcessExecutor.for_config(cfg)


class RunRecorder(RunCallback):
    """Appends every round's rows to the run folder's Parquet parts; compacts them at the end.

    Fault rows (a client host died and was replaced) go to ``faults.parquet`` and are counted
    in the manifest (``faults``); the :class:`ManifestKeeper` writes it at the end of the round.
    """

    def __init__(self, writer):
        self.writer = writer

    def on_round_end(self, run: RunContext, record: RoundRecord) -> None:
        try:
            self.writer.append("rounds", [record.row])
            self.writer.append("clients", record.client_rows)
            for name, rows in record.extra_tables.items():
                self.writer.append(name, rows)
        except Exception as err:
            fault = storage_fault(err, f"the Parquet tables of round {record.round}", self.writer.dir,
                                  self.writer.dir)
            if fault is None:
                raise
            raise fault from err
        if record.extra_tables.get("faults"):
            run.info["faults"] = run.info.get("faults", 0) + len(record.extra_tables["faults"])

    def on_run_end(self, run: RunContext, status: str) -> None:
        if status != "failed":  # a failed run is compacted by execute_run, which handles a full disk
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
    parts=None,
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
    keeper = ManifestKeeper(path, manifest)
    wall0 = time.perf_counter()
    recorder = RunRecorder(writer)
    sim = None
    failure: BaseException | None = None
    try:  # from the first write on: a full disk is reported and the folder closed
        dump_config(cfg, path / "config.yaml")  # on resume: result-neutral fields may have changed
        keeper.start()
        executor = executor if executor is not None else make_executor(cfg)
        sim = make_simulation(cfg, executor, parts=parts)  # the validation's parts, if it handed them
        mark("run: simulation built")
        manifest["num_classes"] = int(sim.data.num_classes)  # what "chance" is, for reports
        if not resume:
            writer.write_table("profiles", _profiles_frame(sim))
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
        failure = storage_fault(err, "the run folder", path, path,
                                sim.next_round if sim is not None else None) or err
        manifest["status"] = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        manifest["error"] = ("".join(traceback.format_exception_only(type(err), err)).strip()
                             if failure is err else f"{type(failure).__name__}: {failure}")
        if failure is err:
            raise
        raise failure from err
    finally:
        keeper.stop()
        failure = _close_folder(cfg, path, writer, keeper, manifest, sim, wall0, failure)
        mark("run: folder complete")
    if failure is not None:  # the run finished, but its folder could not be completed
        raise failure
    return path


def _close_folder(cfg: ExperimentConfig, path: Path, writer: RunWriter, keeper: ManifestKeeper,
                  manifest: dict, sim: Simulation | None, wall0: float,
                  failure: BaseException | None) -> StorageFault | None:
    """Compact the tables and write the final manifest. A full or read-only disk here is
    reported without hiding ``failure`` (why the run ended): it gets a note instead, and a
    run that had succeeded gets the fault back to raise."""
    manifest["finished"] = utc_now()
    manifest["wall_s"] = time.perf_counter() - wall0
    late_fault = None
    try:
        late = sim.executor.drain_faults() if sim is not None else []
        if late:  # a host died after the last round's record (e.g. while checkpointing)
            writer.append("faults", late)
            manifest["faults"] = manifest.get("faults", 0) + len(late)
        writer.finalize()  # idempotent: also covers a failure before the loop started
    except Exception as err:
        fault = storage_fault(err, "the compacted Parquet tables", path, path)
        if fault is None and failure is None:
            raise
        if failure is None:
            late_fault = fault
            manifest.update(status="failed", error=f"{type(fault).__name__}: {fault}")
    if failure is None and late_fault is None and manifest.get("status") == "finished":
        _warn_about_results(cfg, path, manifest)
    fault = failure if isinstance(failure, StorageFault) else late_fault
    try:
        keeper.write()
    except StorageFault as err:
        fault = fault or err
        fault.set_state("the run folder could not be marked failed: manifest.json cannot be written, "
                        "so its last version, which says 'running', stays (`hetsim show` reports the "
                        "run as crashed)")
        return fault if failure is None else None
    if fault is not None:
        fault.set_state(f"the run folder {path} is marked failed")
    return late_fault


CHANCE_FACTOR = 1.5  # final accuracy at most this x 1/num_classes: "near chance" (as the report says)
NEVER_AGGREGATED_SHARE = 0.1  # warn when at least this share of the fleet never took part


def _warn_about_results(cfg: ExperimentConfig, path: Path, manifest: dict) -> None:
    """Warnings for a finished run that cannot mean what it seems to: no update ever arrived,
    a share of the fleet never aggregated, accuracy still near chance (terminal and manifest)."""
    rounds = read_table(path, "rounds")
    if rounds is None or rounds.empty:
        return
    texts = []
    arrived = int(rounds["num_arrived"].sum())
    manifest["num_arrived"] = arrived  # an explicit flag: 0 is a run whose model never trained
    skipped = int(rounds["num_nonfinite"].sum()) if "num_nonfinite" in rounds else 0
    if arrived == 0 and cfg.train.on_nonfinite == "skip_client" and skipped:
        texts.append(f"train.on_nonfinite: skip_client skipped every upload of the run ({skipped} non-finite "
                     f"upload(s) in {len(rounds)} round(s)): the global model never changed from its "
                     "initialisation, so its accuracy is chance; lower train.lr, or set "
                     "train.on_nonfinite: stop to end such a run as diverged")
    elif arrived == 0 and cfg.clock.mode == "timing_only":
        texts.append(f"no client's upload arrived in any of the {len(rounds)} round(s)")
    elif arrived == 0:
        deadline = cfg.clock.fixed_deadline_s
        field = "clock.deadline_s" if cfg.clock.deadline_s is not None else "clock.deadline.seconds"
        texts.append(f"no client's update arrived in any of the {len(rounds)} round(s) (0 bytes aggregated): "
                     "the model never trained"
                     + (f"; no client met {field} = {deadline:g} s (raise it, or see the fleet's "
                        "links in the report)" if deadline is not None else ""))
    else:
        clients = read_table(path, "clients")
        if clients is not None and not clients.empty and "sim_total_s" in clients:
            # among the clients that did the work: not being drawn, or offline when drawn, is the
            # fleet's chance; doing the work and never counting (too slow, lost) is the finding
            worked = clients.loc[clients["sim_total_s"].notna(), "client_id"].nunique()
            never = worked - clients.loc[clients["made_deadline"].astype(bool), "client_id"].nunique()
            did = "ran" if cfg.clock.mode == "timing_only" else "trained"
            if worked and never / worked >= NEVER_AGGREGATED_SHARE:
                texts.append(f"{never} of the {worked} clients that {did} in {len(rounds)} round(s) "
                             f"({100 * never / worked:.0f} %) were never aggregated (too slow or lost on the "
                             f"way); `hetsim report {path}` lists them with their profiles")
    k = manifest.get("num_classes")
    final = next((float(v.dropna().iloc[-1]) for col in ("global_acc", "pers_acc") if col in rounds
                  for v in [rounds[col]] if v.notna().any()), None)
    if k and final is not None and final <= CHANCE_FACTOR / k:
        texts.append(f"the final accuracy {100 * final:.1f} % is near chance ({k} classes: chance "
                     f"{100 / k:.1f} %; warned at or below {100 * CHANCE_FACTOR / k:.1f} %)")
    for text in texts:
        log.warning("hetsim: warning: %s", text)
        if text not in manifest.setdefault("warnings", []):  # a resumed run ends again: said once
            manifest["warnings"].append(text)
    # the results' own warnings, which a report derives again from the tables (with ids): kept
    # apart so that its banner does not say them twice
    manifest["result_warnings"] = texts


def _new_manifest(cfg: ExperimentConfig, command: list[str], warnings: list[str] | None) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "running",
        "seed": cfg.seed,
        "algorithm": cfg.algorithm.name,
        **({"asynchronous": cfg.asynchronous.mode} if cfg.asynchronous else {}),
        "dataset": cfg.dataset.name,
        "started": utc_now(),
        "command": command,
        **process_identity(),  # the round loop's process: the driver actor's under Ray
        "loop_pid": os.getpid(),  # (= pid; kept for readers of schema 1)
        "warnings": list(warnings or []),
        "versions": versions(),
        **({"plugins": plugins} if (plugins := describe_plugins(cfg.plugins)) else {}),
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


def _profiles_frame(sim: Simulation) -> pa.Table:
    """profiles.parquet: every client's profile (and conditions), as Arrow columns straight from
    the profile table's arrays (a pandas frame of 10M clients would copy them twice)."""
    profiles = sim.profiles
    columns = {"client_id": np.arange(len(profiles), dtype=np.int64),
               **{f: getattr(profiles, f) for f in TABLE_COLUMNS}}
    if sim.conditions is not None:
        columns.update(sim.conditions.columns())
    return pa.table({k: pa.array(v, type=pa.string()) if v.dtype == object else v for k, v in columns.items()})


def _restore_for_resume(sim: Simulation, path: Path, writer: RunWriter, manifest: dict, entry: dict,
                        allow_config_change: bool = False) -> None:
    """Load the newest checkpoint into ``sim`` and cut the tables back to it. Table files that
    cannot be read are set aside: a round table's from the newest checkpoint at or before its
    rounds (which recomputes them), profiles.parquet written again from the config."""
    damaged = check_damaged_tables(path)  # raises if no checkpoint can rebuild them
    rebuild = [d for d in damaged if d.table not in HISTORY_TABLES]
    ckpt, meta = None, None
    # newest first; one that fails to load (cut by a power loss) is skipped
    for _, candidate in reversed(list_checkpoints(path)):
        if rebuild:  # one past the damaged files' rounds would lose them: an older one
            try:
                if not rebuilds(read_meta(candidate), rebuild):
                    continue
            except CheckpointError:
                pass  # the restore below says why it is skipped
        try:
            meta = restore_checkpoint(sim, candidate, allow_config_change=allow_config_change)
            ckpt = candidate
            break
        except (CheckpointError, OSError, RuntimeError, ValueError) as err:
            entry.setdefault("skipped", []).append({"checkpoint": candidate.name, "error": str(err)})
            text = f"checkpoint {candidate} could not be loaded and is skipped: {str(err)[:300]}"
            log.warning("hetsim: warning: %s", text)  # said, not only recorded
            manifest.setdefault("warnings", []).append(text)
    if ckpt is None and entry.get("skipped"):
        raise CorruptRunFolderError(
            f"no checkpoint of {path} could be restored ({len(entry['skipped'])} tried, each "
            f"damaged: {entry['skipped'][0]['error'][:200]}); remove {path / CHECKPOINTS} to rerun "
            "it from round 0")
    entry["from_round"] = sim.next_round
    entry["checkpoint"] = f"{CHECKPOINTS}/{ckpt.name}" if ckpt is not None else None
    # checkpoints past this one go before any damaged file is set aside: a resume killed in
    # between must not continue from one of them, past rounds that are no longer on disk
    prune_checkpoints(path, sim.cfg.checkpoint.keep, newer_than=sim.next_round)
    entry["rows_dropped"] = writer.rewind(sim.next_round, meta["tables"] if meta else None,
                                          damaged=[d.path for d in rebuild])
    source = f"checkpoint {ckpt.name}" if ckpt is not None else "round 0 (the run has no checkpoint)"
    errors = {d.path: d.error for d in damaged}
    notes = [(old, new, f"its rounds are recomputed from {source}") for old, new in writer.set_aside.items()]
    for d in damaged:
        if d.table == "profiles":  # built from the config and seed: the same table again
            notes.append((d.path, set_aside(d.path), "written again from the config"))
            writer.write_table("profiles", _profiles_frame(sim))
        elif d.table in HISTORY_TABLES:  # a log of replaced client hosts: results do not need it
            notes.append((d.path, set_aside(d.path), "its records of replaced client hosts are lost"))
    for old, new, what in notes:
        text = f"{old} is damaged ({errors[old]}): set aside as {new.name}; {what}"
        log.warning("hetsim: warning: %s", text)
        manifest.setdefault("warnings", []).append(text)
        entry.setdefault("set_aside", []).append(str(new.relative_to(path)))
    sim.executor.recovery_checkpoint = ckpt
    manifest.setdefault("resumes", []).append(entry)


