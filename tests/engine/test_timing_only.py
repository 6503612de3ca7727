"""``clock.mode: timing_only`` (engine/loop/timing.py): the clock without training.

A timing-only run and the full run of the same config must give the same clock columns, bit for
bit, on the fleets the repository ships (studies/whatif_*.yaml, studies/energy_wearables.yaml)
and for every method with a fixed payload, synchronous and asynchronous; methods whose payload
depends on training are refused at validation with the reason.
"""
from __future__ import annotations

import pandas as pd
import pytest
import yaml
from helpers import REPO, one_torch_thread

from engine.config.schema import apply_overrides, load_config
from engine.errors import ConfigError
from engine.loop.callbacks import Stop
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import resume_run, run_experiment
from engine.run.validate import validate_experiment
from sweeps.whatif import load_whatif_file

# a small experiment: 12 clients of synthetic data, a tiny MLP, 3 rounds, half the fleet a round
BASE = ["dataset.name=synthetic", "dataset.params={num_features: 6, num_classes: 3, min_samples: 20, max_samples: 40}",
        "partition.scheme=natural", "model.name=mlp", "model.params={hidden: [8]}", "clients.num_clients=12",
        "clients.participation=0.5", "rounds=3", "checkpoint.every=0", "train.batch_size=8"]
TIMING = ["clock.mode=timing_only"]
LEARNING = ("train_loss", "num_nonfinite", "pers_", "global_", "server_", "test_samples", "compressor", "k",
            "residual_norm", "packs_", "mask_w", "theta_a")


def _shipped_fleets() -> dict[str, tuple[dict, list[str]]]:
    """name -> (clients.profiles, the study's clock overrides) of every fleet the repository ships."""
    out = {}
    for study in ("whatif_bandwidth", "whatif_conditions"):
        spec, fleets, _ = load_whatif_file(REPO / "studies" / f"{study}.yaml")
        clock = [o for o in spec.overrides if o.startswith("clock.")]
        out.update({f"{study}:{name}": (profiles, clock) for name, profiles in fleets.items()})
    energy = yaml.safe_load((REPO / "studies" / "energy_wearables.yaml").read_text())
    out["energy_wearables"] = (energy["clients"]["profiles"], [])
    return out


FLEETS = _shipped_fleets()


def _config(overrides: list[str], profiles: dict | None = None):
    cfg = load_config(None, overrides)
    return cfg if profiles is None else load_config(apply_overrides(cfg.to_dict(), {"clients.profiles": profiles}))


def _runs(tmp_path, overrides: list[str], profiles: dict | None = None):
    """(full run, timing-only run) of one config."""
    with one_torch_thread():
        full = load_run(run_experiment(_config(overrides, profiles), tmp_path / "full", command=[]))
    timing = load_run(run_experiment(_config([*overrides, *TIMING], profiles), tmp_path / "timing", command=[]))
    return full, timing


