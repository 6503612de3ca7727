"""Trial checkpoints in Ray Tune: a trial whose worker is killed (SIGKILL) continues from its last
checkpoint, an interrupted sweep's running trial too (Population Based Training: test_sweep_pbt.py)."""
import os
import signal

import pandas as pd
import pytest
import yaml
from helpers import REPO
from helpers.sweeps import BASE as SWEEP_BASE
from helpers.sweeps import KillTrialWorker

from engine.config.schema import load_config
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import run_experiment

BASE = {**SWEEP_BASE, "rounds": 6, "algorithm": {"name": "fedavg"}}


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


def assert_same_rounds(mine: pd.DataFrame, direct: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(
        mine[list(direct.columns)].drop(columns=list(WALL_COLUMNS), errors="ignore").reset_index(drop=True),
        direct.drop(columns=list(WALL_COLUMNS), errors="ignore"), check_dtype=False)


def direct_run(tmp_path, cfg_dict: dict, name: str):
    return load_run(run_experiment(load_config(cfg_dict), tmp_path / "direct" / name))


@pytest.mark.ray
def test_a_killed_trial_continues_from_its_last_checkpoint_with_the_same_results(tmp_path, local_ray, capsys):
    from sweeps import run_sweep

    killer = KillTrialWorker(at=3)
    spec = {"name": "kill", "base": BASE, "space": {"train.lr": {"grid": [0.1]}},
            "checkpoint_every": 2, "max_failures": 1}
    sweep = run_sweep(spec, storage=tmp_path / "sw", quiet=True, callbacks=[killer])
    assert killer.killed, "the trial's worker was killed"
    err = capsys.readouterr().err
    assert "failed (" in err and "retry 1 of 1, from its last checkpoint" in err
    t = sweep.trials.iloc[0]
    assert t["status"] == "finished" and t["rounds_done"] == 6
    assert t["attempts"] == 2 and t["resumed_from_round"] == 2  # checkpoint after round 2 of 3 done
    run = sweep.run(t["trial_id"])
    assert [r["from_round"] for r in run.manifest["resumes"]] == [2]
    info = yaml.safe_load((tmp_path / "sw" / t["run_dir"] / "trial.json").read_text())
    assert [(h["attempt"], h["first_round"], h["restored_from"]) for h in info["history"]] == [
        (1, 0, None), (2, 2, t["trial_id"])]
    print(f"killed pid {killer.killed[0]} after 3 rounds; restarted from round {t['resumed_from_round']}")
    # every round once, equal to an undisturbed run of the same config
    direct = direct_run(tmp_path, {**BASE, "train": {"lr": 0.1}}, "kill")
    assert run.rounds["round"].tolist() == list(range(6))
    assert_same_rounds(run.rounds, direct.rounds)
    assert_same_rounds(run.clients, direct.clients)
    assert t["final_global_acc"] == direct.rounds["global_acc"].iloc[-1]
    # Tune kept the checkpoints in storage
    assert list((tmp_path / "sw" / "tune" / t["trial_id"]).glob("checkpoint_*"))


class InterruptAfterRounds:
    """Sends Tune the SIGUSR1 it treats like Ctrl+C once a trial reported `at` rounds."""

    def __init__(self, at: int):
        self.at, self.sent = at, False

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.sent and result.get("rounds_done") == self.at:
            self.sent = True
            os.kill(os.getpid(), signal.SIGUSR1)


@pytest.mark.ray
def test_resumed_sweep_continues_a_running_trial_from_its_checkpoint(tmp_path, local_ray):
    from sweeps import resume_sweep, run_sweep

    spec = {"name": "int", "base": BASE, "space": {"train.lr": {"grid": [0.1]}}, "checkpoint_every": 2}
    first = run_sweep(spec, storage=tmp_path / "sw", quiet=True, callbacks=[InterruptAfterRounds(3)])
    assert (first.trials["status"] == "unfinished").all()
    resumed = resume_sweep(tmp_path / "sw", quiet=True)
    t = resumed.trials.iloc[0]
    assert t["status"] == "finished" and t["attempts"] == 2 and t["resumed_from_round"] in (2, 4)
    run = resumed.run(t["trial_id"])
    assert run.rounds["round"].tolist() == list(range(6))
    assert_same_rounds(run.rounds, direct_run(tmp_path, {**BASE, "train": {"lr": 0.1}}, "int").rounds)


def test_a_stopped_trial_closes_its_run_folder_before_its_process_ends_or_runs_another_trial(
        monkeypatch, tmp_path):
    """Tune wakes a stopped trial's function (SystemExit in tune.report) and does not wait for it
    to close its run folder: cleanup returns at once, reset_config gives it 2 s. The mixin waits."""
    import threading
    import time

    from ray import tune
    from ray.tune.trainable.function_trainable import FunctionTrainable, wrap_function

    from sweeps import runner

    trial_class = wrap_function(tune.with_parameters(runner.trial_or_reuse, sweep={}))
    mro = trial_class.__mro__
    assert mro.index(runner.ClosesItsRunFolder) < mro.index(FunctionTrainable)

    class TuneLike:  # what FunctionTrainable does with the function's thread
        def __init__(self):
            self.wake = threading.Event()

        def cleanup(self):
            self.wake.set()

        def reset_config(self, new_config):
            self.wake.set()
            self.thread.join(timeout=0.05)  # Tune's TUNE_FUNCTION_THREAD_TIMEOUT_S, scaled down
            return not self.thread.is_alive()

    class Trial(runner.ClosesItsRunFolder, TuneLike):
        pass

    def closing_slowly(params, sweep):  # blocked in tune.report, then closes its run folder
        trial.wake.wait()
        time.sleep(0.3)
        (tmp_path / params["name"]).write_text("closed")

    monkeypatch.setattr(runner, "_trial_or_reuse", closing_slowly)
    for name, end in (("cleanup", lambda t: t.cleanup()), ("reset", lambda t: t.reset_config({}))):
        trial = Trial()
        trial.thread = threading.Thread(target=runner.trial_or_reuse, args=({"name": name}, {}), daemon=True)
        trial.thread.start()
        assert end(trial) in (None, True)
        assert (tmp_path / name).read_text() == "closed", f"{name} returned before the run folder was closed"
        trial.thread.join()


def test_reporter_attaches_only_checkpoints_written_in_this_run(monkeypatch, tmp_path):
    """A resumed run's manifest still names the checkpoint of an earlier attempt (e.g. one
    written when Tune paused the trial); it must not be reported again (it may be pruned)."""
    from types import SimpleNamespace

    from ray import tune

    from engine.loop.callbacks import RunContext
    from sweeps.trainable import TuneReporter

    reports = []
    monkeypatch.setattr(tune, "report", lambda metrics, checkpoint=None: reports.append(checkpoint))
    stale = {"latest": "checkpoints/round-000004", "next_round": 4}
    run = RunContext(load_config(BASE), tmp_path, first_round=3, info={"checkpoint": stale})
    reporter = TuneReporter(last_round=5)
    reporter.on_run_begin(run)
    reporter.on_round_end(run, SimpleNamespace(round=3, row={"round": 3}))
    assert reports == [None]
    (tmp_path / "checkpoints" / "round-000005").mkdir(parents=True)
    run.info["checkpoint"] = {"latest": "checkpoints/round-000005", "next_round": 5}  # saved this round
    reporter.on_round_end(run, SimpleNamespace(round=4, row={"round": 4}))
    assert reports[1] is not None and reports[1].path.endswith("round-000005")


KILLED_AFTER_TWO_TRIALS = """
import json, os, signal, sys
from sweeps import run_sweep

class KillAfterTwoTrials:  # SIGKILL of the sweep's own process, once two trials completed
    def __init__(self):
        self.done = []

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.done.append(trial.trial_id)
        if len(self.done) == 2:
            os.kill(os.getpid(), signal.SIGKILL)

spec = json.loads(sys.argv[1])
run_sweep(spec, storage=sys.argv[2], quiet=True, callbacks=[KillAfterTwoTrials()])
"""


@pytest.mark.ray
def test_a_sweep_killed_after_two_trials_finished_resumes_without_running_them_again(tmp_path, local_ray):
    import json
    import subprocess
    import sys

    from sweeps import resume_sweep

    spec = {"name": "kill2", "base": {**BASE, "rounds": 3}, "space": {"train.lr": {"grid": [0.05, 0.1, 0.2]}},
            "max_concurrent_trials": 1}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", KILLED_AFTER_TWO_TRIALS, json.dumps(spec), str(tmp_path / "sw")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    runs = tmp_path / "sw" / "runs"
    info = {d.name: json.loads((d / "trial.json").read_text()) for d in runs.iterdir() if (d / "trial.json").exists()}
    finished = sorted(t for t, i in info.items() if i["status"] == "finished")
    assert len(finished) == 2
    before = {t: (runs / t / "manifest.json").read_text() for t in finished}

    resumed = resume_sweep(tmp_path / "sw", quiet=True)
    trials = resumed.trials.set_index("trial_id")
    assert len(trials) == 3 and (trials["status"] == "finished").all(), trials[["status", "error"]]
    for t in finished:  # reused: the run folder and its trial record are untouched
        assert (runs / t / "manifest.json").read_text() == before[t]
        assert json.loads((runs / t / "trial.json").read_text())["attempts"] == 1
        assert trials.loc[t, "rounds_done"] == 3
        assert resumed.run(t).rounds["round"].tolist() == [0, 1, 2]
    rounds = resumed.rounds
    assert sorted(rounds.groupby("trial_id")["round"].count().tolist()) == [3, 3, 3]
