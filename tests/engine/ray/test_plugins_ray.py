"""Plugins on Ray: the example plugins (a method package, a selection policy file) on client and driver
actors, in a two-trial sweep and from a notebook's ``__main__``, with tables equal to the in-process
run's; a plugin the actors cannot import, and one that fails in a round, end with exit 2 naming it.
A cluster whose worker has its own disk: tests/engine/ray/test_cluster.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import REPO
from helpers.plugins import isolated_plugins
from helpers.tabular import comparable_tables

import engine
from algorithms.fedavg import FedAvgClient, FedAvgServer
from engine import plugins
from hetsim.cli import main
from sweeps import load_sweep

EXAMPLES = REPO / "examples"

EXPERIMENT = EXAMPLES / "selectors" / "experiment.yaml"  # power_of_choice.py + the fedavgm package folder
SMALL = ["--set", "rounds=3", "--set", "checkpoint.every=0"]
ON_RAY = ["--set", "executor.kind=ray", "--set", "executor.num_actors=1"]


@pytest.fixture(autouse=True)
def forget_plugins():
    with isolated_plugins():  # the plugins a test imports are not left to the next test file
        yield


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


@pytest.mark.ray
def test_the_example_plugins_run_on_ray_actors_with_the_in_process_tables(tmp_path, local_ray):
    assert main(["run", "-c", str(EXPERIMENT), "-q", "-o", str(tmp_path / "here"), *SMALL]) == 0
    assert main(["run", "-c", str(EXPERIMENT), "-q", "-o", str(tmp_path / "ray"), *SMALL, *ON_RAY]) == 0
    here, there = engine.load_run(tmp_path / "here"), engine.load_run(tmp_path / "ray")
    assert there.manifest["executor"]["kind"] == "ray" and there.manifest["plugins"] == here.manifest["plugins"]
    for name, table in comparable_tables(there).items():
        pd.testing.assert_frame_equal(table, comparable_tables(here)[name], obj=name)
    assert there.clients["selection_reason"].notna().all() and there.rounds["server_velocity_norm"].notna().all()


@pytest.mark.ray
def test_a_two_trial_sweep_of_a_plugin_methods_option(tmp_path, local_ray):
    spec = {"name": "beta", "base": str(EXPERIMENT), "space": {"algorithm.beta": {"grid": [0.0, 0.5]}},
            "overrides": ["rounds=2", "checkpoint.every=0"], "max_concurrent_trials": 1}
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(spec_file), "--storage", str(tmp_path / "sw"), "-q"]) == 0
    trials = load_sweep(tmp_path / "sw").trials.set_index("beta")
    assert (trials["status"] == "finished").all() and len(trials) == 2
    for beta in (0.0, 0.5):  # each trial's result is the direct run's
        assert main(["run", "-c", str(EXPERIMENT), "-q", "-o", str(tmp_path / f"direct{beta}"), "--set", "rounds=2",
                     "--set", f"algorithm.beta={beta}"]) == 0
        direct = engine.load_run(tmp_path / f"direct{beta}").rounds["global_acc"].iloc[-1]
        assert trials.loc[beta, "final_global_acc"] == direct


class ScaledParams(plugins.AlgorithmParams):
    shrink: float = 0.0


class ShrinkingServer(FedAvgServer):
    """FedAvg, then the global model shrunk towards zero by ``shrink`` (defined in this test
    module: a session's own class, which trials get by value)."""

    def aggregate(self, round, results):
        super().aggregate(round, results)
        for model in self.models.values():
            plugins.load_flat_state(model, plugins.flat_state(model) * (1.0 - self.params.shrink))
        return {"shrink": self.params.shrink}


@pytest.mark.ray
def test_a_sessions_own_method_runs_in_a_sweeps_trials(tmp_path, local_ray):
    from sweeps.runner import run_sweep

    plugins.register_method(plugins.AlgorithmSpec("shrinking", ScaledParams, FedAvgClient, ShrinkingServer))
    base = {"rounds": 2, "dataset": {"name": "digits"}, "model": {"name": "mlp"},
            "algorithm": {"name": "shrinking"}, "clients": {"num_clients": 6, "profiles": {}},
            "checkpoint": {"every": 0}}
    sweep = run_sweep({"name": "shrink", "base": base, "space": {"algorithm.shrink": {"grid": [0.0, 0.5]}},
                       "max_concurrent_trials": 1}, storage=tmp_path / "sw", quiet=True)
    trials = sweep.trials.set_index("shrink")
    assert (trials["status"] == "finished").all(), trials[["status", "error"]]
    direct = engine.simulate(base, {"algorithm.shrink": 0.5}, run_dir=tmp_path / "direct")
    assert trials.loc[0.5, "final_global_acc"] == direct.rounds["global_acc"].iloc[-1]
    assert sweep.rounds.groupby("shrink")["server_shrink"].first().to_dict() == {0.0: 0.0, 0.5: 0.5}


def every_other(view):
    """Odd clients do one step, even ones their configured work (a session's own work policy, which
    the Ray driver actor gets by value)."""
    return np.where(view.ids % 2 == 1, 1, view.configured)


@pytest.mark.ray
def test_a_sessions_own_work_policy_runs_on_the_ray_driver_with_the_in_process_tables(tmp_path, local_ray):
    base = {"rounds": 2, "dataset": {"name": "digits"}, "model": {"name": "mlp"}, "train": {"local_steps": 6},
            "clients": {"num_clients": 6, "participation": 1.0, "profiles": {}}, "checkpoint": {"every": 0}}
    here = engine.simulate(base, work=every_other, run_dir=tmp_path / "here")
    there = engine.simulate(base, {"executor.kind": "ray", "executor.num_actors": 1}, work=every_other,
                            run_dir=tmp_path / "ray")
    assert there.manifest["executor"]["kind"] == "ray"
    assert {e["session"] for e in there.manifest["plugins"]} >= {"work policy 'every_other'"}
    steps = there.clients.set_index("client_id")["local_steps"].dropna()  # (unavailable clients: none)
    assert (steps[steps.index % 2 == 1] == 1).all() and (steps[steps.index % 2 == 0] > 1).all()
    for name, table in comparable_tables(there).items():
        pd.testing.assert_frame_equal(table, comparable_tables(here)[name], obj=name)


@pytest.mark.ray
def test_a_notebooks_own_classes_run_on_ray_by_value(tmp_path):
    """examples/notebook.py defines its method and model in __main__ and runs them in-process and
    on Ray (its own local Ray), asserting equal tables. Each run builds its parts once: the caller
    once per run (its validation hands them to the in-process run), the driver actor once, and the
    client actors never (the start-up trace counts them per process)."""
    trace = tmp_path / "trace.txt"
    out = subprocess.run([sys.executable, str(EXAMPLES / "notebook.py"), "--ray", f"--out={tmp_path}"],
                         capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO), "HETSIM_TRACE": str(trace)}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Ray: the same tables" in out.stdout
    built = [line.split()[1] for line in trace.read_text().splitlines() if "parts: built" in line]
    by_process = sorted(built.count(pid) for pid in set(built))
    assert by_process == [1, 2], by_process  # the driver actor's one; the caller's in-process and Ray runs
    run = engine.load_run(tmp_path / "notebook-ray")
    assert run.manifest["algorithm"] == "server_momentum" and run.config["model"]["name"] == "TinyNet"
    assert {e["session"] for e in run.manifest["plugins"]} >= {"algorithm 'server_momentum'", "model 'TinyNet'"}


