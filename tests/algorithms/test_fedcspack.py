"""Tests for algorithms/fedcspack.py (offline, CPU, a few seconds).

Expected numbers come from literal hand values or from an independent float64 numpy
implementation written here pack by pack (never from the functions under test).
"""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import REPO
from pydantic import ValidationError

import algorithms.fedcspack as fcs
from algorithms.base import ClientContext, Payload, ServerContext, TrainSettings
from algorithms.fedcspack import (
    SELECTION_OPS_PER_PACK,
    SELECTION_OPS_PER_PARAM,
    SPEC,
    FedCSPACKClient,
    FedCSPACKParams,
    FedCSPACKServer,
    aggregate_packs,
    download_nbytes,
    pack_budget,
    pack_scores,
    pad_to_packs,
    select_packs,
    selection_ops,
    upload_nbytes,
)
from algorithms.training import flat_params, load_flat_params, local_sgd

E = math.e


# ------------------------------------------------------------------ independent reference ---


def _lse(x):
    m = np.max(x)
    return m + np.log(np.sum(np.exp(x - m)))


def ref_scores(local, glob, p, include_padding=True):
    """float64 numpy, one pack at a time: (theta_a, theta[J], beta[J])."""
    lo, gl = np.asarray(local, np.float64), np.asarray(glob, np.float64)
    n = lo.size
    j = -(-n // p)
    lp, gp = np.zeros(j * p), np.zeros(j * p)
    lp[:n], gp[:n] = lo, gl
    den = np.linalg.norm(lo) * np.linalg.norm(gl)
    theta_a = float(lo @ gl / den) if den > 0 else 0.0
    theta, beta = np.zeros(j), np.zeros(j)
    for i in range(j):
        a, b = lp[i * p : (i + 1) * p], gp[i * p : (i + 1) * p]
        if not include_padding and i == j - 1 and n % p:
            a, b = a[: n % p], b[: n % p]
        d = np.linalg.norm(a) * np.linalg.norm(b)
        theta[i] = a @ b / d if d > 0 else 0.0
        lg, ll = b - _lse(b), a - _lse(a)
        beta[i] = np.sum(np.exp(lg) * (lg - ll))
    return theta_a, theta, beta


# hand example: n = 10, P = 4 -> J = 3, the last pack [2, 3] padded with two zeros
G10 = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 2, 3])
L10 = torch.tensor([0.0, 1, 0, 0, 1, 0, 0, 0, 2, 3])
THETA_A = 14 / (4 * math.sqrt(15))  # dot 14, |L|^2 = 15, |G|^2 = 16
THETA = [0.0, 1 / math.sqrt(2), 1.0]
BETA = [
    (E - 1) / (E + 3),  # KL(softmax[1,0,0,0] || softmax[0,1,0,0])
    math.log((E + 3) / (2 * E + 2)) + E / (2 * E + 2),  # KL(sm[1,1,0,0] || sm[1,0,0,0])
    0.0,  # identical packs
]


# ------------------------------------------------------------------------- pure functions ---


def test_pad_to_packs_shape_and_zero_padding():
    packs = pad_to_packs(torch.arange(10.0), 4)
    assert packs.shape == (3, 4)
    assert packs.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 0]]
    assert pad_to_packs(torch.arange(8.0), 4).shape == (2, 4)


def test_pack_scores_hand_values():
    theta_a, theta, beta = pack_scores(L10, G10, 4)
    assert theta_a == pytest.approx(THETA_A, abs=1e-6)
    np.testing.assert_allclose(theta.numpy(), THETA, atol=1e-6)
    np.testing.assert_allclose(beta.numpy(), BETA, atol=1e-6)
    assert BETA[0] == pytest.approx(0.300489, abs=1e-6)  # the literals themselves
    assert BETA[1] == pytest.approx(0.102789, abs=1e-6)


def test_select_packs_hand_values():
    theta_a, theta, beta = pack_scores(L10, G10, 4)
    idx, w = select_packs(theta, theta_a, beta, "all", "cskd")
    assert idx.dtype == torch.long and w.dtype == torch.float32
    assert idx.tolist() == [0, 1]  # pack 2 has theta 1 >= theta_a
    np.testing.assert_allclose(w.numpy(), [BETA[0], THETA[1] + BETA[1]], atol=1e-6)
    _, w_cs = select_packs(theta, theta_a, beta, "all", "cs")
    np.testing.assert_allclose(w_cs.numpy(), [0.0, THETA[1]], atol=1e-6)
    _, w_kd = select_packs(theta, theta_a, beta, "all", "kd")
    np.testing.assert_allclose(w_kd.numpy(), BETA[:2], atol=1e-6)
    idx1, w1 = select_packs(theta, theta_a, beta, 1, "cskd")
    assert idx1.tolist() == [0] and w1.tolist() == pytest.approx([BETA[0]], abs=1e-6)


