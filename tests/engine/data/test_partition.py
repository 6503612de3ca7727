"""Tests of engine.data.partition: partitioners, FederatedData construction and label skew."""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine.data.datasets import ArrayDataset, load_dataset
from engine.data.partition import FederatedData, build_federated_data, label_skew, partition_labels


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _labels(n=2000, num_classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, num_classes, n)


def _assert_exact_cover(parts, n):
    allidx = np.concatenate(parts)
    assert allidx.dtype == np.int64
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


# --------------------------------------------------------------------------- partition_labels
@pytest.mark.parametrize(
    "scheme, kw",
    [
        ("iid", {}),
        ("dirichlet", {"alpha": 0.1, "min_samples": 1}),
        ("dirichlet", {"alpha": 100.0}),
        ("shards", {"shards_per_client": 2}),
        ("shards", {"shards_per_client": 3}),
    ],
)
@pytest.mark.parametrize("num_clients", [1, 7, 50])
def test_every_sample_assigned_exactly_once(scheme, kw, num_clients):
    y = _labels()
    parts = partition_labels(y, num_clients, scheme, np.random.default_rng(1), **kw)
    assert len(parts) == num_clients
    _assert_exact_cover(parts, len(y))
    assert all(len(p) > 0 for p in parts)


def test_iid_is_balanced():
    parts = partition_labels(_labels(1003), 10, "iid", np.random.default_rng(0))
    assert {len(p) for p in parts} <= {100, 101}


def test_dirichlet_alpha_controls_skew(digits):
    skews = {}
    for alpha in (0.1, 100.0):
        vals = [
            label_skew(partition_labels(digits.y, 20, "dirichlet", np.random.default_rng(s), alpha=alpha), digits.y, 10)
            for s in range(3)
        ]
        skews[alpha] = float(np.mean(vals))
    # measured on digits/20 clients: ~0.75 for alpha=0.1, ~0.05 for alpha=100
    assert skews[0.1] - skews[100.0] > 0.4, skews
    assert skews[100.0] < 0.15


def test_iid_skew_low_shards_skew_high(digits):
    rng = np.random.default_rng(0)
    assert label_skew(partition_labels(digits.y, 10, "iid", rng), digits.y, 10) < 0.1
    assert label_skew(partition_labels(digits.y, 10, "shards", rng), digits.y, 10) > 0.6


def test_dirichlet_min_samples_respected():
    y = _labels(3000)
    parts = partition_labels(y, 40, "dirichlet", np.random.default_rng(0), alpha=0.3, min_samples=20)
    assert min(len(p) for p in parts) >= 20
    _assert_exact_cover(parts, len(y))


def test_dirichlet_min_samples_impossible_names_parameters():
    y = _labels(1000)
    # feasible in principle (1000 >= 100 x 8) but practically never with alpha=0.01
    with pytest.raises(ValueError, match=r"max_retries=5.*alpha=0\.01.*num_clients=100.*min_samples=8"):
        partition_labels(y, 100, "dirichlet", np.random.default_rng(0), alpha=0.01, min_samples=8, max_retries=5)
    # infeasible outright: more than n samples requested
    with pytest.raises(ValueError, match=r"num_clients=100.*min_samples=20"):
        partition_labels(y, 100, "dirichlet", np.random.default_rng(0), alpha=1.0, min_samples=20)


@pytest.mark.parametrize("spc", [1, 2, 3])
def test_shards_limit_labels_per_client(digits, spc):
    parts = partition_labels(digits.y, 15, "shards", np.random.default_rng(0), shards_per_client=spc)
    _assert_exact_cover(parts, len(digits.y))
    for p in parts:
        assert len(np.unique(digits.y[p])) <= spc


