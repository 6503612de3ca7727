"""ASCEND reward v4 (the time factor normalised by the link's present state) and
``time_model: measured`` (the clock's phase times of the client's round): docs/ascend.md, "Reward v4"."""
import math

import numpy as np
import pandas as pd
import pytest
from helpers.ascend import RPI4, ctx_for, server_for
from helpers.checkpoint import Collect, assert_same_tables, cfg_of, frames, simulation

from algorithms.ascend import AscendClient, AscendParams, reward_v3, reward_v4
from algorithms.ascend_time import measured_costs, measured_seconds, round_seconds, unit_costs, work_vector
from algorithms.bandits import FixedArm

SLOW = RPI4.model_copy(update={"down_mbps": RPI4.down_mbps / 1000, "up_mbps": RPI4.up_mbps / 1000})  # a bad state


def rounds(params, profiles, arms):
    """One client, one round per profile, playing ``arms`` (a fixed arm swapped in each round);
    returns the reward parts computed at each upload."""
    server, client, st, out = server_for(params), AscendClient(params), {}, []
    for rnd, (pf, arm) in enumerate(zip(profiles, arms)):
        bc = server.broadcast(rnd)["a"]
        ctx = ctx_for(0, rnd, st, profile=pf)
        client.receive(ctx, bc)
        st["policy"] = FixedArm(arm)
        res = client.fit(ctx, bc)
        out.append({**res.metrics, **st["pending"]["parts"]})
    return out


def test_reward_v4_is_v3_with_texp_in_place_of_tbar():
    for g_sign in (1, -1):
        a = reward_v4(0.5 * g_sign, 0.4 * g_sign, T=2.0, T_exp=3.0, rho=0.6, kappa=1.5)
        b = reward_v3(0.5 * g_sign, 0.4 * g_sign, T=2.0, T_bar=3.0, rho=0.6, kappa=1.5)
        assert a["reward_texp"] == 3.0 and all(a[k] == b[k] for k in b)


def test_unit_costs_reproduce_the_clock_and_measured_costs_invert_it():
    w = work_vector(60_000, 3e9, 0.002, 8_000)
    c = unit_costs(RPI4)
    from hardware_profiles import clock
    want = (clock.transfer_seconds(60_000, RPI4.down_mbps, RPI4.latency_s) + clock.compute_seconds(3e9, RPI4.gflops)
            + 0.002 + clock.transfer_seconds(8_000, RPI4.up_mbps, RPI4.latency_s))
    assert round_seconds(w, c, RPI4.latency_s) == pytest.approx(float(want), rel=1e-12)
    phases = {"download_s": 0.4, "compute_s": 2.0, "compress_s": 0.003, "upload_s": 0.9}
    cm = measured_costs(phases, w, RPI4.latency_s, train_share=0.75)
    assert round_seconds(w, cm, RPI4.latency_s) == pytest.approx(measured_seconds(phases, 0.75), rel=1e-12)


def test_v4_factor_is_one_when_only_the_link_changes_and_the_arm_stays():
    """Same arm, the link falls to a thousandth in round 1 and recovers in round 2: v3's T̄/T swings
    with the link, v4's T_exp/T stays 1 (T and T_exp move together)."""
    profiles, arms = [RPI4, SLOW, RPI4], ["topk"] * 3
    v4 = rounds(AscendParams(k=0.2, reward="v4", gamma=None), profiles, arms)
    v3 = rounds(AscendParams(k=0.2, gamma=None), profiles, arms)
    for r4, r3 in zip(v4, v3):
        assert r4["reward_factor"] == pytest.approx(1.0, rel=1e-12)
        assert r4["sim_T"] == r3["sim_T"] and r4["reward_g"] == r3["reward_g"]  # same play, same terms
        assert r4["sim_Texp"] == pytest.approx(r4["sim_T"], rel=1e-12)
    assert v3[1]["reward_factor"] < 0.9 or v3[1]["reward_factor"] > 1.1  # v3 swings with the link
    assert v3[1]["sim_T"] > 1.5 * v3[0]["sim_T"]


def test_v4_factor_differs_when_the_payload_differs_and_equals_v3_on_a_constant_link():
    """Top-K (values + int32 indices) then Random-K (values + a seed), link constant: the second
    play's T_exp is the mean of the two plays' times, so its factor is not 1, and it is v3's."""
    params = dict(k=0.2, gamma=None)
    v4 = rounds(AscendParams(reward="v4", **params), [RPI4, RPI4], ["topk", "randomk"])
    v3 = rounds(AscendParams(**params), [RPI4, RPI4], ["topk", "randomk"])
    assert v4[1]["reward_factor"] > 1.0 + 1e-6  # Random-K's smaller payload: faster than the client's mean
    assert v4[1]["reward_factor"] == pytest.approx(v3[1]["reward_factor"], rel=1e-12)
    assert v4[1]["reward"] == pytest.approx(v3[1]["reward"], rel=1e-12)
    # and on a slower link the same arm change is worth more (the payload is a larger part of T)
    slow = rounds(AscendParams(reward="v4", **params), [SLOW, SLOW], ["topk", "randomk"])
    assert slow[1]["reward_factor"] > v4[1]["reward_factor"]


def test_v3_stays_the_default_and_measured_needs_v3_or_v4():
    assert AscendParams().reward == "v3" and AscendParams().time_model == "profile"
    with pytest.raises(ValueError, match="time_model='measured' is not allowed with reward='v2'"):
        AscendParams(reward="v2", time_model="measured")
    assert AscendParams(reward="v4").rho_value == 0.6 and AscendParams(reward="v4").seconds_pricing


