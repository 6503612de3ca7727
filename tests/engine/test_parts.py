"""A config is built once per run (the validation hands its parts to the run), and a warm process
reuses the data and initial models of earlier runs without changing a result."""
import collections
import pickle

import pandas as pd
import pytest
import torch

import engine
import engine.loop.parts as parts
import engine.models.arch as arch
from engine.clients.host import ClientHost
from engine.loop.simulation import Simulation
from engine.results import WALL_COLUMNS

# two architectures: client 0 trains a small LeNet, the others the MLP
TINY = {"dataset.name": "mnist5k", "model.name": "mlp", "model.per_client": {0: "lenet5_half"},
        "clients.num_clients": 6, "rounds": 2, "clients.profiles": {}}


@pytest.fixture
def counted(monkeypatch):
    """Counts of the data, profile and model builds of this process, from a cold start."""
    parts.forget()
    counts = {"data": 0, "profiles": 0, "models": collections.Counter()}
    build_data, assign_profiles, build_model = parts.build_data, parts.assign_profiles, arch.build_model

    def data(cfg):
        counts["data"] += 1
        return build_data(cfg)

    def profiles(*args, **kwargs):
        counts["profiles"] += 1
        return assign_profiles(*args, **kwargs)

    def model(name, *args, **kwargs):
        counts["models"][name] += 1
        return build_model(name, *args, **kwargs)

    monkeypatch.setattr(parts, "build_data", data)
    monkeypatch.setattr(parts, "assign_profiles", profiles)
    monkeypatch.setattr(arch, "build_model", model)
    yield counts
    parts.forget()


def _results(run):
    keep = [c for c in run.rounds.columns if c not in WALL_COLUMNS]
    clients = run.clients.drop(columns=[c for c in run.clients.columns if c in WALL_COLUMNS or "wall" in c])
    return run.rounds[keep], clients


def test_a_run_builds_its_config_once_then_a_warm_run_reuses_data_and_models_and_gives_equal_tables(
        counted, tmp_path, monkeypatch):
    built, handed = [], []
    build_parts, init = parts.build_parts, Simulation.__init__
    monkeypatch.setattr(parts, "build_parts", lambda *a, **k: built.append(build_parts(*a, **k)) or built[-1])

    def sim_init(self, cfg, executor=None, data=None, parts=None):
        handed.append(parts)
        init(self, cfg, executor, data, parts)

    monkeypatch.setattr(Simulation, "__init__", sim_init)
    cold = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY, run_dir=tmp_path / "cold")
    assert cold.manifest["status"] == "finished"
    # in-process: one build of each for the validation (and its server check), the run's server
    # and the client host (both copy the built models)
    assert counted == {"data": 1, "profiles": 1, "models": {"lenet5_half": 1, "mlp": 1}}
    # the validation built the parts once, and its server check and the run got those very parts
    assert len(built) == 1 and handed == [built[0], built[0]]

    warm = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY, run_dir=tmp_path / "warm")
    # the same config again: its fleet is built again (milliseconds), data and models are kept
    assert counted == {"data": 1, "profiles": 2, "models": {"lenet5_half": 1, "mlp": 1}}
    for a, b in zip(_results(cold), _results(warm)):
        pd.testing.assert_frame_equal(a, b)

    # as a sweep's warm trial worker: another trial (a learning rate) takes the same data and
    # initial models, builds its fleet (milliseconds), and gives other results
    other = engine.simulate({"output": {"dir": str(tmp_path)}}, {**TINY, "train.lr": 0.5}, run_dir=tmp_path / "lr")
    assert counted == {"data": 1, "profiles": 3, "models": {"lenet5_half": 1, "mlp": 1}}
    assert not _results(other)[0]["global_loss"].equals(_results(cold)[0]["global_loss"])

    # another seed: other data, fleet and models, built once each
    engine.simulate({"output": {"dir": str(tmp_path)}}, {**TINY, "seed": 1}, run_dir=tmp_path / "seed")
    assert counted == {"data": 2, "profiles": 4, "models": {"lenet5_half": 2, "mlp": 2}}


def test_a_warm_run_equals_a_cold_one_after_another_config_ran_between(counted, tmp_path):
    first = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY, run_dir=tmp_path / "a")
    engine.simulate({"output": {"dir": str(tmp_path)}}, {**TINY, "train.lr": 0.5}, run_dir=tmp_path / "b")
    again = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY, run_dir=tmp_path / "c")
    assert counted["data"] == 1 and counted["models"] == {"lenet5_half": 1, "mlp": 1}
    for a, b in zip(_results(first), _results(again)):
        pd.testing.assert_frame_equal(a, b)


def test_parts_hand_out_copies_of_what_a_run_changes(counted):
    cfg = engine.load_config({}, {**TINY, "clients.profiles": {"devices": {"phone_mid": 1.0}, "battery": {}}})
    built = parts.build_parts(cfg)
    a, b = built.take_models(), built.take_models()
    assert counted["models"] == {"lenet5_half": 1, "mlp": 1}  # copies, not builds
    for arch_name in built.arch_names:
        for wa, wb, w0 in zip(a[arch_name].parameters(), b[arch_name].parameters(),
                              built.models[arch_name].parameters()):
            assert wa is not wb and wa is not w0 and bool((wa == wb).all()) and bool((wa == w0).all())
    with torch.no_grad():
        next(a["mlp"].parameters()).add_(1.0)  # a run's server changes its own
    assert bool((next(built.models["mlp"].parameters()) == next(b["mlp"].parameters())).all())
    batteries = built.fresh_batteries()
    batteries.level[:] = 0.0
    assert built.batteries.level.min() > 0


def test_a_client_host_in_the_drivers_process_copies_the_initial_models_and_one_elsewhere_builds_its_own(counted):
    cfg = engine.load_config({}, TINY)
    sim = Simulation(cfg)
    setup = sim.host_setup()
    host = ClientHost(setup)
    assert counted["models"] == {"lenet5_half": 1, "mlp": 1}
    for arch_name, model in host.workspace.items():
        assert model is not sim.initial_models[arch_name] and model is not sim.models[arch_name]
        for w, w0 in zip(model.state_dict().values(), sim.initial_models[arch_name].state_dict().values()):
            assert torch.equal(w, w0)
    shipped = pickle.loads(pickle.dumps(setup))  # as to a Ray client actor: another process
    assert shipped.initial_models is None and setup.initial_models is not None
    elsewhere = ClientHost(shipped)
    assert counted["models"] == {"lenet5_half": 2, "mlp": 2}  # it builds its own: the same weights
    for arch_name, model in elsewhere.workspace.items():
        for w, w0 in zip(model.state_dict().values(), host.workspace[arch_name].state_dict().values()):
            assert torch.equal(w, w0)
