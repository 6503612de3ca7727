"""ASCEND: reward, per-architecture aggregation, distillation, rollback, and one engine run."""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import REPO

from algorithms import ALGORITHMS
from algorithms.ascend import (
    DEFAULT_ARMS as STRATEGIES,
)
from algorithms.ascend import (
    SPEC,
    AscendClient,
    AscendParams,
    AscendServer,
    ascend_reward_v1,
    kl_teacher_student,
    logits_of,
    relative_decrease,
    reward_v2,
    time_factor,
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
    assert ((p.warmup, p.eps_c, p.eps_min, p.ema_lambda, p.rho_value, p.gamma, p.forced_rounds)
            == (2, 1.0, 0.03, 0.3, 0.6, 0.2, 3))
    assert p.reward == "v3" and AscendParams(reward="v1").reward == "v1"
    assert AscendParams(arms=["topk", "randomk", "periodick", "qsgd8"]).arms[-1] == "qsgd8"
    assert ((p.distill_steps, p.distill_lr, p.temperature, p.teacher, p.public_probe_size)
            == (50, 1e-3, 1.0, "aggregates", 512))
    assert AscendParams(k=1000).k == 1000
    for bad, field in [({"policy": "greedy"}, "policy"), ({"policy": "fixed"}, "arm"), ({"arm": "topk"}, "arm"),
                       ({"arms": ["topk", "topk"]}, "arms"), ({"gamma": -0.1}, "gamma"), ({"epsilon": 1.5}, "epsilon"),
                       ({"teacher": "x"}, "teacher"), ({"k": 0}, "k"), ({"arms": ["bestk"]}, "arms"),
                       ({"reward": "v5"}, "reward")]:
        with pytest.raises(ValueError, match=field):
            AscendParams(**bad)


# ------------------------------------------------------------------------------ reward
def test_reward_v1_formula_with_hand_numbers():
    df = relative_decrease(2.0, 1.6)  # 0.2
    dd = relative_decrease(0.5, 0.45)  # 0.1
    assert df == pytest.approx(0.2) and dd == pytest.approx(0.1)
    # (0.6*0.1 + 0.4*0.2) / (3/2) = 0.14 / 1.5
    assert ascend_reward_v1(df, dd, T=3.0, T_bar=2.0) == pytest.approx(0.14 / 1.5)
    assert ascend_reward_v1(0.5, 0.5, T=1.0, T_bar=4.0) == 1.0  # 0.5*4 = 2 -> clipped
    assert ascend_reward_v1(-0.5, -2.0, T=1.0, T_bar=1.0) == -1.0  # -1.4 -> clipped
    assert ascend_reward_v1(0.1, 0.0, T=1.0, T_bar=1.0, rho=0.0) == pytest.approx(0.1)
    assert relative_decrease(0.0, 1.0) == 0.0  # undefined -> neutral
    assert ascend_reward_v1(relative_decrease(1.0, float("nan")), 0.0, 1.0, 1.0) == -1.0  # divergence


def test_v1_client_closes_reward_one_participation_late_from_the_virtual_clock():
    params = AscendParams(k=5, distill_steps=0, gamma=None, reward="v1", rho=0.6)
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
    from algorithms.compressed_fedavg import decode_upload
    from algorithms.training import load_flat_params

    want = []
    for r in results:
        m = tiny(r.arch)
        load_flat_params(m, bases[r.arch] + decode_upload(r.upload).dense())
        want.append(logits_of(m, server.public_x))
    assert torch.allclose(t, torch.stack(want).mean(0), atol=1e-6)


def test_clients_teacher_of_an_asynchronous_step_weights_each_update_against_its_own_base():
    """Asynchronous steps (docs/async.md, ASCEND): per-upload bases (their base versions) and
    weights s(tau): the teacher is sum_n s_n z_n / sum_n s_n of the models base_n + delta_n."""
    params, server = make_server(teacher="clients", distill_steps=0, gamma=None, k=1.0)
    results = run_clients(AscendClient(params), server.broadcast(0), 0, {}, [0, 1, 2])
    from algorithms.compressed_fedavg import decode_upload  # as the test above
    from algorithms.training import load_flat_params

    g = torch.Generator().manual_seed(3)
    bases = [flat_params(server.models[r.arch]) + 0.1 * torch.randn(len(flat_params(server.models[r.arch])),
                                                                    generator=g) for r in results]
    weights = [1.0, 0.5, 0.25]
    t = server.build_teacher(results, bases, weights=weights)
    z = []
    for r, b in zip(results, bases):
        m = tiny(r.arch)
        load_flat_params(m, b + decode_upload(r.upload).dense())
        z.append(logits_of(m, server.public_x))
    assert torch.allclose(t, (z[0] + 0.5 * z[1] + 0.25 * z[2]) / 1.75, atol=1e-6)
    assert not torch.allclose(t, torch.stack(z).mean(0), atol=1e-4)


def test_a_checkpoint_from_before_asynchronous_ascend_restores():
    """Older checkpoints have no rolled_back_updates field: restored as none; other fields stay required."""
    _, server = make_server()
    state = server.checkpoint_state()
    del state["fields"]["rolled_back_updates"]
    _, fresh = make_server()
    fresh.rolled_back_updates = [[1, 2]]
    fresh.restore_checkpoint_state(state)
    assert fresh.rolled_back_updates == []
    del state["fields"]["forced_until"]
    with pytest.raises(ValueError, match="lacks the server fields"):
        fresh.restore_checkpoint_state(state)


# ------------------------------------------------------------------------------ rollback
def test_loss_spike_rolls_back_once_restores_bit_for_bit_and_forces_topk():
    params, server = make_server(k=0.2, distill_steps=5, gamma=0.2, forced_rounds=3, reward="v2")
    client = AscendClient(params)
    states: dict[int, dict] = {}
    cids = [0, 1, 2, 3]
    out0 = server.aggregate(0, run_clients(client, server.broadcast(0), 0, states, cids))
    assert out0["rollback"] == 0 and "rollbacks" not in server.drain_tables()

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
    assert row["action"] == "rolled_back" and row["num_discarded"] == 4
    # the discarded round's alignment terms are traced but never published to the clients
    assert all(a["rolled_back"] for a in tables["alignment"]) and len(tables["alignment"]) == 4
    assert all(e[0] == 0 for e in server.broadcast(2)["a"].meta["dd"].values())
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
    assert server.rolled_back == [1] and "rollbacks" not in server.drain_tables()


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
    rows = server.drain_tables()["rollbacks"]
    # every rollback is a row, and so is every accepted spike, with the reason
    assert [r["action"] for r in rows] == ["rolled_back" if f[0] else "accepted" for f in flags if f != (0, 0)]
    accepted = [r for r in rows if r["action"] == "accepted"]
    assert accepted[0]["round"] == 3 and "max_consecutive_rollbacks=2" in accepted[0]["reason"]
    assert accepted[0]["consecutive"] == 2 and accepted[0]["num_discarded"] == 0
    assert all("gamma" in r["reason"] for r in rows if r["action"] == "rolled_back")
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
def test_v1_lost_upload_restores_residual_discards_reward_and_keeps_the_choice(lost):
    params = AscendParams(k=5, distill_steps=0, gamma=None, reward="v1")
    client = AscendClient(params)
    seen, used = {}, {}
    compress_delta = client.compress_delta

    def spy(ctx, delta, arm, k=None):  # the accumulated vector a = e + delta of this fit
        r = ctx.state.get("residual")
        used[ctx.round] = None if r is None else r.copy()
        seen[ctx.round] = delta.clone() if r is None else torch.from_numpy(r.copy()) + delta
        return compress_delta(ctx, delta, arm, k=k)

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


def test_v1_lost_upload_forgets_exp3_choice_probability():
    client = AscendClient(AscendParams(k=5, policy="exp3", distill_steps=0, gamma=None, reward="v1"))
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
    from engine.config.schema import load_config

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
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    run = load_run(run_experiment(_engine_cfg(tmp_path, "plain", "algorithm.gamma=null", "algorithm.reward=v2")))
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
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    # lr 2.0 diverges: the guard rolls every round back and the models never move (the
    # engine's own divergence policy is off here so that ASCEND's guard sees the uploads)
    run = load_run(run_experiment(_engine_cfg(tmp_path, "spike", "train.lr=2.0", "rounds=3", "algorithm.k=0.1",
                                              "train.on_nonfinite=ignore")))
    rb = run.table("rollbacks")
    assert list(rb.columns[:5]) == ["round", "loss_before", "loss_after", "threshold", "forced_until"]
    assert set(rb["action"]) == {"rolled_back"}  # 3 rounds: the cap (3 in a row) is never reached
    assert list(rb["round"]) == list(run.rounds.loc[run.rounds["server_rollback"] == 1, "round"])
    assert len(rb) >= 1
    first = int(rb["round"].iloc[0])
    later = run.clients[run.clients["round"] > first]
    assert (later["arm"] == "topk").all() and (later["arm_reason"] == "forced").all()
    assert run.rounds["global_acc"].nunique() == 1  # restored bit for bit every time


# ------------------------------------------------------------------------------ reward version 2
def test_reward_v2_parts_with_hand_numbers():
    # progress: g = 0.5*0.1 + 0.5*0.2 = 0.15; slower than usual (T = 3, T̄ = 2) -> x 2/3
    parts = reward_v2(df=0.2, dd=0.1, T=3.0, T_bar=2.0)
    assert parts["reward_g"] == pytest.approx(0.15) and parts["reward_rho"] == 0.5
    assert parts["reward_factor"] == pytest.approx(2 / 3) and parts["reward"] == pytest.approx(0.1)
    assert reward_v2(0.2, 0.1, T=1.0, T_bar=2.0)["reward"] == pytest.approx(0.3)  # faster: x 2
    # regress: g = 0.5*(-0.4) + 0.5*(-0.2) = -0.3; sign-aware: the slow arm loses MORE (x T/T̄ = 1.5)
    slow, fast = reward_v2(-0.2, -0.4, T=3.0, T_bar=2.0), reward_v2(-0.2, -0.4, T=1.0, T_bar=2.0)
    assert slow["reward_factor"] == pytest.approx(1.5) and slow["reward"] == pytest.approx(-0.45)
    assert fast["reward_factor"] == pytest.approx(0.5) and fast["reward"] == pytest.approx(-0.15)
    # v1 divided by T/T̄ whatever the sign: the slow arm looked better after a bad round
    v1_slow = ascend_reward_v1(-0.2, -0.4, T=3.0, T_bar=2.0, rho=0.5)
    v1_fast = ascend_reward_v1(-0.2, -0.4, T=1.0, T_bar=2.0, rho=0.5)
    assert v1_slow == pytest.approx(-0.2) and v1_fast == pytest.approx(-0.6) and v1_slow > v1_fast
    assert slow["reward"] < fast["reward"]
    assert time_factor(0.0, 3.0, 2.0) == pytest.approx(2 / 3)  # g = 0 counts as progress (r = 0 anyway)
    assert time_factor(-1.0, 0.0, 2.0) == 1.0  # undefined -> 1
    # no teacher yet: dD is NaN, rho_eff = 0 and g = df
    first = reward_v2(df=0.3, dd=float("nan"), T=2.0, T_bar=2.0)
    assert first["reward_rho"] == 0.0
    assert first["reward_g"] == pytest.approx(0.3) and first["reward"] == pytest.approx(0.3)
    # clipping to [-1, 1]: the raw value is kept as a part
    big = reward_v2(df=0.8, dd=0.8, T=1.0, T_bar=4.0)
    assert big["reward_raw"] == pytest.approx(3.2) and big["reward"] == 1.0
    assert reward_v2(df=0.1, dd=-50.0, T=1.0, T_bar=1.0)["reward"] == -1.0
    assert reward_v2(df=0.1, dd=-math.inf, T=1.0, T_bar=1.0)["reward"] == -1.0  # divergence
    assert reward_v2(0.2, 0.1, 3.0, 2.0, rho=0.0)["reward"] == pytest.approx(0.2 * 2 / 3)


def _bc(arch, round, model=None, dd=None, forced=False, rolled_back=()):
    from algorithms.fedavg import state_payload

    p = state_payload(flat_state(model if model is not None else tiny(arch)))
    p.meta = {"round": round, "dd": dd or {}, "rolled_back": list(rolled_back), "forced": forced}
    return p


@torch.no_grad()
def _probe_ce(client, ctx, flat):
    from algorithms.training import load_flat_params

    m = tiny(ctx.arch)
    load_flat_params(m, flat)
    idx = client.probe_indices(ctx)
    return float(nn.functional.cross_entropy(m(ctx.train_x[idx]), ctx.train_y[idx]))


def test_v2_local_term_is_measured_on_the_update_actually_sent():
    from algorithms.compressed_fedavg import decode_upload

    client = AscendClient(AscendParams(k=5, distill_steps=0, gamma=None, reward="v2"))
    st = {}
    model = tiny("a", seed=11)
    w_t = flat_params(model)
    bc = _bc("a", 0, model)
    ctx = make_ctx(0, 0, st)
    client.receive(ctx, bc)
    res = client.fit(ctx, bc)
    m = res.metrics
    sent = decode_upload(res.upload)
    assert sent.k == 5 and res.metrics["arm"] == "topk"
    f_before, f_after = _probe_ce(client, ctx, w_t), _probe_ce(client, ctx, w_t + sent.dense())
    assert m["probe_loss"] == pytest.approx(f_before, rel=1e-6)
    assert m["probe_loss_sent"] == pytest.approx(f_after, rel=1e-6)
    assert m["df_sent"] == pytest.approx((f_before - f_after) / f_before, rel=1e-5, abs=1e-9)
    assert m["df_sent"] != 0.0  # five coordinates of the update do change the probe loss
    # both probe forwards are charged to the clock (1/3 of a training step per sample)
    assert res.train_flops == pytest.approx(1e6 * (32 + 2 * 32 / 3))
    T = res.train_flops / 3e9 + res.compress_ops / 3e9 + 0.05 + 8 * res.upload.nbytes / 5e6
    assert m["sim_T"] == pytest.approx(T, rel=1e-12) and m["sim_Tbar"] == pytest.approx(T, rel=1e-12)
    assert st["pending"] == {"round": 0, "arm": "topk", "reason": "warmup", "T": m["sim_T"],
                             "df": m["df_sent"], "tbar": m["sim_Tbar"]}


def test_v2_reward_closes_with_the_servers_dd_and_the_clients_running_mean_T():
    client = AscendClient(AscendParams(k=5, distill_steps=0, gamma=None, reward="v2"))
    st = {}
    Ts, dfs = [], []
    dd = {0: 0.05, 2: -0.3}  # the server's dD of this client's uploads of rounds 0 and 2
    for rnd in (0, 2, 5):
        ctx = make_ctx(1, rnd, st)
        entry = {1: [rnd - (2 if rnd == 2 else 3), dd.get(rnd - (2 if rnd == 2 else 3), 0.0)]} if rnd else {}
        bc = _bc("a", rnd, tiny("a", seed=rnd), dd={**entry, 0: [rnd, 9.9]})  # another client's entry too
        client.receive(ctx, bc)
        res = client.fit(ctx, bc)
        m = res.metrics
        if rnd:  # the previous upload's reward, every part logged
            want = reward_v2(dfs[-1], dd[m["reward_round"]], Ts[-1], float(np.mean(Ts)))
            for key, v in want.items():
                assert m[key] == pytest.approx(v), key
            assert m["reward_df"] == dfs[-1] and m["reward_dd"] == dd[m["reward_round"]]
            assert m["reward_T"] == Ts[-1] and m["reward_tbar"] == pytest.approx(np.mean(Ts))
            assert m["reward_fed"] and not m["reward_lost"]
        Ts.append(m["sim_T"])
        dfs.append(m["df_sent"])
        assert m["sim_Tbar"] == pytest.approx(np.mean(Ts))  # the client's own running mean, this T included
    # round 2's reward (dD = -0.3 < 0) was fed into the warm-up mean of randomk
    pol = st["policy"]
    assert pol.warmup_count.tolist() == [1, 1, 0]
    # an entry of another round (stale) is not used: dD NaN, rho_eff 0
    ctx = make_ctx(1, 9, st)
    bc = _bc("a", 9, dd={1: [2, 0.7]})
    client.receive(ctx, bc)
    m = client.fit(ctx, bc).metrics
    assert m["reward_round"] == 5 and math.isnan(m["reward_dd"]) and m["reward_rho"] == 0.0
    assert m["reward_g"] == pytest.approx(m["reward_df"])


def test_v2_lost_upload_earns_minus_one_for_its_arm():
    client = AscendClient(AscendParams(k=5, distill_steps=0, gamma=None, reward="v2"))
    st = {}
    ctx = make_ctx(0, 0, st)
    bc = _bc("a", 0)
    client.receive(ctx, bc)
    first = client.fit(ctx, bc).metrics
    assert first["arm"] == "topk"
    residual_after_fit = st["residual"].copy()
    client.on_dropped(st, 0)  # deadline / over-selection
    assert st["pending"]["lost"] and "undo" not in st and not np.array_equal(st["residual"], residual_after_fit)
    ctx = make_ctx(0, 1, st)
    bc = _bc("a", 1, dd={0: [0, 0.9]})  # even an entry (impossible for a lost upload) is ignored
    client.receive(ctx, bc)
    m = client.fit(ctx, bc).metrics
    assert m["reward"] == -1.0 and m["reward_lost"] and m["reward_arm"] == "topk" and m["reward_round"] == 0
    assert m["reward_fed"] and math.isnan(m["reward_g"]) and m["reward_T"] == first["sim_T"]
    assert st["policy"].warmup_sum.tolist() == [-1.0, 0.0, 0.0]  # fed to the lost arm
    assert m["arm"] == "randomk"  # the warm-up moves on
    # with a larger clip the lost reward is -clip; EXP3 gets it with the probability of its choice
    exp3 = AscendClient(AscendParams(k=5, policy="exp3", distill_steps=0, gamma=None, reward_clip=2.0, reward="v2"))
    st = {}
    ctx = make_ctx(0, 0, st)
    client_bc = _bc("a", 0)
    exp3.receive(ctx, client_bc)
    arm = exp3.fit(ctx, client_bc).metrics["arm"]
    p_chosen = st["policy"].pending_p[arm]
    exp3.on_dropped(st, 0)
    log_w = st["policy"].log_w.copy()
    ctx = make_ctx(0, 1, st)
    exp3.receive(ctx, _bc("a", 1))
    m = exp3.fit(ctx, _bc("a", 1)).metrics
    assert m["reward"] == -2.0 and m["reward_lost"]
    # r' = (r + 1) / 2 clipped to [0, 1] = 0: the lost arm's weight does not grow, the others shift
    i = st["policy"].arms.index(arm)
    assert p_chosen > 0 and st["policy"].updates[i] == 1
    assert np.allclose(st["policy"].log_w - st["policy"].log_w.max(), log_w - log_w.max())


def test_epsilon_decays_in_the_clients_own_choices_not_in_global_rounds():
    """A client that takes part every 7th round: after its warm-up (3 arms x 2) its t-th choice
    uses eps = max(0.03, min(1, 1 * 3 / t)) whatever the global round number."""
    client = AscendClient(AscendParams(k=5, distill_steps=0, gamma=None, reward="v2"))
    st, eps, reasons = {}, [], []
    for i in range(16):
        rnd = 7 * i
        ctx = make_ctx(2, rnd, st)
        bc = _bc("b", rnd)
        client.receive(ctx, bc)
        m = client.fit(ctx, bc).metrics
        eps.append(m["epsilon"])
        reasons.append(m["arm_reason"])
    assert eps[:6] == [1.0] * 6 and reasons[:6] == ["warmup"] * 6
    assert eps[6:] == pytest.approx([min(1.0, 3 / t) for t in range(1, 11)])  # 1, 1, 1, 0.75, ..., 0.3
    assert st["policy"].post_choices == 10
    assert "exploit" in reasons[6:]  # it does reach exploitation
    # a fixed epsilon stays fixed
    fixed = AscendClient(AscendParams(k=5, distill_steps=0, gamma=None, epsilon=0.2, warmup=0, reward="v2"))
    st = {}
    ctx = make_ctx(2, 40, st)
    fixed.receive(ctx, _bc("b", 40))
    assert fixed.fit(ctx, _bc("b", 40)).metrics["epsilon"] == 0.2


def test_server_dd_per_upload_against_the_previous_teacher():
    """Two clients of one architecture with different arms get different dD (v1 gave every
    client of an architecture the same number); dD is computed by hand from the teacher."""
    from algorithms.compressed_fedavg import decode_upload
    from algorithms.training import load_flat_params

    params, server = make_server(k=6, distill_steps=3, gamma=None, reward="v2")
    client, states = AscendClient(params), {}
    r0 = run_clients(client, server.broadcast(0), 0, states, [0, 1, 2])
    server.aggregate(0, r0)
    tables = server.drain_tables()
    assert all(math.isnan(a["dd"]) for a in tables["alignment"])  # no teacher before round 1
    bc1 = server.broadcast(1)
    assert set(bc1["a"].meta["dd"]) == {0, 1} and set(bc1["b"].meta["dd"]) == {2}
    assert bc1["a"].meta["dd"][0][0] == 0 and math.isnan(bc1["a"].meta["dd"][0][1])
    assert bc1["a"].nbytes == 4 * 83 + 12 * 2 + 4 * 2  # the model, 2 entries, forced flags
    teacher = server.teacher_probe.clone()
    w_t = {a: flat_params(m).clone() for a, m in server.models.items()}
    r1 = run_clients(client, bc1, 1, states, [0, 1, 2])
    assert [r.metrics["arm"] for r in r1] == ["randomk"] * 3
    r1[1].upload.arrays["values"] *= -3.0  # client 1 sent something different
    server.aggregate(1, r1)
    rows = {a["client_id"]: a for a in server.drain_tables()["alignment"]}
    for r in r1:
        m = tiny(r.arch)
        load_flat_params(m, w_t[r.arch])
        d0 = float(kl_teacher_student(teacher, logits_of(m, server.probe_x)))
        load_flat_params(m, w_t[r.arch] + decode_upload(r.upload).dense())
        d1 = float(kl_teacher_student(teacher, logits_of(m, server.probe_x)))
        row = rows[r.client_id]
        assert row["d_before"] == pytest.approx(d0, rel=1e-5) and row["d_after"] == pytest.approx(d1, rel=1e-5)
        assert row["dd"] == pytest.approx((d0 - d1) / d0, rel=1e-4, abs=1e-9) and row["arm"] == "randomk"
    assert rows[0]["dd"] != rows[1]["dd"]
    bc2 = server.broadcast(2)
    assert bc2["a"].meta["dd"][1] == [1, rows[1]["dd"]]
    # the client closes its round-1 reward with exactly that number
    ctx = make_ctx(1, 2, states[1])
    client.receive(ctx, bc2["a"])
    m = client.fit(ctx, bc2["a"]).metrics
    assert m["reward_round"] == 1 and m["reward_dd"] == rows[1]["dd"] and m["reward_rho"] == 0.5
    # entries older than d_history rounds leave the broadcast
    server.params = AscendParams(k=6, distill_steps=3, gamma=None, d_history=2, reward="v2")
    assert set(server.broadcast(3)["a"].meta["dd"]) == {0, 1}  # round 1 >= 3 - 2
    assert server.broadcast(4)["a"].meta["dd"] == {} and server.broadcast(4)["a"].nbytes == 4 * 83 + 4 * 2


def test_two_epsilons_of_the_example_sweep_give_different_arm_sequences(tmp_path):
    """The example sweep's trials (sweeps/examples/ascend_eps_gamma.yaml), on a small stand-in
    data set and model: with its epsilon 0.05 and 0.5, the same seed and the same warm-up, the
    clients' own choices after the warm-up differ."""

    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment
    from sweeps import resolve

    sweep = resolve(REPO / "sweeps" / "examples" / "ascend_eps_gamma.yaml")
    assert sweep.spec.space["algorithm.epsilon"]["grid"] == [None, 0.05, 0.5]
    arms = {}
    for eps in (0.05, 0.5):
        raw = sweep.trial_raw({"algorithm.epsilon": eps, "algorithm.gamma": 0.2})
        raw.update(rounds=9, dataset={"name": "digits"}, model={"name": "mlp"},
                   output={"dir": str(tmp_path), "name": f"eps{eps}"})
        raw["clients"] = {**raw["clients"], "num_clients": 4}
        raw["algorithm"] = {**raw["algorithm"], "distill_steps": 2}
        raw["evaluation"] = {**raw.get("evaluation", {}), "personalized": False}
        cfg = load_config(raw)
        assert cfg.algorithm.epsilon == eps and cfg.algorithm.warmup == 2 and cfg.clients.participation == 1.0
        c = load_run(run_experiment(cfg)).clients.sort_values(["round", "client_id"])
        arms[eps] = c["arm"].tolist()
        assert (c.loc[c["round"] < 6, "arm_reason"] == "warmup").all()
        assert (c.loc[c["round"] >= 6, "epsilon"] == eps).all()
    assert arms[0.05][:24] == arms[0.5][:24]  # the warm-up is the same
    assert arms[0.05][24:] != arms[0.5][24:]
