"""Compressors, error feedback and the op-count model (fast, CPU only)."""
import math
import pickle

import numpy as np
import pytest
import torch

from algorithms.base import OFFSET_BYTES, SEED_BYTES
from algorithms.compressors import (
    COMPRESSORS,
    DEFAULT_OP_COSTS,
    QSGD8,
    Compressed,
    Compressor,
    OpCosts,
    PeriodicK,
    RandomK,
    TopK,
    compress,
    decode,
    periodick_indices,
    randomk_indices,
    register,
    resolve_k,
    scatter_add_,
    selection_ops,
)
from algorithms.error_feedback import ErrorFeedback

NAMES = sorted(COMPRESSORS)
SPARSIFIERS = ["periodick", "randomk", "topk"]  # send K coordinates unscaled


def topk(a, k, costs=None, clamp=False):
    return TopK(costs).compress(a, k, clamp=clamp)


def randomk(a, k, seed):
    return RandomK().compress(a, k, seed=seed)


def periodick(a, k, round):
    return PeriodicK().compress(a, k, round=round)


def vec(d, seed=0):
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def run(name, a, k, round=0, seed=1234):
    return compress(name, a, k, seed=seed, round=round)


# ------------------------------------------------------------------ K


def test_resolve_k_count_and_ratio():
    assert resolve_k(5, 10) == 5
    assert resolve_k(10, 10) == 10
    assert resolve_k(np.int64(3), 10) == 3
    assert resolve_k(0.5, 10) == 5
    assert resolve_k(1.0, 10) == 10
    assert resolve_k(0.01, 1000) == 10
    assert resolve_k(1e-9, 1000) == 1  # never zero coordinates
    assert resolve_k(11, 10, clamp=True) == 10


@pytest.mark.parametrize("k", [0, -3, 11, 0.0, -0.1, 1.5, 2.0, float("nan"), True, "5", None])
def test_resolve_k_rejects_bad_k(k):
    with pytest.raises(ValueError, match="k="):
        resolve_k(k, 10)


def test_bad_k_message_names_range():
    with pytest.raises(ValueError, match=r"k=11 .*\[1, d=10\]"):
        topk(vec(10), 11)
    with pytest.raises(ValueError, match=r"fraction in \(0, 1\]"):
        randomk(vec(10), 1.5, seed=1)
    with pytest.raises(ValueError, match="unknown compressor"):
        compress("bogus", vec(10), 2)
    with pytest.raises(ValueError, match="seed"):
        compress("randomk", vec(10), 2)
    with pytest.raises(ValueError, match="round"):
        compress("periodick", vec(10), 2)


@pytest.mark.parametrize("name", SPARSIFIERS)
def test_k_as_count_and_ratio_select_same_number(name):
    a = vec(200)
    assert run(name, a, 20).k == 20
    assert run(name, a, 0.1).k == 20


# ------------------------------------------------------------------ payload sizes


@pytest.mark.parametrize("k", [1, 7, 100])
def test_payload_sizes_exact(k):
    a = vec(1000)
    t, r, p = topk(a, k), randomk(a, k, seed=9), periodick(a, k, round=3)
    assert t.nbytes == 8 * k
    assert r.nbytes == 4 * k + 8 == 4 * k + SEED_BYTES
    assert p.nbytes == 4 * k + 4 == 4 * k + OFFSET_BYTES
    for c in (t, r, p):
        arrays = c.to_arrays()
        assert sum(x.nbytes for x in arrays.values()) == c.nbytes
        assert arrays["values"].dtype == np.float32 and arrays["values"].size == k
    assert t.to_arrays()["indices"].dtype == np.int32
    assert r.to_arrays()["seed"].dtype == np.uint64
    assert p.to_arrays()["offset"].dtype == np.int32
    assert t.indices is not None and r.indices is None and p.indices is None


@pytest.mark.parametrize("name", NAMES)
def test_roundtrip_through_arrays(name):
    a = vec(500, 3)
    c = run(name, a, 37, round=5, seed=2**63 + 11)
    back = Compressed.from_arrays(name, c.to_arrays(), 500)
    assert torch.equal(decode(name, {**c.to_arrays(), "buffers": np.ones(3, np.float32)}, 500).values,
                       back.values)  # arrays that are not the compressor's are ignored
    assert back.nbytes == c.nbytes and back.ops == 0.0
    assert torch.equal(back.dense(), c.dense()) and back.dense().shape == (500,)
    assert torch.equal(back.index_tensor(), c.index_tensor())
    c2 = pickle.loads(pickle.dumps(c))
    assert torch.equal(c2.dense(), c.dense())