def test_shards_fewer_shards_than_labels_still_covers():
    y = _labels(500)
    parts = partition_labels(y, 2, "shards", np.random.default_rng(0), shards_per_client=2)  # 4 shards, 10 labels
    _assert_exact_cover(parts, len(y))


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"scheme": "bogus"}, "scheme='bogus'.*iid.*dirichlet.*shards"),
        ({"scheme": "natural"}, "build_federated_data"),
        ({"scheme": "dirichlet", "alpha": 0.0}, "alpha=0.0"),
        ({"scheme": "shards", "shards_per_client": 0}, "shards_per_client=0"),
        ({"scheme": "iid", "num_clients": 0}, "num_clients=0"),
        ({"scheme": "iid", "num_clients": 5000}, "num_clients=5000"),
    ],
)
def test_partition_errors(kwargs, pattern):
    args = {"num_clients": 10, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        partition_labels(_labels(1000), args.pop("num_clients"), args.pop("scheme"), np.random.default_rng(0), **args)


def test_dirichlet_10k_clients_fast():
    y = _labels(600_000, seed=3)
    t0 = time.perf_counter()
    parts = partition_labels(y, 10_000, "dirichlet", np.random.default_rng(0), alpha=0.5, min_samples=1)
    elapsed = time.perf_counter() - t0
    assert len(parts) == 10_000
    assert sum(len(p) for p in parts) == len(y)
    assert elapsed < 10, f"dirichlet over 10,000 clients took {elapsed:.1f}s"


# --------------------------------------------------------------------------- build_federated_data
def _all_sets(fd: FederatedData):
    return [fd.client_train_idx, fd.client_test_idx, fd.global_test_idx, fd.public_idx]


def _assert_disjoint_cover(fd: FederatedData, n_pool: int):
    allidx = np.concatenate(_all_sets(fd))
    assert all(a.dtype == np.int64 for a in _all_sets(fd))
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n_pool))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_build_disjoint_and_covering(digits, scheme):
    fd = build_federated_data(digits, num_clients=10, scheme=scheme, seed=0, public_fraction=0.1, min_samples=5)
    n = len(digits.y)
    _assert_disjoint_cover(fd, n)
    assert fd.num_clients == 10 and fd.input_shape == (64,) and fd.num_classes == 10
    assert len(fd.global_test_idx) == round(0.2 * n)
    assert len(fd.public_idx) == round(0.1 * (n - round(0.2 * n)))
    ntr, nte = fd.client_num_train(), fd.client_num_test()
    assert (ntr >= 1).all()
    # test_fraction respected per client (rounding) and overall
    tot = ntr + nte
    assert np.all(np.abs(nte - 0.25 * tot) <= 1)
    assert abs(nte.sum() / tot.sum() - 0.25) < 0.02
    for c in range(fd.num_clients):
        assert len(fd.train_indices(c)) == ntr[c] and len(fd.test_indices(c)) == nte[c]
    assert fd.client_label_counts("all").sum() == tot.sum()


def test_build_public_zero_is_empty(digits):
    fd = build_federated_data(digits, num_clients=5, scheme="iid", seed=0)
    assert fd.public_idx.size == 0 and fd.public_idx.dtype == np.int64
    _assert_disjoint_cover(fd, len(digits.y))


def test_build_deterministic(digits):
    kw = dict(num_clients=8, scheme="dirichlet", alpha=0.5, public_fraction=0.05, min_samples=5)
    a = build_federated_data(digits, seed=11, **kw)
    b = build_federated_data(digits, seed=11, **kw)
    c = build_federated_data(digits, seed=12, **kw)
    for name in ("client_train_idx", "client_train_ptr", "client_test_idx", "client_test_ptr", "global_test_idx",
                 "public_idx"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.client_train_idx, c.client_train_idx)
    assert not np.array_equal(a.global_test_idx, c.global_test_idx)


def test_build_with_official_test_split():
    rng = np.random.default_rng(0)
    ds = ArrayDataset(
        "toy",
        rng.standard_normal((300, 4)).astype(np.float32),
        rng.integers(0, 3, 300),
        3,
        test_x=rng.standard_normal((50, 4)).astype(np.float32),
        test_y=rng.integers(0, 3, 50),
    )
    fd = build_federated_data(ds, num_clients=6, scheme="iid", seed=0, public_fraction=0.1)
    assert len(fd.x) == 350 and len(fd.y) == 350
    np.testing.assert_array_equal(fd.global_test_idx, np.arange(300, 350))
    np.testing.assert_array_equal(fd.x[300:], ds.test_x)
    assert len(fd.public_idx) == 30
    _assert_disjoint_cover(fd, 350)


def test_build_natural_synthetic():
    ds = load_dataset("synthetic", num_clients=40, seed=0)
    fd = build_federated_data(ds, num_clients=40, scheme="natural", seed=0, public_fraction=0.05)
    assert fd.num_clients == 40
    _assert_disjoint_cover(fd, len(ds.x))
    assert (fd.client_num_train() >= 1).all()
    # client data stays with its natural owner
    for c in (0, 17, 39):
        owned = set(ds.natural_clients[c].tolist())
        assert set(fd.train_indices(c).tolist()) | set(fd.test_indices(c).tolist()) <= owned
    assert abs(len(fd.global_test_idx) / len(ds.x) - 0.2) < 0.03
    assert build_federated_data(ds, num_clients=None, scheme="natural", seed=0).num_clients == 40
    with pytest.raises(ValueError, match=r"num_clients=10 .*40 natural clients"):
        build_federated_data(ds, num_clients=10, scheme="natural", seed=0)


def test_build_natural_needs_natural_clients(digits):
    with pytest.raises(ValueError, match="natural clients"):
        build_federated_data(digits, num_clients=10, scheme="natural", seed=0)


@pytest.mark.parametrize("pname", ["test_fraction", "global_test_fraction", "public_fraction"])
def test_build_bad_fraction(digits, pname):
    with pytest.raises(ValueError, match=f"{pname}=1.5"):
        build_federated_data(digits, num_clients=4, scheme="iid", seed=0, **{pname: 1.5})


def test_label_skew_accepts_federated_data(digits):
    lo = build_federated_data(digits, num_clients=10, scheme="dirichlet", alpha=100.0, seed=0)
    hi = build_federated_data(digits, num_clients=10, scheme="dirichlet", alpha=0.1, seed=0, min_samples=5)
    assert label_skew(hi) - label_skew(lo) > 0.3
    assert label_skew([np.arange(10)], np.arange(10) % 2, 2) == 0.0
