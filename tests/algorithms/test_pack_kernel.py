"""Tests for algorithms/pack_kernel.py: the compiled per-pack statistics behind FedCSPACK.

Expected values come from float64 numpy / torch (never from the kernel itself).
"""
import numpy as np
import pytest
import torch

from algorithms.pack_kernel import SUMS, exp32_array, pack_sums


def ref_stats(local, glob):
    """float64: dot, |L|^2, |G|^2 and KL(softmax(G) || softmax(L)) per row (log_softmax form)."""
    lo, gl = torch.as_tensor(np.asarray(local, np.float64)), torch.as_tensor(np.asarray(glob, np.float64))
    lg, ll = torch.log_softmax(gl, 1), torch.log_softmax(lo, 1)
    kl = (lg.exp() * (lg - ll)).sum(1)
    return np.stack([(lo * gl).sum(1), (lo * lo).sum(1), (gl * gl).sum(1), kl.numpy()])


def test_exp32_is_float32_accurate_and_clamps():
    x = np.linspace(-87.0, 88.0, 200_001).astype(np.float32)
    rel = exp32_array(x).astype(np.float64) / np.exp(x.astype(np.float64)) - 1.0
    assert np.abs(rel).max() <= 2e-7  # about 1 ulp of float32
    assert exp32_array(np.float32([0.0]))[0] == 1.0
    # out of range: clamped to [-87, 88], finite, never inf / 0 / NaN
    big, small = exp32_array(np.float32([1000.0, -1000.0]))
    assert big == pytest.approx(np.exp(88.0), rel=1e-6) and np.isfinite(big)
    assert small == pytest.approx(np.exp(-87.0), rel=1e-6) and small > 0


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 37), (50, 1024), (7, 4097)])
@pytest.mark.parametrize("drift", [1e-4, 1e-2, 0.3, 2.0])
def test_pack_stats_match_float64(rows, cols, drift):
    # drift 1e-4 .. 1e-2: KL from ~1e-9 to ~1e-4, the regime of a trained network; 0.3 and 2.0
    # exercise the second pass (some |G - L| >= 1/4) and its exp-based branch (|u| >= 1)
    rng = np.random.default_rng(rows * cols)
    g = rng.normal(0, 0.5, (rows, cols)).astype(np.float32)
    lo = (g + rng.normal(0, drift, (rows, cols))).astype(np.float32)
    got = pack_sums(torch.from_numpy(lo), torch.from_numpy(g)).numpy()
    ref = ref_stats(lo, g)
    assert got.dtype == np.float64 and got.shape == (len(SUMS), rows)
    np.testing.assert_allclose(got[:3], ref[:3], rtol=1e-13)  # exact products, float64 sums
    if cols == 1:
        assert np.all(got[3] == 0.0)  # a pack of one value: KL = 0 exactly
    else:
        np.testing.assert_allclose(got[3], ref[3], rtol=1e-6)


def test_kl_of_a_shifted_pack_is_exact():
    # every value moved by the same amount (a bias vector, a BatchNorm scale under weight
    # decay): the naive sums cancel ~1e4-fold here; the kernel redoes the row around the mean
    rng = np.random.default_rng(7)
    g = np.ones((4, 256), np.float32) + rng.normal(0, 0.01, (4, 256)).astype(np.float32)
    lo = (g - 1e-3 + rng.normal(0, 1e-5, (4, 256))).astype(np.float32)
    lo[3] = g[3] + np.float32(0.125)  # a pure shift: KL is the rounding of L only, ~1e-14
    got = pack_sums(torch.from_numpy(lo), torch.from_numpy(g)).numpy()
    ref = ref_stats(lo, g)
    np.testing.assert_allclose(got[3, :3], ref[3, :3], rtol=1e-5)
    assert np.all(ref[3, :3] < 1e-9)
    assert 0.0 <= got[3, 3] < 1e-12 and abs(ref[3, 3]) < 1e-12


def test_rows_beyond_the_exp_range_come_back_nan_for_the_caller():
    g = np.zeros((3, 16), np.float32)
    lo = g + np.float32(0.01) * np.arange(16, dtype=np.float32)
    g[1, 3] = 100.0  # exp32 would clamp
    lo[2, 5] = 95.0  # |u| > 87
    out = pack_sums(torch.from_numpy(lo), torch.from_numpy(g)).numpy()
    assert np.isfinite(out[3, 0]) and np.isnan(out[3, 1]) and np.isnan(out[3, 2])
    assert np.all(np.isfinite(out[:3]))  # the dot products are still there


def test_pack_sums_no_rows_and_bad_shapes():
    assert pack_sums(torch.zeros(0, 8), torch.zeros(0, 8)).shape == (4, 0)
    with pytest.raises(ValueError, match="one shape"):
        pack_sums(torch.zeros(2, 8), torch.zeros(2, 7))
    with pytest.raises(ValueError, match="one shape"):
        pack_sums(torch.zeros(8), torch.zeros(8))


def test_pack_sums_same_bits_whatever_the_layout_and_call():
    rng = np.random.default_rng(3)
    g = torch.from_numpy(rng.normal(0, 0.5, (301, 256)).astype(np.float32))
    lo = g + 0.01 * torch.from_numpy(rng.normal(0, 1, (301, 256)).astype(np.float32))
    first = pack_sums(lo, g)
    assert torch.equal(pack_sums(lo, g), first)
    # a non-contiguous view gives the same sums as its contiguous copy
    assert torch.equal(pack_sums(lo.t().contiguous().t(), g.t().contiguous().t()), first)
    # one row alone is summed exactly as within the whole batch
    assert torch.equal(pack_sums(lo[7:8], g[7:8])[:, 0], first[:, 7])


def test_nan_reaches_only_its_own_row():
    g = torch.full((3, 20), 0.1)
    lo = g.clone()
    lo[1, 4] = float("nan")
    out = pack_sums(lo, g)
    assert torch.isfinite(out[:, [0, 2]]).all()
    local_side = [SUMS.index(s) for s in ("dot", "local_sq", "beta")]
    assert torch.isnan(out[local_side, 1]).all()
    assert torch.isfinite(out[SUMS.index("global_sq"), 1])