def assert_same_clock(full, timing) -> None:
    """Every column of the timing-only tables is one of the full run's, equal bit for bit (wall
    clocks aside), and none of them is about training or accuracy."""
    assert timing.manifest["status"] == "finished" and timing.config["clock"]["mode"] == "timing_only"
    for name, keys in (("rounds", ["round"]), ("clients", ["round", "client_id"])):
        a, b = getattr(full, name), getattr(timing, name)
        cols = [c for c in b.columns if c not in WALL_COLUMNS]
        assert not [c for c in cols if c.startswith(LEARNING)], cols
        assert set(cols) <= set(a.columns), set(cols) - set(a.columns)
        assert len(a) == len(b) > 0
        a = a[cols].sort_values(keys, kind="stable").reset_index(drop=True)
        b = b[cols].sort_values(keys, kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.parametrize("fleet", list(FLEETS))
def test_timing_only_equals_the_full_runs_clock_on_each_shipped_fleet(fleet, tmp_path):
    profiles, clock = FLEETS[fleet]
    full, timing = _runs(tmp_path, [*BASE, *clock], profiles)
    assert_same_clock(full, timing)
    if fleet == "energy_wearables":  # batteries: the levels the clock moved are in both
        assert {"battery_level", "battery_level_end", "on_charger"} <= set(timing.clients.columns)
    if fleet == "whatif_conditions:fading_links":
        assert {"down_mbps", "down_state"} <= set(timing.clients.columns)


MIXED = ("clients.profiles={devices: {phone_mid: 0.5, laptop_cpu: 0.5}, network: {5mbps: 0.5, 50mbps: 0.5}, "
         "availability: 0.8, dropout: 0.1, "
         "conditions: {sets: {fading: {share: 0.5, down: gilbert_elliott}, steady: {share: 0.5}}}}")
METHODS = {
    "fedprox": ["algorithm.name=fedprox"],
    "topk": ["algorithm.name=fedavg_compressed", "algorithm.compressor=topk", "algorithm.k=40"],
    "randomk-steps": ["algorithm.name=fedavg_compressed", "algorithm.compressor=randomk", "algorithm.k=0.2",
                      "train.local_steps=3"],
    "periodick": ["algorithm.name=fedavg_compressed", "algorithm.compressor=periodick", "algorithm.k=0.3"],
    "qsgd8": ["algorithm.name=fedavg_compressed", "algorithm.compressor=qsgd8", "train.local_epochs=2"],
    "fedcspack-full": ["algorithm.name=fedcspack", "algorithm.sharing=full", "algorithm.pack_size=32"],
    # two architectures by device: the phones train a CNN, the laptops the MLP
    "zoo": ["dataset.name=mnist5k", "dataset.params={}", "partition.scheme=iid",
            "model.zoo=[{arch: cnn, max_gflops: 10}]"],
}


@pytest.mark.parametrize("method", list(METHODS))
def test_timing_only_equals_the_full_runs_clock_for_every_fixed_payload(method, tmp_path):
    extra = ["clock.over_selection=1.3", "clock.deadline={policy: percentile, percent: 80}"]
    full, timing = _runs(tmp_path, [*BASE, MIXED, *extra, *METHODS[method]])
    assert_same_clock(full, timing)
    if method == "zoo":
        assert set(timing.clients["arch"].dropna()) == {"cnn", "mlp"}


@pytest.mark.parametrize("method", ["fedavg", "fedcspack-full"])
def test_asynchronous_timing_only_equals_the_full_runs_clock(method, tmp_path):
    extra = METHODS.get(method, [])
    battery = "clients.profiles.battery={start: {low: 0.1, high: 0.9}}"
    full, timing = _runs(tmp_path, [*BASE, MIXED, battery, "clock.deadline_s=30", *extra,
                                    "asynchronous={concurrency: 4, buffer_size: 2}"])
    assert_same_clock(full, timing)
    assert {"staleness", "applied_version"} <= set(timing.clients.columns)


@pytest.mark.parametrize(("overrides", "why"), [
    (["algorithm.name=ascend"], "each client's bandit picks its compressor"),
    (["algorithm.name=fedcspack", "algorithm.pack_size=32", "algorithm.k=2"], "algorithm.sharing = 'packs'"),
])
def test_a_method_whose_payload_depends_on_training_is_refused_at_validation(overrides, why):
    cfg = load_config(None, [*BASE, "partition.public_fraction=0.1", *overrides, *TIMING])
    with pytest.raises(ConfigError) as err:
        validate_experiment(cfg)
    text = str(err.value)
    assert "clock.mode = 'timing_only'" in text and f"algorithm.name = {cfg.algorithm.name!r}" in text
    assert why in text and "clock.mode: virtual" in text


def test_a_method_without_a_payload_rule_is_refused():
    from algorithms.base import Server, TimingUnsupported

    class Mine(Server):
        pass

    with pytest.raises(TimingUnsupported, match="gives no payload rule"):
        Mine.timing_payload(None, {})


def test_timing_only_runs_in_this_process_only():
    with pytest.raises(ConfigError, match="executor.kind = 'ray': clock.mode = 'timing_only' trains nothing"):
        load_config(None, [*TIMING, "executor.kind=ray"])


def test_a_stopped_timing_only_run_resumes_to_the_uninterrupted_tables(tmp_path):
    """Checkpoints hold what the clock learned (an adaptive deadline) and the batteries."""
    overrides = [*BASE, MIXED, *TIMING, "rounds=5", "checkpoint.every=2", "clients.profiles.battery={}",
                 "clock.deadline={policy: adaptive, quantile: 0.5, margin: 1.0, window: 2}",
                 "algorithm.name=fedcspack", "algorithm.sharing=full", "algorithm.pack_size=32"]
    ref = load_run(run_experiment(load_config(None, overrides), tmp_path / "ref", command=[]))
    assert ref.rounds["sim_deadline_s"].iloc[1:].notna().all()  # learned from round 0 on
    path = tmp_path / "r"
    run_experiment(load_config(None, overrides), path, command=[],
                   callbacks=[lambda rec: Stop("enough") if rec.round == 2 else None])
    assert load_run(path).manifest["status"] == "stopped"
    run = load_run(resume_run(path, command=[]))
    assert run.manifest["resumes"][0]["from_round"] == 3
    for name in ("rounds", "clients"):
        a, b = getattr(run, name), getattr(ref, name)
        keep = [c for c in a.columns if c not in WALL_COLUMNS]
        pd.testing.assert_frame_equal(a[keep], b[keep], check_exact=True)


def test_the_example_sweep_compares_the_four_deadline_policies_timed_only():
    from hardware_profiles.deadlines import POLICIES
    from sweeps import resolve

    sweep = resolve(REPO / "sweeps" / "examples" / "deadline_policies.yaml")
    named = sweep.spec.space["clock.deadline"]["named"]
    assert sorted(v["policy"] for v in named.values()) == sorted(POLICIES)
    for name in named:
        cfg = load_config(sweep.trial_raw({"clock.deadline": name}))
        assert cfg.clock.mode == "timing_only" and cfg.clock.deadline.policy == named[name]["policy"]
