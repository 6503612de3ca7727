"""The Tune function trainable: one trial = one simulation = one run folder.

``hetsim_trial(params, sweep)`` applies the trial's ``{dotted key: value}`` to the base
experiment, runs it with :func:`engine.run.api.run_in_folder` and reports every round's ``rounds.parquet`` row to
Tune with :func:`ray.tune.report` (Ray 2.x's Tune API for function trainables; ``ray.train.report``
is Train's). The last round is reported after the run folder is complete, so a scheduler
decision on it cannot cut the run's finalisation short. Schedulers read ``last_<metric>``: the
last evaluated value (rounds between evaluations report NaN for the metric itself).

Where the run folder goes: ``<storage>/runs/<trial_id>/``, through the storage of the trial's
Tune storage context (``RunConfig(storage_path, storage_filesystem)``). When that storage is
this node's own disk (a local path, a shared mount) the run is written there directly;
otherwise (object storage, or a local path of another node) it is written to the trial's local
working directory and mirrored to storage after every round and when the trial ends, also when
it fails or is stopped (:class:`engine.storage.locations.DirectoryMirror`).

Checkpoints: at the rounds where the engine writes a checkpoint (``checkpoint.every`` of the
experiment, or the sweep's ``checkpoint_every``; every ``perturbation_interval`` under PBT) the
round is reported with ``checkpoint=tune.Checkpoint.from_directory(<that checkpoint>)``, which
Tune copies to ``<storage>/tune/<trial_id>/checkpoint_*``. A trial that Tune starts with a
checkpoint (a retry after a failure or a lost node, ``--resume`` of the sweep, or a PBT exploit
step, whose checkpoint is another trial's) puts it into its run folder and continues from it
with :func:`engine.run.body.execute_run` ``(resume=True)``: rounds after it are recomputed and every
table holds each round once. ``trial.json`` keeps one ``history`` entry per start (attempt,
node, first round, the trial whose checkpoint it continued, the hyperparameters).

Executors inside a trial:

* ``executor.kind: inprocess`` (default): the simulation runs in the trial's own process, which
  reserves ``resources_per_trial.cpus`` (default 1) and ``resources_per_trial.gpus`` (its
  clients train on that GPU share with ``executor.device: auto`` or ``cuda``).
* ``executor.kind: ray``: the trial reserves a placement group ``[{CPU: c, GPU: g}] + num_actors
  x [{CPU: executor.cpus_per_actor, GPU: executor.gpus_per_actor}]`` (``c`` =
  ``resources_per_trial.cpus``, default 0.01: the round loop mostly waits; ``g`` =
  ``resources_per_trial.gpus``, for the trial's global evaluation). The round loop runs in the
  trial process and its client actors are placed in bundles 1..num_actors of that group, so
  concurrent trials never compete for CPUs or GPUs.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import posixpath
import shutil
import traceback
from pathlib import Path
from typing import Any

import pandas as pd
import ray
from ray import tune
from ray.tune import PlacementGroupFactory

from engine import RunCallback, load_config
from engine.atomic import write_json_atomic
from engine.checkpoint.folder import CHECKPOINTS, checkpoint_name, list_checkpoints
from engine.checkpoint.snapshot import read_meta
from engine.clients.device import set_ray_gpu_ids
from engine.ray.executor import RayExecutor
from engine.results import Storage, StorageError, read_table
from engine.results.manifest import update_manifest
from engine.run.api import run_in_folder
from engine.run.body import execute_run
from engine.run.validate import validate_for_run
from engine.storage.locations import DirectoryMirror
from engine.trace import mark
from sweeps.results import SEARCHER_PREFIX, searcher_values
from sweeps.space import plain
from sweeps.spec import ResolvedSweep

TRIAL_INFO = "trial.json"
RAY_EXECUTOR_TRIAL_CPUS = 0.01
LAST_PREFIX = "last_"  # last_<metric>: the last evaluated value, what schedulers compare


def trial_dirname(trial) -> str:
    """Tune's per-trial folder under ``<storage>/tune/``: the bare trial id."""
    return trial.trial_id


