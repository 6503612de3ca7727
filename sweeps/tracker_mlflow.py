"""Tune's MLflow logger for a sweep: one MLflow run per trial, a metric point per round.

Runs on the driver (Tune's callbacks do). Unlike Tune's own ``MLflowLoggerCallback``: the run
is found again by its tags (``trial_id``, ``sweep_storage``) when a trial starts in a later fit
(``--resume``), so a trial has one run, never one per fit; the step is the round; the
params are the trial's hyperparameters under the sweep's column names (the first values: MLflow
params cannot change, so PBT's later values are in trials.parquet / rounds.parquet); a round
that a restarted trial reports again with the same simulation values (all but the host's
wall-clock columns) is not logged twice, so the wall-clock columns keep the first start's
values; each round's metrics go in one ``log_batch``. A trial the fit leaves unfinished (an interruption) is marked
``KILLED`` and set back to ``RUNNING`` when it continues.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from ray.air.integrations.mlflow import MLflowLoggerCallback

from engine.results import WALL_COLUMNS
from sweeps.callbacks import logger_levels
from sweeps.tracker_tensorboard import round_scalars

CHATTY_LOGGERS = ("mlflow", "alembic")  # "Creating initial MLflow database tables..." and migrations


def _quiet():
    return logger_levels({name: logging.WARNING for name in CHATTY_LOGGERS})


def _same(values: dict[str, float]) -> tuple:
    """What must match for a re-reported round to count as logged: its values but the host's
    wall-clock ones (a recomputed round's simulation values are equal, its wall time is not)."""
    return tuple(sorted((k, None if math.isnan(v) else v) for k, v in values.items() if k not in WALL_COLUMNS))


class SweepMLflow(MLflowLoggerCallback):
    def __init__(self, *, tracking_uri: str, experiment_name: str, artifact_location: str | None,
                 tags: dict[str, str], param_columns: dict[str, str]):
        super().__init__(tracking_uri=tracking_uri, experiment_name=experiment_name, tags=tags)
        self.artifact_location = artifact_location
        self.columns = dict(param_columns)

    def setup(self, *args, **kwargs) -> None:
        with _quiet():
            self.mlflow_util.setup_mlflow(tracking_uri=self.tracking_uri, experiment_name=self.experiment_name,
                                          artifact_location=self.artifact_location)
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment_id = self.mlflow_util.experiment_id
        self._trial_runs: dict[str, str] = {}  # trial_id -> MLflow run id
        self._params: dict[str, set[str]] = {}  # params already on the run
        self._logged: dict[str, dict[int, tuple]] = {}  # trial -> round -> its _same() as logged
        self._open: set[str] = set()

    def _run_of(self, trial) -> str:
        tid = trial.trial_id
        if tid in self._trial_runs:
            return self._trial_runs[tid]
        storage = self.tags["sweep_storage"].replace("'", "\\'")
        found = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.trial_id = '{tid}' and tags.sweep_storage = '{storage}'",
            max_results=1)
        if found:  # started in an earlier fit of this sweep: continue it
            run = found[0]
            self._params[tid] = set(run.data.params)
            self._logged[tid] = self._history(run)
        else:
            run = self.client.create_run(self.experiment_id, run_name=tid, tags={**self.tags, "trial_id": tid})
            self._params[tid] = set()
        self._trial_runs[tid] = run.info.run_id
        return run.info.run_id

    def _history(self, run) -> dict[int, tuple]:
        """The rounds an earlier fit logged (the last point of each step), as :func:`_same` keys."""
        steps: dict[int, dict[str, float]] = {}
        for key in run.data.metrics:
            for m in sorted(self.client.get_metric_history(run.info.run_id, key), key=lambda m: m.timestamp):
                steps.setdefault(m.step, {})[key] = m.value
        return {step: _same(values) for step, values in steps.items()}

    def log_trial_start(self, trial) -> None:
        run_id = self._run_of(trial)
        if trial.trial_id not in self._open:
            self.client.update_run(run_id, status="RUNNING")
            self._open.add(trial.trial_id)
        params = {self.columns.get(k, k): v for k, v in (trial.config or {}).items()}
        new = [Param(k, str(v)) for k, v in params.items() if k not in self._params[trial.trial_id]]
        if new:
            self.client.log_batch(run_id, params=new)
            self._params[trial.trial_id].update(p.key for p in new)

    def log_trial_result(self, iteration: int, trial, result: dict[str, Any]) -> None:
        tid = trial.trial_id
        if "round" not in result:  # not a round of the trainable
            return
        if tid not in self._open:
            self.log_trial_start(trial)
        step = int(result["round"])
        values = round_scalars(result)
        logged = self._logged.setdefault(tid, {})
        # a restart (retry, --resume, PBT) reports the rounds after its checkpoint again: those
        # recomputed with the same values are logged already
        if logged.get(step) == _same(values):
            return
        logged[step] = _same(values)
        now = int(time.time() * 1000)
        self.client.log_batch(self._trial_runs[tid],
                              metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def log_trial_end(self, trial, failed: bool = False) -> None:
        if trial.trial_id in self._open:
            self.client.set_terminated(self._trial_runs[trial.trial_id], "FAILED" if failed else "FINISHED")
            self._open.discard(trial.trial_id)

    def close(self) -> None:
        """End of the fit: trials it leaves unfinished (an interruption) are ``KILLED``."""
        for tid in list(self._open):
            self.client.set_terminated(self._trial_runs[tid], "KILLED")
        self._open.clear()
