"""A config is built once per run (validation and run share the parts), and a warm process reuses
the data of earlier runs without changing a result (issues 34, 38)."""
import collections

import pandas as pd
import pytest

import engine
import engine.loop.parts as parts
import engine.models.arch as arch
from engine.results import WALL_COLUMNS

# two architectures: client 0 trains a small LeNet, the others the MLP
TINY = {"dataset.name": "mnist5k", "model.name": "mlp", "model.per_client": {0: "lenet5_half"},
        "clients.num_clients": 6, "rounds": 2, "clients.profiles": {}}


@pytest.fixture
def counted(monkeypatch):
    """Counts of the data builds and model builds of this process, from a cold start."""
    parts.forget()
    counts = {"data": 0, "models": collections.Counter()}
    build_data, build_model = parts.build_data, arch.build_model

    def data(cfg):
        counts["data"] += 1
        return build_data(cfg)

    def model(name, *args, **kwargs):
        counts["models"][name] += 1
        return build_model(name, *args, **kwargs)

    monkeypatch.setattr(parts, "build_data", data)
    monkeypatch.setattr(arch, "build_model", model)
    yield counts
    parts.forget()


def _results(run):
    keep = [c for c in run.rounds.columns if c not in WALL_COLUMNS]
    clients = run.clients.drop(columns=[c for c in run.clients.columns if c in WALL_COLUMNS or "wall" in c])
    return run.rounds[keep], clients


def test_a_run_builds_its_config_once_then_a_warm_run_builds_nothing_and_gives_equal_tables(counted, tmp_path):
    cold = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY, run_dir=tmp_path / "cold")
    assert cold.manifest["status"] == "finished"
    # one data build for the validation and the run; each architecture's model built for the
    # validation (whose server check takes it), for the run's server and for the client host
    # (which builds its own: under Ray it is another process)
    assert counted["data"] == 1
    assert counted["models"] == {"lenet5_half": 3, "mlp": 3}

    warm = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY, run_dir=tmp_path / "warm")
    assert counted["data"] == 1  # the data is not built again
    assert counted["models"] == {"lenet5_half": 6, "mlp": 6}  # models: from the seed (cheaper than a copy)
    for a, b in zip(_results(cold), _results(warm)):
        pd.testing.assert_frame_equal(a, b)

    # another trial of a sweep (a learning rate): same data and initial models, other results
    other = engine.simulate({"output": {"dir": str(tmp_path)}}, {**TINY, "train.lr": 0.5}, run_dir=tmp_path / "lr")
    assert counted["data"] == 1
    assert not _results(other)[0]["global_loss"].equals(_results(cold)[0]["global_loss"])

    # another seed: other data and other models, built once each
    engine.simulate({"output": {"dir": str(tmp_path)}}, {**TINY, "seed": 1}, run_dir=tmp_path / "seed")
    assert counted["data"] == 2


def test_a_warm_run_equals_a_cold_one_after_another_config_ran_between(counted, tmp_path):
    first = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY, run_dir=tmp_path / "a")
    engine.simulate({"output": {"dir": str(tmp_path)}}, {**TINY, "train.lr": 0.5}, run_dir=tmp_path / "b")
    again = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY, run_dir=tmp_path / "c")
    assert counted["data"] == 1
    for a, b in zip(_results(first), _results(again)):
        pd.testing.assert_frame_equal(a, b)


def test_parts_hand_out_copies_of_what_a_run_changes():
    cfg = engine.load_config({}, {**TINY, "clients.profiles": {"devices": {"phone_mid": 1.0}, "battery": {}}})
    built = parts.build_parts(cfg)
    assert parts.build_parts(cfg) is built  # kept for the run that follows its validation
    a, b = built.take_models(), built.take_models()
    assert a is built.models  # the first taker gets the built ones, the next the same weights anew
    for arch_name in built.arch_names:
        for wa, wb in zip(a[arch_name].parameters(), b[arch_name].parameters()):
            assert wa is not wb and bool((wa == wb).all())
    batteries = built.fresh_batteries()
    batteries.level[:] = 0.0
    assert built.batteries.level.min() > 0
    parts.forget()
