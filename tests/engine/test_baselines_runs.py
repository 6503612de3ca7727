"""The baselines in runs: what the clock charges each of them (FedSPU's sub-model, HeteroFL's tiers),
FedSPU's retired clients, the engine hooks they use (``Server.excluded_clients``,
``ClientResult.download_nbytes``, named architectures in ``model.zoo``) and the reference's
Fashion-MNIST CNN's dropout in a run. In-process and tiny (a few seconds)."""
import numpy as np
import pytest
from helpers.plugins import isolated_plugins

from engine.config.schema import load_config
from engine.errors import ConfigError
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import run_experiment

BASE = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=8", "clients.participation=0.5",
        "clients.profiles={availability: 1.0, dropout: 0.0, devices: {rpi4: 0.5, laptop_cpu: 0.5}}",
        "checkpoint.every=0", "evaluation.personalized=false"]


def run(tmp_path, *extra):
    return load_run(run_experiment(load_config(None, [*BASE, *extra]), tmp_path, command=[]))


def test_fedspu_charges_its_sub_model_and_never_selects_a_retired_client_before_the_early_stopping_round(tmp_path):
    r = run(tmp_path, "algorithm={name: fedspu, val_fraction: 0.5}", "train.lr=3.0", "rounds=6")
    c = r.clients
    slow, fast = c[c["tier"] == "rpi4"], c[c["tier"] == "laptop_cpu"]
    d = 64 * 64 + 64 + 64 * 10 + 10  # the digits MLP's state
    assert (fast["update_rate"] == 1.0).all() and (fast["bytes_down"] == 4 * d).all()
    assert (fast["bytes_up"] == 4 * d + 1).all()  # the whole state and the early-stopping byte
    # rpi4 updates int(0.4 * 64) = 25 hidden neurons: 25 * 64 + 25 in, 10 * 25 + 10 out
    part = 25 * 64 + 25 + 10 * 25 + 10
    assert (slow["bytes_down"] == 4 * part).all() and (slow["bytes_up"] == 4 * part + 4 * (25 + 1) + 1).all()
    # the FLOP rule: a frozen weight skips its weight gradient (2 FLOPs per sample in a linear layer)
    per_sample = fast["train_flops"].max() / fast.loc[fast["train_flops"].idxmax(), "num_samples"]
    assert per_sample > (slow["train_flops"] / slow["num_samples"]).max()
    reached = r.rounds.index[r.rounds["server_early_stopped"] == 1]
    end = int(reached[0]) if len(reached) else len(r.rounds) - 1
    retired = set()
    for rnd in range(end + 1):
        now = c[c["round"] == rnd]
        assert not retired & set(now["client_id"]), rnd
        retired |= set(now.loc[now["early_stopped"] == 1, "client_id"])
        assert r.rounds.loc[rnd, "server_es_active_clients"] == 8 - len(retired)
    assert retired  # at this learning rate losses rise: the rule is exercised


def test_heterofl_charges_each_tier_its_sub_models_bytes_and_flops(tmp_path):
    from engine.models.flops import training_flops_per_sample

    zoo = "model.zoo=[{arch: mlp_quarter, model: mlp, max_gflops: 5}]"
    r = run(tmp_path, "algorithm.name=heterofl", "rounds=2", zoo, "model.arch_params={mlp_quarter: {width: 0.25}}")
    c = r.clients
    assert set(c.loc[c["tier"] == "rpi4", "arch"]) == {"mlp_quarter"}
    assert set(c.loc[c["tier"] != "rpi4", "arch"]) == {"mlp"}
    sizes = {"mlp": 64 * 64 + 64 + 64 * 10 + 10, "mlp_quarter": 64 * 16 + 16 + 16 * 10 + 10}
    for arch, rows in c.groupby("arch"):
        assert (rows["bytes_up"] == 4 * sizes[arch]).all() and (rows["bytes_down"] == 4 * sizes[arch]).all()
        per_sample = training_flops_per_sample("mlp", (64,), 10, **({"width": 0.25} if arch == "mlp_quarter" else {}))
        assert (rows["train_flops"] == per_sample * rows["num_samples"]).all()


