"""Tune's TensorBoard logger (tensorboardX) for a sweep: one event folder per trial.

Event files go to ``<storage>/tensorboard/<trial_id>/``: written there directly when the sweep
folder is on this machine's disk (so ``tensorboard --logdir <storage>/tensorboard`` shows a
running sweep), else (object storage) into a local staging folder that is uploaded when a trial
ends, every :data:`UPLOAD_EVERY_S` seconds and when the fit ends.

Unlike Tune's own ``TBXLoggerCallback`` (whose files land in Tune's driver staging folder,
synced to storage only every 5 minutes): the step is the round (not Tune's report count, which
restarts differ in), the tags are the rounds.parquet column names, the hyperparameters carry
the sweep's column names, and a restarted trial (a retry, ``--resume``, a PBT exploit) opens a
new event file with ``purge_step`` = the first round it reports again, so TensorBoard shows
each round once (the recomputed value).
"""
from __future__ import annotations

import itertools
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ray.tune.logger import TBXLoggerCallback
from ray.tune.result import AUTO_RESULT_KEYS

from engine.results import Storage
from engine.storage.locations import DirectoryMirror

# Tune's bookkeeping and the trainable's scheduler helpers: not rounds.parquet columns
NOT_ROUND_KEYS = frozenset(AUTO_RESULT_KEYS) | {"done", "rounds_done", "trial_id", "experiment_tag",
                                                  "should_checkpoint"}
UPLOAD_EVERY_S = 30.0
_FILES = itertools.count(1)  # per process: a resume in the same second must not reuse a name


def round_scalars(result: dict[str, Any]) -> dict[str, float]:
    """The numeric values of the rounds.parquet row in a Tune result (NaN kept)."""
    out = {}
    for key, value in result.items():
        if key in NOT_ROUND_KEYS or key.startswith("last_"):
            continue
        if isinstance(value, bool):
            out[key] = float(value)
        elif isinstance(value, (int, float)) or type(value).__module__ == "numpy":
            try:
                out[key] = float(value)
            except (TypeError, ValueError):
                continue
    return out


def hparam_value(value: Any) -> Any:
    """What TensorBoard's hparams plugin takes: str, bool, int or float."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (list, dict, str)):
        value = item()
    return value if isinstance(value, (str, bool, int, float)) else str(value)


class SweepTensorBoard(TBXLoggerCallback):
    """``TBXLoggerCallback`` writing ``<folder>/<trial_id>/events.out.tfevents.*``."""

    def __init__(self, folder: Storage, param_columns: dict[str, str]):
        super().__init__()  # imports tensorboardX
        self.columns = dict(param_columns)
        self.mirror: DirectoryMirror | None = None
        local = folder.local_path()
        if local is None:  # object storage: stage here, upload there
            self.logdir = Path(tempfile.mkdtemp(prefix="hetsim-tensorboard-"))
            if folder.exists():  # a resume: keep the earlier files (the mirror deletes what is not here)
                folder.download(self.logdir)
            self.mirror = DirectoryMirror(self.logdir, folder)
        else:
            self.logdir = local
            self.logdir.mkdir(parents=True, exist_ok=True)
        self._uploaded = time.monotonic()

    def log_trial_start(self, trial) -> None:
        writer = self._trial_writer.pop(trial, None)
        if writer is not None:
            writer.close()
        self._trial_result[trial] = {}

    def log_trial_result(self, iteration: int, trial, result: dict) -> None:
        if "round" not in result:  # not a round of the trainable
            return
        step = int(result["round"])
        writer = self._trial_writer.get(trial)
        if writer is None:  # opened at the first report: its round is where a restart continues
            writer = self._summary_writer_cls(
                str(self.logdir / trial.trial_id), flush_secs=30, purge_step=step,
                filename_suffix=f".{os.getpid()}.{next(_FILES):04d}")  # tensorboardX names by the second
            self._trial_writer[trial] = writer
        values = {k: v for k, v in round_scalars(result).items() if not math.isnan(v)}
        for key, value in values.items():
            writer.add_scalar(key, value, global_step=step)
        self._trial_result[trial] = values
        writer.flush()
        if self.mirror is not None and time.monotonic() - self._uploaded > UPLOAD_EVERY_S:
            self._upload()

    def log_trial_end(self, trial, failed: bool = False) -> None:
        writer = self._trial_writer.pop(trial, None)
        result = self._trial_result.pop(trial, {})
        if writer is None:
            return
        if result:
            self._log_hparams(writer, trial, result)
        writer.close()
        self._upload()

    def _log_hparams(self, writer, trial, result: dict[str, float]) -> None:
        from tensorboardX.summary import hparams  # loaded with tensorboardX in __init__

        params = {self.columns.get(k, k): hparam_value(v) for k, v in (trial.config or {}).items()
                  if v is not None}
        try:
            for summary in hparams(hparam_dict=params, metric_dict=result):
                writer.file_writer.add_summary(summary)
        except Exception:  # noqa: BLE001 - as Tune: a value tensorboardX refuses never stops the sweep
            pass

    def _upload(self) -> None:
        if self.mirror is not None:
            self.mirror.sync()
            self._uploaded = time.monotonic()

    def close(self) -> None:
        """End of the fit (also an interrupted one): close the open files, upload, clean up."""
        for trial in list(self._trial_writer):
            self._trial_writer.pop(trial).close()
        self._trial_result.clear()
        self._upload()
        if self.mirror is not None:
            shutil.rmtree(self.logdir, ignore_errors=True)