@pytest.mark.parametrize("n,p", [(1000, 64), (1024, 64), (5, 8), (37, 1)])
@pytest.mark.parametrize("include", [True, False])
def test_pack_scores_match_numpy_reference(n, p, include):
    rng = np.random.default_rng(n + p)
    g = rng.normal(0, 0.5, n).astype(np.float32)
    lo = (g + rng.normal(0, 0.3, n)).astype(np.float32)
    ta, th, be = pack_scores(torch.from_numpy(lo), torch.from_numpy(g), p,
                             kl_padding="include" if include else "exclude")
    rta, rth, rbe = ref_scores(lo, g, p, include_padding=include)
    assert ta == pytest.approx(rta, abs=1e-6)
    np.testing.assert_allclose(th.numpy(), rth, atol=1e-6)
    # float32 inputs: beta's absolute error is ~1e-7 * max|w| (here |w| <= ~2.5)
    np.testing.assert_allclose(be.numpy(), rbe, rtol=1e-4, atol=5e-7)


def test_padding_in_kl_include_vs_exclude():
    # n = 6, P = 4: the last pack is [a, b] + two zeros of padding
    g = torch.tensor([0.0, 0, 0, 0, 1.0, 0.0])
    lo = torch.tensor([0.0, 0, 0, 0, 0.0, 1.0])
    _, th_in, be_in = pack_scores(lo, g, 4, kl_padding="include")
    _, th_ex, be_ex = pack_scores(lo, g, 4, kl_padding="exclude")
    # exclude: KL(sm[1,0] || sm[0,1]) = e/(e+1) * 1 + 1/(e+1) * (-1) = (e-1)/(e+1)
    assert be_ex[1].item() == pytest.approx((E - 1) / (E + 1), abs=1e-6)
    # include: KL(sm[1,0,0,0] || sm[0,1,0,0]) = (e-1)/(e+3): the padded zeros are equal logits,
    # but they take softmax mass, so beta differs
    assert be_in[1].item() == pytest.approx((E - 1) / (E + 3), abs=1e-6)
    assert th_in[1].item() == th_ex[1].item() == 0.0  # padding never changes the cosine
    assert be_in[0].item() == be_ex[0].item() == 0.0


def test_zero_packs_give_no_nan():
    g = torch.tensor([0.0, 0, 0, 0, 1, 2, 3, 4, 0, 0])
    lo = torch.tensor([0.0, 0, 0, 0, 1, 2, 3, 5, 0.5, 0])
    ta, th, be = pack_scores(lo, g, 4)
    assert torch.isfinite(th).all() and torch.isfinite(be).all()
    assert th[0].item() == 0.0 and th[2].item() == 0.0  # both-zero and global-zero packs
    assert be[0].item() == 0.0
    ta0, th0, be0 = pack_scores(torch.zeros(10), torch.zeros(10), 4)
    assert ta0 == 0.0 and th0.tolist() == [0.0] * 3 and be0.tolist() == [0.0] * 3
    idx, w = select_packs(th0, ta0, be0, "all", "cskd")
    assert idx.numel() == 0 and w.numel() == 0


def _all_huge():
    rng = np.random.default_rng(1)
    g = rng.normal(0, 1, 40) * 200  # exp would overflow float32
    return g, g + rng.normal(0, 30, 40)


def _mixed_ranges():
    # P = 8; per pack: ordinary, all far below exp's range, one value above it, all above it,
    # values near the fast path's limits (partition sums just inside [1e-30, 1e30])
    rng = np.random.default_rng(5)
    g = rng.normal(0, 0.5, 40)
    g[8:16] -= 95.0
    g[19] = 120.0
    g[24:32] += 100.0
    g[32:40] = rng.uniform(-60.0, 60.0, 8)
    return g, g + rng.normal(0, 0.3, 40)


@pytest.mark.parametrize("make,rtol,atol", [(_all_huge, 1e-6, 1e-9), (_mixed_ranges, 1e-4, 1e-6)])
def test_weights_beyond_the_fast_exp_range_take_the_stable_path(make, rtol, atol):
    g, lo = (x.astype(np.float32) for x in make())
    _, th, be = pack_scores(torch.from_numpy(lo), torch.from_numpy(g), 8)
    _, rth, rbe = ref_scores(lo, g, 8)
    assert torch.isfinite(be).all()
    np.testing.assert_allclose(be.numpy(), rbe, rtol=rtol, atol=atol)
    np.testing.assert_allclose(th.numpy(), rth, atol=1e-6)


def test_identical_models_share_nothing_but_zero_packs():
    w = torch.tensor([0.3, -1.2, 0.7, 2.0, 0.1, 0.0, 0.0, 0.0, 0.0])
    ta, th, be = pack_scores(w, w.clone(), 3)
    assert ta == pytest.approx(1.0, abs=1e-12)
    idx, wt = select_packs(th, ta, be, "all", "cskd")
    assert idx.tolist() == [2] and wt.tolist() == [0.0]  # the all-zero pack: theta 0, beta 0


THETA10 = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.2, 0.95, 0.0, 0.4, 0.8, 0.7], dtype=torch.float64)
BETA10 = torch.arange(10, dtype=torch.float64) / 100


