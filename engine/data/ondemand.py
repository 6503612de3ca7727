"""Federated data built client by client, when a client takes part.

An eager dataset (:class:`engine.data.partition.FederatedData`) holds every sample of every
client in memory before the first round; a million clients of ``synthetic`` would need 15 GB.
:class:`OnDemandFederatedData` holds only per-client *counts* (a few int64 per client) and a
:class:`ClientSource` that yields one client's rows when asked: generated from (seed, client
id) (:class:`SyntheticSource`, ``synthetic`` with ``lazy: true``) or read from a file on disk
(:class:`engine.data.disk_table.DiskTableSource`, ``parquet`` with ``on_disk: true``). A round
touches the selected clients' rows only, so memory and per-round cost do not grow with the fleet.

How a client's rows are split, as in :func:`engine.data.partition.build_federated_data` for
``partition.scheme: natural`` (each client holds out its own fractions), with each client's
shuffle drawn from its own stream ``(seed, client id)``:

1. ``round(global_test_fraction * n)`` rows go to the global test set, then
   ``round(public_fraction * rest)`` to the server's public set (at least one row stays);
2. a client with its own test rows (a table's split column) keeps them as its local test set;
   else ``round(test_fraction * rest)`` of the rest are its local test set (one row stays).

The global test and public sets are the held-out rows of at most :data:`HELDOUT_CLIENTS`
clients (all of them in smaller fleets; a seeded random subset in larger ones), so global
evaluation costs the same for 10k or 1M clients. The other clients' held-out rows are unused.
The split draws differ from the eager builder's (those shuffle the whole pool with one
generator), so an on-demand dataset is a new version of the data, pinned by its own tests.

An on-disk table with ``iid``, ``dirichlet`` or ``shards`` (:class:`PartitionedTableData`) is
different: its row cache is in the eager pool's order, and the index of rows per client is built
once from the label column by :func:`engine.data.partition.partition_pool`, the function the
eager builder uses, so a seed gives the same clients, splits and sample order as loading the
table into memory; a round reads the union of its clients' rows, sorted, in contiguous runs.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
import zlib
from typing import Protocol

import numpy as np

from engine.data.partition import _csr_label_counts, partition_pool

__all__ = ["ClientSource", "OnDemandFederatedData", "PartitionedTableData", "SyntheticSource", "HELDOUT_CLIENTS",
           "held_out"]

# Clients whose held-out rows form the global test and public sets (a seeded subset above this).
HELDOUT_CLIENTS = 10_000
# Sub-streams of (seed, stream, client): distinct from the eager partition's (0..3).
_STREAM_SIZES, _STREAM_CLIENT, _STREAM_SPLIT, _STREAM_SHARED, _STREAM_HELDOUT = 101, 102, 103, 104, 105


class ClientSource(Protocol):
    """Where an on-demand dataset's rows come from."""

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    sizes: np.ndarray  # per client: its training rows (held-out fractions are taken from these)
    test_sizes: np.ndarray | None  # per client: its own test rows (None: it has none)

    def rows(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Client ``c``'s training rows (x float32, y int64) and its own test rows (or None)."""


def held_out(sizes: np.ndarray, fraction: float, keep_min: int = 1) -> np.ndarray:
    """Rows moved out of each segment: ``round(fraction * n)``, keeping ``keep_min`` (the rule
    of :func:`engine.data.partition._segment_take`)."""
    take = np.floor(fraction * sizes + 0.5).astype(np.int64)
    return np.clip(take, 0, np.maximum(sizes - keep_min, 0))


class OnDemandFederatedData:
    """Per-client counts plus a :class:`ClientSource`; rows are produced by :meth:`split`."""

    on_demand = True

    def __init__(self, source: ClientSource, *, seed: int, test_fraction: float, global_test_fraction: float,
                 public_fraction: float, heldout_clients: int = HELDOUT_CLIENTS, meta: dict | None = None):
        self.source, self.seed = source, int(seed)
        self.name, self.num_classes = source.name, int(source.num_classes)
        n = np.asarray(source.sizes, dtype=np.int64)
        if len(n) == 0 or (n < 1).any():
            bad = int(np.flatnonzero(n < 1)[0]) if len(n) else None
            raise ValueError("an on-demand dataset needs at least one client with at least one training row"
                             + (f"; client {bad} has none" if bad is not None else ""))
        self.n_global = held_out(n, global_test_fraction)
        self.n_public = held_out(n - self.n_global, public_fraction)
        rest = n - self.n_global - self.n_public
        if source.test_sizes is not None:
            self.n_test = np.asarray(source.test_sizes, dtype=np.int64)
            self.n_train = rest
        else:
            self.n_test = held_out(rest, test_fraction)
            self.n_train = rest - self.n_test
        k = len(n)
        if k <= heldout_clients:
            self.heldout = np.arange(k, dtype=np.int64)
        else:
            pick = np.random.default_rng([self.seed, _STREAM_HELDOUT]).choice(k, heldout_clients, replace=False)
            self.heldout = np.sort(pick).astype(np.int64)
        self.meta = dict(meta or {}, scheme="natural", seed=self.seed, num_clients=k, on_demand=True,
                         test_fraction=test_fraction, global_test_fraction=global_test_fraction,
                         public_fraction=public_fraction, heldout_clients=int(len(self.heldout)))
        self._held: tuple[np.ndarray, ...] | None = None  # global test and public rows, built when first asked

    def __getstate__(self):  # the held-out rows are the driver's: hosts never need them
        state = dict(self.__dict__)
        state["_held"] = None
        return state

    # ------------------------------------------------------------------ the face FederatedData has too
    @property
    def num_clients(self) -> int:
        return len(self.n_train)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.source.input_shape)

    def client_num_train(self) -> np.ndarray:
        return self.n_train

    def client_num_test(self) -> np.ndarray:
        return self.n_test

    @property
    def num_global_test(self) -> int:
        return int(self.n_global[self.heldout].sum())

    @property
    def num_public(self) -> int:
        return int(self.n_public[self.heldout].sum())

    def global_test_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._held_rows()[:2]

    def public_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._held_rows()[2:]

    def client_label_counts(self, split: str = "train") -> np.ndarray:
        """(num_clients, num_classes) label histogram; builds every client's rows (slow for big fleets)."""
        if split not in ("train", "test", "all"):
            raise ValueError(f"split={split!r} is invalid; allowed: 'train', 'test', 'all'")
        counts = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        for c in range(self.num_clients):
            _, ytr, _, yte, *_ = self.split(c)
            ys = [ytr] if split == "train" else [yte] if split == "test" else [ytr, yte]
            counts[c] = np.bincount(np.concatenate(ys), minlength=self.num_classes)
        return counts

    # ------------------------------------------------------------------ rows
    def split(self, c: int) -> tuple[np.ndarray, ...]:
        """Client ``c``'s (train x, train y, test x, test y, global-test x, y, public x, y)."""
        x, y, own_x, own_y = self.source.rows(c)
        order = np.random.default_rng([self.seed, _STREAM_SPLIT, int(c)]).permutation(len(y))
        g, p, t = int(self.n_global[c]), int(self.n_public[c]), int(self.n_test[c])
        cuts = np.cumsum([g, p]) if own_x is not None else np.cumsum([g, p, t])
        parts = np.split(order, cuts)
        gt, pub = parts[0], parts[1]
        if own_x is not None:
            train, tx, ty = parts[2], own_x, own_y
        else:
            te, train = parts[2], parts[3]
            tx, ty = x[te], y[te]
        return x[train], y[train], tx, ty, x[gt], y[gt], x[pub], y[pub]

    def gather(self, client_ids, with_test: bool) -> tuple[np.ndarray, np.ndarray, dict[int, tuple]]:
        """The rows of ``client_ids`` as one pool (x, y) and, per client, its (train, test) index
        ranges into it: a host's samples for one round."""
        xs, ys, where, at = [], [], {}, 0
        for c in map(int, client_ids):
            xtr, ytr, xte, yte, *_ = self.split(c)
            parts = [(xtr, ytr), (xte, yte)] if with_test else [(xtr, ytr)]
            ranges = []
            for px, py in parts:
                xs.append(px)
                ys.append(py)
                ranges.append(np.arange(at, at + len(py), dtype=np.int64))
                at += len(py)
            where[c] = (ranges[0], ranges[1] if with_test else np.zeros(0, np.int64))
        if not xs:
            return (np.zeros((0, *self.input_shape), np.float32), np.zeros(0, np.int64), where)
        return np.concatenate(xs), np.concatenate(ys).astype(np.int64, copy=False), where

    def _held_rows(self) -> tuple[np.ndarray, ...]:
        if self._held is None:
            parts = [self.split(int(c))[4:] for c in self.heldout]
            shape = (0, *self.input_shape)

            def cat(i, dtype):
                arrays = [p[i] for p in parts if len(p[i])]
                return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(
                    shape if dtype == np.float32 else 0, dtype)
            self._held = (cat(0, np.float32), cat(1, np.int64), cat(2, np.float32), cat(3, np.int64))
        return self._held