NOT_ON_WORKERS = """
    import sys

    if "default_worker.py" in sys.argv[0]:  # a Ray worker: as a node without the plugin's dependency
        raise ImportError("libfancy.so: cannot open shared object file")

    from engine import plugins

    plugins.register_metric("always_one", lambda outputs, targets: 1.0)
"""

FAILS_IN_FIT = """
    from engine import plugins
    from engine.plugins import AlgorithmParams

    fedavg = __import__("algorithms.fedavg", fromlist=["FedAvgClient"])


    class Client(fedavg.FedAvgClient):
        def fit(self, ctx, broadcast):
            if ctx.round == 1:
                raise ValueError(f"client {ctx.client_id} has no data for round 1")
            return super().fit(ctx, broadcast)


    plugins.register_method("fit_fails", params=AlgorithmParams, client=Client, server=fedavg.FedAvgServer)
"""


@pytest.mark.ray
def test_a_plugin_the_actors_cannot_import_or_that_fails_in_a_round_ends_with_exit_2(tmp_path, local_ray, capsys):
    (tmp_path / "fancy_metric.py").write_text(textwrap.dedent(NOT_ON_WORKERS))
    exp = tmp_path / "exp.yaml"
    exp.write_text("plugins: [fancy_metric.py]\nevaluation: {metrics: [always_one]}\ndataset: {name: digits}\n"
                   "model: {name: mlp}\nclients: {num_clients: 6, profiles: {}}\nrounds: 2\n")
    assert main(["run", "-c", str(exp), "-q", "-o", str(tmp_path / "refused"), *ON_RAY]) == 2
    err = capsys.readouterr().err
    assert f"plugins[0] = '{tmp_path / 'fancy_metric.py'}': importing it failed on node " in err, err
    assert "ImportError: libfancy.so: cannot open shared object file" in err and "Traceback" not in err
    assert f'File "{tmp_path / "fancy_metric.py"}", line 5, in <module>' in err
    refused = engine.load_run(tmp_path / "refused")
    assert refused.manifest["status"] == "failed" and refused.rounds.empty  # before the first round

    (tmp_path / "fit_fails.py").write_text(textwrap.dedent(FAILS_IN_FIT))
    assert main(["run", "-q", "-o", str(tmp_path / "failed"), "--plugin", str(tmp_path / "fit_fails.py"),
                 "--set", "algorithm.name=fit_fails", "--set", "rounds=3", "--set", "dataset.name=digits",
                 "--set", "model.name=mlp", "--set", "clients.num_clients=6", "--set", "clients.profiles={}",
                 *ON_RAY]) == 2
    err = capsys.readouterr().err
    assert "failed in round 1: ValueError: client" in err and "has no data for round 1" in err, err
    assert f'File "{tmp_path / "fit_fails.py"}", line 11, in fit' in err and "Traceback" not in err
    assert f"hetsim run --resume {tmp_path / 'failed'}" in err
    failed = engine.load_run(tmp_path / "failed")
    assert failed.manifest["status"] == "failed" and list(failed.rounds["round"]) == [0]