@pytest.mark.parametrize("name", SPARSIFIERS)
def test_dense_places_values(name):
    a = vec(300, 4)
    c = run(name, a, 30, round=2)
    dense = c.dense()
    idx = c.index_tensor()
    assert dense.dtype == torch.float32 and dense.shape == (300,)
    assert torch.equal(dense[idx], a[idx])
    mask = torch.ones(300, dtype=torch.bool)
    mask[idx] = False
    assert torch.count_nonzero(dense[mask]) == 0
    with pytest.raises(ValueError, match="length"):
        scatter_add_(torch.zeros(301, dtype=torch.float64), c)
    acc = torch.zeros(300, dtype=torch.float64)
    scatter_add_(acc, c, 0.5)
    assert torch.equal(acc, dense.double() * 0.5)


# ------------------------------------------------------------------ each compressor


def test_topk_picks_largest_magnitudes():
    a = torch.tensor([0.1, -5.0, 0.3, 4.0, -0.2, 3.0, 0.0, -2.5])
    c = topk(a, 3)
    assert sorted(c.index_tensor().tolist()) == [1, 3, 5]
    assert sorted(c.values.tolist()) == [-5.0, 3.0, 4.0]
    big = vec(10_000, 5)
    c = topk(big, 100)
    thresh = big.abs()[c.index_tensor()].min()
    mask = torch.ones(10_000, dtype=torch.bool)
    mask[c.index_tensor()] = False
    assert big.abs()[mask].max() <= thresh


def test_periodick_wraps_around():
    a = torch.arange(10, dtype=torch.float32)
    c = periodick(a, 4, round=2)
    assert c.meta["offset"] == 8
    assert c.index_tensor().tolist() == [8, 9, 0, 1]
    assert c.values.tolist() == [8.0, 9.0, 0.0, 1.0]
    assert periodick_indices(10, 4, round=2).tolist() == [8, 9, 0, 1]
    assert periodick(a, 4, round=0).index_tensor().tolist() == [0, 1, 2, 3]
    assert periodick(a, 4, round=1).index_tensor().tolist() == [4, 5, 6, 7]
    # successive rounds sweep every coordinate
    seen = torch.cat([periodick(a, 3, round=r).index_tensor() for r in range(10)])
    assert set(seen.tolist()) == set(range(10))
    assert periodick(a, 10, round=7).index_tensor().tolist() == list(range(10))


def test_randomk_reproducible_distinct_and_seed_dependent():
    d, k = 100_000, 5_000
    a = vec(d, 6)
    c = randomk(a, k, seed=42)
    idx = randomk_indices(d, k, 42)
    assert torch.equal(c.index_tensor(), idx)
    assert torch.equal(randomk_indices(d, k, 42), idx)  # from the seed alone
    assert idx.unique().numel() == k
    assert int(idx.min()) >= 0 and int(idx.max()) < d
    assert torch.equal(c.values, a[idx])  # unscaled
    other = randomk_indices(d, k, 43)
    assert not torch.equal(idx, other)
    assert len(set(idx.tolist()) & set(other.tolist())) < k // 2
    # large K path (randperm) and the full 64-bit seed range
    big = randomk_indices(1000, 900, 2**64 - 1)
    assert big.unique().numel() == 900 and torch.equal(big, randomk_indices(1000, 900, 2**64 - 1))
    with pytest.raises(ValueError, match="seed"):
        randomk(a, 3, seed=-1)


def test_randomk_is_roughly_uniform():
    d, k = 100, 10
    counts = np.zeros(d)
    for s in range(2000):
        counts[randomk_indices(d, k, s).numpy()] += 1
    # each coordinate expected 200 times; binomial sd ~ 13.4
    assert counts.min() > 140 and counts.max() < 260


# ------------------------------------------------------------------ error feedback


