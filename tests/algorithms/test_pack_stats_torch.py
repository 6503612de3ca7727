"""FedCSPACK's torch (GPU) path for the per-pack sums, run here on CPU tensors: it is
device-agnostic code, checked against an independent float64 numpy reference."""
import copy

import numpy as np
import pytest
import torch

import algorithms.fedcspack as fcs
import algorithms.pack_stats_torch as pst
from algorithms.fedcspack import mask_weights, pack_scores
from algorithms.pack_kernel import SUMS, pack_sums
from algorithms.pack_stats_torch import pack_sums_on_device, pack_sums_torch


def ref_stats(local, glob):
    """dot, |L|^2, |G|^2 and KL(softmax(G) || softmax(L)) per row, max-shifted log_softmax in
    numpy's long double (80-bit on x86: the torch path's float64 beta is far more accurate
    than a float64 log_softmax reference, whose terms are ~|log p|, not ~beta)."""
    lo, gl = np.asarray(local, np.longdouble), np.asarray(glob, np.longdouble)

    def log_softmax(x):
        m = x.max(1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))

    lg, ll = log_softmax(gl), log_softmax(lo)
    kl = (np.exp(lg) * (lg - ll)).sum(1)
    return np.stack([(lo * gl).sum(1), (lo * lo).sum(1), (gl * gl).sum(1), kl]).astype(np.float64)


# beta of the torch path against ref_stats: 1e-9 relative with an extended long double,
# the float64 reference's own accuracy otherwise
BETA_RTOL = 1e-9 if np.finfo(np.longdouble).eps < 1e-18 else 1e-6


def ref_scores(local, glob, p):
    """float64 numpy, pack by pack, padding included: (theta_a, theta, beta)."""
    lo, gl = np.asarray(local, np.float64), np.asarray(glob, np.float64)
    n, j = lo.size, -(-lo.size // p)
    lp, gp = np.zeros(j * p), np.zeros(j * p)
    lp[:n], gp[:n] = lo, gl
    theta_a = lo @ gl / (np.linalg.norm(lo) * np.linalg.norm(gl))
    theta, beta = np.zeros(j), np.zeros(j)
    for i in range(j):
        a, b = lp[i * p:(i + 1) * p], gp[i * p:(i + 1) * p]
        theta[i] = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
        lg = b - (b.max() + np.log(np.exp(b - b.max()).sum()))
        ll = a - (a.max() + np.log(np.exp(a - a.max()).sum()))
        beta[i] = np.sum(np.exp(lg) * (lg - ll))
    return theta_a, theta, beta


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 37), (50, 1024), (7, 4097)])
@pytest.mark.parametrize("drift", [1e-4, 1e-2, 0.3, 2.0])
@pytest.mark.parametrize("chunk", [pst.CHUNK_VALUES, 1000])  # 1000: several chunks of rows
def test_torch_pack_sums_are_float64_accurate(rows, cols, drift, chunk, monkeypatch):
    # drift 1e-4 .. 1e-2: KL ~1e-9 .. 1e-4 (a trained network); 0.3, 2.0: the exp branch of phi
    monkeypatch.setattr(pst, "CHUNK_VALUES", chunk)
    rng = np.random.default_rng(rows * cols)
    g = rng.normal(0, 0.5, (rows, cols)).astype(np.float32)
    lo = (g + rng.normal(0, drift, (rows, cols))).astype(np.float32)
    got = pack_sums_torch(torch.from_numpy(lo), torch.from_numpy(g))
    assert got.dtype == torch.float64 and got.shape == (len(SUMS), rows) == (4, rows)
    ref = ref_stats(lo, g)
    # float64 accumulation: ~1e-16 * C relative, far inside the kernel's 1e-13 / 2e-7
    np.testing.assert_allclose(got[:3].numpy(), ref[:3], rtol=1e-12)
    if cols == 1:
        assert torch.all(got[3] == 0.0)  # a pack of one value: KL = 0 exactly, as the kernel
    else:
        np.testing.assert_allclose(got[3].numpy(), ref[3], rtol=BETA_RTOL)


