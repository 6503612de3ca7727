"""ASCEND's reused forwards (study throughput): every figure a reused forward gives
is the one the forward itself would give, bit for bit (the paths compared with the reuse off)."""
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers.ascend import RPI4 as PROFILE
from helpers.ascend import data as labelled

from algorithms.ascend import AscendClient, AscendParams, AscendServer
from algorithms.base import ClientContext, ServerContext, TrainSettings
from algorithms.training import flat_params

ARCHS = ("a", "b")


def tiny(arch, seed=0):
    """Two architectures of a hidden layer each (8 and 5 units)."""
    torch.manual_seed(seed)
    hidden = 8 if arch == "a" else 5
    return nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def server(params, n_public):
    x, y = labelled(7, n_public)
    ctx = ServerContext(public_x=x, public_y=y, num_clients=4, client_arch=np.array(["a", "a", "b", "b"], dtype=object))
    return AscendServer(params, {a: tiny(a) for a in ARCHS}, seed=0, context=ctx)


def no_server_reuse(s):
    """The server as before the reuse: every probe forward run again."""
    s.probe_is_public = lambda: False
    plain = s.global_probe_loss
    s.global_probe_loss = lambda logits=None: plain()
    return s


def rounds(s, client, n_rounds=2):
    """Rounds of 4 clients (two per architecture): every server metric and the final models."""
    states = {c: {} for c in range(4)}
    outs = []
    for rnd in range(n_rounds):
        bc = s.broadcast(rnd)
        results = []
        for cid in range(4):
            arch = ARCHS[cid // 2]
            x, y = labelled(100 + cid, 32)
            ctx = ClientContext(
                client_id=cid, round=rnd, arch=arch, model=tiny(arch, seed=99), state=states[cid], train_x=x,
                train_y=y, rng=np.random.default_rng([0, rnd, cid]), train=TrainSettings(batch_size=8, lr=0.1),
                flops_per_sample=1e6, profile=PROFILE,
            )
            client.receive(ctx, bc[arch])
            results.append(client.fit(ctx, bc[arch]))
        outs.append((s.aggregate(rnd, results), [r.metrics for r in results]))
    return outs, {a: flat_params(m) for a, m in s.models.items()}


def same(a, b):
    """Equal dicts of numbers, NaN equal to NaN, bit for bit."""
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and math.isnan(x):
            assert isinstance(y, float) and math.isnan(y), k
        else:
            assert x == y, (k, x, y)


# the probe set is the public split (96 samples) or a part of it; either rollback loss
@pytest.mark.parametrize(("rollback_loss", "probe_size"), [("ce", 512), ("kl", 40)])
def test_server_reuse_gives_the_figures_of_the_forwards_it_saves(rollback_loss, probe_size):
    kw = {"distill_steps": 3, "rollback_loss": rollback_loss, "public_probe_size": probe_size,
          "psi_probe_size": min(probe_size, 32), "k": 0.3}
    fast = server(AscendParams(**kw), 96)
    assert fast.probe_is_public() == (probe_size >= 96)
    got, models = rounds(fast, AscendClient(AscendParams(**kw)))
    want, models_want = rounds(no_server_reuse(server(AscendParams(**kw), 96)), AscendClient(AscendParams(**kw)))
    for (g, gc), (w, wc) in zip(got, want):
        same(g, w)
        for x, y in zip(gc, wc):
            same(x, y)
    assert all(torch.equal(models[a], models_want[a]) for a in ARCHS)
    assert all(o["distill_kl_a"] < o["distill_kl0_a"] for o, _ in got)  # distillation ran


def test_client_reuse_of_the_received_models_logits_changes_nothing():
    """The received model's public logits, run once per architecture and round, are those each
    client's own forward gives: every client metric and the models after the rounds equal."""
    kw = {"distill_steps": 2, "k": 0.3, "psi_probe_size": 32}
    fast = AscendClient(AscendParams(**kw))
    forwards = []
    plain_logits = fast_logits = fast.received_logits.__func__

    def counted(self, ctx, x):
        z = fast_logits(self, ctx, x)
        forwards.append(z)
        return z

    fast.received_logits = counted.__get__(fast)
    got, models = rounds(server(AscendParams(**kw), 96), fast)
    slow = AscendClient(AscendParams(**kw))
    slow.received_logits = lambda ctx, x: plain_logits(AscendClient(AscendParams(**kw)), ctx, x)  # no cache
    want, models_want = rounds(server(AscendParams(**kw), 96), slow)
    for (g, gc), (w, wc) in zip(got, want):
        same(g, w)
        for x, y in zip(gc, wc):
            same(x, y)
    assert all(torch.equal(models[a], models_want[a]) for a in ARCHS)
    assert len(forwards) == 8 and len({id(z) for z in forwards}) == 4  # 8 uploads, a forward per (arch, round)


def test_received_logits_run_again_for_other_bits():
    """A cached forward is reused only for the same bits of state and inputs: -0.0 is not 0.0."""
    client = AscendClient(AscendParams())
    x, y = labelled(1, 8)
    model = tiny("a")
    ctx = ClientContext(client_id=0, round=0, arch="a", model=model, state={}, train_x=x, train_y=y,
                        rng=np.random.default_rng(0), train=TrainSettings(batch_size=8, lr=0.1), flops_per_sample=1.0)
    z = client.received_logits(ctx, x)
    assert client.received_logits(ctx, x.clone()) is z  # equal bits: reused
    with torch.no_grad():
        model[0].bias[0] = 0.0
        z0 = client.received_logits(ctx, x)
        assert z0 is not z
        model[0].bias[0] = -0.0  # torch.equal would call the states equal
        assert client.received_logits(ctx, x) is not z0
    x2 = x.clone()
    x2[0, 0] = torch.nextafter(x2[0, 0], torch.tensor(math.inf))  # one input one ulp off
    z2 = client.received_logits(ctx, x2)
    assert client.received_logits(ctx, x) is not z2
