"""The sample-weighted mean shared by FedAvg, compressed FedAvg and ASCEND, against an
independent float64 reference (math.fsum per coordinate)."""
import math
import warnings

import numpy as np
import pytest
import torch

import algorithms.toolkit as toolkit
from algorithms.toolkit import weighted_mean


def fsum_reference(weights: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
    return np.array([math.fsum(float(w) * float(r[j]) for w, r in zip(weights, rows))
                     for j in range(rows[0].size)])


@pytest.mark.parametrize("block_rows", [1, 3, 7, None])  # None: the default (all rows at once here)
@pytest.mark.parametrize("n", [1, 7, 20])
def test_weighted_mean_is_the_float64_sum_rounded_once_for_any_block(monkeypatch, block_rows, n):
    d = 301
    if block_rows is not None:
        monkeypatch.setattr(toolkit, "WEIGHTED_MEAN_BLOCK_BYTES", block_rows * 8 * d)
    rng = np.random.default_rng(n)
    # magnitudes from 1e-3 to 1e3, so float32 accumulation would lose digits that float64 keeps
    rows = [(rng.standard_normal(d) * 10.0 ** rng.uniform(-3, 3, d)).astype(np.float32) for _ in range(n)]
    weights = rng.random(n)
    weights /= weights.sum()
    expected = fsum_reference(weights, rows)
    out = weighted_mean(torch.from_numpy(weights), [torch.from_numpy(r) for r in rows])
    assert out.dtype == torch.float32 and out.shape == (d,)
    # float64 sums differ from fsum by ~1e-16 relative: rounding to float32 agrees but for ties
    np.testing.assert_allclose(out.numpy(), expected.astype(np.float32), rtol=2 ** -23, atol=0)


def test_weighted_mean_takes_read_only_numpy_arrays_of_any_shape():
    """Uploads fetched from Ray's object store are read-only numpy arrays."""
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(4)]
    for r in rows:
        r.setflags(write=False)
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it wraps a read-only array
        out = weighted_mean(torch.from_numpy(weights), rows)
    expected = fsum_reference(weights, [r.reshape(-1) for r in rows])
    np.testing.assert_allclose(out.numpy(), expected.astype(np.float32), rtol=2 ** -23, atol=0)


def test_weighted_mean_of_nothing_says_so():
    with pytest.raises(ValueError, match="no vectors to average"):
        weighted_mean(torch.zeros(0, dtype=torch.float64), [])