def test_kl_of_a_shifted_pack_is_exact_on_the_torch_path():
    rng = np.random.default_rng(7)  # the kernel test's case: the textbook sums cancel ~1e4-fold
    g = np.ones((4, 256), np.float32) + rng.normal(0, 0.01, (4, 256)).astype(np.float32)
    lo = (g - 1e-3 + rng.normal(0, 1e-5, (4, 256))).astype(np.float32)
    lo[3] = g[3] + np.float32(0.125)
    got = pack_sums_torch(torch.from_numpy(lo), torch.from_numpy(g)).numpy()
    ref = ref_stats(lo, g)
    np.testing.assert_allclose(got[3, :3], ref[3, :3], rtol=1e-8)
    assert 0.0 <= got[3, 3] < 1e-12


@pytest.mark.parametrize("cols", [1, 16, 300])
def test_both_paths_give_the_same_beta_and_the_same_rows_to_recompute(cols):
    """The kernel (CPU) and the torch path (GPU) agree row by row: beta within the kernel's
    float32-exp rounding, NaN (recompute) on the same rows, 0 for packs of one value."""
    rng = np.random.default_rng(cols)
    g = rng.normal(0, 0.3, (12, cols)).astype(np.float32)
    lo = (g + rng.normal(0, 0.01, (12, cols))).astype(np.float32)
    g[1, 0] = 100.0  # sum exp(G) >= e^87
    g[2] = -70.0  # sum exp(G) < e^-60
    lo[3, 0] = g[3, 0] + 95.0  # |u| > 87 (with cols = 1 the mean absorbs it: a finite row)
    lo[4, 0] = np.nan
    g[5, 0] = np.inf
    lo[6] = g[6]  # L = G: beta = 0 exactly on both
    kernel = pack_sums(torch.from_numpy(lo), torch.from_numpy(g))
    torch_ = pack_sums_torch(torch.from_numpy(lo), torch.from_numpy(g))
    assert kernel.shape == torch_.shape == (4, 12) and kernel.dtype == torch_.dtype == torch.float64
    np.testing.assert_array_equal(torch.isnan(kernel[3]).numpy(), torch.isnan(torch_[3]).numpy())
    assert torch.isnan(torch_[3, [1, 2, 4, 5]]).all() and bool(torch.isnan(torch_[3, 3])) == (cols > 1)
    assert torch_[3, 6] == 0.0 == kernel[3, 6]
    if cols == 1:
        assert torch.all(torch_[3, [0, 6, 7, 8]] == 0.0) and torch.all(kernel[3, [0, 6, 7, 8]] == 0.0)
    ok = ~torch.isnan(torch_[3])
    np.testing.assert_allclose(kernel[3, ok].numpy(), torch_[3, ok].numpy(), rtol=2e-6, atol=1e-300)
    fin = torch.isfinite(torch_[:3]) & torch.isfinite(kernel[:3])
    np.testing.assert_allclose(kernel[:3][fin].numpy(), torch_[:3][fin].numpy(), rtol=1e-13)


def test_dispatch_keeps_the_compiled_kernel_on_the_cpu_and_checks_shapes(monkeypatch):
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    calls = []
    monkeypatch.setattr(pst, "pack_sums_torch", lambda *x: calls.append(x))
    assert torch.equal(pack_sums_on_device(a, b), pack_sums(a, b))  # the numba kernel's bits
    assert not calls
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"need two \(R, C\) tensors of one shape"):
        pack_sums_torch(a, torch.randn(4, 9))
    assert pack_sums_torch(torch.zeros(0, 8), torch.zeros(0, 8)).shape == (4, 0)


@pytest.fixture
def torch_path(monkeypatch):
    """pack_scores on CPU tensors through the GPU code path."""
    monkeypatch.setattr(fcs, "pack_sums_on_device", pack_sums_torch)


