"""FedAvg with compressed uploads, on a tiny model and hand-built contexts (no engine, no Ray)."""
import numpy as np
import pytest
import torch
import torch.nn as nn
from pydantic import ValidationError

from algorithms.base import ClientContext, TrainSettings
from algorithms.compressed_fedavg import (
    SPEC,
    CompressedFedAvgClient,
    CompressedFedAvgParams,
    CompressedFedAvgServer,
    decode_upload,
)
from algorithms.compressors import randomk_indices, selection_ops
from algorithms.training import flat_params, load_flat_params

NAMES = ["topk", "randomk", "periodick"]


def tiny(bn=False):
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8)] + ([nn.BatchNorm1d(8)] if bn else []) + [nn.ReLU(), nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def data(cid, n=24):
    g = torch.Generator().manual_seed(100 + cid)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def ctx_for(cid, rnd, model, state, n=24):
    x, y = data(cid, n)
    return ClientContext(
        client_id=cid, round=rnd, arch="", model=model, state=state, train_x=x, train_y=y,
        rng=np.random.default_rng([0, rnd, cid]), train=TrainSettings(batch_size=8, lr=0.1),
        flops_per_sample=10.0,
    )


def one_round(params, server, states, rnd, clients=(0, 1), sizes=(24, 24), bn=False):
    client = SPEC.client(params)
    bc = server.broadcast(rnd)[""]
    results = []
    for cid, n in zip(clients, sizes):
        model = tiny(bn)  # the host's workspace model, reset before each client
        ctx = ctx_for(cid, rnd, model, states.setdefault(cid, {}), n)
        client.receive(ctx, bc)
        results.append(client.fit(ctx, bc))
    return results


@pytest.mark.parametrize("name", NAMES)
def test_client_payload_bytes_ops_metrics_and_residual(name):
    params = CompressedFedAvgParams(compressor=name, k=10)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    d = sum(p.numel() for p in tiny().parameters())  # 6*8+8 + 8*3+3 = 83
    states = {}
    (res,) = one_round(params, server, states, 0, clients=(0,), sizes=(24,))
    want = {"topk": 8 * 10, "randomk": 4 * 10 + 8, "periodick": 4 * 10 + 4}[name]
    assert res.upload.nbytes == want == sum(a.nbytes for a in res.upload.arrays.values())
    assert res.compress_ops == selection_ops(name, d, 10)
    assert res.metrics["compressor"] == name and res.metrics["k"] == 10
    assert res.num_samples == 24 and res.train_flops == 10.0 * 24
    residual = states[0]["residual"]
    assert residual.dtype == np.float32 and residual.shape == (d,)
    assert res.metrics["residual_norm"] == pytest.approx(float(np.linalg.norm(residual)), rel=1e-6)
    # sent + residual == the client's whole delta (first round: residual was zero)
    model = tiny()
    load_flat_params(model, server.broadcast(0)[""].arrays["state"][:d])
    ctx = ctx_for(0, 0, model, {})
    start = flat_params(model)
    from algorithms.training import local_sgd
    local_sgd(ctx)
    delta = flat_params(model) - start
    assert torch.equal(decode_upload(res.upload).dense() + torch.from_numpy(residual), delta)


@pytest.mark.parametrize("name", NAMES)
def test_server_reconstructs_exactly_the_sent_coordinates(name):
    params = CompressedFedAvgParams(compressor=name, k=0.1)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    before = flat_params(server.models[""])
    (res,) = one_round(params, server, {}, 3, clients=(5,), sizes=(24,))
    c = decode_upload(res.upload)
    if name == "randomk":
        seed = int(res.upload.arrays["seed"][0])
        assert torch.equal(c.index_tensor(), randomk_indices(before.numel(), c.k, seed))
    metrics = server.aggregate(3, [res])
    after = flat_params(server.models[""])
    sent = c.dense()
    assert torch.equal(after, before + sent)
    changed = (after != before).nonzero().flatten()
    assert set(changed.tolist()) <= set(c.index_tensor().tolist())
    assert metrics["num_aggregated"] == 1


def test_weighted_average_of_two_clients():
    params = CompressedFedAvgParams(compressor="topk", k=20)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    before = flat_params(server.models[""])
    results = one_round(params, server, {}, 0, sizes=(24, 8))
    server.aggregate(0, results)
    want = before + (0.75 * decode_upload(results[0].upload).dense().double()
                     + 0.25 * decode_upload(results[1].upload).dense().double()).float()
    torch.testing.assert_close(flat_params(server.models[""]), want, rtol=0, atol=1e-7)


def test_residual_persists_and_conserves_over_rounds():
    params = CompressedFedAvgParams(compressor="periodick", k=5)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    states = {}
    for rnd in range(4):
        old = states.get(0, {}).get("residual")
        (res,) = one_round(params, server, states, rnd, clients=(0,), sizes=(24,))
        assert res.upload.arrays["offset"][0] == (rnd * 5) % 83
        new = states[0]["residual"]
        if old is not None:
            assert not np.array_equal(old, new)
        server.aggregate(rnd, [res])


def test_without_error_feedback_no_residual():
    params = CompressedFedAvgParams(compressor="randomk", k=5, error_feedback=False)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    states = {}
    (res,) = one_round(params, server, states, 0, clients=(0,), sizes=(24,))
    assert "residual" not in states[0] and res.metrics["residual_norm"] == 0.0


def test_randomk_seed_deterministic_per_round_and_client():
    params = CompressedFedAvgParams(compressor="randomk", k=5)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    a = one_round(params, server, {}, 2)
    b = one_round(params, server, {}, 2)
    c = one_round(params, server, {}, 3)
    seeds = lambda rs: [int(r.upload.arrays["seed"][0]) for r in rs]  # noqa: E731
    assert seeds(a) == seeds(b)
    assert seeds(a)[0] != seeds(a)[1] and seeds(a) != seeds(c)
    assert all(0 <= s < 2**63 for s in seeds(a))


def test_batchnorm_buffers_dense_and_local():
    params = CompressedFedAvgParams(compressor="topk", k=10)
    server = SPEC.server(params, {"": tiny(bn=True)}, seed=0)
    (res,) = one_round(params, server, {}, 0, clients=(0,), sizes=(24,), bn=True)
    assert res.upload.arrays["buffers"].shape == (16,)  # running mean + var of 8 features
    assert res.upload.nbytes == 8 * 10 + 4 * 16
    server.aggregate(0, [res])
    bn = server.models[""][1]
    np.testing.assert_array_equal(bn.running_mean.numpy(), res.upload.arrays["buffers"][:8])

    local = CompressedFedAvgParams(compressor="topk", k=10, buffers="local")
    server = SPEC.server(local, {"": tiny(bn=True)}, seed=0)
    states = {}
    (res,) = one_round(local, server, states, 0, clients=(0,), sizes=(24,), bn=True)
    assert "buffers" not in res.upload.arrays and res.upload.nbytes == 80
    assert states[0]["buffers"].shape == (16,)
    model = tiny(bn=True)
    client = SPEC.client(local)
    client.receive(ctx_for(0, 1, model, states[0]), server.broadcast(1)[""])
    np.testing.assert_array_equal(model[1].running_mean.numpy(), states[0]["buffers"][:8])


def test_params_validation():
    assert SPEC.name == "fedavg_compressed" and SPEC.params is CompressedFedAvgParams
    p = CompressedFedAvgParams()
    assert (p.compressor, p.k, p.error_feedback) == ("topk", 0.01, True)
    assert CompressedFedAvgParams(k=1000).k == 1000 and isinstance(CompressedFedAvgParams(k=1000).k, int)
    assert CompressedFedAvgParams(k=1.0).k == 1.0
    assert CompressedFedAvgParams(k=np.int64(7)).k == 7
    assert CompressedFedAvgParams(k="1e-2").k == 0.01 and CompressedFedAvgParams(k="10").k == 10
    for bad in (0, -1, 0.0, 1.5, True, "ten", "1e5", None):
        with pytest.raises(ValidationError, match="k"):
            CompressedFedAvgParams(k=bad)
    with pytest.raises(ValidationError, match=r"compressor='qsgd' is not allowed.*'qsgd8'"):
        CompressedFedAvgParams(compressor="qsgd")
    assert CompressedFedAvgParams(compressor="qsgd8").compressor == "qsgd8"
    assert CompressedFedAvgParams(op_costs={"qsgd8_per_element": 7}).op_costs == {"qsgd8_per_element": 7.0}
    with pytest.raises(ValidationError, match="op_costs.topk_per_item is not allowed"):
        CompressedFedAvgParams(op_costs={"topk_per_item": 1})
    with pytest.raises(ValidationError):
        CompressedFedAvgParams(unknown=1)
    with pytest.raises(ValidationError):
        CompressedFedAvgParams(op_costs={"topk_per_element": -1})


def test_k_larger_than_model():
    params = CompressedFedAvgParams(compressor="topk", k=1000)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    with pytest.raises(ValueError, match="k=1000"):
        one_round(params, server, {}, 0, clients=(0,), sizes=(24,))
    clamped = CompressedFedAvgParams(compressor="topk", k=1000, clamp_k=True)
    (res,) = one_round(clamped, server, {}, 0, clients=(0,), sizes=(24,))
    assert res.metrics["k"] == 83


def test_client_class_is_spec_client():
    assert SPEC.client is CompressedFedAvgClient and SPEC.server is CompressedFedAvgServer


# ------------------------------------------------------------------------------ lost uploads
def bits(x):
    """The float32 bit patterns (so -0.0 != +0.0 and NaN payloads count)."""
    return np.asarray(x, dtype=np.float32).view(np.int32)


def delta_of(server, cid, rnd, d):
    """The client's local delta of round ``rnd`` from the server's broadcast, recomputed."""
    from algorithms.training import local_sgd

    model = tiny()
    load_flat_params(model, torch.from_numpy(server.broadcast(rnd)[""].arrays["state"][:d]))
    ctx = ctx_for(cid, rnd, model, {})
    start = flat_params(model)
    local_sgd(ctx)
    return flat_params(model) - start


@pytest.mark.parametrize("name", NAMES)
def test_on_dropped_puts_the_sent_values_back_bit_for_bit(name):
    params = CompressedFedAvgParams(compressor=name, k=10)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    client = SPEC.client(params)
    d = 83
    states = {}
    one_round(params, server, states, 0, clients=(0,), sizes=(24,))  # a non-zero residual
    before = states[0]["residual"].copy()
    (res,) = one_round(params, server, states, 1, clients=(0,), sizes=(24,))
    a = torch.from_numpy(before) + delta_of(server, 0, 1, d)  # the accumulated vector of round 1
    st = states[0]
    # the record is small: K values and the positions in their wire form (no dense vector)
    sent = st["sent"]
    assert sent["round"] == 1 and sent["compressor"] == name
    assert sum(v.nbytes for v in sent["arrays"].values()) == res.upload.nbytes
    np.testing.assert_array_equal(sent["arrays"]["values"], res.upload.arrays["values"])
    idx = decode_upload(res.upload).index_tensor()
    assert (st["residual"][idx.numpy()] == 0).all()  # exactly 0 where sent, a elsewhere
    assert not torch.equal(torch.from_numpy(st["residual"]), a)

    after_fit = st["residual"].copy()
    client.on_dropped(st, 0)  # another round: nothing happens
    assert np.array_equal(bits(st["residual"]), bits(after_fit)) and st["sent"]["round"] == 1

    client.on_dropped(st, 1)
    assert torch.equal(torch.from_numpy(st["residual"]), a)
    assert np.array_equal(bits(st["residual"]), bits(a.numpy()))
    assert "sent" not in st  # consumed: a second report changes nothing
    client.on_dropped(st, 1)
    assert np.array_equal(bits(st["residual"]), bits(a.numpy()))

    # the next round accumulates on top of the whole a: nothing of round 1 was lost
    (res2,) = one_round(params, server, states, 2, clients=(0,), sizes=(24,))
    a2 = a + delta_of(server, 0, 2, d)
    assert torch.equal(decode_upload(res2.upload).dense() + torch.from_numpy(states[0]["residual"]), a2)


@pytest.mark.parametrize("name", NAMES)
def test_on_dropped_is_exact_for_signed_zeros_and_infinities(name):
    """``residual[idx] += values`` would give +0.0 for -0.0 and NaN for inf; the write-back is exact."""
    client = SPEC.client(CompressedFedAvgParams(compressor=name, k=40))
    delta = torch.randn(83, generator=torch.Generator().manual_seed(1))
    delta[0:20] = -0.0
    delta[30] = float("inf")
    delta[31] = -float("inf")
    st = {}
    ctx = ctx_for(0, 0, tiny(), st)
    c, _ = client.compress_delta(ctx, delta, name)
    idx = c.index_tensor().numpy()
    assert {30, 31} <= set(idx.tolist()) or name == "randomk"
    naive = st["residual"].copy()
    naive[idx] += c.values.numpy()
    assert not np.array_equal(bits(naive), bits(delta.numpy()))
    client.on_dropped(st, 0)
    assert np.array_equal(bits(st["residual"]), bits(delta.numpy()))


def test_on_dropped_without_error_feedback_is_a_no_op():
    params = CompressedFedAvgParams(compressor="topk", k=5, error_feedback=False)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    states = {}
    one_round(params, server, states, 0, clients=(0,), sizes=(24,))
    assert "sent" not in states[0] and "residual" not in states[0]
    SPEC.client(params).on_dropped(states[0], 0)
    assert "residual" not in states[0]
    SPEC.client(params).on_dropped({}, 0)  # a client without any state


def test_qsgd8_client_round_and_on_dropped():
    params = CompressedFedAvgParams(compressor="qsgd8", k=0.01)  # k is not used by qsgd8
    server = SPEC.server(params, {"": tiny()}, seed=0)
    client = SPEC.client(params)
    states = {}
    one_round(params, server, states, 0, clients=(0,), sizes=(24,))
    before = states[0]["residual"].copy()
    (res,) = one_round(params, server, states, 1, clients=(0,), sizes=(24,))
    d = 83
    assert res.upload.nbytes == d + 4 and res.metrics["k"] == d and res.compress_ops == 70.0 * d
    a = torch.from_numpy(before) + delta_of(server, 0, 1, d)
    sent = decode_upload(res.upload).dense()
    torch.testing.assert_close(sent + torch.from_numpy(states[0]["residual"]), a, rtol=0, atol=1e-6)
    client.on_dropped(states[0], 1)
    np.testing.assert_allclose(states[0]["residual"], a.numpy(), rtol=0, atol=1e-6)


def test_sent_record_is_overwritten_each_round():
    params = CompressedFedAvgParams(compressor="randomk", k=5)
    server = SPEC.server(params, {"": tiny()}, seed=0)
    states = {}
    for rnd in range(3):
        (res,) = one_round(params, server, states, rnd, clients=(0,), sizes=(24,))
        assert states[0]["sent"]["round"] == rnd
        assert states[0]["sent"]["arrays"]["seed"][0] == res.upload.arrays["seed"][0]
        assert sum(v.nbytes for v in states[0]["sent"]["arrays"].values()) == 4 * 5 + 8


def test_engine_run_keeps_the_mass_of_uploads_that_miss_the_deadline(tmp_path, monkeypatch):
    """Through ``run_experiment``: the 5 Mbps clients miss every deadline; each report of a lost
    upload makes the client's residual its whole accumulated vector, which for a client never
    heard is the sum of all its local deltas; the trace's ``residual_norm`` of its next round is
    the norm of that sum minus its Top-K (without the hook it would be a different number)."""
    from engine.clients.host import ClientHost
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    deltas, restored = {}, {}
    compress_delta = CompressedFedAvgClient.compress_delta

    def spy_compress(self, ctx, delta, compressor):
        deltas[(ctx.client_id, ctx.round)] = delta.clone()
        return compress_delta(self, ctx, delta, compressor)

    notify = ClientHost.notify_dropped

    def spy_notify(self, round, client_ids):
        notify(self, round, client_ids)
        for cid in client_ids:
            restored[(int(cid), round)] = self.states[int(cid)]["residual"].copy()

    monkeypatch.setattr(CompressedFedAvgClient, "compress_delta", spy_compress)
    monkeypatch.setattr(ClientHost, "notify_dropped", spy_notify)
    cfg = load_config(None, [
        "dataset.name=digits", "model.name=mlp", "clients.num_clients=6", "clients.participation=1.0",
        "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}, availability: 1.0, dropout: 0.0}",
        "clock.deadline_s=0.05", "algorithm.name=fedavg_compressed", "algorithm.compressor=topk",
        "rounds=3", "evaluation.personalized=false", f"output.dir={tmp_path}",
    ])
    c = load_run(run_experiment(cfg, tmp_path / "deadline")).clients
    late = c["drop_reason"] == "deadline"
    assert late.any() and (~late).any()
    assert (c.loc[late, "net_tier"] == "5mbps").all() and c.loc[~late, "made_deadline"].all()
    dropped = set(zip(c.loc[late, "client_id"], c.loc[late, "round"]))
    assert set(restored) == dropped  # the engine reported exactly the lost uploads
    rounds = sorted(c["round"].unique())
    for cid in sorted({cid for cid, _ in dropped}):
        assert all((cid, r) in dropped for r in rounds)  # never heard: every round lost
        acc = None
        e_without = torch.zeros_like(deltas[(cid, 0)])
        for r in rounds:
            acc = deltas[(cid, r)].clone() if acc is None else acc + deltas[(cid, r)]
            # after the report: the residual is the sum of every local delta so far, bit for bit
            assert np.array_equal(bits(restored[(cid, r)]), bits(acc.numpy()))
            row = c[(c["client_id"] == cid) & (c["round"] == r)].iloc[0]
            k = int(row["k"])
            e_with = acc.clone()
            e_with[torch.topk(acc.abs(), k).indices] = 0
            assert row["residual_norm"] == pytest.approx(float(torch.linalg.vector_norm(e_with)), rel=1e-6)
            a_without = e_without + deltas[(cid, r)]  # the mass a lost upload would have lost
            e_without = a_without.clone()
            e_without[torch.topk(a_without.abs(), k).indices] = 0
            if r > 0:
                assert row["residual_norm"] != pytest.approx(float(torch.linalg.vector_norm(e_without)), rel=1e-3)