@pytest.mark.parametrize(
    "k,expected",
    [
        ("all", [0, 1, 3, 4, 6, 7, 8, 9]),  # every candidate (theta < 0.85)
        (100, [0, 1, 3, 4, 6, 7, 8, 9]),
        (0.99, [0, 1, 3, 4, 6, 7, 8, 9]),  # floor(9.9) = 9 >= the 8 candidates
        (3, [1, 4, 6]),  # the three lowest theta: 0.0 (6), 0.1 (1), 0.2 (4)
        (0.3, [1, 4, 6]),  # floor(0.3 * 10) = 3
        (0.25, [1, 6]),  # floor(2.5) = 2
        (0.01, [6]),  # at least one
        (1, [6]),
    ],
)
def test_top_k_cap(k, expected):
    idx, w = select_packs(THETA10, 0.85, BETA10, k, "cskd")
    assert idx.tolist() == expected
    np.testing.assert_allclose(w.numpy(), (THETA10 + BETA10)[expected].numpy(), rtol=1e-6)


def test_top_k_ties_break_by_index():
    theta = torch.tensor([0.2, 0.1, 0.1, 0.1, 0.5], dtype=torch.float64)
    idx, _ = select_packs(theta, 0.9, torch.zeros(5, dtype=torch.float64), 2, "cs")
    assert idx.tolist() == [1, 2]


def test_pack_budget_values_and_errors():
    assert pack_budget("all", 10) is None
    assert pack_budget(4, 10) == 4
    assert pack_budget(0.5, 7) == 3
    assert pack_budget(0.3, 10) == 3  # 0.3 * 10 = 3.0000000000000004 in floating point
    for bad in (0, -1, 0.0, 1.5, "half", True):
        with pytest.raises(ValueError):
            pack_budget(bad, 10)
    with pytest.raises(ValueError, match="ambiguous"):
        pack_budget(1.0, 10)
    with pytest.raises(ValueError):
        select_packs(THETA10, 0.85, BETA10, "all", "cosine")


def test_aggregate_overlapping_packs_exact_numbers():
    g = torch.arange(10.0)  # packs [0..3], [4..7], [8, 9, pad, pad]
    a = ([0, 1], [1.0, 3.0], np.array([[1.0] * 4, [4.0] * 4], np.float32))
    b = ([1, 2], [1.0, 2.0], np.array([[8.0] * 4, [10.0, 20.0, 30.0, 40.0]], np.float32))
    c = ([2], [0.0], np.array([[100.0] * 4], np.float32))  # weight 0: contributes nothing
    new, midx, mw = aggregate_packs(g, 4, [a, b, c])
    # pack 0: only a -> +1; pack 1: M = 4 -> 3/4 * 4 + 1/4 * 8 = 5; pack 2: b alone -> +[10, 20]
    expected = [1, 2, 3, 4, 9, 10, 11, 12, 18, 29]
    assert new.shape == (10,)  # padding (30, 40) stripped
    assert new.tolist() == expected
    assert midx.tolist() == [0, 1, 2]
    assert mw.tolist() == [1.0, 4.0, 2.0]


def test_aggregate_disjoint_and_degenerate_cases():
    g = torch.arange(10.0)
    a = (np.array([0], np.int32), np.array([0.5], np.float32), np.full((1, 4), 2.0, np.float32))
    b = (np.array([2], np.int32), np.array([2.0], np.float32), np.full((1, 4), -1.0, np.float32))
    new, midx, mw = aggregate_packs(g, 4, [a, b])
    assert new.tolist() == [2, 3, 4, 5, 4, 5, 6, 7, 7, 8]  # pack 1 unchanged
    assert midx.tolist() == [0, 2] and mw.tolist() == [0.5, 2.0]
    # every weight at a position 0 -> unchanged, no division by zero, empty mask
    z = ([1], [0.0], np.full((1, 4), 9.0, np.float32))
    new, midx, mw = aggregate_packs(g, 4, [z])
    assert new.tolist() == g.tolist() and midx.numel() == 0 and mw.numel() == 0
    # nobody uploaded / an empty upload
    empty = (np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros((0, 4), np.float32))
    for uploads in ([], [empty]):
        new, midx, _ = aggregate_packs(g, 4, uploads)
        assert new.tolist() == g.tolist() and midx.numel() == 0
    with pytest.raises(ValueError):
        aggregate_packs(g, 4, [([3], [1.0], np.zeros((1, 4), np.float32))])  # J = 3
    with pytest.raises(ValueError):
        aggregate_packs(g, 4, [([0, 1], [1.0], np.zeros((2, 4), np.float32))])


def test_byte_accounting():
    # k = 3 of J = 100 packs of 1024: 4*1024*3 + min(4*3, ceil(100/8) = 13) + 4*3
    assert upload_nbytes(3, 100, 1024) == 12288 + 12 + 12
    # k = 10: the 13-byte bitmap is smaller than 40 bytes of indices
    assert upload_nbytes(10, 100, 1024) == 40960 + 13 + 40
    assert upload_nbytes(0, 100, 1024) == 0
    # download: 4*n + ceil(J/8) + 4*|mask|
    assert download_nbytes(1000, 10, 4) == 4000 + 2 + 16
    assert download_nbytes(1000, 10, 0) == 4002


def test_selection_op_count():
    assert SELECTION_OPS_PER_PARAM == 21 and SELECTION_OPS_PER_PACK == 12
    assert selection_ops(10, 4) == 21 * 12 + 12 * 3  # padded J*P = 12 values, J = 3 packs
    assert selection_ops(10, 4, num_sorted=4) == 21 * 12 + 12 * 3 + 4 * 2