def trial_resources(resolved: ResolvedSweep):
    """What one trial reserves: plain CPUs (in-process) or a placement group (Ray executor)."""
    cfg = resolved.base_cfg
    res = resolved.spec.resources_per_trial
    if cfg.executor.kind == "ray":
        head = {"CPU": res.cpus if res.cpus is not None else RAY_EXECUTOR_TRIAL_CPUS}
        if res.gpus:
            head["GPU"] = res.gpus
        actor = {"CPU": cfg.executor.cpus_per_actor}
        if cfg.executor.gpus_per_actor:
            actor["GPU"] = cfg.executor.gpus_per_actor  # the client actors' shares are the trial's too
        actors = [dict(actor) for _ in range(cfg.executor.num_actors or 1)]
        return PlacementGroupFactory([head, *actors])
    head = {"CPU": res.cpus if res.cpus is not None else 1.0}
    if res.gpus:
        head["GPU"] = res.gpus
    return PlacementGroupFactory([head])


def round_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """A rounds.parquet row as Tune metrics: plain scalars only, plus ``rounds_done``."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        value = plain(value)
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
    out["rounds_done"] = int(row["round"]) + 1
    return out


def _write_info(run_dir: Path, info: dict[str, Any]) -> None:
    write_json_atomic(run_dir / TRIAL_INFO, info)


def _mark_manifest(run_dir: Path, status: str, error: str) -> None:
    if (run_dir / "manifest.json").exists():
        update_manifest(run_dir, status=status, error=error)


def error_text(err: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(err), err)).strip()


class TuneReporter(RunCallback):
    """Reports every round's row to Tune; the last round only once the run folder is complete
    (:meth:`flush`), so a scheduler decision on it cannot cut the run's finalisation short.

    ``carry``: metrics also reported as ``last_<m>``, the last non-NaN value so far (rounds
    without evaluation have NaN; schedulers compare ``last_<m>``). A round after which the
    engine wrote a checkpoint is reported with it. ``mirror`` (if any) is synced before each
    report, so what Tune has seen is in storage.

    Every result also carries the cumulative ``total_sim_time_s`` and ``total_bytes_up`` (what
    ``scheduler.time_attr`` counts) and, for a searcher (``spec`` with ``search.algorithm: optuna``),
    ``trial_<column>``: the trial-level values it optimises over the rounds so far (Tune hands a
    searcher only the last result). ``earlier``: the rounds before a resumed run's first one."""

    def __init__(self, last_round: int, carry: tuple[str, ...] = (), mirror: DirectoryMirror | None = None,
                 spec: dict[str, Any] | None = None, earlier: pd.DataFrame | None = None):
        self.rows: list[dict[str, Any]] = [] if earlier is None else earlier.to_dict("records")
        self.bytes_up = sum(int(r.get("bytes_up") or 0) for r in self.rows)
        searcher = ((spec or {}).get("search") or {}).get("algorithm") == "optuna"
        self.searcher_spec = spec if searcher else None
        self.last_round = last_round
        self.rounds_done = 0
        self.deferred: list[dict[str, Any]] = []
        self.carry = tuple(dict.fromkeys(carry))
        self.last: dict[str, float] = {}
        self.mirror = mirror
        self.checkpoint_seen: dict | None = None

    def on_run_begin(self, run) -> None:
        # a resumed run's manifest still names the checkpoint of an earlier attempt
        self.checkpoint_seen = run.info.get("checkpoint")

    def on_round_end(self, run, record) -> None:
        self.rounds_done = record.round + 1
        metrics = round_metrics(record.row)
        self.rows.append(dict(record.row))
        metrics["total_sim_time_s"] = float(record.row.get("sim_time_s", math.nan))
        self.bytes_up += int(record.row.get("bytes_up") or 0)
        metrics["total_bytes_up"] = self.bytes_up
        if self.searcher_spec is not None:
            values = searcher_values(pd.DataFrame(self.rows), self.searcher_spec)
            metrics.update({SEARCHER_PREFIX + k: v for k, v in values.items()})
        for m in self.carry:
            v = metrics.get(m)
            if isinstance(v, (int, float)) and not math.isnan(v):
                self.last[m] = float(v)
            metrics[LAST_PREFIX + m] = self.last.get(m, math.nan)
        if record.round >= self.last_round:
            self.deferred.append(metrics)
            return
        if self.mirror is not None:
            self.mirror.sync()
        written = run.info.get("checkpoint")  # a new dict each time CheckpointCallback saves one
        fresh = written is not None and written is not self.checkpoint_seen
        self.checkpoint_seen = written
        if fresh and written.get("next_round") == self.rounds_done and run.path is not None:
            checkpoint = tune.Checkpoint.from_directory(str(Path(run.path) / written["latest"]))
            tune.report(metrics, checkpoint=checkpoint)
        else:
            tune.report(metrics)

    def flush(self) -> None:
        """Report the last round, marked ``done``: the trial has ended, so Tune completes it
        without asking the scheduler (PBT would otherwise perturb it once more)."""
        for i, metrics in enumerate(self.deferred):
            tune.report({**metrics, "done": True} if i == len(self.deferred) - 1 else metrics)
        self.deferred = []