@pytest.mark.parametrize("n,p", [(5000, 64), (1030, 256), (37, 1)])
def test_scores_and_mask_weights_through_the_torch_path_match_float64(n, p, torch_path):
    rng = np.random.default_rng(n)
    g = rng.normal(0, 0.05, n).astype(np.float32)  # small weights: beta ~ 1e-6, the hard case
    lo = (g + rng.normal(0, 0.01, n)).astype(np.float32)
    ta, th, be = pack_scores(torch.from_numpy(lo), torch.from_numpy(g), p)
    rta, rth, rbe = ref_scores(lo, g, p)
    assert ta == pytest.approx(rta, rel=1e-12)
    np.testing.assert_allclose(th.numpy(), rth, rtol=1e-12, atol=1e-15)
    if p == 1:  # softmax of one value is 1: beta = 0 exactly
        assert torch.all(be == 0.0)
    # the spec's bound: every mask weight within 1e-5 relative of float64 (here far inside it)
    for weighting in ("cskd", "cs", "kd"):
        got = mask_weights(th, be, weighting).numpy()
        ref = mask_weights(torch.from_numpy(rth), torch.from_numpy(rbe), weighting).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-15)


def test_huge_weights_take_the_stable_path_on_the_torch_path(torch_path):
    rng = np.random.default_rng(1)
    g = (rng.normal(0, 1, 40) * 400).astype(np.float32)  # exp overflows even float64 (> 709)
    lo = (g + rng.normal(0, 30, 40)).astype(np.float32)
    _, th, be = pack_scores(torch.from_numpy(lo), torch.from_numpy(g), 8)
    _, rth, rbe = ref_scores(lo, g, 8)
    assert torch.isfinite(be).all()
    np.testing.assert_allclose(be.numpy(), rbe, rtol=1e-9, atol=1e-12)


def test_fedcspack_upload_is_the_same_payload_on_either_path(monkeypatch):
    """The torch path changes only the rounding of the scores: on this case the client uploads
    the same packs and deltas, and weights within float32 rounding, as numpy arrays."""
    from algorithms.base import ClientContext, Payload, TrainSettings

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 30), torch.nn.ReLU(), torch.nn.Linear(30, 2))
    params = fcs.flat_params(model).numpy()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 3, generator=gen), torch.randint(0, 2, (40,), generator=gen)
    bc = Payload(arrays={"params": params, "mask_idx": np.zeros(0, np.int32),
                         "mask_w": np.zeros(0, np.float32)}, nbytes=0)
    client = fcs.FedCSPACKClient(fcs.FedCSPACKParams(pack_size=16, k=0.3))
    uploads = []
    for kernel in (fcs.pack_sums_on_device, pack_sums_torch):
        monkeypatch.setattr(fcs, "pack_sums_on_device", kernel)
        m = copy.deepcopy(model)
        ctx = ClientContext(client_id=0, round=0, arch="", model=m, state={}, train_x=x, train_y=y,
                            rng=np.random.default_rng(3), train=TrainSettings(batch_size=8, lr=0.1),
                            flops_per_sample=1.0)
        client.receive(ctx, bc)
        uploads.append(client.fit(ctx, bc).upload)
    a, b = uploads
    assert a.nbytes == b.nbytes and a.arrays.keys() == b.arrays.keys()
    for key in a.arrays:
        assert isinstance(b.arrays[key], np.ndarray) and a.arrays[key].dtype == b.arrays[key].dtype
    assert 0 < len(a.arrays["idx"]) < fcs.num_packs(params.size, 16)
    np.testing.assert_array_equal(a.arrays["idx"], b.arrays["idx"])
    np.testing.assert_array_equal(a.arrays["delta"], b.arrays["delta"])
    np.testing.assert_allclose(a.arrays["w"], b.arrays["w"], rtol=1e-5)