class SyntheticSource:
    """LEAF / FedProx Synthetic(alpha, beta) generated one client at a time (``lazy: true``).

    The same model as :func:`engine.data.datasets.load_synthetic` (see there), drawn from
    per-client streams: client sizes from ``(seed, 101)``, client k's parameters (u_k, B_k,
    W_k, b_k, v_k) and samples from ``(seed, 102, k)``, Synthetic-IID's shared W, b from
    ``(seed, 104)``. Values therefore differ from the eager generator's for the same seed;
    ``tests/engine/data/test_ondemand.py`` pins them.
    """

    test_sizes = None

    def __init__(self, *, seed: int, alpha: float, beta: float, num_clients: int, num_features: int,
                 num_classes: int, min_samples: int, max_samples: int, samples_mu: float,
                 samples_sigma: float, iid: bool):
        self.seed, self.alpha, self.beta, self.iid = int(seed), float(alpha), float(beta), bool(iid)
        self.num_features, self.num_classes = int(num_features), int(num_classes)
        self.input_shape = (self.num_features,)
        self.name = "synthetic_iid" if iid else f"synthetic({alpha:g},{beta:g})"
        rng = np.random.default_rng([self.seed, _STREAM_SIZES])
        sizes = min_samples + np.floor(rng.lognormal(samples_mu, samples_sigma, int(num_clients)))
        self.sizes = np.minimum(sizes, max_samples).astype(np.int64)
        self.sd = (np.power(np.arange(1, num_features + 1, dtype=np.float64), -1.2) ** 0.5).astype(np.float32)
        if self.iid:
            shared = np.random.default_rng([self.seed, _STREAM_SHARED])
            self.shared_w = shared.standard_normal((num_features, num_classes), dtype=np.float32)
            self.shared_b = shared.standard_normal(num_classes, dtype=np.float32)

    def rows(self, c: int):
        F, C = self.num_features, self.num_classes
        rng = np.random.default_rng([self.seed, _STREAM_CLIENT, int(c)])
        if self.iid:
            w, b, v = self.shared_w, self.shared_b, np.zeros(F, dtype=np.float32)
        else:
            u = np.float32(rng.normal(0.0, self.alpha))
            big_b = np.float32(rng.normal(0.0, self.beta))
            w = rng.standard_normal((F, C), dtype=np.float32) + u
            b = rng.standard_normal(C, dtype=np.float32) + u
            v = rng.standard_normal(F, dtype=np.float32) + big_b
        x = rng.standard_normal((int(self.sizes[c]), F), dtype=np.float32)
        x *= self.sd
        x += v
        y = np.argmax(x @ w + b, axis=1).astype(np.int64)  # softmax is monotone: argmax of logits
        return x, y, None, None


