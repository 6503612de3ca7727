"""The plugin API in one process: registering at any time, what a bad registration or a bad plugin
says, plugin files named by a config, objects passed to engine.simulate, and the hooks a method gets
(its own loss, metrics, selection). On Ray, in a sweep and on a cluster: tests/engine/ray/test_plugins_ray.py
and tests/engine/ray/test_cluster.py."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import REPO
from helpers.plugins import isolated_plugins

import engine
from engine import plugins
from engine.config.schema import load_config
from engine.errors import ConfigError, PluginError
from engine.results.tables import WALL_COLUMNS
from hetsim.cli import main

EXAMPLES = REPO / "examples"
TINY = {"dataset.name": "digits", "model.name": "mlp", "clients.num_clients": 6, "rounds": 3,
        "clients.profiles": {}, "checkpoint.every": 1}


@pytest.fixture(autouse=True)
def session_names():
    """What a test registers or imports as a plugin is forgotten after it."""
    with isolated_plugins():
        yield


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def comparable(rounds: pd.DataFrame) -> pd.DataFrame:
    return rounds[[c for c in rounds.columns if c not in WALL_COLUMNS]]


class EchoClient(plugins.Client):
    """FedAvg's client half, written against the public contract."""

    def receive(self, ctx, broadcast):
        plugins.load_flat_state(ctx.model, broadcast.arrays["state"])

    def fit(self, ctx, broadcast):
        loss, seen = plugins.local_sgd(ctx, loss=self.loss_of(ctx))
        state = plugins.flat_state(ctx.model).numpy().astype(np.float32)
        return plugins.ClientResult(ctx.client_id, ctx.arch, plugins.Payload({"state": state}, 4 * state.size),
                                    len(ctx.train_y), ctx.flops_per_sample * seen, metrics={"train_loss": loss})


class MeanServer(plugins.Server):
    def broadcast(self, round):
        return {a: plugins.Payload({"state": plugins.flat_state(m).numpy()}, 4 * plugins.flat_state(m).numel())
                for a, m in self.models.items()}

    def aggregate(self, round, results):
        for arch, model in self.models.items():
            mine = [r for r in results if r.arch == arch]
            if mine:
                plugins.load_flat_state(model, plugins.sample_weighted_mean(mine, "state"))
        return {}


# ---------------------------------------------------------------- registering


def test_a_method_registered_after_a_config_was_loaded_is_found_and_a_clash_names_both(session_names):
    load_config(None, TINY)  # the schema is built and used before the method exists
    with pytest.raises(ConfigError, match=r"algorithm.name = 'echo_avg': unknown algorithm 'echo_avg'.*plugins:"):
        load_config(None, {**TINY, "algorithm.name": "echo_avg"})

    class EchoParams(plugins.AlgorithmParams):
        scale: float = 1.0

    spec = plugins.register_method("echo_avg", params=EchoParams, client=EchoClient, server=MeanServer)
    cfg = load_config(None, {**TINY, "algorithm": {"name": "echo_avg", "scale": 2.0}})
    assert cfg.algorithm.name == "echo_avg" and cfg.algorithm.scale == 2.0 and type(cfg.algorithm) is EchoParams
    with pytest.raises(ConfigError, match=r"algorithm.scal = .*unknown key; did you mean 'scale'"):
        load_config(None, {**TINY, "algorithm": {"name": "echo_avg", "scal": 2.0}})
    assert plugins.register_method(spec) is spec  # the same method again: nothing happens
    with pytest.raises(PluginError, match=r"algorithm 'echo_avg' is already registered by .*test_plugins.*"
                                          r"registering .* under the same name is not allowed"):
        plugins.register_method("echo_avg", params=EchoParams, client=EchoClient, server=type("S", (MeanServer,), {}))

    # the decorator form: one half decorated, the other given
    @plugins.register_method("echo_avg2", client=EchoClient)
    class Decorated(MeanServer):
        pass

    assert engine.load_config(None, {**TINY, "algorithm.name": "echo_avg2"}).algorithm.name == "echo_avg2"
    assert [n for n, o in plugins.registered("method") if o.kind == "session"][-2:] == ["echo_avg", "echo_avg2"]