# ------------------------------------------------------------------------------- params ---


def test_params_defaults_and_types():
    p = FedCSPACKParams()
    assert (p.name, p.pack_size, p.k, p.weighting) == ("fedcspack", 1024, "all", "cskd")
    assert (p.personalization, p.sharing, p.record_packs) == ("own_mask", "packs", False)
    assert FedCSPACKParams(k=3).k == 3 and isinstance(FedCSPACKParams(k=3).k, int)
    assert FedCSPACKParams(k=0.5).k == 0.5
    assert FedCSPACKParams(k=1).k == 1  # one pack
    assert SPEC.name == "fedcspack" and SPEC.params is FedCSPACKParams
    assert SPEC.client is FedCSPACKClient and SPEC.server is FedCSPACKServer


@pytest.mark.parametrize(
    "kwargs,field,allowed",
    [
        ({"pack_size": 0}, "pack_size", ">= 1"),
        ({"pack_size": 2.5}, "pack_size", ">= 1"),
        ({"pack_size": True}, "pack_size", ">= 1"),
        ({"k": 0}, "k", "'all'"),
        ({"k": 1.5}, "k", "(0, 1)"),
        ({"k": 1.0}, "k", "ambiguous (one of the packs or all of them?)"),
        ({"k": "most"}, "k", "'all'"),
        ({"k": False}, "k", "'all'"),
        ({"weighting": "cos"}, "weighting", "'cskd', 'cs' or 'kd'"),
        ({"personalization": "x"}, "personalization", "'own_mask', 'global_mask' or 'none'"),
        ({"sharing": "some"}, "sharing", "'packs' or 'full'"),
        ({"name": "fedavg"}, "name", "'fedcspack'"),
        ({"topk": 3}, "topk", "Extra inputs"),
    ],
)
def test_params_validation_errors(kwargs, field, allowed):
    with pytest.raises(ValidationError) as err:
        FedCSPACKParams(**kwargs)
    text = str(err.value)
    assert field in text and allowed in text


# ------------------------------------------------------------------ client / server halves ---


def make_ctx(model, state=None, seed=0, n=20, lr=0.1, epochs=1, client_id=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen)
    y = torch.randint(0, 2, (n,), generator=gen)
    return ClientContext(
        client_id=client_id, round=0, arch="", model=model,
        state={} if state is None else state, train_x=x, train_y=y,
        rng=np.random.default_rng(seed),
        train=TrainSettings(local_epochs=epochs, batch_size=4, lr=lr),
        flops_per_sample=10.0,
    )


def broadcast_of(params, mask_idx=(), mask_w=()):
    arr = np.asarray(params, np.float32)
    return Payload(arrays={"params": arr, "mask_idx": np.asarray(mask_idx, np.int32),
                           "mask_w": np.asarray(mask_w, np.float32)}, nbytes=0)


GLOBAL8 = np.arange(8, dtype=np.float32) + 100  # nn.Linear(3, 2): 6 weights + 2 biases
PERSONAL8 = -np.arange(8, dtype=np.float32) - 1  # P = 3 -> packs [0..2], [3..5], [6, 7, pad]


def _receive(personalization, state, mask_idx=(0, 2)):
    torch.manual_seed(0)
    client = FedCSPACKClient(FedCSPACKParams(pack_size=3, personalization=personalization))
    ctx = make_ctx(nn.Linear(3, 2), state=state)
    client.receive(ctx, broadcast_of(GLOBAL8, mask_idx, [1.0] * len(mask_idx)))
    return flat_params(ctx.model).numpy()


@pytest.mark.parametrize("rule", ["own_mask", "global_mask", "none"])
def test_first_time_client_takes_the_whole_global_model(rule):
    np.testing.assert_array_equal(_receive(rule, {}), GLOBAL8)


def test_receive_own_mask_overwrites_only_own_last_shared_packs():
    state = {fcs._PERSONAL: torch.from_numpy(PERSONAL8.copy()), fcs._SHARED: torch.tensor([1])}
    got = _receive("own_mask", state)
    np.testing.assert_array_equal(got, [-1, -2, -3, 103, 104, 105, -7, -8])
    state[fcs._SHARED] = torch.tensor([0, 2])  # including the padded last pack
    got = _receive("own_mask", state)
    np.testing.assert_array_equal(got, [100, 101, 102, -4, -5, -6, 106, 107])
    state[fcs._SHARED] = torch.zeros(0, dtype=torch.long)  # shared nothing: keeps all local
    np.testing.assert_array_equal(_receive("own_mask", state), PERSONAL8)


def test_receive_global_mask_overwrites_the_broadcast_mask_packs():
    state = {fcs._PERSONAL: torch.from_numpy(PERSONAL8.copy()), fcs._SHARED: torch.tensor([1])}
    got = _receive("global_mask", state, mask_idx=(0, 2))
    np.testing.assert_array_equal(got, [100, 101, 102, -4, -5, -6, 106, 107])
    np.testing.assert_array_equal(_receive("global_mask", state, mask_idx=()), PERSONAL8)


