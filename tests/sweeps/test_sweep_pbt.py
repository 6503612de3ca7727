"""Population Based Training in a sweep: its spec checks, the example spec's exploit steps
(another trial's checkpoint, new hyperparameters) in the results, synch PBT ending when a
trial fails, and an exploited trial that Tune would have stopped one round later (sweeps.pbt)."""
import collections
import json
import os
import signal
import time
from unittest import mock

import pytest
import yaml
from helpers.sweeps import BASE as SWEEP_BASE
from helpers.sweeps import EXAMPLES, KillTrialWorker

from engine.config.schema import load_config

BASE = {**SWEEP_BASE, "rounds": 6, "algorithm": {"name": "fedavg"}}


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


def test_pbt_specs_are_checked():
    from sweeps import SweepSpecError, resolve

    base = {"name": "p", "base": BASE, "space": {"train.lr": {"loguniform": [0.01, 0.2]}},
            "scheduler": {"name": "pbt", "perturbation_interval": 2}}
    r = resolve(base)
    assert r.checkpoint_every == 2 and load_config(r.trial_raw({"train.lr": 0.1})).checkpoint.every == 2
    with pytest.raises(SweepSpecError, match="checkpoint_every = 3: PBT copies checkpoints every 2 rounds"):
        resolve({**base, "checkpoint_every": 3})
    synch = {**base, "scheduler": {"name": "pbt", "perturbation_interval": 2, "synch": True}}
    assert resolve(synch).checkpoint_every == 1
    with pytest.raises(SweepSpecError, match=r"checkpoint_every = 2: synchronous PBT .* needs checkpoint_every: 1"):
        resolve({**synch, "checkpoint_every": 2})
    with pytest.raises(SweepSpecError, match=r"hyperparam_mutations: 'train.momentum' is not a key of the space"):
        resolve({**base, "scheduler": {"name": "pbt", "hyperparam_mutations": ["train.momentum"]}})
    with pytest.raises(SweepSpecError, match="perturbation_interval = 6: must be < the experiment's rounds"):
        resolve({**base, "scheduler": {"name": "pbt", "perturbation_interval": 6}})
    with pytest.raises(SweepSpecError, match=r"space.checkpoint.every: checkpoint is fixed for the whole sweep"):
        resolve({**base, "space": {"checkpoint.every": {"grid": [1, 2]}}})
    example = resolve(EXAMPLES / "pbt_lr_eps.yaml")
    assert example.spec.scheduler.name == "pbt" and example.checkpoint_every == 1  # synch


def tune_controller_without_ray():
    """A Tune controller whose pause, stop and save handling are Tune's own (``TuneController``'s
    methods) over the state they keep, without Ray: a save resolves at once to a checkpoint named
    after the trial, an actor is a name."""
    # Ray Tune: not imported when the suite is collected
    from ray.train._internal.session import _FutureTrainingResult, _TrainingResult
    from ray.tune import Checkpoint
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

    class Controller(TuneController):
        def __init__(self):  # Tune's starts Ray's actor and resource managers: none here
            self._trials, self._live_trials, self._trials_to_cache = [], set(), set()
            self._pending_trials, self._running_trials, self._paused_trials = set(), set(), set()
            self._stopped_trials, self._failed_trials, self._pending_trials_list = set(), set(), []
            self._resources_to_pending_trials = collections.defaultdict(set)
            self._cached_trial_decisions, self._queued_trial_decisions, self._iteration = {}, {}, 0
            self._trial_to_actor, self._actor_to_trial, self.removed = {}, {}, []
            self._search_alg = self._callbacks = self._checkpoint_manager = mock.Mock()
            self._actor_manager = self._resource_updater = mock.Mock()

        def start(self, trial):
            self._trials.append(trial)
            self._live_trials.add(trial)
            self._pending_trials.add(trial)
            self._set_trial_status(trial, Trial.RUNNING)
            self._trial_to_actor[trial] = f"actor of {trial.trial_id}"
            self._actor_to_trial[f"actor of {trial.trial_id}"] = trial

        def _schedule_trial_save(self, trial, result=None):
            saved = _TrainingResult(Checkpoint(f"/ckpt/{trial.trial_id}"), dict(result or trial.last_result))
            trial.temporary_state.saving_to = mock.Mock(_FutureTrainingResult, resolve=lambda block=True: saved)
            return trial.temporary_state.saving_to

        def _maybe_cache_trial_actor(self, trial):
            return False

        def _remove_actor(self, tracked_actor):
            self.removed.append(tracked_actor)

    return Controller()


