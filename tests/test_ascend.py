"""ASCEND: reward, per-architecture aggregation, distillation, rollback, and one engine run."""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from algorithms import ALGORITHMS
from algorithms.ascend import (
    SPEC,
    DEFAULT_ARMS as STRATEGIES,
    AscendClient,
    AscendParams,
    AscendServer,
    ascend_reward,
    kl_teacher_student,
    logits_of,
    relative_decrease,
)
from algorithms.base import ClientContext, ClientResult, ServerContext, TrainSettings
from algorithms.compressed_fedavg import compressed_payload
from algorithms.compressors import compress
from algorithms.training import flat_params, flat_state
from hardware_profiles.profile import HardwareProfile

ARCHS = ("a", "b")
PROFILE = HardwareProfile(
    name="c", gflops=3.0, down_mbps=5.0, up_mbps=5.0, latency_s=0.05, memory_gb=4.0, availability=1.0, dropout=0.0
)


def tiny(arch, seed=0):
    torch.manual_seed(seed)
    if arch == "a":
        return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))  # 83 parameters
    return nn.Sequential(nn.Linear(6, 3))  # 21 parameters


def public(n=96):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # learnable labels


def make_server(**kw):
    params = AscendParams(**kw)
    x, y = public()
    ctx = ServerContext(public_x=x, public_y=y, num_clients=4, client_arch=np.array(["a", "a", "b", "b"], dtype=object))
    return params, AscendServer(params, {a: tiny(a) for a in ARCHS}, seed=0, context=ctx)


def arch_of(cid):
    return "a" if cid < 2 else "b"


def client_data(cid, n=32):
    g = torch.Generator().manual_seed(100 + cid)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def make_ctx(cid, rnd, state):
    x, y = client_data(cid)
    return ClientContext(
        client_id=cid, round=rnd, arch=arch_of(cid), model=tiny(arch_of(cid), seed=99), state=state,
        train_x=x, train_y=y, rng=np.random.default_rng([0, rnd, cid]),
        train=TrainSettings(batch_size=8, lr=0.1), flops_per_sample=1e6, profile=PROFILE,
    )


def run_clients(client, bc, rnd, states, cids):
    results = []
    for cid in cids:
        ctx = make_ctx(cid, rnd, states.setdefault(cid, {}))
        client.receive(ctx, bc[ctx.arch])
        results.append(client.fit(ctx, bc[ctx.arch]))
    return results


def state_dicts(server):
    return {a: {k: v.clone() for k, v in m.state_dict().items()} for a, m in server.models.items()}


# ------------------------------------------------------------------------------ registry, params
def test_registered_and_params_validation():
    assert ALGORITHMS["ascend"] is SPEC and SPEC.client is AscendClient
    p = AscendParams(k="1e-2")  # YAML 1.1 reads 1e-2 as a string
    assert p.k == 0.01 and p.policy == "egreedy" and p.arms == ("topk", "randomk", "periodick")
    assert (p.warmup, p.eps_c, p.eps_min, p.ema_lambda, p.rho, p.gamma, p.forced_rounds) == (2, 3.0, 0.03, 0.3, 0.6, 0.2, 3)
    assert (p.distill_steps, p.distill_lr, p.temperature, p.teacher, p.public_probe_size) == (50, 1e-3, 1.0, "aggregates", 512)
    assert AscendParams(k=1000).k == 1000
    for bad, field in [({"policy": "greedy"}, "policy"), ({"policy": "fixed"}, "arm"), ({"arm": "topk"}, "arm"),
                       ({"arms": ["topk", "topk"]}, "arms"), ({"gamma": -0.1}, "gamma"), ({"epsilon": 1.5}, "epsilon"),
                       ({"teacher": "x"}, "teacher"), ({"k": 0}, "k"), ({"arms": ["bestk"]}, "arms")]:
        with pytest.raises(ValueError, match=field):
            AscendParams(**bad)