class TrialFolder:
    """Where one trial writes its run folder, and how it gets to the sweep's storage."""

    def __init__(self, trial_id: str):
        ctx = tune.get_context().get_storage()  # Tune's StorageContext: RunConfig's storage
        self.sweep = Storage(ctx.storage_filesystem, ctx.storage_fs_path, ctx.storage_fs_path)
        self.remote = self.sweep.child("runs", trial_id)
        self.node_id = ray.get_runtime_context().get_node_id()
        local = self.sweep.local_path()
        if local is not None:
            if not (local / "sweep.yaml").exists():
                raise StorageError(
                    f"the sweep folder {local} is not visible on node {self.node_id[:8]} "
                    f"({ray.util.get_node_ip_address()}): a local storage path must be on a "
                    "filesystem every node mounts at the same path; set storage to such a path "
                    "or to an object store URI (s3://bucket/prefix)")
            self.run_dir = local / "runs" / trial_id
            self.mirror = None
        else:  # object storage or another node's disk: stage here, mirror there
            self.run_dir = Path(ctx.trial_working_directory) / "run"
            self.mirror = DirectoryMirror(self.run_dir, self.remote)

    def previous_info(self) -> dict[str, Any]:
        try:
            return self.remote.read_json(TRIAL_INFO) if self.remote.exists(TRIAL_INFO) else {}
        except (OSError, ValueError):
            return {}

    def start_clean(self) -> None:
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        if self.mirror is not None and self.remote.exists():
            self.remote.delete("")
        self.run_dir.mkdir(parents=True)

    def continue_from(self, checkpoint) -> int | None:
        """Make Tune's ``checkpoint`` the newest of the run folder (fetched from storage if it
        is staged here); returns the round it continues from, None if the run folder is gone."""
        if self.mirror is not None:  # a fresh node, or a stale staging copy: storage has the truth
            if self.run_dir.exists():
                shutil.rmtree(self.run_dir)
            self.remote.download(self.run_dir)
        if not (self.run_dir / "manifest.json").is_file():
            return None
        with checkpoint.as_directory() as src:
            next_round = int(read_meta(src)["next_round"])
            for n, d in list_checkpoints(self.run_dir):  # its own later (or same-round) ones
                if n >= next_round:
                    shutil.rmtree(d)
            dest = self.run_dir / CHECKPOINTS / checkpoint_name(next_round)
            shutil.copytree(src, dest)
        return next_round

    def write_info(self, info: dict[str, Any]) -> None:
        _write_info(self.run_dir, info)

    def sync(self, final: bool = False) -> None:
        if self.mirror is None:
            return
        self.mirror.sync()
        if final:  # storage has it all: the staging copy is not needed any more
            shutil.rmtree(self.run_dir, ignore_errors=True)


def checkpoint_origin(checkpoint) -> str:
    """The trial that wrote a Tune checkpoint (``<storage>/tune/<trial_id>/checkpoint_*``)."""
    return posixpath.basename(posixpath.dirname(checkpoint.path.rstrip("/")))


