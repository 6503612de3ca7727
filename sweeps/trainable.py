"""The Tune function trainable: one trial = one simulation = one run folder.

``hetsim_trial(params, sweep)`` applies the trial's ``{dotted key: value}`` to the base
experiment, runs it with :mod:`engine.run` into ``<storage>/runs/<trial_id>/`` and reports every
round's ``rounds.parquet`` row to Tune with :func:`ray.tune.report` (Ray 2.x's Tune API for
function trainables; ``ray.train.report`` is Train's). The last round is reported after the run
folder is complete, so a scheduler decision on it cannot cut the run's finalisation short.

Executors inside a trial:

* ``executor.kind: inprocess`` (default): the simulation runs in the trial's own process, which
  reserves ``resources_per_trial.cpus`` (default 1).
* ``executor.kind: ray``: the trial reserves a placement group ``[{CPU: c}] + num_actors x
  [{CPU: executor.cpus_per_actor}]`` (``c`` = ``resources_per_trial.cpus``, default 0.01: the
  round loop mostly waits). The round loop runs in the trial process and its client actors are
  placed in bundles 1..num_actors of that group, so concurrent trials never compete for CPUs.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import traceback
from pathlib import Path
from typing import Any

from engine.callbacks import RunCallback
from engine.config import load_config
from engine.ray_executor import RayExecutor
from engine.trace import mark
from sweeps.space import plain
from sweeps.spec import ResolvedSweep

TRIAL_INFO = "trial.json"
RAY_EXECUTOR_TRIAL_CPUS = 0.01


def trial_dirname(trial) -> str:
    """Tune's per-trial folder under ``<storage>/tune/``: the bare trial id."""
    return trial.trial_id


def trial_resources(resolved: ResolvedSweep):
    """What one trial reserves: plain CPUs (in-process) or a placement group (Ray executor)."""
    from ray.tune import PlacementGroupFactory

    cfg = resolved.base_cfg
    res = resolved.spec.resources_per_trial
    if cfg.executor.kind == "ray":
        head = {"CPU": res.cpus if res.cpus is not None else RAY_EXECUTOR_TRIAL_CPUS}
        if res.gpus:
            head["GPU"] = res.gpus
        actors = [{"CPU": cfg.executor.cpus_per_actor} for _ in range(cfg.executor.num_actors or 1)]
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
    tmp = run_dir / (TRIAL_INFO + ".tmp")
    tmp.write_text(json.dumps(info, indent=2, default=str))
    os.replace(tmp, run_dir / TRIAL_INFO)


def _mark_manifest(run_dir: Path, status: str, error: str) -> None:
    path = run_dir / "manifest.json"
    if not path.exists():
        return
    manifest = json.loads(path.read_text())
    manifest["status"], manifest["error"] = status, error
    tmp = path.with_name("manifest.json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    os.replace(tmp, path)


def error_text(err: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(err), err)).strip()


class TuneReporter(RunCallback):
    """Reports every round's row to Tune; the last round only once the run folder is complete
    (:meth:`flush`), so a scheduler decision on it cannot cut the run's finalisation short."""

    def __init__(self, last_round: int):
        self.last_round = last_round
        self.rounds_done = 0
        self.deferred: list[dict[str, Any]] = []

    def on_round_end(self, run, record) -> None:
        from ray import tune

        self.rounds_done = record.round + 1
        metrics = round_metrics(record.row)
        if record.round >= self.last_round:
            self.deferred.append(metrics)
        else:
            tune.report(metrics)

    def flush(self) -> None:
        from ray import tune

        for metrics in self.deferred:
            tune.report(metrics)
        self.deferred = []


def hetsim_trial(params: dict[str, Any], sweep: dict[str, Any]) -> None:
    """Tune function trainable (bound to the resolved sweep with ``tune.with_parameters``)."""
    import ray
    from ray import tune

    from engine.run import execute_run, run_experiment

    mark("trial: begins")
    resolved = ResolvedSweep.from_dict(sweep)
    trial_id = tune.get_context().get_trial_id()
    run_dir = resolved.storage / "runs" / trial_id
    if run_dir.exists():  # an unfinished trial restarted by a resume: start clean
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    params = {k: plain(v) for k, v in params.items()}
    info: dict[str, Any] = {
        "trial_id": trial_id,
        "params": params,
        "node_id": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "status": "running",
    }
    _write_info(run_dir, info)

    reporter = TuneReporter(last_round=math.inf)
    command = [*(resolved.command or ["hetsim", "sweep"]), f"trial={trial_id}"]
    try:
        cfg = load_config(resolved.trial_raw(params))
        reporter.last_round = cfg.rounds - 1
        placement_group = ray.util.get_current_placement_group()
        if cfg.executor.kind == "ray" and placement_group is not None:
            executor = RayExecutor(cfg, placement_group=placement_group)
            executor.prelaunch()  # the client actors start while the trial loads the data
            execute_run(cfg, run_dir, [reporter], command, executor=executor)
        else:  # in-process (or, outside a placement group, the engine's own driver actor)
            run_experiment(cfg, run_dir, [reporter], command)
    except SystemExit:  # Tune stopped the trial (scheduler decision or sweep interrupted)
        msg = f"stopped by Tune after {reporter.rounds_done} round(s)"
        _mark_manifest(run_dir, "stopped", msg)
        _write_info(run_dir, {**info, "status": "stopped", "error": msg})
        raise
    except BaseException as err:
        _write_info(run_dir, {**info, "status": "error", "error": error_text(err)})
        raise
    _write_info(run_dir, {**info, "status": "finished"})
    reporter.flush()
    mark("trial: ends")