# ------------------------------------------------------------------------------ reward
def test_reward_formula_with_hand_numbers():
    df = relative_decrease(2.0, 1.6)  # 0.2
    dd = relative_decrease(0.5, 0.45)  # 0.1
    assert df == pytest.approx(0.2) and dd == pytest.approx(0.1)
    # (0.6*0.1 + 0.4*0.2) / (3/2) = 0.14 / 1.5
    assert ascend_reward(df, dd, T=3.0, T_bar=2.0) == pytest.approx(0.14 / 1.5)
    assert ascend_reward(0.5, 0.5, T=1.0, T_bar=4.0) == 1.0  # 0.5*4 = 2 -> clipped
    assert ascend_reward(-0.5, -2.0, T=1.0, T_bar=1.0) == -1.0  # -1.4 -> clipped
    assert ascend_reward(0.1, 0.0, T=1.0, T_bar=1.0, rho=0.0) == pytest.approx(0.1)
    assert relative_decrease(0.0, 1.0) == 0.0  # undefined -> neutral
    assert ascend_reward(relative_decrease(1.0, float("nan")), 0.0, 1.0, 1.0) == -1.0  # divergence


def test_client_closes_reward_one_participation_late_from_the_virtual_clock():
    params = AscendParams(k=5, distill_steps=0, gamma=None)
    client = AscendClient(params)
    st = {}
    bc0 = {"a": _payload("a", round=0, probe_kl={0: 0.5})}
    ctx = make_ctx(0, 0, st)
    client.receive(ctx, bc0["a"])
    f0 = st["round_info"]["f"]
    res0 = client.fit(ctx, bc0["a"])
    assert res0.metrics["arm"] == "topk" and res0.metrics["arm_reason"] == "warmup"
    assert math.isnan(res0.metrics["reward"])
    # T = train + select + upload (latency included), by hand
    n_probe = min(32, 4 * 8)
    flops = 1e6 * (32 + n_probe / 3)
    T = flops / 3e9 + res0.compress_ops / 3e9 + 0.05 + 8 * res0.upload.nbytes / 5e6
    assert res0.train_flops == pytest.approx(flops)
    assert st["pending"]["T"] == pytest.approx(T, rel=1e-12)
    # next participation, round 3: the broadcast model differs; D history has both rounds
    model = tiny("a", seed=5)
    bc3 = _payload("a", round=3, probe_kl={0: 0.5, 3: 0.45}, model=model)
    ctx = make_ctx(0, 3, st)
    client.receive(ctx, bc3)
    f3 = st["round_info"]["f"]
    res3 = client.fit(ctx, bc3)
    m = res3.metrics
    df = (f0 - f3) / f0
    want = max(-1.0, min(1.0, (0.6 * 0.1 + 0.4 * df) / (T / T)))  # T̄ = mean of the one T so far
    assert m["reward"] == pytest.approx(want) and m["reward_df"] == pytest.approx(df)
    assert m["reward_dd"] == pytest.approx(0.1) and m["reward_T"] == pytest.approx(T) and m["reward_arm"] == "topk"
    assert m["arm"] == "randomk"  # warm-up round robin
    assert st["policy"].warmup_sum[0] == pytest.approx(want) and st["policy"].warmup_count.tolist() == [1, 0, 0]
    assert m["q_topk"] == pytest.approx(want) and math.isnan(m["q_randomk"])


def _payload(arch, round, probe_kl, model=None, forced=False, rolled_back=()):
    from algorithms.fedavg import state_payload

    p = state_payload(flat_state(model if model is not None else tiny(arch)))
    p.meta = {"round": round, "probe_kl": probe_kl, "rolled_back": list(rolled_back), "forced": forced}
    return p