def test_receive_none_takes_everything():
    state = {fcs._PERSONAL: torch.from_numpy(PERSONAL8.copy()), fcs._SHARED: torch.tensor([1])}
    np.testing.assert_array_equal(_receive("none", state), GLOBAL8)


def test_buffers_stay_local():
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))  # 6 + 2 + 2 + 2 = 12 params
    saved = {"1.running_mean": torch.tensor([0.5, -0.5]), "1.running_var": torch.tensor([2.0, 3.0]),
             "1.num_batches_tracked": torch.tensor(7)}
    ctx = make_ctx(model, state={fcs._BUFFERS: saved})
    client = FedCSPACKClient(FedCSPACKParams(pack_size=5, personalization="none"))
    g = np.linspace(-1, 1, 12).astype(np.float32)
    client.receive(ctx, broadcast_of(g))
    np.testing.assert_array_equal(flat_params(model).numpy(), g)
    assert model[1].running_mean.tolist() == [0.5, -0.5]
    assert model[1].running_var.tolist() == [2.0, 3.0]
    assert int(model[1].num_batches_tracked) == 7
    client.fit(ctx, broadcast_of(g))
    kept = ctx.state[fcs._BUFFERS]
    assert torch.equal(kept["1.running_mean"], model[1].running_mean)  # the trained statistics
    assert not torch.equal(kept["1.running_mean"], saved["1.running_mean"])
    assert int(kept["1.num_batches_tracked"]) == 7 + 5  # 20 samples, batch 4


def test_fit_upload_state_and_metrics():
    torch.manual_seed(0)
    params = FedCSPACKParams(pack_size=3, record_packs=True)
    client = FedCSPACKClient(params)
    ctx = make_ctx(nn.Linear(3, 2), lr=0.5, epochs=2, seed=1)
    g = np.array([0.03, -0.02, 0.05, 0.01, 0.04, -0.06, 0.001, -0.002], np.float32)
    bc = broadcast_of(g)
    client.receive(ctx, bc)
    res = client.fit(ctx, bc)
    local = flat_params(ctx.model).numpy()
    ta, th, be = ref_scores(local, g, 3)
    expected_idx = [j for j in range(3) if th[j] < ta]
    assert expected_idx == [1, 2]  # the test is about something
    up = res.upload.arrays
    assert up["idx"].dtype == np.int32 and up["w"].dtype == np.float32
    assert up["delta"].dtype == np.float32 and up["delta"].shape == (len(expected_idx), 3)
    assert up["idx"].tolist() == expected_idx
    np.testing.assert_allclose(up["w"], np.abs(th + be)[expected_idx], rtol=1e-5, atol=1e-7)
    padded_delta = np.zeros(9, np.float32)
    padded_delta[:8] = local - g
    np.testing.assert_allclose(up["delta"], padded_delta.reshape(3, 3)[expected_idx], atol=1e-7)
    assert res.upload.nbytes == upload_nbytes(len(expected_idx), 3, 3)
    assert res.num_samples == 20 and res.train_flops == 10.0 * 40
    assert res.compress_ops == selection_ops(8, 3)
    m = res.metrics
    assert m["packs_total"] == 3 and m["packs_shared"] == len(expected_idx)
    assert m["packs_below_threshold"] == len(expected_idx)
    assert m["theta_a"] == pytest.approx(ta, abs=1e-6)
    assert m["mask_w_mean"] == pytest.approx(float(np.mean(up["w"])), rel=1e-6)
    assert m["mask_w_min"] == pytest.approx(float(up["w"].min()))
    assert m["mask_w_max"] == pytest.approx(float(up["w"].max()))
    assert "shared_packs" not in m  # pack-level traces go to packs.parquet, not clients.parquet
    assert math.isfinite(m["train_loss"])
    # state: personal params, last shared packs, buffers - and nothing else (no W_prev kept)
    assert set(ctx.state) == {fcs._PERSONAL, fcs._SHARED, fcs._SHARED_ROUND, fcs._BUFFERS}
    assert ctx.state[fcs._SHARED_ROUND] == 0
    np.testing.assert_array_equal(ctx.state[fcs._PERSONAL].numpy(), local)
    assert ctx.state[fcs._SHARED].tolist() == expected_idx
    np.testing.assert_array_equal(bc.arrays["params"], g)  # the broadcast was not modified


def test_fit_state_per_personalization_rule():
    for rule, keys in [("global_mask", {fcs._PERSONAL, fcs._BUFFERS}), ("none", {fcs._BUFFERS})]:
        client = FedCSPACKClient(FedCSPACKParams(pack_size=3, personalization=rule))
        state = {fcs._PERSONAL: torch.zeros(8), fcs._SHARED: torch.tensor([0])}
        ctx = make_ctx(nn.Linear(3, 2), state=state)
        bc = broadcast_of(GLOBAL8 / 100)
        client.receive(ctx, bc)
        client.fit(ctx, bc)
        assert set(ctx.state) == keys