@pytest.mark.parametrize("name", SPARSIFIERS)
def test_error_feedback_conserves_mass_exactly(name):
    d, k = 1_000, 37
    residual = None
    total_in = torch.zeros(d, dtype=torch.float64)
    total_sent = torch.zeros(d, dtype=torch.float64)
    for r in range(8):
        delta = vec(d, 100 + r) * (0.1 ** (r % 3))
        a = ErrorFeedback.accumulate(residual, delta)
        if residual is not None:
            assert torch.equal(a, residual + delta)
        c = compress(name, a, k, seed=1000 + r, round=r)
        sent = c.dense()
        residual = ErrorFeedback.update_residual(a, c)
        assert torch.equal(sent + residual, a)  # bit for bit
        assert torch.count_nonzero(residual[c.index_tensor()]) == 0
        total_in += delta.double()
        total_sent += sent.double()
    # nothing lost overall: everything sent + what is still held == everything that came in
    torch.testing.assert_close(total_sent + residual.double(), total_in, rtol=0, atol=1e-5)


def test_error_feedback_accepts_numpy_residual_and_checks_length():
    delta = vec(10)
    res = np.ones(10, dtype=np.float32)
    assert torch.equal(ErrorFeedback.accumulate(res, delta), torch.from_numpy(res) + delta)
    with pytest.raises(ValueError, match="residual"):
        ErrorFeedback.accumulate(np.ones(9, dtype=np.float32), delta)


# ------------------------------------------------------------------ op counts


@pytest.mark.parametrize("d,k", [(100, 1), (1000, 10), (61_706, 617), (11_000_000, 10_000), (10, 10), (1000, 1000)])
def test_topk_costs_more_than_randomk_and_periodick(d, k):
    t, r, p = (selection_ops(n, d, k) for n in ("topk", "randomk", "periodick"))
    assert t > r > p > 0
    assert selection_ops("qsgd8", d, k) == 70.0 * d  # a streaming pass over d, whatever K


def test_op_formulas_and_compressed_ops():
    c = DEFAULT_OP_COSTS
    d, k = 50_000, 500
    assert selection_ops("topk", d, k) == c.topk_per_element * d + c.topk_per_selected_log * k * math.log2(k)
    assert selection_ops("randomk", d, k) == c.randomk_per_index * k
    assert selection_ops("periodick", d, k) == c.periodick_per_index * k
    a = vec(d)
    assert topk(a, k).ops == selection_ops("topk", d, k)
    assert randomk(a, k, 1).ops == selection_ops("randomk", d, k)
    assert periodick(a, k, 1).ops == selection_ops("periodick", d, k)
    # Top-K is O(d): 10x the model at the same K costs ~10x; Random-K does not change
    assert selection_ops("topk", 10 * d, k) > 9 * selection_ops("topk", d, k)
    assert selection_ops("randomk", 10 * d, k) == selection_ops("randomk", d, k)
    custom = OpCosts(topk_per_element=1.0, topk_per_selected_log=0.0)
    assert topk(a, k, costs=custom).ops == d
    with pytest.raises(ValueError, match="topk_per_element"):
        OpCosts(topk_per_element=-1.0)
    with pytest.raises(ValueError, match="qsgd8_per_element"):  # the message lists the keys
        OpCosts(topk_per_item=1.0)


# ------------------------------------------------------------------ 8-bit stochastic quantisation


def test_qsgd8_payload_bytes_levels_and_roundtrip():
    d = 1300  # 3 buckets of 512, the last one partial
    a = vec(d, 8)
    a[600:700] = 0.0  # zeros quantise to exactly 0
    a[1024:] = 0.0  # an all-zero (partial) bucket: scale 0, no division by 0
    c = compress("qsgd8", a, 0.01, seed=77)  # K is not used: every coordinate travels
    arrays = c.to_arrays()
    assert set(arrays) == {"q", "scale"}
    assert arrays["q"].dtype == np.int8 and arrays["q"].size == d
    assert arrays["scale"].dtype == np.float32 and arrays["scale"].size == 3
    assert c.nbytes == d * 1 + 3 * 4 == sum(x.nbytes for x in arrays.values())
    assert c.k == d and c.ops == 70.0 * d
    q = arrays["q"].astype(np.int64)
    assert np.abs(q).max() <= 127 and np.all(q[600:700] == 0) and np.all(q[1024:] == 0)
    scale = np.abs(a.numpy()[:512]).max()
    assert arrays["scale"][0] == scale and arrays["scale"][2] == 0.0
    # each value is one of the two levels around a_i (stochastic rounding), with the sign of a_i
    step = np.repeat(arrays["scale"] / 127.0, 512)[:d]
    lo = np.floor(np.abs(a.numpy()) / np.where(step > 0, step, 1))
    assert np.all((np.abs(q) == lo) | (np.abs(q) == lo + 1) | (step == 0))
    assert np.all(np.sign(q) * np.sign(a.numpy()) >= 0)
    back = decode("qsgd8", arrays, d)
    assert back.ops == 0.0 and back.nbytes == c.nbytes
    assert torch.equal(back.dense(), c.dense())
    np.testing.assert_allclose(c.dense().numpy(), q * step, rtol=1e-6)
    assert torch.equal(compress("qsgd8", a, 1, seed=77).dense(), c.dense())  # seeded
    assert not torch.equal(compress("qsgd8", a, 1, seed=78).dense(), c.dense())
    with pytest.raises(ValueError, match="seed"):
        compress("qsgd8", a, 1)