def test_a_methods_excluded_clients_are_left_out_of_the_policys_pool():
    from engine.loop.selection import ClientSelector

    cfg = load_config(None, [*BASE, "clients.participation=0.75"])
    selector = ClientSelector(cfg, 8, np.full(8, 10))
    sel, target = selector.select(0, exclude=np.array([1, 2, 3, 4]))
    assert target == 6 and sorted(sel.ids) == [0, 5, 6, 7]  # as many as are left
    assert not set(selector.select(1, exclude=np.array([0]))[0].ids) & {0}
    none = np.array([], dtype=np.int64)
    assert selector.select(2)[0].ids.tolist() == selector.select(2, exclude=none)[0].ids.tolist()


def test_named_architectures_in_the_zoo_build_a_registered_model_and_bad_ones_are_refused():
    cfg = load_config(None, [*BASE, "model.zoo=[{arch: slim, model: mlp, max_gflops: 5}]",
                             "model.arch_params={slim: {width: 0.5}}", "model.per_client={3: slim}"])
    from engine.models.arch import arch_spec
    assert arch_spec(cfg, "slim") == ("mlp", {"width": 0.5})
    for bad, words in (("model.zoo=[{arch: slim}]", ["model.zoo.0.arch = 'slim'", "the model it builds in model:"]),
                       ("model.zoo=[{arch: s, model: mlpp}]", ["model.zoo.0.model = 'mlpp'", "did you mean 'mlp'"]),
                       ("model.zoo=[{arch: cnn, model: mlp}]", ["model.zoo.0.arch = 'cnn'", "a name of its own"]),
                       ("model.per_client={1: slimm}", ["model.per_client.1 = 'slimm'"])):
        with pytest.raises(ConfigError) as err:
            load_config(None, [*BASE, bad])
        for w in words:
            assert w in str(err.value), (w, str(err.value))


def test_heterofl_refuses_architectures_that_are_not_one_model_at_several_widths(tmp_path):
    from engine.errors import UserError

    with pytest.raises(UserError, match="'mlp_deep' is not a narrower copy of the widest, 'mlp'"):
        run(tmp_path, "algorithm.name=heterofl", "rounds=1", "model.zoo=[{arch: mlp_deep, model: mlp, max_gflops: 5}]",
            "model.arch_params={mlp_deep: {hidden: [8, 8]}}")


def tiny_images(*, seed, n=160):
    from engine import plugins

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(n, 1, 28, 28)) + y[:, None, None, None]).astype(np.float32)
    return plugins.ArrayDataset("tiny_images", x, y.astype(np.int64), 3)


def test_the_fashion_cnns_dropout_is_drawn_per_client_and_batched_training_leaves_it_to_each_client(tmp_path):
    from engine.loop.simulation import Simulation
    from engine.plugins import register_dataset

    with isolated_plugins():
        register_dataset("tiny_images", tiny_images)
        items = [*BASE, "dataset.name=tiny_images", "model.name=fmnist_cnn", "partition.scheme=iid", "rounds=2",
                 "clients.num_clients=4"]
        runs = [run(tmp_path / name, *items[len(BASE):], *extra) for name, extra in
                (("a", []), ("b", []), ("batched", ["executor.batch_clients=true"]))]
        for other in runs[1:]:
            for table in ("rounds", "clients"):
                a, b = getattr(runs[0], table), getattr(other, table)
                keep = [col for col in a.columns if col not in WALL_COLUMNS]
                assert a[keep].equals(b[keep]), table
        assert any("has dropout" in w for w in runs[2].manifest["warnings"])
        # a client's dropout does not depend on which clients its host ran before it in the round
        sim = Simulation(load_config(None, items))
        sim.start()
        broadcast = sim.server.broadcast(0)
        alone = sim.executor.run_round(0, [2], broadcast, False).results[0]
        after = sim.executor.run_round(0, [0, 1, 2], broadcast, False).results[2]
        assert np.array_equal(alone.upload.arrays["state"], after.upload.arrays["state"])
        sim.executor.close()