# ------------------------------------------------------------------------------ aggregation
def test_per_architecture_aggregation_with_two_archs_exact_numbers():
    params, server = make_server(k=2, distill_steps=0, gamma=None)
    base_a, base_b = flat_params(server.models["a"]), flat_params(server.models["b"])
    va = torch.zeros(83)
    va[0], va[5] = 2.0, 4.0
    ua = torch.zeros(83)
    ua[0], ua[9] = 1.0, -0.5
    vb = torch.arange(21, dtype=torch.float32)
    results = [
        ClientResult(0, "a", compressed_payload(compress("topk", ua, 2)), num_samples=10, train_flops=0),
        ClientResult(1, "a", compressed_payload(compress("topk", va, 2)), num_samples=30, train_flops=0),
        ClientResult(2, "b", compressed_payload(compress("periodick", vb, 4, round=1)), num_samples=5, train_flops=0),
    ]
    out = server.aggregate(0, results)
    want_a = torch.zeros(83)
    want_a[0], want_a[5], want_a[9] = 0.25 * 1.0 + 0.75 * 2.0, 0.75 * 4.0, 0.25 * -0.5  # 1.75, 3.0, -0.125
    want_b = torch.zeros(21)
    want_b[4:8] = torch.tensor([4.0, 5.0, 6.0, 7.0])  # offset (1*4) mod 21
    assert torch.equal(flat_params(server.models["a"]), base_a + want_a)
    assert torch.equal(flat_params(server.models["b"]), base_b + want_b)
    assert out["num_aggregated"] == 3 and out["rollback"] == 0


# ------------------------------------------------------------------------------ distillation
def test_distillation_reduces_kl_teacher_student_on_the_public_set():
    params, server = make_server(distill_steps=50)
    teacher = 3.0 * logits_of(tiny("a", seed=3), server.public_x)  # a confident, different teacher
    kls = []
    for steps in (0, 10, 50):
        _, s = make_server(distill_steps=steps)
        s.distill("b", teacher, round=0)
        kls.append(float(kl_teacher_student(teacher, logits_of(s.models["b"], s.public_x))))
    assert kls[0] > kls[1] > kls[2] and kls[2] < 0.8 * kls[0]
    # through aggregate: the per-arch KL after distillation is below the one before
    client = AscendClient(params)
    out = server.aggregate(0, run_clients(client, server.broadcast(0), 0, {}, [0, 2]))
    for a in ARCHS:
        assert out[f"distill_kl_{a}"] < out[f"distill_kl0_{a}"] and out[f"distill_loss_{a}"] > 0


def test_clients_teacher_uses_every_reconstructed_model():
    params, server = make_server(teacher="clients", distill_steps=0, gamma=None, k=1.0)
    client = AscendClient(params)
    results = run_clients(client, server.broadcast(0), 0, {}, [0, 1, 2])
    bases = {a: flat_params(m) for a, m in server.models.items()}
    t = server.build_teacher(results, bases)
    from algorithms.training import load_flat_params
    from algorithms.compressed_fedavg import decode_upload

    want = []
    for r in results:
        m = tiny(r.arch)
        load_flat_params(m, bases[r.arch] + decode_upload(r.upload).dense())
        want.append(logits_of(m, server.public_x))
    assert torch.allclose(t, torch.stack(want).mean(0), atol=1e-6)