def hetsim_trial(params: dict[str, Any], sweep: dict[str, Any]) -> None:
    """Tune function trainable (bound to the resolved sweep with ``tune.with_parameters``)."""
    mark("trial: begins")
    resolved = ResolvedSweep.from_dict(sweep)
    trial_id = tune.get_context().get_trial_id()
    folder = TrialFolder(trial_id)
    previous = folder.previous_info()
    params = {k: plain(v) for k, v in params.items()}
    checkpoint = tune.get_checkpoint()
    first_round = folder.continue_from(checkpoint) if checkpoint is not None else None
    origin = checkpoint_origin(checkpoint) if first_round is not None else None
    if first_round is None:
        folder.start_clean()
    attempt = int(previous.get("attempts", 0)) + 1
    history = list(previous.get("history", []))
    history.append({"attempt": attempt, "node_id": folder.node_id, "first_round": first_round or 0,
                    "params": params, "restored_from": origin,
                    "started": dt.datetime.now(dt.timezone.utc).isoformat()})
    set_ray_gpu_ids(ray.get_gpu_ids())  # this trial's GPU share, for the device its clients train on
    info: dict[str, Any] = {
        "trial_id": trial_id,
        "params": params,
        "node_id": folder.node_id,
        "pid": os.getpid(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "status": "running",
        "attempts": attempt,
        "resumed_from_round": first_round,
        "history": history,
    }
    folder.write_info(info)

    spec = resolved.spec
    carry = (spec.metric, spec.scheduler.metric or spec.metric)
    earlier = None
    if first_round:  # the rounds before the checkpoint count towards the trial's totals
        done = read_table(folder.run_dir, "rounds")
        earlier = done[done["round"] < first_round] if done is not None and "round" in done else None
    reporter = TuneReporter(last_round=math.inf, carry=carry, mirror=folder.mirror,
                            spec=sweep["spec"], earlier=earlier)
    reporter.rounds_done = first_round or 0
    command = [*(resolved.command or ["hetsim", "sweep"]), f"trial={trial_id}"]

    def ended(status: str, error: str | None = None) -> None:
        history[-1].update(status=status, error=error, rounds_done=reporter.rounds_done)
        folder.write_info({**info, "status": status, "error": error, "history": history})
        folder.sync(final=True)

    try:
        cfg = load_config(resolved.trial_raw(params))
        validated = validate_for_run(cfg, folder.run_dir)  # its parts are handed to the run below
        warnings, parts = validated.warnings, validated.parts
        reporter.last_round = cfg.rounds - 1
        placement_group = ray.util.get_current_placement_group()
        executor = None
        if cfg.executor.kind == "ray" and placement_group is not None:
            executor = RayExecutor(cfg, placement_group=placement_group)
            executor.prelaunch()  # the client actors start while the trial loads the data
        if first_round is not None:
            # another trial's checkpoint (PBT) was written under other hyperparameters
            execute_run(cfg, folder.run_dir, [reporter], command, executor=executor, resume=True,
                        allow_config_change=origin != trial_id, warnings=warnings, parts=parts)
        elif executor is not None or cfg.executor.kind != "ray":
            execute_run(cfg, folder.run_dir, [reporter], command, executor=executor, warnings=warnings, parts=parts)
        else:  # outside a placement group: the engine's own driver actor
            run_in_folder(cfg, folder.run_dir, [reporter], command, warnings)
    except SystemExit:  # Tune stopped the trial (scheduler decision, PBT exploit, interruption)
        msg = f"stopped by Tune after {reporter.rounds_done} round(s)"
        _mark_manifest(folder.run_dir, "stopped", msg)
        ended("stopped", msg)
        raise
    except BaseException as err:
        ended("error", error_text(err))
        raise
    manifest = json.loads((folder.run_dir / "manifest.json").read_text())
    if manifest.get("status") == "diverged":  # train.on_nonfinite: stop ended it
        ended("diverged", manifest.get("error", ""))
    else:
        ended("finished")
    reporter.flush()
    mark("trial: ends")
