"""ASCEND, spec version 3: reward (local and knowledge fidelity), block warm-up in a random order
per client, selection priced in seconds per device tier, joint (compressor, K) arms."""
import math

import numpy as np
import pytest
import torch
from helpers.ascend import RPI4, ctx_for, server_for, tiny

from algorithms.ascend import (
    AscendClient,
    AscendParams,
    knowledge_fidelity,
    local_fidelity,
    reward_v3,
)
from algorithms.bandits import EpsilonGreedyEMA
from algorithms.compressed_fedavg import decode_upload
from hardware_profiles import clock


def play(params, cid=0, rnd=0, state=None, **ctx_kw):
    server = server_for(params)
    client = AscendClient(params)
    st = {} if state is None else state
    bc = server.broadcast(rnd)["a"]
    ctx = ctx_for(cid, rnd, st, **ctx_kw)
    client.receive(ctx, bc)
    return client, ctx, bc, client.fit(ctx, bc)


# ------------------------------------------------------------------------------ pure reward
def test_reward_v3_terms_with_hand_numbers():
    # the fresh update lowers the loss 2.0 -> 1.0, the sent one 2.0 -> 1.5: half of it kept
    assert local_fidelity(2.0, 1.0, 1.5) == pytest.approx(0.5)
    assert local_fidelity(2.0, 1.0, 0.5) == 1.0 and local_fidelity(2.0, 1.0, 9.0) == -1.0  # clipped
    assert local_fidelity(2.0, 1.9995, 1.0) == 0.0  # the fresh update did not lower f by > 1e-3 f
    assert local_fidelity(2.0, 2.5, 1.0) == 0.0 and local_fidelity(math.nan, 1.0, 1.0) == 0.0
    assert local_fidelity(2.0, 1.0, math.inf) == -1.0  # a divergent sent model
    assert knowledge_fidelity(0.25, 1.0) == pytest.approx(0.75)
    assert knowledge_fidelity(5.0, 1.0) == -1.0 and knowledge_fidelity(0.0, 0.0) == 1.0
    assert knowledge_fidelity(math.nan, 1.0) == -1.0
    # g = 0.6*0.75 + 0.4*0.5 = 0.65; slower than usual (T = 3, T̄ = 2): x (2/3)^kappa
    parts = reward_v3(0.5, 0.75, T=3.0, T_bar=2.0)
    assert parts["reward_g"] == pytest.approx(0.65) and parts["reward"] == pytest.approx(0.65 * 2 / 3)
    assert reward_v3(0.5, 0.75, 3.0, 2.0, kappa=2.0)["reward"] == pytest.approx(0.65 * 4 / 9)
    # regress on a faster arm loses less: g = -0.5, T/T̄ = 0.5
    assert reward_v3(-0.5, -0.5, 1.0, 2.0)["reward"] == pytest.approx(-0.25)
    assert reward_v3(1.0, 1.0, 1.0, 4.0)["reward"] == 1.0  # clipped


def test_reward_v3_is_bounded_on_random_terms():
    rng = np.random.default_rng(0)
    for _ in range(500):
        f_w, f_full, f_sent = rng.lognormal(0, 2, 3)
        phi = local_fidelity(f_w, f_full, f_sent)
        psi = knowledge_fidelity(*rng.lognormal(0, 3, 2))
        T, tb = rng.lognormal(0, 3, 2)
        r = reward_v3(phi, psi, T, tb, rho=rng.random(), kappa=rng.uniform(0.5, 3))["reward"]
        assert -1.0 <= phi <= 1.0 and -1.0 <= psi <= 1.0 and -1.0 <= r <= 1.0


# ------------------------------------------------------------------------------ one client's play
def _fixed(arm, k=3, **kw):
    return AscendParams(k=k, policy="fixed", arm=arm, gamma=None, distill_steps=0, **kw)