@pytest.mark.parametrize("make, message", [
    (lambda: plugins.register_method("m1", client=plugins.Client, server=MeanServer),
     r"method 'm1': the client class algorithms.base.Client does not define receive\(ctx, broadcast\), which "
     r"algorithms.base.Client leaves to each method"),
    (lambda: plugins.register_method("m2", client=EchoClient, server=type("NoAggregate", (plugins.Server,), {
        "broadcast": lambda self, r: {}})),
     r"the server class .*NoAggregate does not define aggregate\(round, results\) -> dict, which "
     r"algorithms.base.Server leaves"),
    (lambda: plugins.register_method("m3", params=dict, client=EchoClient, server=MeanServer),
     r"method 'm3': params=builtins.dict is not a pydantic model class; give a subclass of "
     r"algorithms.base.AlgorithmParams"),
    (lambda: plugins.register_method("m4", params=type("P", (__import__("pydantic").BaseModel,), {}),
                                     client=EchoClient, server=MeanServer),
     r"params class .*P is a pydantic model but not a subclass of algorithms.base.AlgorithmParams"),
    (lambda: plugins.register_method("m5", client=MeanServer, server=MeanServer),
     r"client=.*MeanServer is not a subclass of algorithms.base.Client"),
    (lambda: plugins.register_method("bad name", client=EchoClient, server=MeanServer),
     r"algorithm name 'bad name' is not allowed"),
    (lambda: plugins.register_selector("s1", type("NoSelect", (plugins.SelectionPolicy,), {})),
     r"selection policy 's1': .*NoSelect does not define select\(view\) -> ids"),
    (lambda: plugins.register_metric("f1", lambda outputs: 0.0),
     r"metric 'f1': .* must take \(outputs, targets\)"),
    (lambda: plugins.register_model("net", torch.nn.Linear, input_shape=(0, 3)),
     r"model 'net': input_shape=\(0, 3\) is not a shape"),
    (lambda: plugins.register_dataset("data", 5), r"dataset 'data': 5 is not callable"),
])
def test_a_bad_registration_names_the_hook_or_the_field(make, message, session_names):
    with pytest.raises(PluginError, match=message):
        make()


# ---------------------------------------------------------------- plugin files named by a config


def test_the_example_plugins_run_from_a_config_and_fedavgm_without_momentum_is_fedavg(tmp_path):
    """examples/selectors/experiment.yaml names a plugin file and a plugin package folder by paths
    relative to itself; run from another folder. FedAvgM with beta 0 and server_lr 1 is FedAvg."""
    exp = EXAMPLES / "selectors" / "experiment.yaml"
    assert main(["run", "-c", str(exp), "-q", "-o", str(tmp_path / "pow")]) == 0
    run = engine.load_run(tmp_path / "pow")
    assert [p["plugin"] for p in run.manifest["plugins"]] == [
        str(EXAMPLES / "selectors" / "power_of_choice.py"), str(EXAMPLES / "fedavgm" / "hetsim_fedavgm")]
    assert run.config["clients"]["selection"] == {"name": "power_of_choice", "d": 12}
    first = run.clients[run.clients["round"] == 0]
    assert len(first) == 6 and (first["selection_reason"] == "highest last loss of 12 drawn").all()
    assert np.isinf(first["selection_score"]).all()  # nobody heard from yet
    # a finite score is the loss the client reported the last time it ran (the engine's history)
    scored = 0
    for row in run.clients[np.isfinite(run.clients["selection_score"])].itertuples():
        before = run.clients[(run.clients["client_id"] == row.client_id) & (run.clients["round"] < row.round)]
        assert row.selection_score == before["train_loss"].dropna().iloc[-1], row
        scored += 1
    assert scored >= 10
    assert run.rounds["server_velocity_norm"].notna().all() and run.rounds["global_macro_f1"].notna().all()

    plain = {"plugins": [str(EXAMPLES / "fedavgm" / "hetsim_fedavgm")], **TINY, "checkpoint.every": 0}
    momentum = engine.simulate(None, {**plain, "algorithm": {"name": "fedavgm", "beta": 0.0}},
                               run_dir=tmp_path / "fedavgm")
    fedavg = engine.simulate(None, {**TINY, "checkpoint.every": 0}, run_dir=tmp_path / "fedavg")
    np.testing.assert_allclose(momentum.rounds["global_loss"], fedavg.rounds["global_loss"], rtol=1e-5)
    np.testing.assert_allclose(momentum.rounds["global_acc"], fedavg.rounds["global_acc"], atol=1 / 359)