def test_fit_sharing_nothing_gives_nan_mask_stats():
    # a zero global model: theta_a = 0 and no pack has theta < 0 -> nothing shared
    client = FedCSPACKClient(FedCSPACKParams(pack_size=3))
    ctx = make_ctx(nn.Linear(3, 2))
    bc = broadcast_of(np.zeros(8, np.float32))
    client.receive(ctx, bc)
    res = client.fit(ctx, bc)
    m = res.metrics
    assert m["packs_shared"] == 0 and m["theta_a"] == 0.0
    assert all(math.isnan(m[c]) for c in ("mask_w_mean", "mask_w_min", "mask_w_max"))
    assert res.upload.arrays["delta"].shape == (0, 3) and res.upload.nbytes == 0
    assert ctx.state[fcs._SHARED].numel() == 0


def test_k_all_no_personalization_full_sharing_is_an_unweighted_average():
    torch.manual_seed(3)
    params = FedCSPACKParams(pack_size=3, k="all", personalization="none", sharing="full")
    template = nn.Linear(3, 2)
    server = FedCSPACKServer(params, {"": copy.deepcopy(template)}, seed=0)
    client = FedCSPACKClient(params)
    g0 = flat_params(server.models[""]).clone()
    bc = server.broadcast(0)[""]
    results, locals_ = [], []
    for cid in range(3):
        ctx = make_ctx(copy.deepcopy(template), seed=10 + cid, client_id=cid)
        client.receive(ctx, bc)
        res = client.fit(ctx, bc)
        assert res.upload.arrays["w"].tolist() == [1.0, 1.0, 1.0]
        assert res.compress_ops == 0.0
        results.append(res)
        # the same training, done directly
        ref_model = copy.deepcopy(template)
        load_flat_params(ref_model, g0.clone())
        local_sgd(make_ctx(ref_model, seed=10 + cid, client_id=cid))
        locals_.append(flat_params(ref_model))
    metrics = server.aggregate(0, results)
    expected = g0 + torch.stack([lo - g0 for lo in locals_]).mean(0)
    np.testing.assert_allclose(flat_params(server.models[""]).numpy(), expected.numpy(), atol=1e-6)
    assert metrics["global_mask_packs"] == 3 and metrics["aggregated_clients"] == 3


def test_server_broadcast_and_global_mask():
    torch.manual_seed(0)
    params = FedCSPACKParams(pack_size=3, record_packs=True)
    server = FedCSPACKServer(params, {"": nn.Linear(3, 2)}, seed=0, context=ServerContext())
    bc = server.broadcast(0)[""]
    g = flat_params(server.models[""]).numpy()
    assert bc.arrays["params"].dtype == np.float32 and bc.arrays["mask_idx"].dtype == np.int32
    assert bc.arrays["mask_w"].dtype == np.float32
    np.testing.assert_array_equal(bc.arrays["params"], g)
    assert bc.arrays["mask_idx"].size == 0 and bc.nbytes == 4 * 8 + 1
    ups = [
        Payload({"idx": np.array([0], np.int32), "w": np.array([2.0], np.float32),
                 "delta": np.full((1, 3), 1.0, np.float32)}, 0),
        Payload({"idx": np.array([0, 2], np.int32), "w": np.array([2.0, 0.5], np.float32),
                 "delta": np.array([[3.0, 3.0, 3.0], [1.0, 2.0, 99.0]], np.float32)}, 0),
    ]
    results = [fcs.ClientResult(client_id=i, arch="", upload=u, num_samples=1, train_flops=0.0)
               for i, u in enumerate(ups)]
    metrics = server.aggregate(0, results)
    expected = g.copy()
    expected[0:3] += 2.0  # (2*1 + 2*3) / 4
    expected[6:8] += [1.0, 2.0]  # padding value 99 stripped
    np.testing.assert_allclose(flat_params(server.models[""]).numpy(), expected, atol=1e-6)
    assert metrics == {"global_mask_packs": 2, "packs_total": 3, "aggregated_clients": 2}
    tables = server.drain_tables()
    assert tables["global_mask"]["pack"].tolist() == [0, 2]
    assert server.drain_tables() == {}  # drained
    bc = server.broadcast(1)[""]
    assert bc.arrays["mask_idx"].tolist() == [0, 2] and bc.arrays["mask_w"].tolist() == [4.0, 0.5]
    assert bc.nbytes == 4 * 8 + 1 + 4 * 2
    server.aggregate(1, [])  # nobody arrived: model unchanged, empty mask
    np.testing.assert_allclose(flat_params(server.models[""]).numpy(), expected, atol=1e-6)
    assert server.broadcast(2)[""].arrays["mask_idx"].size == 0


def test_read_only_arrays_from_the_transport_are_accepted_silently():
    import warnings

    def ro(a):
        a = np.array(a)
        a.flags.writeable = False
        return a

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new, midx, _ = aggregate_packs(ro(np.arange(10, dtype=np.float32)), 4, [
            (ro(np.array([0, 2], np.int32)), ro(np.array([1.0, 1.0], np.float32)),
             ro(np.ones((2, 4), np.float32)))])
        assert new.tolist() == [1, 2, 3, 4, 4, 5, 6, 7, 9, 10] and midx.tolist() == [0, 2]
        state = {fcs._PERSONAL: torch.from_numpy(PERSONAL8.copy())}
        client = FedCSPACKClient(FedCSPACKParams(pack_size=3, personalization="global_mask"))
        ctx = make_ctx(nn.Linear(3, 2), state=state)
        bc = Payload(arrays={"params": ro(GLOBAL8), "mask_idx": ro(np.array([1], np.int32)),
                             "mask_w": ro(np.array([1.0], np.float32))}, nbytes=0)
        client.receive(ctx, bc)
        np.testing.assert_array_equal(flat_params(ctx.model).numpy(),
                                      [-1, -2, -3, 103, 104, 105, -7, -8])
        client.fit(ctx, bc)