# ------------------------------------------------------------------------------ rollback
def test_loss_spike_rolls_back_once_restores_bit_for_bit_and_forces_topk():
    params, server = make_server(k=0.2, distill_steps=5, gamma=0.2, forced_rounds=3)
    client = AscendClient(params)
    states: dict[int, dict] = {}
    cids = [0, 1, 2, 3]
    out0 = server.aggregate(0, run_clients(client, server.broadcast(0), 0, states, cids))
    assert out0["rollback"] == 0 and server.drain_tables() == {}

    # round 1: every client works; client 0's upload carries a huge delta (the spike)
    before = state_dicts(server)
    saved = {c: (states[c]["residual"].copy(), copy.deepcopy(states[c]["policy"])) for c in cids}  # after round 0
    bc1 = server.broadcast(1)
    results = run_clients(client, bc1, 1, states, cids)
    reward_r1 = {r.client_id: r.metrics["reward"] for r in results}
    results[0].upload.arrays["values"] *= 1e6
    out1 = server.aggregate(1, results)
    assert out1["rollback"] == 1 and out1["forced_until"] == 4
    for a in ARCHS:  # every architecture's previous parameters, bit for bit
        for k, v in server.models[a].state_dict().items():
            assert torch.equal(v, before[a][k])
    tables = server.drain_tables()
    (row,) = tables["rollbacks"]
    assert set(row) >= {"round", "loss_before", "loss_after", "threshold", "forced_until"}
    assert row["round"] == 1 and row["forced_until"] == 4 and row["loss_after"] > row["threshold"]
    assert row["threshold"] == pytest.approx(1.2 * row["loss_before"])
    assert server.drain_tables() == {}

    # rounds 2-4 are forced to Top-K; the rolled-back round's reward never reaches the policy
    for rnd in (2, 3, 4):
        bc = server.broadcast(rnd)
        assert all(p.meta["forced"] and p.meta["rolled_back"] == [1] for p in bc.values())
        if rnd == 2:
            ctx = make_ctx(1, 2, states[1])
            client.receive(ctx, bc["a"])
            residual, policy = saved[1]
            assert np.array_equal(states[1]["residual"], residual)  # restored lazily
            # the policy is back to just before round 1's choice: round 0's reward (closed at
            # round 1's receive, about accepted models) is kept, round 1's choice is undone
            restored = states[1]["policy"]
            assert policy.updates.tolist() == [0, 0, 0] and restored.updates.tolist() == [1, 0, 0]
            assert restored.warmup_sum[0] == pytest.approx(reward_r1[1])
            assert restored.warmup_choices == policy.warmup_choices == 1
            assert "pending" not in states[1] or states[1]["pending"]["round"] == 2
            res = client.fit(ctx, bc["a"])
            assert math.isnan(res.metrics["reward"]) and res.metrics["restored_round"] == 1
            results = [res] + run_clients(client, bc, rnd, states, [0, 2, 3])
        else:
            results = run_clients(client, bc, rnd, states, cids)
        assert [(r.metrics["arm"], r.metrics["arm_reason"]) for r in results] == [("topk", "forced")] * 4
        assert all(not r.metrics["reward_fed"] for r in results)  # forced rewards are not fed by default
        assert server.aggregate(rnd, results)["rollback"] == 0
    bc5 = server.broadcast(5)
    assert not bc5["a"].meta["forced"]
    results = run_clients(client, bc5, 5, states, cids)
    # warm-up resumes where the undo left it: round 0 was topk, round 1 (randomk) was undone
    assert [r.metrics["arm"] for r in results] == ["randomk"] * 4
    assert [r.metrics["arm_reason"] for r in results] == ["warmup"] * 4
    server.aggregate(5, results)
    assert server.rolled_back == [1] and server.drain_tables() == {}


def test_consecutive_rollbacks_are_capped_for_finite_spikes_only():
    params, server = make_server(k=0.2, distill_steps=0, max_consecutive_rollbacks=2)
    client, states = AscendClient(params), {}
    server.aggregate(0, run_clients(client, server.broadcast(0), 0, states, [0, 2]))
    flags = []
    for rnd in range(1, 5):  # a finite spike every round
        results = run_clients(client, server.broadcast(rnd), rnd, states, [0, 2])
        results[0].upload.arrays["values"] *= 1e3
        out = server.aggregate(rnd, results)
        assert math.isfinite(out["probe_loss"])
        flags.append((out["rollback"], out["rollback_capped"]))
    assert flags[:3] == [(1, 0), (1, 0), (0, 1)]  # the third spike in a row is accepted
    assert len(server.drain_tables()["rollbacks"]) == sum(f[0] for f in flags)
    # a non-finite loss is always rolled back
    _, s2 = make_server(k=0.2, distill_steps=0, max_consecutive_rollbacks=1)
    for rnd in range(3):
        results = run_clients(client, s2.broadcast(rnd), rnd, {}, [0])
        results[0].upload.arrays["values"][:] = np.nan
        assert s2.aggregate(rnd, results)["rollback"] == 1