def test_an_exploited_trial_that_was_saving_for_its_pause_is_not_stopped_at_its_next_checkpoint():
    """Synch PBT, two trials, a step at rounds_done 2. Trial a's result comes first: paused, Tune
    saves its checkpoint first (pause with checkpoint). Trial b's result comes before that save
    ends and runs the step, where a (the worse) exploits b: paused again, without a checkpoint, by
    Tune's stop, which caches STOP for the saving trial and drops the save. That STOP ended a at
    its next checkpoint, one round after the step (TERMINATED at 3 of 4 rounds: early_stopped)."""
    # Ray Tune: not imported when the suite is collected
    from ray.train._internal.session import _TrainingResult
    from ray.tune import Checkpoint
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import TrialScheduler

    from sweeps.pbt import SynchPBT

    pbt = SynchPBT(time_attr="rounds_done", metric="acc", mode="max", perturbation_interval=2,
                   hyperparam_mutations={"lr": [0.3]}, quantile_fraction=0.25, synch=True,
                   log_config=False)
    tune = tune_controller_without_ray()
    a, b = (Trial("hetsim", config={"lr": lr}, stub=True, trial_id=i) for i, lr in (("a", 0.003), ("b", 0.3)))
    for t in (a, b):
        tune.start(t)
        pbt.on_trial_add(tune._wrapped(), t)

    def result(trial, acc):
        trial.update_last_result({"rounds_done": 2, "acc": acc})
        return pbt.on_trial_result(tune._wrapped(), trial, dict(trial.last_result))

    assert result(a, 0.1) == TrialScheduler.PAUSE  # b is not at the step yet
    tune.pause_trial(a)  # what Tune does with PAUSE: save first, pause once saved
    assert a.status == Trial.RUNNING and a.is_saving and tune._cached_trial_decisions == {"a": "PAUSE"}
    assert result(b, 0.9) == TrialScheduler.PAUSE  # the step: a exploits b
    assert a.status == Trial.PAUSED and a.config == {"lr": 0.3} and not a.is_saving
    assert a.latest_checkpoint_result.checkpoint.path == "/ckpt/b" and tune.removed == ["actor of a"]
    # a runs again from b's checkpoint; its round after the step reports a checkpoint, saved
    tune._set_trial_status(a, Trial.RUNNING)
    a.storage = mock.Mock()  # where Tune would number the checkpoint
    tune._process_trial_save(a, _TrainingResult(Checkpoint("/ckpt/a-3"), {"rounds_done": 3}))
    assert a.latest_checkpoint_result.checkpoint.path == "/ckpt/a-3"
    assert tune._queued_trial_decisions.get("a") is None, "a stopped at 3 of 4 rounds by a STOP Tune cached at the step"


@pytest.mark.ray
def test_pbt_example_runs_and_its_exploit_steps_are_in_the_results(tmp_path, local_ray):
    """The example spec, on a small ASCEND experiment: two trials far apart in learning rate;
    the worse one copies the better one's checkpoint and continues with new values."""
    from sweeps import load_sweep, run_sweep

    example = yaml.safe_load((EXAMPLES / "pbt_lr_eps.yaml").read_text())
    # rounds of a few ms (no pacing): a paused attempt must have closed its run folder before the
    # trial runs again (sweeps.runner.ClosesItsRunFolder, no actor reuse under PBT)
    # 4 rounds: one exploit step (at round 2); each step pauses both trials and restarts their
    # processes (a few CPU seconds each: no actor reuse under PBT)
    small = {**BASE, "rounds": 4, "algorithm": {"name": "ascend", "k": 0.05, "distill_steps": 5},
             "partition": {"public_fraction": 0.1}}
    spec = {**example, "base": small, "overrides": [], "num_samples": 1,
            "space": {"train.lr": {"grid": [0.003, 0.3]}, "algorithm.epsilon": example["space"]["algorithm.epsilon"]},
            "scheduler": {**example["scheduler"], "perturbation_interval": 2, "resample_probability": 0.0,
                          "synch": True}}  # both trials meet at each step (the first may end before the other starts)
    sweep = run_sweep(spec, storage=tmp_path / "sw", quiet=True)
    t = sweep.trials.set_index("trial_id")
    assert (t["status"] == "finished").all(), t[["status", "error"]]
    assert t["exploits"].sum() >= 1, "PBT made the worse trial exploit the better one"
    r = sweep.rounds
    for _, rows in r.groupby("trial_id"):
        assert rows["round"].tolist() == list(range(4)), "every round once"
    for trial_id in t.index:  # each attempt closed the run folder (trial.json says how it ended) before the next
        history = json.loads((tmp_path / "sw" / "runs" / trial_id / "trial.json").read_text())["history"]
        assert [h.get("status") for h in history] == ["stopped"] * (len(history) - 1) + ["finished"], history
    exploited = r[r["restored_from"] != ""]
    assert len(exploited) and set(exploited["restored_from"]) <= set(t.index)
    for trial_id, rows in exploited.groupby("trial_id"):
        mine = r[r["trial_id"] == trial_id].set_index("round")
        steps = [int(x) for x in rows["round"]
                 if x == 0 or mine.loc[x - 1, "restored_from"] != mine.loc[x, "restored_from"]
                 or mine.loc[x - 1, "lr"] != mine.loc[x, "lr"] or mine.loc[x - 1, "epsilon"] != mine.loc[x, "epsilon"]]
        assert steps, "exploit steps"
        assert set(rows["restored_from"]) <= set(t.index) - {trial_id}
        assert rows["lr"].iloc[-1] == t.loc[trial_id, "lr"]  # trials.parquet: the values at the end
        assert set(mine["lr"]) <= {0.003, 0.3} and set(mine["epsilon"]) <= {0.0, 0.05, 0.1, 0.2, 0.4}
        run = sweep.run(trial_id)
        assert set(steps) <= {e["from_round"] for e in run.manifest["resumes"]}
        for step in steps:
            print(f"trial {trial_id} continued from {mine.loc[step, 'restored_from']}'s checkpoint at round "
                  f"{step}: lr {mine.loc[step - 1, 'lr']:.4g} -> {mine.loc[step, 'lr']:.4g}, "
                  f"epsilon {mine.loc[step - 1, 'epsilon']} -> {mine.loc[step, 'epsilon']}")
    # rebuilt from the run folders alone: the same exploit steps
    refreshed = load_sweep(tmp_path / "sw", refresh=True)
    assert refreshed.trials.set_index("trial_id")["exploits"].to_dict() == t["exploits"].to_dict()