def test_engine_run_writes_fedcspack_traces_and_pack_tables(tmp_path):
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    cfg = load_config(None, [
        "dataset.name=digits", "model.name=mlp", "clients.num_clients=6", "clients.participation=0.5",
        "clients.profiles={availability: 1.0, dropout: 0.0}", "rounds=2",
        "algorithm.name=fedcspack", "algorithm.pack_size=256", "algorithm.record_packs=true",
    ])
    run = load_run(run_experiment(cfg, tmp_path / "run"))
    c = run.clients
    for col in ("packs_total", "packs_below_threshold", "packs_shared", "mask_w_mean",
                "mask_w_min", "mask_w_max", "theta_a"):
        assert col in c.columns, col
    assert (c["packs_total"] == math.ceil(4810 / 256)).all()
    assert (c["packs_shared"] <= c["packs_below_threshold"]).all()
    packs = run.table("packs")
    # one row per shared pack of every arrived client, matching the per-client counts
    counts = packs.groupby(["round", "client_id"]).size()
    arrived = c[c["made_deadline"] & (c["packs_shared"] > 0)].set_index(["round", "client_id"])
    assert counts.sort_index().tolist() == arrived["packs_shared"].sort_index().tolist()
    assert list(packs.columns) == ["round", "client_id", "arch", "pack", "weight"]
    mask = run.table("global_mask")
    last = run.rounds.set_index("round")["server_global_mask_packs"]
    assert mask.groupby("round").size().to_dict() == {r: n for r, n in last.items() if n}
    # upload bytes follow the spec: values + min(indices, bitmap) + weights
    k = c["packs_shared"]
    j = math.ceil(4810 / 256)
    expect = 4 * 256 * k + np.minimum(4 * k, math.ceil(j / 8)) + 4 * k
    assert (c["bytes_up"] == np.where(k > 0, expect, 0)).all()