def test_topk_keeps_more_of_the_update_than_randomk_at_small_k():
    """Same client, same round, same fresh update: at K = 3 of 83 Top-K keeps more of the
    update's loss decrease (phi) and of its change of the public predictions (psi), so it earns
    more; every term is a trace column, and the reward is within [-1, 1]."""
    out = {}
    for arm in ("topk", "randomk"):
        _, _, _, res = play(_fixed(arm))
        out[arm] = res.metrics
    top, rnd = out["topk"], out["randomk"]
    assert top["probe_loss_full"] == rnd["probe_loss_full"]  # the same fresh update
    assert top["phi"] > rnd["phi"] and top["psi"] > rnd["psi"]
    assert top["reward_sent"] > rnd["reward_sent"]
    for m in (top, rnd):
        assert -1.0 <= m["reward_sent"] <= 1.0 and m["progress_g"] == pytest.approx(0.6 * m["psi"] + 0.4 * m["phi"])
        assert m["kl_full_sent"] < m["kl_full_w"] or m["psi"] <= 0  # psi = 1 - KL(full||sent) / KL(full||w)
        assert m["psi"] == pytest.approx(1 - m["kl_full_sent"] / m["kl_full_w"], abs=1e-12)


def test_v3_terms_are_measured_on_a_held_out_probe_and_priced_in_seconds():
    params = _fixed("topk", k=5)
    client, ctx, bc, res = play(params)
    m = res.metrics
    probe = client.probe_indices(ctx)
    assert len(probe) == 8  # min(probe_batches x batch = 32, 20 % of 40 samples)
    assert res.num_samples == 40 - 8  # the probe is held out of training
    # training: 32 samples, 1 epoch; measurement: 3 local probe forwards of 8, 3 public of 96
    assert res.train_flops == pytest.approx(1e6 * (32 + (3 * 8 + 3 * 96) / 3))
    # selection in seconds from the rpi4 tier: 4 x 83 bytes fit its cache -> in-cache Top-K
    t_sel = 83 * 12.0e-9
    assert m["sim_T_select"] == pytest.approx(t_sel, rel=1e-12)
    assert float(clock.compress_seconds(res.compress_ops, RPI4.gflops)) == pytest.approx(t_sel, rel=1e-12)
    # T = download + training (without the measurement forwards) + selection + upload
    T = (0.05 + 8 * bc.nbytes / 5e6) + 32e6 / 3e9 + t_sel + (0.05 + 8 * res.upload.nbytes / 5e6)
    assert m["sim_T"] == pytest.approx(T, rel=1e-12) and m["sim_Tbar"] == pytest.approx(T, rel=1e-12)
    assert m["sim_T_measure"] == pytest.approx((3 * 8 + 3 * 96) / 3 * 1e6 / 3e9)
    # the sent update is the decoded payload
    sent = decode_upload(res.upload)
    assert sent.k == 5 and m["k"] == 5


def test_selection_cost_falls_back_to_op_count_without_tier_constants():
    from hardware_profiles.profile import HardwareProfile

    bare = HardwareProfile(name="c", gflops=3.0, down_mbps=5.0, up_mbps=5.0, latency_s=0.05, memory_gb=4.0,
                           availability=1.0, dropout=0.0)  # a user tier without select_* fields
    _, _, _, res = play(_fixed("topk", k=5), profile=bare)
    assert res.metrics["sim_T_select"] == pytest.approx(res.compress_ops / 3e9)
    assert res.compress_ops == pytest.approx(140.0 * 83 + 70.0 * 5 * math.log2(5))
    # out of cache: a vector larger than the tier's cache costs the out-of-cache ns
    big = RPI4.model_copy(update={"cache_bytes": 100.0})
    assert clock.select_seconds("topk", 83, 5, big) == pytest.approx(83 * 45.0e-9)
    assert clock.select_seconds("randomk", 83, 5, RPI4) == pytest.approx(5 * 45.0e-9)
    assert clock.select_seconds("periodick", 83, 5, RPI4) == pytest.approx(5 * 1.0e-9)
    assert clock.select_seconds("qsgd8", 83, 83, RPI4) == pytest.approx(83 * 18.0e-9)