class InterruptIfStuck:
    """Interrupts the sweep (SIGUSR1, like Ctrl+C) once a trial errored and every other unfinished
    trial stayed paused for `after_s`: synch PBT waiting for a trial that will never come."""

    def __init__(self, after_s: float):
        self.after_s, self.since, self.fired = after_s, None, False

    def on_step_begin(self, iteration, trials, **info):
        unfinished = [t for t in trials if t.status not in ("ERROR", "TERMINATED")]
        stuck = any(t.status == "ERROR" for t in trials) and unfinished and all(
            t.status == "PAUSED" for t in unfinished)
        self.since = (self.since or time.monotonic()) if stuck else None
        if stuck and not self.fired and time.monotonic() - self.since > self.after_s:
            self.fired = True
            os.kill(os.getpid(), signal.SIGUSR1)


@pytest.mark.ray
@pytest.mark.timeout(300)  # a backstop: InterruptIfStuck ends a hung sweep sooner
def test_synch_pbt_ends_when_a_trial_fails_and_the_others_finish(tmp_path, local_ray):
    """Tune keeps an errored trial among its live ones, and synch PBT waited for it at every step;
    a trial already paused at a step when the other failed was never resumed (sweeps.pbt.SynchPBT).
    The first trial to finish round 1 is killed (a failing config value would be copied by PBT's
    exploit); the other meets the step at round 2 before or after the failure, the one at 4 after."""
    from sweeps import run_sweep

    killer, stuck = KillTrialWorker(at=1), InterruptIfStuck(after_s=20)
    spec = {"name": "pbtfail", "base": {**BASE, "rounds": 5}, "space": {"train.lr": {"grid": [0.05, 0.2]}},
            "scheduler": {"name": "pbt", "perturbation_interval": 2, "synch": True}}
    sweep = run_sweep(spec, storage=tmp_path / "sw", quiet=True, callbacks=[killer, stuck])
    assert killer.killed
    assert not stuck.fired, "the other trial waited for the failed one at the synch step"
    t = sweep.trials.set_index("trial_id")
    assert sorted(t["status"]) == ["error", "finished"], t[["status", "error"]]
    failed, ok = t[t["status"] == "error"].iloc[0], t[t["status"] == "finished"].iloc[0]
    assert failed["error"] and failed["rounds_done"] >= 1  # Tune's words for the lost worker
    assert ok["rounds_done"] == 5 and ok["exploits"] == 0  # nobody to exploit once alone
    rounds = sweep.rounds
    assert rounds[rounds["trial_id"] == ok.name]["round"].tolist() == list(range(5))
    kept = rounds[rounds["trial_id"] == failed.name]["round"].tolist()  # what it wrote is kept
    assert kept == list(range(len(kept))) and len(kept) >= 1
