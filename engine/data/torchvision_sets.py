"""The datasets torchvision reads from their standard files: MNIST, Fashion-MNIST (torchvision's
layout), EMNIST and CIFAR-10/100, loaded from ``root`` (or downloaded with ``download: true``),
normalised and returned as :class:`engine.data.datasets.ArrayDataset`. A missing file is a
:class:`~engine.data.datasets.DatasetNotFoundError` naming the folder, every missing file and how
to obtain them. Registered in :mod:`engine.registry` as ``mnist``, ``fashion_mnist_tv``,
``emnist``, ``cifar10``, ``cifar100``."""
from __future__ import annotations

import os

import numpy as np

from engine.data.datasets import (
    _MNIST_FILES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    ArrayDataset,
    DatasetNotFoundError,
    _normalise_uint8_images,
    default_data_root,
)

# --------------------------------------------------------------------------- #
# torchvision datasets
# --------------------------------------------------------------------------- #
EMNIST_SPLITS = ("byclass", "bymerge", "balanced", "letters", "digits", "mnist")
# per-channel statistics of the training sets (EMNIST: balanced split; other splits are within 1%)
_TV_STATS = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist_tv": (FASHION_MNIST_MEAN, FASHION_MNIST_STD),
    "emnist": ((0.1751,), (0.3332,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def _tv_expected_files(name: str, root: str, split: str | None = None) -> list[str]:
    """Files torchvision needs under ``root`` to load ``name`` without downloading."""
    if name in ("mnist", "fashion_mnist_tv"):
        folder = os.path.join(root, "MNIST" if name == "mnist" else "FashionMNIST", "raw")
        return [os.path.join(folder, f) for f in _MNIST_FILES]
    if name == "emnist":
        folder = os.path.join(root, "EMNIST", "raw")
        return [
            os.path.join(folder, f"emnist-{split}-{part}-{kind}-idx{3 if kind == 'images' else 1}-ubyte")
            for part in ("train", "test")
            for kind in ("images", "labels")
        ]
    if name == "cifar10":
        folder = os.path.join(root, "cifar-10-batches-py")
        files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
        return [os.path.join(folder, f) for f in files]
    if name == "cifar100":
        folder = os.path.join(root, "cifar-100-python")
        return [os.path.join(folder, f) for f in ("train", "test", "meta")]
    raise ValueError(f"no torchvision file list for dataset {name!r}")


def _tv_missing_error(name: str, root: str, missing: list[str], extra: str = "") -> DatasetNotFoundError:
    folder = os.path.dirname(missing[0])
    names = ", ".join(os.path.basename(m) for m in missing)
    hint = ""
    if name in ("mnist", "fashion_mnist_tv", "emnist") and any(os.path.isfile(m + ".gz") for m in missing):
        # torchvision reuses archives already present, so download=True works offline here
        hint = (" The .gz archives are present: gunzip them, or set `download: true` (torchvision then only "
                "extracts them).")
    return DatasetNotFoundError(
        f"dataset {name!r}: missing {len(missing)} file(s) in folder {folder!r}: {names}.{extra} "
        f"Set `download: true` on a machine with internet (torchvision downloads into root={root!r}), "
        f"or copy the files there from a machine that has them.{hint}",
        missing,
    )


def _load_torchvision(name: str, root: str | None, download: bool, split: str | None = None) -> ArrayDataset:
    root = root or default_data_root()
    expected = _tv_expected_files(name, root, split)
    missing = [p for p in expected if not os.path.isfile(p)]
    if missing and not download:
        raise _tv_missing_error(name, root, missing)

    import torchvision.datasets as tvd  # lazy: importing torch is slow and most runs never need it

    cls = {
        "mnist": tvd.MNIST,
        "fashion_mnist_tv": tvd.FashionMNIST,
        "emnist": tvd.EMNIST,
        "cifar10": tvd.CIFAR10,
        "cifar100": tvd.CIFAR100,
    }[name]
    kwargs = {"split": split} if name == "emnist" else {}
    try:
        train = cls(root, train=True, download=download, **kwargs)
        test = cls(root, train=False, download=False, **kwargs)
    except RuntimeError as e:  # torchvision: "Dataset not found or corrupted" (md5 mismatch included)
        missing = [p for p in expected if not os.path.isfile(p)] or expected
        raise _tv_missing_error(
            name, root, missing, extra=f" (torchvision refused the files: {e}; they may be incomplete or corrupted)"
        ) from e

    def to_nchw(data) -> np.ndarray:
        arr = data.numpy() if hasattr(data, "numpy") else np.asarray(data)
        if arr.ndim == 3:  # MNIST family: (N, H, W)
            arr = arr[:, None]
            if name == "emnist":
                arr = arr.transpose(0, 1, 3, 2)  # EMNIST idx files store images transposed
        else:  # CIFAR: (N, H, W, C)
            arr = arr.transpose(0, 3, 1, 2)
        return arr

    def labels(t) -> np.ndarray:
        arr = t.numpy() if hasattr(t, "numpy") else np.asarray(t)
        return arr.astype(np.int64)

    mean, std = _TV_STATS[name]
    num_classes = len(train.classes)
    y, ty = labels(train.targets), labels(test.targets)
    if name == "emnist" and split == "letters":
        # labels are 1..26 with an unused class 0 ("N/A"); shift to 0..25
        y, ty, num_classes = y - 1, ty - 1, 26
    x = _normalise_uint8_images(to_nchw(train.data), mean, std)
    tx = _normalise_uint8_images(to_nchw(test.data), mean, std)
    ds_name = f"emnist_{split}" if name == "emnist" else name
    return ArrayDataset(ds_name, x, y, num_classes, test_x=tx, test_y=ty)


def load_mnist(*, root=None, download=False, seed=0) -> ArrayDataset:
    """MNIST via torchvision: ``<root>/MNIST/raw/*-idx?-ubyte``."""
    return _load_torchvision("mnist", root, download)


def load_fashion_mnist_tv(*, root=None, download=False, seed=0) -> ArrayDataset:
    """Fashion-MNIST via torchvision: ``<root>/FashionMNIST/raw/*-idx?-ubyte``."""
    return _load_torchvision("fashion_mnist_tv", root, download)


def load_emnist(*, root=None, download=False, seed=0, split: str = "balanced") -> ArrayDataset:
    """EMNIST via torchvision: ``<root>/EMNIST/raw/emnist-<split>-{train,test}-*``.
    Images are transposed back to upright; ``letters`` labels shifted to 0..25."""
    if split not in EMNIST_SPLITS:
        raise ValueError(f"emnist: split={split!r} is invalid; allowed: {list(EMNIST_SPLITS)}")
    return _load_torchvision("emnist", root, download, split=split)


def load_cifar10(*, root=None, download=False, seed=0) -> ArrayDataset:
    """CIFAR-10 via torchvision: ``<root>/cifar-10-batches-py/``."""
    return _load_torchvision("cifar10", root, download)


def load_cifar100(*, root=None, download=False, seed=0) -> ArrayDataset:
    """CIFAR-100 (fine labels) via torchvision: ``<root>/cifar-100-python/``."""
    return _load_torchvision("cifar100", root, download)