def test_v3_closes_the_reward_at_the_next_participation_and_a_lost_upload_earns_minus_one():
    params = AscendParams(k=5, gamma=None, distill_steps=0, warmup=2)
    server, client, st = server_for(params), AscendClient(params), {}
    sent = []
    for rnd in range(3):
        bc = server.broadcast(rnd)["a"]
        ctx = ctx_for(0, rnd, st)
        client.receive(ctx, bc)
        m = client.fit(ctx, bc).metrics
        sent.append(m)
        if rnd == 1:
            client.on_dropped(st, 1)  # deadline: its reward is -1
    assert math.isnan(sent[0]["reward"])
    assert sent[1]["reward"] == sent[0]["reward_sent"] and sent[1]["reward_phi"] == sent[0]["phi"]
    assert sent[1]["reward_psi"] == sent[0]["psi"] and sent[1]["reward_T"] == sent[0]["sim_T"]
    assert sent[2]["reward"] == -1.0 and sent[2]["reward_lost"] and sent[2]["reward_arm"] == sent[1]["arm"]
    # the block warm-up: arm played twice in a row; the block's first reward is left out of Q
    assert sent[0]["arm"] == sent[1]["arm"] and sent[2]["arm"] != sent[1]["arm"]
    pol = st["policy"]
    i = pol.arms.index(sent[0]["arm"])
    assert pol.warmup_seen[i] == 2 and pol.warmup_count[i] == 1 and pol.warmup_sum[i] == -1.0


def test_v3_trains_batched_on_the_rows_without_its_probe():
    """executor.batch_clients: the batched step draws the client's batches over train_rows (every
    row but the probe's), so fit gives what the sequential fit gives; a batch drawn over other
    rows is refused."""
    from algorithms.batched_training import BatchJob, draw_batches, train_batched

    params = AscendParams(k=5, arms=("topk", "randomk"), warmup=0, eps_min=0.5, gamma=None, distill_steps=0)
    client, ctx, _, seq = play(params)
    server, bat_client = server_for(params), AscendClient(params)
    bc = server.broadcast(0)["a"]
    ctx = ctx_for(0, 0, {})
    bat_client.receive(ctx, bc)
    rows = bat_client.train_rows(ctx)
    probe = bat_client.probe_indices(ctx)
    assert len(rows) + len(probe) == 40 and not set(rows.tolist()) & set(probe.tolist())
    start = {n: p.detach().clone() for n, p in ctx.model.named_parameters()}
    jobs = [BatchJob(start, {}, draw_batches(ctx.rng, rows, 8, 1), rows=len(rows))]
    (update,) = train_batched(tiny(), jobs, ctx.train_x, ctx.train_y, lr=0.1)
    update.rng_state = ctx.rng.bit_generator.state
    ctx.pretrained = update
    res = bat_client.fit(ctx, bc)
    assert res.num_samples == seq.num_samples == len(rows)
    assert res.metrics["arm_label"] == seq.metrics["arm_label"]
    assert res.metrics["train_loss"] == pytest.approx(seq.metrics["train_loss"], rel=1e-6)
    for col in ("phi", "psi", "reward_sent"):
        assert res.metrics[col] == pytest.approx(seq.metrics[col], rel=1e-5, abs=1e-6), col
    np.testing.assert_allclose(decode_upload(res.upload).dense(), decode_upload(seq.upload).dense(),
                               rtol=1e-5, atol=1e-7)
    # a batch drawn over all 40 rows does not match what v3's fit trains on
    ctx = ctx_for(0, 0, {})
    bat_client.receive(ctx, bc)
    jobs = [BatchJob(start, {}, draw_batches(ctx.rng, torch.arange(40), 8, 1), rows=40)]
    (update,) = train_batched(tiny(), jobs, ctx.train_x, ctx.train_y, lr=0.1)
    ctx.pretrained = update
    with pytest.raises(RuntimeError, match=r"fit trains on 32 rows, but the batch was drawn over 40"):
        bat_client.fit(ctx, bc)


