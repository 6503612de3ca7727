"""Population Based Training whose synchronous mode survives a failed trial and a step that
exploits a trial Tune is saving.

Tune (2.60) keeps an errored trial in ``get_live_trials()`` (only ``stop_trial`` removes one, and
it returns early for ERROR), and ``PopulationBasedTraining(synch=True)`` pauses every trial at
a perturbation step until all live trials got there: a trial that failed before the step never
gets there, so the others waited paused forever. And when the last trial to reach a step fails
instead, the trials already paused there are never resumed: only a result runs the step.

:class:`SynchPBT` counts only unfinished trials as the population a step waits for, and when
every unfinished trial waits paused at the step (the trial they waited for ended), it takes
that step itself, as the last trial's result would have, when Tune next asks it which trial to
run.

And a trial that the step exploits while Tune still saves its checkpoint for the pause it asked at
the step (its result came first; the other trial's result, which runs the step, came before that
save ended) kept a STOP from Tune: ``_schedule_trial_stop`` caches STOP for a saving trial "for
after the save", then drops that save's future, so the STOP waits in ``_cached_trial_decisions``
and ends the trial at its next checkpoint, one round after the step, TERMINATED with rounds to go
(ray-project/ray#57906). :meth:`SynchPBT._exploit` drops what Tune cached for a trial it paused.
"""
from __future__ import annotations

import logging

from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining

logger = logging.getLogger(__name__)


class _UnfinishedTrials:
    """The Tune controller as PBT sees it, with finished (errored) trials not live."""

    def __init__(self, controller):
        self._controller = controller

    def get_live_trials(self):
        return {t for t in self._controller.get_live_trials() if not t.is_finished()}

    def __getattr__(self, name):
        return getattr(self._controller, name)


class SynchPBT(PopulationBasedTraining):
    def on_trial_result(self, tune_controller, trial, result):
        if self._synch:
            tune_controller = _UnfinishedTrials(tune_controller)
        return super().on_trial_result(tune_controller, trial, result)

    def _exploit(self, tune_controller, trial, trial_to_clone):
        running = trial.status != Trial.PAUSED
        super()._exploit(tune_controller, trial, trial_to_clone)
        if running:  # paused here: its actor and the save in flight are gone, and so is what waited on them
            controller = getattr(tune_controller, "_tune_controller", tune_controller)  # past Tune's wrapper
            if controller._cached_trial_decisions.pop(trial.trial_id, None) == "STOP":
                logger.info("synch PBT: trial %s, exploited while Tune saved it, continues (Tune's STOP for it "
                            "dropped)", trial.trial_id)

    def choose_trial_to_run(self, tune_controller):
        if self._synch:
            self._step_if_all_wait(tune_controller)
        return super().choose_trial_to_run(tune_controller)

    def _step_if_all_wait(self, tune_controller) -> None:
        """The perturbation step of PBT's synch branch (``on_trial_result``), taken when every
        unfinished trial is paused at it: the trial they waited for ended without a result there."""
        waiting = [t for t in tune_controller.get_trials() if not t.is_finished()]
        sync = self._next_perturbation_sync
        if not waiting or any(t.status != Trial.PAUSED or self._trial_state[t].last_train_time < sync
                              for t in waiting):
            return
        logger.warning("synch PBT: a trial ended before the step at %s; the %d trial(s) waiting there take it "
                       "without it", sync, len(waiting))
        lower, upper = self._quantiles()  # of the unfinished trials
        middle = [t for t in waiting if t not in lower and t not in upper]
        for t in upper + middle + lower:  # as PBT: the top trials' checkpoints before the exploits
            self._trial_state[t].last_perturbation_time = self._trial_state[t].last_train_time
            self._checkpoint_or_exploit(t, tune_controller, upper, lower)
        times = [self._trial_state[t].last_train_time for t in tune_controller.get_trials()]
        self._next_perturbation_sync = max(sync + self._perturbation_interval, max(times))
