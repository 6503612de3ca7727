"""The system-heterogeneity toolbox in whole runs (in-process): local work as a policy (the deadline
policy fits every client before the deadline on the clock's own arithmetic, the clock charges
exactly the steps done, a user's function through register_work_policy), what validation refuses,
and the FedOpt family with a plain server step equal to FedAvg (synchronous) and FedBuff
(asynchronous). Ray, timing-only and every policy x mode: tests/engine/test_matrix.py; resume:
tests/engine/test_checkpoint.py."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers.plugins import isolated_plugins

import engine
from algorithms.training import local_samples
from engine import plugins
from engine.config.schema import load_config
from engine.errors import ConfigError, PluginError
from engine.results.tables import WALL_COLUMNS
from engine.run.listing import list_entries
from engine.run.validate import validate_experiment

STEPS, BATCH = 40, 16
DEADLINE = 0.226  # the 5 Mbps transfers take 0.223 s: the phones and Raspberry Pis on them must cut
FLEET = {"devices": {"phone_low": 0.34, "rpi4": 0.33, "laptop_cpu": 0.33}, "network": {"5mbps": 0.5, "500mbps": 0.5},
         "availability": 1.0, "dropout": 0.0}
BASE = {"dataset.name": "digits", "model.name": "mlp", "model.params": {"hidden": [128]}, "clients.num_clients": 8,
        "clients.participation": 1.0, "rounds": 2, "clients.profiles": FLEET, "train.local_steps": STEPS,
        "train.batch_size": BATCH, "checkpoint.every": 0, "evaluation.personalized": False,
        "clock.deadline_s": DEADLINE}
FADING = {"sets": {"fading": {"down": "gilbert_elliott", "up": "gilbert_elliott", "compute": "thermal_throttling"}}}


@pytest.fixture(autouse=True)
def session_names():
    with isolated_plugins():
        yield


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df[[c for c in df.columns if c not in WALL_COLUMNS]]


def ran(run) -> pd.DataFrame:
    return run.clients[run.clients["sim_total_s"].notna()]


@pytest.mark.parametrize("conditions", [False, True], ids=["constant", "fading"])
def test_the_deadline_policy_gives_each_client_the_most_steps_that_fit_and_the_clock_charges_them(tmp_path,
                                                                                                    conditions):
    extra = {"clients.profiles": {**FLEET, "conditions": FADING}} if conditions else {}
    run = engine.simulate(None, {**BASE, **extra, "train.work": {"policy": "deadline"}}, run_dir=tmp_path / "r")
    c = ran(run)
    steps = c["local_steps"].to_numpy()
    assert 1 <= steps.min() < STEPS == steps.max()  # slow clients cut, fast ones do the configured work
    samples = local_samples(c["num_samples"].to_numpy(), BATCH, 1, steps)
    per_sample = c["train_flops"].to_numpy() / samples  # the clock charges exactly the steps done
    np.testing.assert_allclose(per_sample, per_sample[0], rtol=1e-12)
    # a client misses the deadline only if a single step is too much (its transfers alone take that long)
    assert (c["made_deadline"] | (steps == 1)).all(), c[["tier", "net_tier", "local_steps", "sim_total_s"]]
    assert (c.loc[steps > 1, "sim_total_s"] <= DEADLINE).all()
    if not conditions:  # one step more would not have fitted (constant speed: the step's compute time adds)
        cut = c[(steps < STEPS) & c["made_deadline"]]
        more = local_samples(cut["num_samples"].to_numpy(), BATCH, 1, cut["local_steps"].to_numpy() + 1)
        gflops = run.profiles.set_index("client_id").loc[cut["client_id"], "gflops"].to_numpy()
        extra_s = per_sample[0] * (more - samples[(steps < STEPS) & c["made_deadline"].to_numpy()]) / (gflops * 1e9)
        assert (cut["sim_total_s"].to_numpy() + extra_s > DEADLINE).all()


@pytest.mark.parametrize(("options", "steps"), [({}, {"laptop_cpu": 40, "rpi4": 2, "phone_low": 1}),
                                                ({"reference_gflops": 12.0, "min_steps": 8},
                                                 {"laptop_cpu": 200, "rpi4": 10, "phone_low": 8})])
def test_per_tier_scales_the_configured_steps_by_device_speed(tmp_path, options, steps):
    """floor(40 x gflops / reference), at least min_steps: laptops 60 GFLOP/s, Raspberry Pis 3, phones 1.5."""
    run = engine.simulate(None, {**BASE, "rounds": 1, "train.work": {"policy": "per_tier", **options}},
                          run_dir=tmp_path / "r")
    c = ran(run)
    assert dict(zip(c["tier"], c["local_steps"])) == steps


def test_the_fixed_policy_is_the_run_without_a_work_policy(tmp_path):
    plain = engine.simulate(None, BASE, run_dir=tmp_path / "plain")
    fixed = engine.simulate(None, {**BASE, "train.work": "fixed"}, run_dir=tmp_path / "fixed")
    assert "local_steps" not in fixed.clients
    pd.testing.assert_frame_equal(comparable(fixed.rounds), comparable(plain.rounds))
    pd.testing.assert_frame_equal(comparable(fixed.clients), comparable(plain.clients))


class HalfParams(plugins.WorkParams):
    share: float = 0.5


def half(view):
    """Each client does a share of its configured steps."""
    return np.maximum(1, np.ceil(view.configured * getattr(view.params, "share", 0.5))).astype(int)


def test_a_users_work_policy_is_registered_listed_and_run_and_timed_alike(tmp_path):
    plugins.register_work_policy("half", half, params=HalfParams)
    assert ("half", "Each client does a share of its configured steps [test_toolbox]") in list_entries("work")
    settings = {**BASE, "train.work": {"policy": "half", "share": 0.25}}
    run = engine.simulate(None, settings, run_dir=tmp_path / "full")
    assert (ran(run)["local_steps"] == STEPS // 4).all()
    timing = engine.simulate(None, {**settings, "clock.mode": "timing_only"}, run_dir=tmp_path / "timing")
    keep = [c for c in timing.clients.columns if c not in WALL_COLUMNS]
    pd.testing.assert_frame_equal(timing.clients[keep], run.clients[keep], check_exact=True)
    with pytest.raises(ConfigError, match=r"train\.work\.shares = 2: unknown key; did you mean 'share'"):
        load_config(None, {**settings, "train.work": {"policy": "half", "shares": 2}})


def test_a_work_policy_given_as_an_object_is_registered_under_its_name(tmp_path):
    run = engine.simulate(None, BASE, work=half, run_dir=tmp_path / "r")
    assert run.config["train"]["work"] == {"policy": "half"} and (ran(run)["local_steps"] == STEPS // 2).all()


def test_a_work_policy_that_breaks_the_rules_is_named_with_the_round_and_the_client(tmp_path):
    def none_for_some(view):
        return np.where(view.ids == view.ids.max(), 0, 3)

    with pytest.raises(PluginError, match=r"work policy 'none_for_some' in round 0 gave client 7 0 steps; each client "
                                          r"does an integer number of steps >= 1"):
        engine.simulate(None, BASE, work=none_for_some, run_dir=tmp_path / "r")
    with pytest.raises(PluginError, match=r"work policy 'takes_two': .* must take \(view\)"):
        plugins.register_work_policy("takes_two", lambda view, other: 1)


@pytest.mark.parametrize(("settings", "message"), [
    ({"clock.deadline_s": None}, "train.work.policy = 'deadline' fits each client's steps before the round's "
                                 "deadline, and the run has none; give clock.deadline_s"),
    ({"clock.deadline_s": None, "clock.deadline": {"policy": "percentile", "percent": 50}},
     "clock.deadline.policy = 'percentile' sets it from their arrivals; allowed: fixed, adaptive, cutoff"),
    ({"clock.mode": "measured"}, "clock.mode = 'measured' times training by the host's wall clock; allowed: "
                                 "clock.mode virtual, realtime or timing_only"),
])
def test_what_the_deadline_policy_cannot_plan_is_refused_naming_the_fields(settings, message):
    cfg = load_config(None, {**BASE, "train.work": "deadline", **settings})
    with pytest.raises(ConfigError) as err:
        validate_experiment(cfg)
    assert message in str(err.value)


def test_a_loss_ranked_selection_policy_is_refused_without_training():
    cfg = load_config(None, {**BASE, "clients.selection": "oort", "clock.mode": "timing_only"})
    with pytest.raises(ConfigError, match="clients.selection.name = 'oort' cannot choose in clock.mode = "
                                          "'timing_only': it ranks clients by the training loss they report"):
        validate_experiment(cfg)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_fedopt_with_a_plain_server_step_is_fedavg_and_fedbuff(tmp_path, mode):
    """server_optimizer: sgd with eta = 1 is FedAvg (a round) and FedBuff (asynchronous): the same
    clients, clock and accuracy (the server's float64 step agrees to float32 rounding)."""
    settings = {**BASE, "train.local_steps": 5, "clients.participation": 0.5, "rounds": 4,
                **({"asynchronous": {"concurrency": 3, "buffer_size": 2}} if mode == "async" else {})}
    avg = engine.simulate(None, settings, run_dir=tmp_path / "avg")
    opt = engine.simulate(None, {**settings, "algorithm": {"name": "fedopt", "server_optimizer": "sgd"}},
                          run_dir=tmp_path / "opt")
    assert opt.config["algorithm"]["server_optimizer"] == "sgd"
    clock = [c for c in avg.clients.columns if c.startswith(("sim_", "bytes_")) or c in ("client_id", "made_deadline")]
    pd.testing.assert_frame_equal(avg.clients[clock], opt.clients[clock])
    np.testing.assert_allclose(opt.rounds["global_loss"], avg.rounds["global_loss"], rtol=1e-5)
    adam = engine.simulate(None, {**settings, "algorithm": {"name": "fedopt"}}, run_dir=tmp_path / "adam")
    assert not np.allclose(adam.rounds["global_loss"], avg.rounds["global_loss"], rtol=1e-3)  # it is another step


def test_batched_training_does_the_steps_of_the_work_policy(tmp_path):
    settings = {**BASE, "train.work": "deadline", "train.local_steps": 12, "rounds": 1,
                "model.params": {"hidden": [16]}}
    one = engine.simulate(None, settings, run_dir=tmp_path / "one")
    many = engine.simulate(None, {**settings, "executor.batch_clients": True}, run_dir=tmp_path / "many")
    for col in ("local_steps", "train_flops", "sim_total_s", "made_deadline"):
        assert (one.clients[col].to_numpy() == many.clients[col].to_numpy()).all(), col
    np.testing.assert_allclose(many.rounds["global_loss"], one.rounds["global_loss"], rtol=1e-4)
