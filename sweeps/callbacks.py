"""Tune's callback hooks in a sweep, and what a sweep prints.

Quiet by default: Tune runs with ``verbose=0`` and ``RAY_AIR_NEW_OUTPUT=0`` (no tables; both set
by :mod:`sweeps.runner`), its per-trial error logs are muted (:func:`quiet_tune`; errors land in
``trials.parquet``), one tqdm bar over trials shows the best metric so far
(:class:`SweepProgress`) and a trial that Tune retries gets one line (:class:`FailureNotices`).

Sweeps started before these classes moved here from :mod:`sweeps.runner` have
``sweeps.runner.SweepCallbacks`` / ``sweeps.runner.NoTensorBoard`` pickled in their Tune state;
``sweeps.runner`` imports both names, so those still resolve on ``--resume``.
"""
from __future__ import annotations

import logging
import math
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray.tune import Callback
from ray.tune.logger import TBXLoggerCallback
from tqdm import tqdm

# Never set TUNE_DISABLE_AUTO_CALLBACK_LOGGERS: without the default loggers
# ResultGrid.get_dataframe() breaks (measured with ray 2.60).
# Tune's per-trial error tracebacks, "Trials did not complete" and the like: the errors land in
# trials.parquet instead. A trial that cannot be scheduled is still reported.
MUTED_LOGGERS = ("ray.tune",)
KEPT_LOGGERS = ("ray.tune.execution.insufficient_resources_manager",)

# ---------------------------------------------------------------- callbacks
# Tune pickles its RunConfig (callbacks included) into the experiment folder and restores it on
# resume. The RunConfig therefore holds one stateless dispatcher; the live callbacks of the
# current fit (progress bar, caller's callbacks) sit in this process-wide list.
ACTIVE: list[Any] = []


class SweepCallbacks(Callback):
    """Forwards Tune's callback hooks to the callbacks of the fit in progress."""

    def _each(self, name: str, **info) -> None:
        for cb in list(ACTIVE):
            fn = getattr(cb, name, None)
            if fn is not None:
                fn(**info)

    def on_step_begin(self, iteration, trials, **info):
        self._each("on_step_begin", iteration=iteration, trials=trials, **info)

    def on_trial_start(self, iteration, trials, trial, **info):
        self._each("on_trial_start", iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._each("on_trial_result", iteration=iteration, trials=trials, trial=trial,
                   result=result, **info)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._each("on_trial_complete", iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._each("on_trial_error", iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._each("on_trial_recover", iteration=iteration, trials=trials, trial=trial, **info)

    def on_experiment_end(self, trials, **info):
        self._each("on_experiment_end", trials=trials, **info)


class FailureNotices:
    """One line on stderr (also with -q) when a trial fails and Tune retries it (a worker or a
    whole node lost, an error with ``max_failures`` > 0): what failed and where it continues."""

    def __init__(self, max_failures: int):
        self.max_failures = max_failures

    def on_trial_recover(self, iteration, trials, trial, **info):
        where = "its last checkpoint" if trial.checkpoint is not None else "round 0 (no checkpoint yet)"
        say(f"trial {trial.trial_id} failed ({last_failure(trial)}); retry {trial.num_failures} of "
            f"{self.max_failures}, from {where}")


def last_failure(trial) -> str:
    """The first line of the trial's last failure in Tune's error file (e.g. its worker died)."""
    try:
        text = Path(trial.error_file).read_text().rsplit("Failure # ", 1)[-1]
        lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
        return lines[0][:200] if lines else "unknown error"
    except Exception:  # noqa: BLE001 - a notice must never break the sweep
        return "unknown error"


class NoTensorBoard(TBXLoggerCallback):
    """Takes the place of Tune's TensorBoard logger, which Tune adds unless one is given; writes
    nothing. Its ``__init__`` imports tensorboardX, and through it torch: ~3 s of CPU in the
    sweep's own process (measured with ray 2.60), for event files nobody reads (the results
    are in trials.parquet / rounds.parquet). Tune's CSV and JSON loggers stay: its result
    analysis reads them."""

    def __init__(self):
        self._trial_writer, self._trial_result = {}, {}

    def log_trial_start(self, trial) -> None:
        pass

    def log_trial_result(self, iteration, trial, result) -> None:
        pass

    def log_trial_end(self, trial, failed: bool = False) -> None:
        pass


class SweepProgress:
    """One tqdm bar over trials: finished/errored count and the best metric so far."""

    def __init__(self, total: int | None, metric: str, mode: str, desc: str):
        self.metric, self.mode = metric, mode
        self.bar = tqdm(total=total, unit="trial", desc=desc, dynamic_ncols=True, file=sys.stderr)
        self.done: set[str] = set()
        self.errors = 0
        self.best = math.nan
        self._primed = False

    def _offer(self, value: Any) -> None:
        try:
            v = float(value)
        except (TypeError, ValueError):
            return
        if math.isnan(v):
            return
        if math.isnan(self.best) or (v > self.best if self.mode == "max" else v < self.best):
            self.best = v

    def _refresh(self) -> None:
        post = {f"best {self.metric}": "n/a" if math.isnan(self.best) else f"{self.best:.4g}"}
        if self.errors:
            post["errors"] = str(self.errors)
        self.bar.set_postfix(post, refresh=False)
        self.bar.n = len(self.done)
        self.bar.refresh()

    def on_step_begin(self, iteration, trials, **info):
        if self._primed:
            return
        self._primed = True  # a resumed sweep: count what finished before
        for t in trials:
            if t.status in ("TERMINATED", "ERROR"):
                self.done.add(t.trial_id)
                self.errors += t.status == "ERROR"
                stats = (getattr(t, "metric_analysis", None) or {}).get(self.metric, {})
                self._offer(stats.get(self.mode))
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        before = self.best
        self._offer(result.get(self.metric))
        if self.best != before:
            self._refresh()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.done.add(trial.trial_id)
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info):
        self.done.add(trial.trial_id)
        self.errors += 1
        self._refresh()

    def close(self) -> None:
        self.bar.close()


@contextmanager
def logger_levels(levels: dict[str, int]):
    """These loggers at these levels for the duration; their own levels restored after."""
    saved = {name: logging.getLogger(name).level for name in levels}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def quiet_tune():
    """Tune's loggers muted (see :data:`MUTED_LOGGERS`) for the duration; restored after."""
    return logger_levels({**{name: logging.CRITICAL for name in MUTED_LOGGERS},
                          **{name: logging.WARNING for name in KEPT_LOGGERS}})


def say(message: str) -> None:
    """One line on stderr, also with ``-q``."""
    print(f"hetsim sweep: {message}", file=sys.stderr, flush=True)