def _study_module():
    import importlib.util

    path = REPO / "studies" / "fedcspack_study.py"
    spec = importlib.util.spec_from_file_location("fedcspack_study", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_study_summary_compares_each_seed_with_its_own_fedavg():
    import pandas as pd

    study = _study_module()
    rows = [  # (seed, group, config, pers_acc, upload_MB)
        (0, "main", "fedavg", 0.80, 10.0), (0, "main", "fedcspack", 0.85, 4.0),
        (0, "ablation", "cs", 0.82, 5.0),
        (1, "main", "fedavg", 0.90, 20.0), (1, "main", "fedcspack", 0.89, 5.0),
        (1, "ablation", "cs", 0.91, 10.0),
    ]
    table = pd.DataFrame(rows, columns=["seed", "group", "config", "pers_acc", "upload_MB"])
    full = study.with_reference_rows(table, ["main", "ablation"])
    assert full["seed"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]  # cskd = the main fedcspack row
    cskd = full[full["config"] == "cskd"]
    assert cskd["pers_acc"].tolist() == [0.85, 0.89]
    fcs_rows = full[full["config"] == "fedcspack"]
    assert fcs_rows["pers_acc_vs_fedavg"].tolist() == pytest.approx([0.05, -0.01])
    assert fcs_rows["upload_vs_fedavg"].tolist() == pytest.approx([0.6, 0.75])
    mean = study.mean_over_seeds(full).set_index(["group", "config"])
    row = mean.loc[("main", "fedcspack")]
    assert row["seeds"] == 2
    assert row["pers_acc"] == pytest.approx(0.87)
    assert (row["pers_acc_min"], row["pers_acc_max"]) == (0.85, 0.89)
    assert row["pers_acc_vs_fedavg"] == pytest.approx(0.02)
    assert mean.loc[("ablation", "cs"), "upload_vs_fedavg"] == pytest.approx(0.5)


# ---------------------------------------------------------------- decisions (version 2) ---


def test_beta_is_exactly_zero_for_packs_of_one_value():
    rng = np.random.default_rng(11)
    g = rng.normal(0, 0.5, 50).astype(np.float32)
    lo = (g + rng.normal(0, 0.3, 50)).astype(np.float32)
    lo[:5] = g[:5] * 400  # some beyond exp's range: the stable path agrees
    _, theta, beta = pack_scores(torch.from_numpy(lo), torch.from_numpy(g), 1)
    assert beta.numel() == 50 and torch.all(beta == 0.0)
    # the server then changes no parameter on account of beta: kd weights are all 0
    _, w = select_packs(theta, 0.9999, beta, "all", "kd")
    assert torch.all(w == 0.0)
    # a last pack of one real value when the padding is excluded
    _, _, be = pack_scores(torch.from_numpy(lo[:9]), torch.from_numpy(g[:9]), 4, kl_padding="exclude")
    assert be[2].item() == 0.0 and be[0].item() > 0.0


def test_kd_weights_of_a_real_cnn_update_match_float64():
    """The `cnn` (the reference's MNIST CNN: 44,426 parameters, 44 packs of 1024) after a few SGD steps: kd
    weights ``|beta|`` are 1e-7 .. 1e-4 here; each within 1e-5 relative of float64."""
    from engine.models.zoo import build_model

    torch.manual_seed(0)
    model = build_model("cnn", (1, 28, 28), 10)
    g = flat_params(model).clone()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 1, 28, 28, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(4):
        opt.zero_grad()
        F_loss = nn.functional.cross_entropy(model(x[16 * step:16 * step + 16]), y[16 * step:16 * step + 16])
        F_loss.backward()
        opt.step()
    lo = flat_params(model)
    theta_a, theta, beta = pack_scores(lo, g, 1024)
    rta, rth, rbe = ref_scores(lo.numpy(), g.numpy(), 1024)
    assert beta.numel() == 44 and 0 < rbe.min() and rbe.max() < 1e-3  # the regime that matters
    np.testing.assert_allclose(beta.numpy(), rbe, rtol=1e-5)
    np.testing.assert_allclose(theta.numpy(), rth, rtol=1e-12)
    assert theta_a == pytest.approx(rta, rel=1e-12)
    # the weights that travel (float32) keep that accuracy, for every weighting
    for weighting, ref in (("kd", np.abs(rbe)), ("cs", np.abs(rth)), ("cskd", np.abs(rth + rbe))):
        idx, w = select_packs(theta, theta_a, beta, "all", weighting)
        assert idx.tolist() == [j for j in range(44) if rth[j] < rta]
        np.testing.assert_allclose(w.numpy(), ref[idx.numpy()], rtol=1e-5)


def _fit_once(client, state, g, round_):
    ctx = make_ctx(nn.Linear(3, 2), state=state, lr=0.5, epochs=2, seed=1)
    ctx.round = round_
    bc = broadcast_of(g)
    client.receive(ctx, bc)
    res = client.fit(ctx, bc)
    return ctx, res


def test_packs_of_a_lost_upload_stay_personal():
    client = FedCSPACKClient(FedCSPACKParams(pack_size=3))
    g = np.array([0.03, -0.02, 0.05, 0.01, 0.04, -0.06, 0.001, -0.002], np.float32)
    state: dict = {}
    ctx, res = _fit_once(client, state, g, round_=4)
    assert res.upload.arrays["idx"].tolist() == [1, 2]  # shared packs 1 and 2
    personal = ctx.state[fcs._PERSONAL].numpy().copy()
    client.on_dropped(ctx.state, 3)  # another round's loss: nothing changes
    assert ctx.state[fcs._SHARED].tolist() == [1, 2]
    client.on_dropped(ctx.state, 4)  # this upload was lost: nothing counts as shared
    assert ctx.state[fcs._SHARED].numel() == 0
    # next round: own_mask overwrites no pack; the whole trained model stays personal
    nxt = make_ctx(nn.Linear(3, 2), state=ctx.state)
    client.receive(nxt, broadcast_of(GLOBAL8))
    np.testing.assert_array_equal(flat_params(nxt.model).numpy(), personal)
    # whereas an upload that arrived: its packs 1 and 2 are overwritten by the global model
    ctx2, _ = _fit_once(client, {}, g, round_=4)
    arrived = make_ctx(nn.Linear(3, 2), state=ctx2.state)
    client.receive(arrived, broadcast_of(GLOBAL8))
    got = flat_params(arrived.model).numpy()
    np.testing.assert_array_equal(got[3:], GLOBAL8[3:])
    np.testing.assert_array_equal(got[:3], ctx2.state[fcs._PERSONAL].numpy()[:3])


def test_lost_uploads_in_an_engine_run_leave_their_packs_personal(tmp_path):
    """Under a deadline some uploads are lost; each such client's recorded pack set is empty
    afterwards, each arrived client's equals the packs of its last upload."""
    from engine.config.schema import load_config
    from engine.loop.simulation import Simulation

    overrides = [
        "dataset.name=digits", "model.name=mlp", "clients.num_clients=6", "clients.participation=1.0",
        "clients.profiles={availability: 1.0, dropout: 0.0, network: {5mbps: 0.5, 500mbps: 0.5}}",
        "rounds=1", "clock.deadline_s=0.05",
        "algorithm.name=fedcspack", "algorithm.pack_size=64", "algorithm.record_packs=true",
    ]
    cfg = load_config(None, overrides)
    sim = Simulation(cfg)
    sim.start()
    try:
        record = sim.run_round(0)
        rows = {r["client_id"]: r for r in record.client_rows}
        lost = [c for c, r in rows.items() if not r["made_deadline"]]
        arrived = [c for c, r in rows.items() if r["made_deadline"]]
        assert lost and arrived, rows  # the test is about something
        for cid in lost:
            assert sim.executor.host.states[cid][fcs._SHARED].numel() == 0
        for cid in arrived:
            assert sim.executor.host.states[cid][fcs._SHARED].numel() == rows[cid]["packs_shared"]
    finally:
        sim.executor.close()