def test_no_rollback_when_gamma_is_none_and_requires_public_split():
    params, server = make_server(k=0.2, distill_steps=0, gamma=None)
    results = run_clients(AscendClient(params), server.broadcast(0), 0, {}, [0, 2])
    results[0].upload.arrays["values"] *= 1e6
    assert server.aggregate(0, results)["rollback"] == 0
    with pytest.raises(ValueError, match="public_fraction"):
        AscendServer(params, {"a": tiny("a")}, seed=0, context=ServerContext())


# ------------------------------------------------------------------------------ lost uploads
@pytest.mark.parametrize("lost", [0, 1, 2])  # warm-up arms: topk, randomk, periodick
def test_lost_upload_restores_residual_discards_reward_and_keeps_the_choice(lost):
    params = AscendParams(k=5, distill_steps=0, gamma=None)
    client = AscendClient(params)
    seen, used = {}, {}
    compress_delta = client.compress_delta

    def spy(ctx, delta, arm):  # the accumulated vector a = e + delta of this fit
        r = ctx.state.get("residual")
        used[ctx.round] = None if r is None else r.copy()
        seen[ctx.round] = delta.clone() if r is None else torch.from_numpy(r.copy()) + delta
        return compress_delta(ctx, delta, arm)

    client.compress_delta = spy
    st = {}
    kl = {0: 0.5}
    for rnd in range(lost + 1):
        kl[rnd] = 0.5 - 0.01 * rnd
        ctx = make_ctx(0, rnd, st)
        bc = _payload("a", round=rnd, probe_kl=dict(kl), model=tiny("a", seed=rnd))
        client.receive(ctx, bc)
        res = client.fit(ctx, bc)
    assert res.metrics["arm"] == STRATEGIES[lost] and st["pending"]["round"] == lost
    after_choice = copy.deepcopy(st["policy"])
    T_warm = list(st["T_warm"])

    client.on_dropped(st, lost + 7)  # another round: nothing changes
    assert {"pending", "undo", "sent"} <= set(st) and not torch.equal(torch.from_numpy(st["residual"]), seen[lost])

    client.on_dropped(st, lost)
    a = seen[lost]
    assert np.array_equal(st["residual"].view(np.int32), a.numpy().view(np.int32))  # bit for bit
    assert not {"pending", "undo", "sent"} & set(st)
    pol = st["policy"]  # the choice stands: the policy is exactly as after it
    for f in ("q", "warmup_sum", "warmup_count", "chosen", "updates"):
        assert np.array_equal(getattr(pol, f), getattr(after_choice, f))
    assert pol.warmup_choices == lost + 1 and st["T_warm"] == T_warm  # its T stays in T̄

    # next round, which also lists the lost round as rolled back: the client is not rolled back
    nxt = lost + 1
    kl[nxt] = 0.4
    ctx = make_ctx(0, nxt, st)
    bc = _payload("a", round=nxt, probe_kl=dict(kl), rolled_back=(lost,))
    client.receive(ctx, bc)
    assert np.array_equal(st["residual"].view(np.int32), a.numpy().view(np.int32))
    res = client.fit(ctx, bc)
    m = res.metrics
    assert math.isnan(m["reward"]) and m["reward_round"] == -1 and not m["reward_fed"]  # nothing closed
    assert math.isnan(m["restored_round"])
    assert pol.updates.tolist() == [1 if i < lost else 0 for i in range(3)]  # the lost choice's reward never fed
    assert m["arm"] == STRATEGIES[nxt % 3]  # the warm-up moved on past the lost choice
    assert np.array_equal(used[nxt].view(np.int32), a.numpy().view(np.int32))  # accumulated on top of a
    assert st["pending"]["round"] == nxt and st["undo"]["round"] == nxt