# ------------------------------------------------------------------------------ warm-up v3
def test_block_warmup_order_and_q_from_the_plays_after_the_first():
    pol = EpsilonGreedyEMA(["a", "b", "c"], warmup=3, order=[2, 0, 1], blocks=True)
    rewards = {"a": [9.0, 0.2, 0.4], "b": [9.0, 0.5, 0.7], "c": [-9.0, 0.1, 0.3]}
    plays = []
    for _ in range(9):
        arm, reason = pol.choose(np.random.default_rng(0))
        assert reason == "warmup"
        plays.append(arm)
        pol.update(arm, rewards[arm][plays.count(arm) - 1])
    assert plays == ["c"] * 3 + ["a"] * 3 + ["b"] * 3
    pol.choose(np.random.default_rng(0))  # ends the warm-up
    assert pol.q.tolist() == pytest.approx([0.3, 0.6, 0.2])  # the first play of each block left out
    with pytest.raises(ValueError, match="permutation"):
        EpsilonGreedyEMA(["a", "b"], order=[0, 0])


def test_warmup_order_is_random_per_client_and_reproducible_from_the_seed():
    client = AscendClient(AscendParams(k=5))
    orders = [client.new_policy(np.random.default_rng([0, 0, cid])).order for cid in range(12)]
    again = [client.new_policy(np.random.default_rng([0, 0, cid])).order for cid in range(12)]
    other_seed = [client.new_policy(np.random.default_rng([1, 0, cid])).order for cid in range(12)]
    assert orders == again and orders != other_seed
    assert len({tuple(o) for o in orders}) > 2 and all(sorted(o) == [0, 1, 2] for o in orders)
    assert {o[0] for o in orders} == {0, 1, 2}  # Top-K is not always first
    assert client.new_policy(np.random.default_rng(0)).blocks
    v2 = AscendClient(AscendParams(k=5, reward="v2")).new_policy()
    assert v2.order == [0, 1, 2] and not v2.blocks  # v2 keeps the round-robin
    assert not client.new_policy(np.random.default_rng(0)).mean
    stationary = AscendClient(AscendParams(k=5, q_update="mean"))
    policy = stationary.new_policy(np.random.default_rng(0))
    assert policy.mean
    policy.mean = False  # a restored policy takes the config's setting
    stationary.sync_policy_params(policy)
    assert policy.mean


# ------------------------------------------------------------------------------ joint arms
def test_joint_compressor_k_arms_validate_and_compress_at_their_own_k():
    p = AscendParams(arms=[["topk", 0.05], "randomk@0.5", "periodick"], k=10)
    assert p.arms == ("topk@0.05", "randomk@0.5", "periodick")
    for bad in (["topk", 0.05, 1], ["topk", 0], "bestk@0.1", ["topk", 1.5]):
        with pytest.raises(ValueError, match="arms"):
            AscendParams(arms=[bad])
    for arm, want_k, want_label_k in (("topk@0.05", 4, 0.05), ("randomk@0.5", 42, 0.5), ("periodick", 10, None)):
        _, _, _, res = play(AscendParams(arms=p.arms, k=10, policy="fixed", arm=arm, gamma=None, distill_steps=0))
        m = res.metrics
        assert m["arm_label"] == arm and m["arm"] == arm.split("@")[0] and m["k"] == want_k
        assert (math.isnan(m["arm_k"]) if want_label_k is None else m["arm_k"] == want_label_k)
        assert "q_topk@0.05" in m and "q_randomk@0.5" in m