_INDEX_PARTS = ("train_idx", "train_ptr", "test_idx", "test_ptr", "global_test", "public")


def _index_file(folder: str, settings: dict) -> str:
    key = zlib.crc32(json.dumps(settings, sort_keys=True, default=str).encode())
    return os.path.join(folder, f"index-{key:08x}.npz")


def _saved_index(folder: str, settings: dict) -> tuple[np.ndarray, ...] | None:
    """The row index a previous build (validation, another run, a client host) saved beside the cache."""
    try:
        with np.load(_index_file(folder, settings), allow_pickle=False) as npz:
            if json.loads(str(npz["settings"])) != json.loads(json.dumps(settings, default=str)):
                return None  # a crc32 collision: build it
            return tuple(npz[k] for k in _INDEX_PARTS)
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):  # absent or unreadable: build it
        return None


def _save_index(folder: str, settings: dict, index: tuple[np.ndarray, ...]) -> None:
    """Written to a temporary file and renamed: a reader never sees half an index. A read-only
    cache folder only costs the rebuild next time."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".index-", suffix=".npz", dir=folder)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, settings=json.dumps(settings, default=str), **dict(zip(_INDEX_PARTS, index)))
        os.replace(tmp, _index_file(folder, settings))
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)


class PartitionedTableData:
    """An on-disk table split by a label scheme: a per-client index (CSR, positions in the row
    cache, which is the eager pool's order) and the pool's labels; rows are read from the cache
    when asked (:meth:`gather`). The index is built once per (scheme, seed, clients, fractions)
    and saved beside the row cache (``index-<key>.npz``), so validation, the run and later runs
    of the same split load it."""

    on_demand = True

    def __init__(self, source, *, num_clients: int | None, scheme: str, seed: int, **split):
        """``source``: a :class:`engine.data.disk_table.DiskTableSource` in pool order (one block);
        ``split``: the partition's settings (alpha, shards_per_client, min_samples and the fractions)."""
        self.source, self.seed = source, int(seed)
        self.name, self.num_classes = source.name, int(source.num_classes)
        n_train = int(source.sizes[0])
        self._labels = source.take_labels()  # the pool's labels: 8 bytes a row, never the features
        settings = dict(num_clients=num_clients, scheme=scheme, seed=self.seed, **split)
        index = _saved_index(source.folder, settings)
        if index is None:
            index = partition_pool(self._labels, n_train, **settings)
            _save_index(source.folder, settings, index)
        (self.tr_idx, self.tr_ptr, self.te_idx, self.te_ptr, self.global_test_idx, self.public_idx) = index
        has_test = len(self._labels) > n_train
        self.meta = dict(scheme=scheme, seed=self.seed, num_clients=int(num_clients), on_demand=True, **split)
        if has_test or scheme == "pfllib":  # the official test split or PFLlib's: no fraction held out
            self.meta["global_test_fraction"] = None
        self.meta["official_test"] = has_test
        self._held: tuple[np.ndarray, ...] | None = None

    def __getstate__(self):  # the held-out rows and the labels are the driver's: hosts never need them
        state = dict(self.__dict__)
        state["_held"] = state["_labels"] = None
        return state

    @property
    def labels(self) -> np.ndarray:
        """Every pool row's label (read again from the cache in a process that received this by pickle)."""
        if self._labels is None:
            self._labels = self.source.take_labels()
        return self._labels

    @property
    def num_clients(self) -> int:
        return len(self.tr_ptr) - 1

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.source.input_shape)

    def train_indices(self, c: int) -> np.ndarray:
        return self.tr_idx[self.tr_ptr[c]:self.tr_ptr[c + 1]]

    def test_indices(self, c: int) -> np.ndarray:
        return self.te_idx[self.te_ptr[c]:self.te_ptr[c + 1]]

    def client_num_train(self) -> np.ndarray:
        return np.diff(self.tr_ptr)

    def client_num_test(self) -> np.ndarray:
        return np.diff(self.te_ptr)

    @property
    def num_global_test(self) -> int:
        return len(self.global_test_idx)

    @property
    def num_public(self) -> int:
        return len(self.public_idx)

    def global_test_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._held_rows()[:2]

    def public_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._held_rows()[2:]

    def client_label_counts(self, split: str = "train") -> np.ndarray:
        """(num_clients, num_classes) label histogram, from the labels alone (nothing read)."""
        if split not in ("train", "test", "all"):
            raise ValueError(f"split={split!r} is invalid; allowed: 'train', 'test', 'all'")
        counts = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        if split in ("train", "all"):
            counts += _csr_label_counts(self.labels, self.tr_idx, self.tr_ptr, self.num_classes)
        if split in ("test", "all"):
            counts += _csr_label_counts(self.labels, self.te_idx, self.te_ptr, self.num_classes)
        return counts

    def gather(self, client_ids, with_test: bool) -> tuple[np.ndarray, np.ndarray, dict[int, tuple]]:
        """The distinct rows of ``client_ids`` as one pool (x, y), read once in cache order, and
        per client its (train, test) positions in it, in the index's order (the eager order)."""
        ids = [int(c) for c in client_ids]
        wanted = [self.train_indices(c) for c in ids] + ([self.test_indices(c) for c in ids] if with_test else [])
        rows = np.unique(np.concatenate(wanted)) if wanted else np.zeros(0, np.int64)
        x, y = self.source.take(rows)
        empty = np.zeros(0, np.int64)
        where = {c: (np.searchsorted(rows, self.train_indices(c)),
                     np.searchsorted(rows, self.test_indices(c)) if with_test else empty) for c in ids}
        return x, y, where

    def _held_rows(self) -> tuple[np.ndarray, ...]:
        if self._held is None:
            self._held = (*self.source.take(self.global_test_idx), *self.source.take(self.public_idx))
        return self._held
