"""Tests for algorithms/pack_kernel.py: the compiled per-pack sums behind FedCSPACK's scores.

Expected values come from float64 numpy (never from the kernel itself).
"""
import numpy as np
import pytest
import torch

from algorithms.pack_kernel import SUMS, exp32_array, pack_sums


def ref_sums(local, glob):
    lo, gl = np.asarray(local, np.float64), np.asarray(glob, np.float64)
    eg = np.exp(gl)
    return np.stack([(lo * gl).sum(1), (lo * lo).sum(1), (gl * gl).sum(1), eg.sum(1),
                     np.exp(lo).sum(1), (eg * (gl - lo)).sum(1)])


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
def test_pack_sums_match_float64(rows, cols):
    rng = np.random.default_rng(rows * cols)
    g = rng.normal(0, 0.5, (rows, cols)).astype(np.float32)
    lo = (g + rng.normal(0, 0.1, (rows, cols))).astype(np.float32)
    got = pack_sums(torch.from_numpy(lo), torch.from_numpy(g)).numpy().astype(np.float64)
    ref = ref_sums(lo, g)
    assert got.shape == (len(SUMS), rows)
    # float32 sums of C values: relative error ~1e-7 * sqrt(C); the last sum has cancellation,
    # so its error is bounded by the sum of the magnitudes of its terms
    np.testing.assert_allclose(got[:5], ref[:5], rtol=2e-6)
    scale = (np.exp(g.astype(np.float64)) * np.abs(g - lo)).sum(1)
    assert np.all(np.abs(got[5] - ref[5]) <= 2e-6 * scale)


def test_pack_sums_no_rows_and_bad_shapes():
    assert pack_sums(torch.zeros(0, 8), torch.zeros(0, 8)).shape == (6, 0)
    with pytest.raises(ValueError, match="one shape"):
        pack_sums(torch.zeros(2, 8), torch.zeros(2, 7))
    with pytest.raises(ValueError, match="one shape"):
        pack_sums(torch.zeros(8), torch.zeros(8))


def test_pack_sums_same_bits_whatever_the_layout_and_call():
    rng = np.random.default_rng(3)
    g = torch.from_numpy(rng.normal(0, 0.5, (301, 256)).astype(np.float32))
    lo = g + 0.01
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
    local_side = [SUMS.index(s) for s in ("dot", "local_sq", "local_exp", "global_exp_diff")]
    assert torch.isnan(out[local_side, 1]).all()
    assert torch.isfinite(out[[SUMS.index("global_sq"), SUMS.index("global_exp")], 1]).all()