def test_a_bad_plugin_ends_with_exit_2_naming_the_users_file(tmp_path, capsys):
    cases = {
        "syntax.py": ("def broken(:\n", r'syntax.py", line 1'),
        "raises.py": ("import math\n\ndef helper():\n    raise RuntimeError('no licence server')\n\nhelper()\n",
                      r"importing it failed: RuntimeError: no licence server\n  File \".*raises.py\", line 6, "
                      r"in <module>\n    helper\(\)\n  File \".*raises.py\", line 4, in helper"),
        "json.py": ("X = 1\n", r"its module name 'json' is taken by .*json/__init__.py"),
    }
    for name, (source, message) in cases.items():
        folder = tmp_path / name.removesuffix(".py")
        write(folder, name, source)
        write(folder, "exp.yaml", f"plugins: [{name}]\n")
        assert main(["validate", "-c", str(folder / "exp.yaml")]) == 2, name
        err = capsys.readouterr().err
        assert f"plugins[0] = '{folder / name}'" in err and "Traceback" not in err, err
        assert __import__("re").search(message, err), (name, err)
    assert main(["validate", "--plugin", "missing.py"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    # a model whose builder fails when the validation builds it for the data
    bad_model = write(tmp_path, "badnet.py", """\
        import torch
        from engine import plugins


        @plugins.register_model("badnet")
        class BadNet(torch.nn.Module):
            def __init__(self, input_shape, num_classes):
                super().__init__()
                self.fc = torch.nn.Linear(input_shape[0] // 0, num_classes)
    """)
    assert main(["validate", "--plugin", str(bad_model), "--set", "model.name=badnet",
                 "--set", "dataset.name=digits"]) == 2
    err = capsys.readouterr().err
    assert "model.name = 'badnet': your plugin's code raised ZeroDivisionError" in err, err
    assert f'File "{bad_model}", line 9, in __init__' in err and "Traceback" not in err
    assert main(["validate", "--set", "plugins=[no_such_module_here]"]) == 2
    assert "no module named 'no_such_module_here'" in capsys.readouterr().err


FAILING = """
    from engine import plugins
    from examples_fedavgm_copy import FedAvgMClient, FedAvgMParams, FedAvgMServer


    class Client(FedAvgMClient):
        def fit(self, ctx, broadcast):
            if ctx.round == 1:
                return self.explode(ctx)
            return super().fit(ctx, broadcast)

        def explode(self, ctx):
            return {}["no such key"]


    plugins.register_method("fails", params=FedAvgMParams, client=Client, server=FedAvgMServer)
"""


def test_a_plugin_failing_in_a_round_names_client_round_and_its_frame_and_resumes_once_fixed(tmp_path, capsys):
    """The resumed run equals an uninterrupted one: the method's server state (FedAvgM's velocity)
    and the selection policy's history (power-of-choice's losses) are in the checkpoint."""
    # a plugin folder: its own module and the copy of the example it imports travel together
    folder = tmp_path / "plug"
    write(folder, "examples_fedavgm_copy.py", (EXAMPLES / "fedavgm" / "hetsim_fedavgm" / "__init__.py").read_text()
          .replace('"fedavgm"', '"fedavgm_copy"'))
    write(folder, "pow_copy.py", (EXAMPLES / "selectors" / "power_of_choice.py").read_text()
          .replace('"power_of_choice"', '"pow_copy"'))
    plugin = write(folder, "failing.py", FAILING)
    exp = write(tmp_path, "exp.yaml", "plugins: [plug]\nalgorithm: {name: fails, beta: 0.5}\n"
                                      "clients: {selection: {name: pow_copy, d: 4}}\n")
    run_dir = tmp_path / "run"
    args = ["run", "-c", str(exp), "-q", "-o", str(run_dir), *[f"--set={k}={v}" for k, v in TINY.items()]]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert __import__("re").search(r"client \d+ failed in round 1: KeyError: 'no such key'", err), err
    assert f'File "{plugin}", line 13, in explode' in err and "return {}[\"no such key\"]" in err
    assert f"hetsim run --resume {run_dir}" in err and "Traceback" not in err
    failed = engine.load_run(run_dir)
    assert failed.manifest["status"] == "failed" and list(failed.rounds["round"]) == [0]
    plugin.write_text(plugin.read_text().replace("ctx.round == 1", "ctx.round == -1"))  # fixed
    assert main(["run", "--resume", str(run_dir), "-q"]) == 0
    done = engine.load_run(run_dir)
    assert done.manifest["status"] == "finished" and list(done.rounds["round"]) == [0, 1, 2]
    assert main([*args[:5], str(tmp_path / "whole"), *args[6:]]) == 0  # the fixed plugin, uninterrupted
    whole = engine.load_run(tmp_path / "whole")
    pd.testing.assert_frame_equal(comparable(done.rounds), comparable(whole.rounds))
    pd.testing.assert_frame_equal(done.clients.drop(columns=list(WALL_COLUMNS), errors="ignore"),
                                  whole.clients.drop(columns=list(WALL_COLUMNS), errors="ignore"))
    assert done.clients["selection_score"].notna().all()


# ---------------------------------------------------------------- objects, hooks, metrics, selection


class HalfLossClient(EchoClient):
    """Its own objective: half the cross-entropy (the loss hook, not a copy of local_sgd)."""

    def batch_loss(self, ctx, model, x, y):
        return 0.5 * torch.nn.functional.cross_entropy(model(x), y)


class Widest(plugins.SelectionPolicy):
    """The clients with the fastest download links."""

    def select(self, view):
        pool = view.pool()
        order = np.argsort(-view.profiles.down_mbps[pool], kind="stable")[:view.count]
        return plugins.Selection(pool[order], score=view.profiles.down_mbps[pool][order], reason="widest link")


def worst_class_recall(outputs, targets):
    pred = outputs.argmax(1)
    return float(min((pred[targets == c] == c).double().mean() for c in targets.unique()))


def test_objects_passed_to_simulate_are_registered_and_their_hooks_used(tmp_path, session_names):
    half = plugins.AlgorithmSpec("half_loss", plugins.AlgorithmParams, HalfLossClient, MeanServer)
    settings = {**TINY, "clients.profiles": {"bandwidth": {"distribution": "loguniform", "low": 5, "high": 500}},
                "train.lr": 0.1, "checkpoint.every": 0, "executor.batch_clients": True}
    run = engine.simulate(None, settings, algorithm=half, selection=Widest, metrics=[worst_class_recall],
                          run_dir=tmp_path / "half")
    assert run.config["algorithm"]["name"] == "half_loss" and run.config["clients"]["selection"] == {"name": "Widest"}
    down = run.profiles.set_index("client_id")["down_mbps"]
    for r, picked in run.clients.groupby("round"):
        assert set(picked["client_id"]) == set(down.nlargest(len(picked)).index), r
        assert (picked["selection_reason"] == "widest link").all()
    assert run.rounds["global_worst_class_recall"].between(0, 1).all()
    assert run.rounds["pers_worst_class_recall"].notna().all()
    assert any("defines its own batch_loss" in w for w in run.manifest["warnings"])
    # half the loss at twice the learning rate: the same SGD steps, so the same models
    same = engine.simulate(None, {**settings, "train.lr": 0.05}, algorithm=plugins.AlgorithmSpec(
        "plain_loss", plugins.AlgorithmParams, EchoClient, MeanServer), selection="Widest", run_dir=tmp_path / "plain")
    np.testing.assert_allclose(run.rounds["global_loss"], same.rounds["global_loss"], rtol=1e-5)
    np.testing.assert_allclose(run.clients["train_loss"].dropna() * 2, same.clients["train_loss"].dropna(), rtol=1e-5)


def test_a_selection_policy_that_breaks_the_rules_is_named_with_the_round(tmp_path, session_names):
    class Twice(plugins.SelectionPolicy):
        def select(self, view):
            return np.array([1, 1])

    class Outside(plugins.SelectionPolicy):
        def select(self, view):
            return [view.num_clients]

    for policy, message in ((Twice, r"selection policy 'Twice' in round 0 chose client\(s\) \[1\] more than once"),
                            (Outside, r"'Outside' in round 0 chose client\(s\) \[6\] outside 0..5")):
        with pytest.raises(PluginError, match=message):
            engine.simulate(None, {**TINY, "checkpoint.every": 0}, selection=policy, run_dir=tmp_path / policy.__name__)


def test_an_installed_package_announces_its_plugins_through_its_entry_point(tmp_path):
    """examples/fedavgm built and installed with pip (into a folder on PYTHONPATH): a config names
    `fedavgm` without plugins:, and `hetsim list` says which package it came from."""
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--target", str(target), str(EXAMPLES / "fedavgm")], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    env = {**__import__("os").environ, "PYTHONPATH": f"{target}:{REPO}"}
    hetsim = [sys.executable, "-c", "import sys; from hetsim.cli import main; sys.exit(main(sys.argv[1:]))"]
    listed = subprocess.run([*hetsim, "list", "algorithms"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("fedavgm "))
    assert "FedAvgM: FedAvg with server momentum" in line and line.endswith("[package hetsim-fedavgm]"), line
    ran = subprocess.run([*hetsim, "run", "-q", "-o", "run", *[f"--set={k}={v}" for k, v in TINY.items()],
                          "--set", "algorithm={name: fedavgm, beta: 0.5}"], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    manifest = engine.load_run(tmp_path / "run").manifest
    assert manifest["algorithm"] == "fedavgm" and manifest["plugins"] == [
        {"package": "hetsim-fedavgm fedavgm = hetsim_fedavgm"}]