def test_qsgd8_is_unbiased():
    a = vec(512, 9)
    mean = torch.stack([compress("qsgd8", a, 1, seed=s).dense() for s in range(4000)]).double().mean(0)
    step = float(a.abs().max()) / 127
    # per value: variance <= step^2 / 4, so the mean of 4000 draws is within ~4 sd = 2 step / sqrt(4000)
    assert float((mean - a.double()).abs().max()) < 2 * step / math.sqrt(4000) * 2
    assert float((mean - a.double()).abs().mean()) < step / 20


def test_qsgd8_error_feedback_and_restore():
    d = 1000
    delta = vec(d, 10)
    ef = ErrorFeedback(QSGD8())
    c, e = ef.compress(None, delta, 1, seed=5)
    torch.testing.assert_close(c.dense() + e, delta, rtol=0, atol=1e-6)  # a = sent + residual
    back = ef.restore(e.numpy().copy(), c)
    np.testing.assert_allclose(back, delta.numpy(), rtol=0, atol=1e-6)  # one rounding per value


def test_a_new_compressor_is_one_class():
    """Registering a class is all it takes: compress / decode / op costs / config keys."""

    class SignOfFirst(Compressor):  # toy: the sign of the first K values, one byte each
        name = "toy_sign"
        COSTS = {"per_index": 1.5}
        ARRAYS = ("signs",)

        def compress(self, a, k, *, seed=None, round=None, clamp=False):
            kk = resolve_k(k, a.numel())
            return self._payload(a, None, torch.sign(a[:kk]), kk, kk, {})

        def ops(self, d, k):
            return self.cost["per_index"] * k

        @classmethod
        def positions(cls, c):
            return torch.arange(c.k)

        @classmethod
        def to_arrays(cls, c):
            return {"signs": c.values.numpy().astype(np.int8)}

        @classmethod
        def from_arrays(cls, arrays, numel):
            v = torch.from_numpy(arrays["signs"].astype(np.float32))
            return Compressed(None, v, arrays["signs"].nbytes, 0.0, {"compressor": cls.name}, numel)

    register(SignOfFirst)
    try:
        a = torch.tensor([2.0, -3.0, 0.5, 9.0])
        c = compress("toy_sign", a, 2)
        assert c.nbytes == 2 and c.ops == 3.0 and c.dense().tolist() == [1.0, -1.0, 0.0, 0.0]
        assert decode("toy_sign", c.to_arrays(), 4).dense().tolist() == [1.0, -1.0, 0.0, 0.0]
        assert OpCosts(toy_sign_per_index=4.0).of("toy_sign") == {"per_index": 4.0}
        assert selection_ops("toy_sign", 4, 2, OpCosts(toy_sign_per_index=4.0)) == 8.0
        from algorithms.ascend import DEFAULT_ARMS, AscendParams
        from algorithms.compressed_fedavg import CompressedFedAvgParams

        assert CompressedFedAvgParams(compressor="toy_sign").compressor == "toy_sign"
        assert AscendParams(arms=["topk", "toy_sign"]).arms == ("topk", "toy_sign")
        assert "toy_sign" not in DEFAULT_ARMS and "toy_sign" not in AscendParams().arms  # never silently
        register(SignOfFirst)  # the same class again: nothing happens
        with pytest.raises(ValueError, match="'toy_sign' is already registered by .*test_compressors"):
            register(type("SignOfFirst", (SignOfFirst,), {}))
    finally:
        COMPRESSORS.registry.remove("toy_sign")