# ------------------------------------------------------------------------------ through the engine
def test_engine_run_v3_traces_every_term_and_the_seconds_priced_selection(tmp_path):
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    cfg = load_config({
        "seed": 0, "rounds": 3,
        "dataset": {"name": "mnist5k"},
        "partition": {"scheme": "dirichlet", "alpha": 0.5, "public_fraction": 0.1},
        "model": {"name": "lenet5", "zoo": [{"arch": "lenet5_half", "max_gflops": 10}]},
        "clients": {"num_clients": 4, "participation": 1.0, "profiles": {
            "devices": {"rpi4": 0.5, "laptop_cpu": 0.5}, "network": {"5mbps": 0.5, "500mbps": 0.5},
            "availability": 1.0, "dropout": 0.0}},
        "algorithm": {"name": "ascend", "k": "1e-2", "distill_steps": 5, "gamma": None,
                      "arms": [["topk", 0.01], ["randomk", 0.05]]},
        "train": {"local_steps": 3},
        "evaluation": {"personalized": False},
        "executor": {"threads_per_actor": 1},
        "output": {"dir": str(tmp_path), "name": "v3"},
    })
    run = load_run(run_experiment(cfg))
    c = run.clients
    want = {"phi", "psi", "progress_g", "reward_sent", "sim_T", "sim_Tbar", "reward", "reward_phi", "reward_psi",
            "reward_g", "reward_factor", "reward_lost", "arm", "arm_label", "arm_k", "k", "sim_T_select",
            "q_topk@0.01", "q_randomk@0.05"}
    assert want <= set(c.columns)
    assert set(c["arm_label"]) <= {"topk@0.01", "randomk@0.05"} and set(c["arm_k"]) <= {0.01, 0.05}
    assert np.allclose(c["sim_compress_s"], c["sim_T_select"], rtol=1e-9)  # the engine's clock charges seconds
    assert np.allclose(c["sim_T"], c["sim_total_s"] - c["sim_T_measure"], rtol=1e-9)
    assert c[["phi", "psi", "reward_sent"]].abs().le(1.0).all().all()
    assert (c["num_samples"] > 0).all() and (c["train_loss"].notna()).all()
    # 3 local steps of batch 16 every round, whatever the client's data size: the training part
    # of the compute time is 48 samples' FLOPs, one figure per architecture
    gflops = run.profiles.set_index("client_id").loc[c["client_id"], "gflops"].to_numpy()
    per_sample = (c["sim_compute_s"] - c["sim_T_measure"]).to_numpy() * gflops * 1e9 / 48
    for arch in ("lenet5", "lenet5_half"):
        x = per_sample[(c["arch"] == arch).to_numpy()]
        assert len(x) and np.allclose(x, x[0], rtol=1e-9)


def test_v3_rollback_undoes_the_choice_and_drops_its_reward():
    params = AscendParams(k=0.2, gamma=0.2, distill_steps=2, forced_rounds=1)
    server, client, states = server_for(params), AscendClient(params), {}

    def round_(rnd, spike=False):
        bc = server.broadcast(rnd)["a"]
        results = []
        for cid in (0, 1):
            ctx = ctx_for(cid, rnd, states.setdefault(cid, {}))
            client.receive(ctx, bc)
            results.append(client.fit(ctx, bc))
        if spike:
            results[0].upload.arrays["values"] *= 1e6
        return results, server.aggregate(rnd, results)

    first, _ = round_(0)
    policy0 = {c: states[c]["policy"].warmup_choices for c in (0, 1)}
    second, out = round_(1, spike=True)
    assert out["rollback"] == 1
    # round 2 is forced Top-K; the receive restores the policy to before round 1's choice
    forced, _ = round_(2)
    assert all(r.metrics["arm_reason"] == "forced" and r.metrics["restored_round"] == 1 for r in forced)
    for c in (0, 1):
        pol = states[c]["policy"]
        assert pol.warmup_choices == policy0[c] == 1
        assert pol.warmup_seen.sum() == 1  # round 0's reward (closed at round 1) kept, round 1's dropped
    # round 3: the warm-up goes on with the second play of the first arm's block
    resumed, _ = round_(3)
    assert [r.metrics["arm"] for r in resumed] == [r.metrics["arm"] for r in first]
    assert all(r.metrics["arm_reason"] == "warmup" for r in resumed)