def test_measured_time_model_closes_the_reward_with_the_phase_times_of_that_round():
    params = AscendParams(k=0.2, reward="v4", time_model="measured", gamma=None)
    server, client, st = server_for(params), AscendClient(params), {}
    bc = server.broadcast(0)["a"]
    ctx = ctx_for(0, 0, st)
    client.receive(ctx, bc)
    st["policy"] = FixedArm("topk")
    client.fit(ctx, bc)
    pending = st["pending"]
    # the clock says the upload took 10x what the round-start profile promised (the link faded)
    est = {"download_s": 0.3, "compute_s": 1.0, "compress_s": 0.001}
    up = 10 * (RPI4.latency_s + 8 * pending["work"][3] / (RPI4.up_mbps * 1e6))
    last = {"round": 0, **est, "upload_s": up}
    bc1 = server.broadcast(1)["a"]
    ctx1 = ctx_for(0, 1, st)
    ctx1.last_times = last
    client.receive(ctx1, bc1)
    closed = st["round_info"]["closed"]
    assert closed["reward_measured"] is True
    assert closed["reward_T"] == pytest.approx(measured_seconds(last, pending["train_share"]), rel=1e-12)
    # one play: T_exp is that play's work at the measured costs, i.e. the measured T itself
    assert closed["reward_texp"] == pytest.approx(closed["reward_T"], rel=1e-12)
    assert closed["reward_factor"] == pytest.approx(1.0, rel=1e-12)
    # without the phase times of that round (e.g. another round's), the profile's reward stays
    st2 = {}
    c2 = AscendClient(params)
    ctx = ctx_for(0, 0, st2)
    c2.receive(ctx, bc)
    c2.fit(ctx, bc)
    ctx1 = ctx_for(0, 1, st2)
    ctx1.last_times = {**last, "round": 5}
    c2.receive(ctx1, bc1)
    assert st2["round_info"]["closed"]["reward_measured"] is False


MARKOV = "clients.profiles.conditions={sets: {fading: {down: gilbert_elliott, up: gilbert_elliott}}}"


def test_v4_measured_continues_bit_identically_from_a_checkpoint(tmp_path):
    """tests/engine/test_checkpoint.py's every-method test, for reward v4 with the measured time model
    on Gilbert-Elliott links (the engine's per-client phase times are checkpointed too)."""
    from engine.checkpoint.snapshot import restore_checkpoint

    cfg = cfg_of("algorithm={name: ascend, k: 0.1, warmup: 1, distill_steps: 3, reward: v4, "
                 "time_model: measured}", MARKOV, "rounds=5")
    full = Collect(checkpoint_after=1, directory=tmp_path / "ckpt")
    simulation(cfg).run([full])
    resumed = simulation(cfg)
    assert restore_checkpoint(resumed, tmp_path / "ckpt")["next_round"] == 2
    assert resumed.last_times  # the phase times of rounds 0-1 came back
    tail = Collect()
    assert resumed.run([tail]) == "finished"
    assert_same_tables(frames(tail.records), frames(full.records[2:]))
    clients = frames(full.records)["clients"]
    assert clients["reward_measured"].any()


def _markov_run(tmp_path, name, algorithm):
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    cfg = load_config({
        "seed": 0, "rounds": 3,
        "dataset": {"name": "digits"},
        "partition": {"scheme": "dirichlet", "alpha": 0.5, "public_fraction": 0.1},
        "model": {"name": "mlp"},
        "clients": {"num_clients": 6, "participation": 1.0, "profiles": {
            "devices": {"rpi4": 0.5, "laptop_cpu": 0.5}, "network": {"5mbps": 1.0},
            "availability": 1.0, "dropout": 0.0,
            "conditions": {"sets": {"fading": {"down": "gilbert_elliott", "up": "gilbert_elliott"}}}}},
        "algorithm": {"name": "ascend", "k": 0.1, "distill_steps": 5, "gamma": None, "warmup": 1, **algorithm},
        "train": {"local_steps": 3},
        "evaluation": {"personalized": False},
        "executor": {"threads_per_actor": 1},
        "output": {"dir": str(tmp_path), "name": name},
    })
    return load_run(run_experiment(cfg)).clients


def test_short_markov_run_v4_rewards_and_their_share_at_the_clip(tmp_path):
    """digits, 6 clients on Gilbert-Elliott links, 3 rounds: v4's columns are there, its time
    factor stays near 1 where v3's swings with the link, and the share of rewards at ±1 is
    printed for both (``pytest -s``)."""
    shares = {}
    for name, algo in (("v3", {}), ("v4", {"reward": "v4"}), ("v4m", {"reward": "v4", "time_model": "measured"})):
        c = _markov_run(tmp_path, name, algo)
        r = c["reward"].dropna()
        shares[name] = float((r.abs() >= 1.0).mean()) if len(r) else math.nan
        f = c["reward_factor"].dropna()
        print(f"{name}: {len(r)} rewards, at ±1: {shares[name]:.3f}, factor {f.min():.3f}-{f.max():.3f}")
        if name != "v3":
            assert {"sim_Texp", "reward_texp"} <= set(c.columns)
            assert c["sim_Texp"].notna().all() and (c["sim_Texp"] > 0).all()
        if name == "v4m":
            closed = c[c["reward_measured"].astype(bool)]
            assert len(closed)
            # the measured T of a round is that round's clock time without the measurement forwards
            prev = c.set_index(["client_id", "round"])
            want = [prev.loc[(cid, rnd), "sim_total_s"] - prev.loc[(cid, rnd), "sim_T_measure"]
                    for cid, rnd in zip(closed["client_id"], closed["reward_round"])]
            assert np.allclose(closed["reward_T"], want, rtol=1e-6)
        else:
            assert "reward_measured" not in c.columns
    assert all(0.0 <= s <= 1.0 for s in shares.values() if not math.isnan(s))
    print(pd.Series(shares, name="share of rewards at ±1"))