def test_lost_upload_forgets_exp3_choice_probability():
    client = AscendClient(AscendParams(k=5, policy="exp3", distill_steps=0, gamma=None))
    st = {}
    ctx = make_ctx(0, 0, st)
    bc = _payload("a", round=0, probe_kl={0: 0.5})
    client.receive(ctx, bc)
    arm = client.fit(ctx, bc).metrics["arm"]
    assert set(st["policy"].pending_p) == {arm}
    client.on_dropped(st, 0)
    assert st["policy"].pending_p == {} and "pending" not in st


# ------------------------------------------------------------------------------ through the engine
def _engine_cfg(tmp_path, name, *extra):
    from engine.config import load_config

    return load_config({
        "seed": 0, "rounds": 4,
        "dataset": {"name": "mnist5k"},
        "partition": {"scheme": "dirichlet", "alpha": 0.5, "public_fraction": 0.1},
        "model": {"name": "lenet5", "zoo": [{"arch": "lenet5_half", "max_gflops": 10}]},
        "clients": {"num_clients": 8, "participation": 1.0, "profiles": {
            "devices": {"rpi4": 0.5, "laptop_cpu": 0.5}, "network": {"5mbps": 0.5, "500mbps": 0.5},
            "availability": 1.0, "dropout": 0.0}},
        "algorithm": {"name": "ascend", "k": "1e-2", "distill_steps": 10},
        "evaluation": {"personalized": False},
        "executor": {"threads_per_actor": 1},
        "output": {"dir": str(tmp_path), "name": name},
    }, list(extra))


TRACE = ["arch", "arm", "arm_reason", "reward", "reward_df", "reward_dd", "reward_T", "epsilon",
         "q_topk", "q_randomk", "q_periodick", "residual_norm", "k"]


def test_engine_run_traces_and_warmup_round_robin(tmp_path):
    from engine.results import load_run
    from engine.run import run_experiment

    run = load_run(run_experiment(_engine_cfg(tmp_path, "plain", "algorithm.gamma=null")))
    c = run.clients
    assert set(TRACE) <= set(c.columns)
    assert set(c["arch"]) == {"lenet5", "lenet5_half"}
    arms = c.pivot(index="client_id", columns="round", values="arm")
    assert (arms.values == np.array(["topk", "randomk", "periodick", "topk"])).all()
    assert (c["arm_reason"] == "warmup").all()
    assert c.loc[c["round"] == 0, "reward"].isna().all() and c.loc[c["round"] > 0, "reward"].notna().all()
    # the reward's T is the engine's own clock minus the (arm-independent) download
    t = c["sim_compute_s"] + c["sim_compress_s"] + c["sim_upload_s"]
    assert np.allclose(c["sim_T"], t, rtol=1e-12)
    assert {"server_rollback", "server_probe_loss", "server_distill_loss_lenet5",
            "server_distill_loss_lenet5_half", "global_acc_lenet5", "global_acc_lenet5_half"} <= set(run.rounds.columns)
    assert run.table("rollbacks") is None


def test_engine_run_with_rollbacks_table(tmp_path):
    from engine.results import load_run
    from engine.run import run_experiment

    # lr 2.0 diverges: the guard rolls every round back and the models never move
    run = load_run(run_experiment(_engine_cfg(tmp_path, "spike", "train.lr=2.0", "rounds=3", "algorithm.k=0.1")))
    rb = run.table("rollbacks")
    assert list(rb.columns[:5]) == ["round", "loss_before", "loss_after", "threshold", "forced_until"]
    assert list(rb["round"]) == list(run.rounds.loc[run.rounds["server_rollback"] == 1, "round"])
    assert len(rb) >= 1
    first = int(rb["round"].iloc[0])
    later = run.clients[run.clients["round"] > first]
    assert (later["arm"] == "topk").all() and (later["arm_reason"] == "forced").all()
    assert run.rounds["global_acc"].nunique() == 1  # restored bit for bit every time
