"""The sweep tests' tiny experiment (digits, an MLP, 10 clients, 2 rounds) and what they share."""
import os
import signal

from engine.config.schema import load_config
from engine.results.tables import load_run
from engine.run.api import run_experiment
from helpers import REPO, one_torch_thread

EXAMPLES = REPO / "sweeps" / "examples"

BASE = {
    "seed": 0,
    "rounds": 2,
    "dataset": {"name": "digits"},
    "model": {"name": "mlp"},
    "clients": {"num_clients": 10, "participation": 0.5, "profiles": {}},
    "algorithm": {"name": "fedprox"},
}
GRID = {"train.lr": {"grid": [0.05, 0.1]}, "algorithm.mu": {"grid": [0.0, 0.1]}}


def spec(**kw):
    return {"name": "t", "base": BASE, "space": GRID, **kw}


def direct_rounds(tmp_path, params, name):
    """The same config run directly with engine.run.run_experiment."""
    with one_torch_thread():
        cfg = load_config(BASE, {**params})
        return load_run(run_experiment(cfg, tmp_path / "direct" / name)).rounds


class InterruptAfterFirstTrial:
    """Sends Tune the SIGUSR1 it treats like Ctrl+C once the first trial has finished."""

    def __init__(self):
        self.sent = False

    def on_trial_complete(self, iteration, trials, trial, **info):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGUSR1)


class KillTrialWorker:
    """SIGKILLs the process of the trial (Tune puts its pid in every result) after `at` rounds."""

    def __init__(self, at: int):
        self.at, self.killed = at, []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.killed and result.get("rounds_done") == self.at:
            self.killed.append(result["pid"])
            os.kill(result["pid"], signal.SIGKILL)
