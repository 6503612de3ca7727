"""Split a dataset over federated clients.

:func:`partition_labels` assigns every sample to exactly one client (IID,
Dirichlet label skew, or pathological label shards);
:func:`build_federated_data` turns an :class:`~engine.data.datasets.ArrayDataset`
into a :class:`FederatedData`: one sample pool plus per-client train/test
index sets in CSR layout (two flat int64 arrays per split, compact for 10,000
clients and cheap to ship through Ray's object store), a held-out global test
set and an optional server-side public split.  :func:`label_skew` measures how
non-IID a partition is.

Over 400 lines because the partition schemes, the compact index layout they produce and its
checks are read together; each scheme is one short function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from engine.data.datasets import ArrayDataset
from engine.data.pfllib import pfllib_pool

__all__ = [
    "FederatedData",
    "PARTITION_SCHEMES",
    "partition_labels",
    "partition_pool",
    "build_federated_data",
    "label_skew",
]

PARTITION_SCHEMES = ("iid", "dirichlet", "shards", "natural", "pfllib")

# sub-streams of the seed, so e.g. changing public_fraction does not reshuffle the partition
_STREAM_GLOBAL_TEST, _STREAM_PUBLIC, _STREAM_PARTITION, _STREAM_LOCAL_SPLIT = range(4)


# --------------------------------------------------------------------------- #
# container
# --------------------------------------------------------------------------- #
@dataclass
class FederatedData:
    """One sample pool (``x``, ``y``) and index sets into it.

    Client c's local train indices are ``client_train_idx[client_train_ptr[c]:client_train_ptr[c+1]]``
    (CSR layout), likewise for local test.  ``global_test_idx`` is never given
    to clients; ``public_idx`` is server-side public data (empty if unused).
    All index arrays are int64 and the sets are pairwise disjoint.
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    client_train_idx: np.ndarray
    client_train_ptr: np.ndarray
    client_test_idx: np.ndarray
    client_test_ptr: np.ndarray
    global_test_idx: np.ndarray
    public_idx: np.ndarray
    meta: dict = field(default_factory=dict)  # how it was built (scheme, seed, fractions, ...)

    # every sample is in memory (engine.data.ondemand.OnDemandFederatedData builds clients' rows when asked)
    on_demand = False

    @property
    def num_clients(self) -> int:
        return len(self.client_train_ptr) - 1

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])

    def train_indices(self, c: int) -> np.ndarray:
        return self.client_train_idx[self.client_train_ptr[c] : self.client_train_ptr[c + 1]]

    def test_indices(self, c: int) -> np.ndarray:
        return self.client_test_idx[self.client_test_ptr[c] : self.client_test_ptr[c + 1]]

    def client_num_train(self) -> np.ndarray:
        return np.diff(self.client_train_ptr)

    @property
    def num_global_test(self) -> int:
        return len(self.global_test_idx)

    @property
    def num_public(self) -> int:
        return len(self.public_idx)

    def global_test_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x[self.global_test_idx], self.y[self.global_test_idx]

    def public_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x[self.public_idx], self.y[self.public_idx]

    def client_num_test(self) -> np.ndarray:
        return np.diff(self.client_test_ptr)

    def client_label_counts(self, split: str = "train") -> np.ndarray:
        """(num_clients, num_classes) label histogram of each client's ``train``, ``test`` or ``all`` data."""
        if split not in ("train", "test", "all"):
            raise ValueError(f"split={split!r} is invalid; allowed: 'train', 'test', 'all'")
        counts = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        for idx, ptr in self._splits(split):
            counts += _csr_label_counts(self.y, idx, ptr, self.num_classes)
        return counts

    def _splits(self, split: str):
        if split in ("train", "all"):
            yield self.client_train_idx, self.client_train_ptr
        if split in ("test", "all"):
            yield self.client_test_idx, self.client_test_ptr


# --------------------------------------------------------------------------- #
# CSR helpers
# --------------------------------------------------------------------------- #
def _to_csr(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=ptr[1:])
    idx = np.concatenate(parts).astype(np.int64, copy=False) if len(parts) else np.zeros(0, np.int64)
    return idx, ptr


def _owner_to_csr(owner: np.ndarray, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """Client id per position -> CSR (positions grouped by client, ascending within a client)."""
    idx = np.argsort(owner, kind="stable").astype(np.int64)
    ptr = np.zeros(num_clients + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=num_clients), out=ptr[1:])
    return idx, ptr


def _segment_ids(ptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))


def _csr_label_counts(y: np.ndarray, idx: np.ndarray, ptr: np.ndarray, num_classes: int) -> np.ndarray:
    n = len(ptr) - 1
    flat = _segment_ids(ptr) * num_classes + y[idx]
    return np.bincount(flat, minlength=n * num_classes).reshape(n, num_classes)


def _segment_take(
    idx: np.ndarray, ptr: np.ndarray, fraction: float, rng: np.random.Generator, keep_min: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Within each segment (client), shuffle and move ``round(fraction * n)``
    samples out, keeping at least ``keep_min`` (if the client has that many).

    Returns (kept_idx, kept_ptr, taken_idx, taken_ptr); vectorised over all
    segments by one lexsort on (segment, random key).
    """
    sizes = np.diff(ptr)
    seg = _segment_ids(ptr)
    order = np.lexsort((rng.random(len(idx)), seg))  # shuffle inside each segment
    shuffled = idx[order]
    n_take = np.floor(fraction * sizes + 0.5).astype(np.int64)
    n_take = np.clip(n_take, 0, np.maximum(sizes - keep_min, 0))
    pos = np.arange(len(idx)) - ptr[seg]  # position inside the segment
    take = pos < n_take[seg]
    taken_ptr = np.zeros_like(ptr)
    np.cumsum(n_take, out=taken_ptr[1:])
    kept_ptr = np.zeros_like(ptr)
    np.cumsum(sizes - n_take, out=kept_ptr[1:])
    return shuffled[~take], kept_ptr, shuffled[take], taken_ptr


# --------------------------------------------------------------------------- #
# partitioners
# --------------------------------------------------------------------------- #
def partition_labels(
    y: np.ndarray,
    num_clients: int,
    scheme: str,
    rng: np.random.Generator,
    *,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    min_samples: int = 10,
    max_retries: int = 100,
) -> list[np.ndarray]:
    """Assign every position of ``y`` to exactly one of ``num_clients`` clients.

    Returns one int64 array of positions into ``y`` per client (ascending);
    together they cover ``range(len(y))`` exactly once.

    ``iid``        shuffle and split into near-equal parts.
    ``dirichlet``  per class, proportions over clients ~ Dirichlet(alpha) (Hsu et
                   al. 2019; NIID-Bench/PFLlib variant: a client already holding
                   more than the average stops receiving further classes).
                   Redrawn until every client has >= ``min_samples``; ValueError
                   after ``max_retries`` draws.  Small alpha = strong label skew.
    ``shards``     pathological (McMahan et al.): ``num_clients * shards_per_client``
                   single-label shards (cut inside each label, shard counts per
                   label proportional to its frequency), ``shards_per_client``
                   random shards per client => at most that many labels each.
                   If there are fewer shards than labels, shards are contiguous
                   cuts of the label-sorted order instead (several labels each).
    ``natural`` is not a label partition: use :func:`build_federated_data`; nor is ``pfllib``,
    whose local splits are part of its draws: use :func:`partition_pool`.
    """
    y = np.asarray(y)
    n = len(y)
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients={num_clients!r} is invalid; allowed: an integer >= 1")
    if n < num_clients:
        raise ValueError(f"cannot split {n} samples over num_clients={num_clients}: need at least one sample "
                         "per client")
    if scheme == "iid":
        return [np.sort(p).astype(np.int64) for p in np.array_split(rng.permutation(n), num_clients)]
    if scheme == "dirichlet":
        return _partition_dirichlet(y, num_clients, rng, alpha, min_samples, max_retries)
    if scheme == "shards":
        return _partition_shards(y, num_clients, rng, shards_per_client)
    if scheme in ("natural", "pfllib"):
        raise ValueError(
            f"scheme={scheme!r} is handled by build_federated_data (natural: the dataset's own clients; "
            "pfllib: with its local splits, partition_pool), not partition_labels"
        )
    raise ValueError(f"scheme={scheme!r} is invalid; allowed: {list(PARTITION_SCHEMES)}")


def _partition_dirichlet(y, num_clients, rng, alpha, min_samples, max_retries) -> list[np.ndarray]:
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha={alpha!r} is invalid; allowed: a finite number > 0")
    n = len(y)
    if min_samples * num_clients > n:
        raise ValueError(
            f"dirichlet partition impossible: num_clients={num_clients} x min_samples={min_samples} "
            f"exceeds the {n} samples available; lower min_samples or num_clients"
        )
    classes = np.unique(y)
    by_class = [np.flatnonzero(y == k) for k in classes]
    avg = n / num_clients
    worst = 0
    for _attempt in range(max(1, max_retries)):
        owner = np.empty(n, dtype=np.int64)
        counts = np.zeros(num_clients, dtype=np.int64)
        for members in by_class:
            members = rng.permutation(members)
            p = rng.dirichlet(np.full(num_clients, alpha))
            # balance trick of the reference code: full clients get no more classes
            masked = p * (counts < avg)
            if masked.sum() > 0:
                p = masked
            total = p.sum()
            p = p / total if np.isfinite(total) and total > 0 else np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(p) * len(members)).astype(np.int64)
            cuts[-1] = len(members)  # float rounding must not drop the last samples
            per_client = np.diff(cuts, prepend=0)
            owner[members] = np.repeat(np.arange(num_clients), per_client)
            counts += per_client
        worst = int(counts.min())
        if worst >= min_samples:
            idx, ptr = _owner_to_csr(owner, num_clients)
            return np.split(idx, ptr[1:-1])
    raise ValueError(
        f"dirichlet partition failed after max_retries={max_retries} draws: with alpha={alpha}, "
        f"num_clients={num_clients} and {n} samples, some client always got fewer than "
        f"min_samples={min_samples} samples (smallest client in the last draw: {worst}); "
        "increase alpha, lower min_samples or num_clients, or raise max_retries"
    )


def _partition_shards(y, num_clients, rng, shards_per_client) -> list[np.ndarray]:
    s = shards_per_client
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
        raise ValueError(f"shards_per_client={s!r} is invalid; allowed: an integer >= 1")
    n = len(y)
    total = num_clients * s
    if total > n:
        raise ValueError(
            f"shards partition impossible: num_clients={num_clients} x shards_per_client={s} = {total} "
            f"shards but only {n} samples; lower shards_per_client or num_clients"
        )
    # random order inside each label, then sorted by label
    perm = rng.permutation(n)
    order = perm[np.argsort(y[perm], kind="stable")]
    classes, class_sizes = np.unique(y, return_counts=True)
    if total >= len(classes):
        alloc = _allocate_shards(class_sizes, total)
        bounds = np.concatenate([[0], np.cumsum(class_sizes)])
        shards = []
        for k in range(len(classes)):
            shards.extend(np.array_split(order[bounds[k] : bounds[k + 1]], alloc[k]))
    else:
        shards = np.array_split(order, total)
    assignment = rng.permutation(total)
    return [
        np.sort(np.concatenate([shards[j] for j in assignment[c * s : (c + 1) * s]])).astype(np.int64)
        for c in range(num_clients)
    ]


def _allocate_shards(class_sizes: np.ndarray, total: int) -> np.ndarray:
    """Shards per class: >= 1 each, <= class size, summing to ``total``, proportional to class size
    (largest remainder)."""
    quota = class_sizes / class_sizes.sum() * total
    alloc = np.clip(np.floor(quota).astype(np.int64), 1, class_sizes)
    while alloc.sum() < total:
        room = np.where(alloc < class_sizes, quota - alloc, -np.inf)
        alloc[np.argmax(room)] += 1
    while alloc.sum() > total:
        excess = np.where(alloc > 1, alloc - quota, -np.inf)
        alloc[np.argmax(excess)] -= 1
    return alloc


# --------------------------------------------------------------------------- #
# building the federated view of a dataset
# --------------------------------------------------------------------------- #
def _check_fraction(pname: str, val: float, upper_inclusive: bool = False) -> None:
    ok = 0.0 <= val <= 1.0 if upper_inclusive else 0.0 <= val < 1.0
    if not (np.isfinite(val) and ok):
        allowed = "0 <= value <= 1" if upper_inclusive else "0 <= value < 1"
        raise ValueError(f"{pname}={val!r} is invalid; allowed: {allowed}")


def build_federated_data(
    ds: ArrayDataset,
    *,
    num_clients: int | None,
    scheme: str,
    seed: int,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    min_samples: int = 10,
    test_fraction: float = 0.25,
    global_test_fraction: float = 0.2,
    public_fraction: float = 0.0,
    max_retries: int = 100,
    pfllib: dict | None = None,
) -> FederatedData:
    """Split ``ds`` into clients.  Deterministic given ``seed``.

    1. Pool = ``ds.x`` with the official test split appended (if any).
    2. Global test = the official test split if present (``global_test_fraction``
       is then ignored), else a random ``global_test_fraction`` of the pool.
    3. Public = a random ``public_fraction`` of the remaining training pool.
    4. The rest is split over ``num_clients`` by :func:`partition_labels`.
    5. Each client's samples are shuffled and ``round(test_fraction * n)`` go to
       its local test set, keeping at least one local train sample.

    ``scheme="natural"`` uses ``ds.natural_clients`` (``num_clients`` must equal
    their count, or be None).  There, steps 2-3 hold out the fractions *from
    each client* (at least one sample stays with every client), so the global
    test and public sets follow the clients' own distributions, as in LEAF. A dataset
    with ``natural_test_clients`` (LEAF, a table with a split column) keeps its own local
    test sets: its test rows are the clients' local tests, and the global test set is held
    out from the training rows.

    ``scheme="pfllib"`` is PFLlib's protocol (:mod:`engine.data.pfllib`, settings ``pfllib``: the
    fields of ``partition.pfllib``): the whole pool, official test split included, goes to the
    clients, and each client's rows are split ``1 - test_fraction`` / ``test_fraction`` as PFLlib
    splits them; the global test set is the clients' local test rows together, or the official
    test split (``global_test: official``, which the clients also hold, as in the reference).
    """
    if scheme not in PARTITION_SCHEMES:
        raise ValueError(f"scheme={scheme!r} is invalid; allowed: {list(PARTITION_SCHEMES)}")
    _check_fraction("test_fraction", test_fraction)
    _check_fraction("global_test_fraction", global_test_fraction)
    _check_fraction("public_fraction", public_fraction)

    def stream(i: int) -> np.random.Generator:
        return np.random.default_rng([int(seed), i])

    has_test = ds.test_x is not None
    n_train = len(ds.x)
    own_tests = scheme == "natural" and ds.natural_test_clients is not None  # e.g. LEAF's per-user split
    if has_test:
        x = np.concatenate([ds.x, ds.test_x])
        y = np.concatenate([ds.y, ds.test_y]).astype(np.int64, copy=False)
        official_test = np.arange(n_train, len(x), dtype=np.int64)
    else:
        x, y = ds.x, ds.y.astype(np.int64, copy=False)
        official_test = None

    if scheme == "natural":
        clients, global_test, public = _natural_clients(
            ds, num_clients, None if own_tests else official_test, global_test_fraction, public_fraction, stream
        )
        num_clients = len(clients[1]) - 1
        c_idx, c_ptr = clients
        if own_tests:  # the clients' own test rows are their local test sets (test_fraction does not apply)
            tr_idx, tr_ptr = c_idx, c_ptr
            te_idx, te_ptr = _to_csr([n_train + np.asarray(t, dtype=np.int64) for t in ds.natural_test_clients])
        else:
            tr_idx, tr_ptr, te_idx, te_ptr = _segment_take(c_idx, c_ptr, test_fraction,
                                                           stream(_STREAM_LOCAL_SPLIT))
    else:
        tr_idx, tr_ptr, te_idx, te_ptr, global_test, public = partition_pool(
            y, n_train, num_clients=num_clients, scheme=scheme, seed=seed, alpha=alpha,
            shards_per_client=shards_per_client, min_samples=min_samples, test_fraction=test_fraction,
            global_test_fraction=global_test_fraction, public_fraction=public_fraction, max_retries=max_retries,
            pfllib=pfllib)
    extra = {"pfllib": dict(pfllib or {})} if scheme == "pfllib" else {}
    return FederatedData(
        name=ds.name,
        x=x,
        y=y,
        num_classes=int(ds.num_classes),
        client_train_idx=tr_idx,
        client_train_ptr=tr_ptr,
        client_test_idx=te_idx,
        client_test_ptr=te_ptr,
        global_test_idx=global_test.astype(np.int64, copy=False),
        public_idx=public.astype(np.int64, copy=False),
        meta=dict(
            scheme=scheme,
            seed=int(seed),
            num_clients=int(num_clients),
            alpha=alpha,
            shards_per_client=shards_per_client,
            min_samples=min_samples,
            test_fraction=test_fraction,
            global_test_fraction=None if has_test or scheme == "pfllib" else global_test_fraction,
            public_fraction=public_fraction,
            official_test=has_test,
            **extra,
        ),
    )


def partition_pool(
    y: np.ndarray,
    n_train: int,
    *,
    num_clients: int | None,
    scheme: str,
    seed: int,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    min_samples: int = 10,
    test_fraction: float = 0.25,
    global_test_fraction: float = 0.2,
    public_fraction: float = 0.0,
    max_retries: int = 100,
    pfllib: dict | None = None,
) -> tuple[np.ndarray, ...]:
    """Steps 2-5 of :func:`build_federated_data` for a label scheme (``iid``, ``dirichlet``,
    ``shards``), from the labels alone: ``y`` is the pool's labels (its first ``n_train`` the
    training rows, the rest the official test split). Returns (train idx, train ptr, test idx,
    test ptr, global test, public), positions into the pool; an on-disk table
    (:mod:`engine.data.ondemand`) indexes its row cache with the same arrays. ``scheme="pfllib"``
    (``pfllib``: its settings) is :func:`engine.data.pfllib.pfllib_pool`."""
    if num_clients is None:
        raise ValueError(f"num_clients is required for scheme={scheme!r}")
    if scheme == "pfllib":
        return pfllib_pool(y, n_train, num_clients=num_clients, alpha=alpha, test_fraction=test_fraction,
                           public_fraction=public_fraction, seed=seed, pfllib=pfllib or {})

    def stream(i: int) -> np.random.Generator:
        return np.random.default_rng([int(seed), i])

    if len(y) > n_train:  # the official test split is the global test set
        global_test = np.arange(n_train, len(y), dtype=np.int64)
        rest = np.arange(n_train, dtype=np.int64)
    else:
        perm = stream(_STREAM_GLOBAL_TEST).permutation(n_train)
        n_gt = int(round(global_test_fraction * n_train))
        global_test, rest = np.sort(perm[:n_gt]), np.sort(perm[n_gt:])
    perm = stream(_STREAM_PUBLIC).permutation(len(rest))
    n_pub = int(round(public_fraction * len(rest)))
    public, rest = np.sort(rest[perm[:n_pub]]), np.sort(rest[perm[n_pub:]])
    parts = partition_labels(
        y[rest],
        num_clients,
        scheme,
        stream(_STREAM_PARTITION),
        alpha=alpha,
        shards_per_client=shards_per_client,
        min_samples=min_samples,
        max_retries=max_retries,
    )
    c_idx, c_ptr = _to_csr([rest[p] for p in parts])
    tr_idx, tr_ptr, te_idx, te_ptr = _segment_take(c_idx, c_ptr, test_fraction, stream(_STREAM_LOCAL_SPLIT))
    return tr_idx, tr_ptr, te_idx, te_ptr, global_test.astype(np.int64, copy=False), public.astype(np.int64)


def _natural_clients(ds, num_clients, official_test, global_test_fraction, public_fraction, stream):
    if not ds.natural_clients:
        raise ValueError(
            f"scheme='natural' needs a dataset with natural clients; {ds.name!r} has none "
            f"(use one of {[s for s in PARTITION_SCHEMES if s != 'natural']})"
        )
    k = len(ds.natural_clients)
    if num_clients is not None and num_clients != k:
        raise ValueError(
            f"num_clients={num_clients} does not match the {k} natural clients of {ds.name!r}; "
            f"set num_clients to {k} (or None) for scheme='natural'"
        )
    idx, ptr = _to_csr([np.asarray(c, dtype=np.int64) for c in ds.natural_clients])
    if len(idx) and (idx.min() < 0 or idx.max() >= len(ds.x) or np.bincount(idx).max() > 1):
        raise ValueError(f"natural_clients of {ds.name!r} must be disjoint index arrays into x (0..{len(ds.x) - 1})")
    if official_test is not None:
        global_test = official_test
    else:
        idx, ptr, global_test, _ = _segment_take(idx, ptr, global_test_fraction, stream(_STREAM_GLOBAL_TEST))
    idx, ptr, public, _ = _segment_take(idx, ptr, public_fraction, stream(_STREAM_PUBLIC))
    return (idx, ptr), np.sort(global_test), np.sort(public)


# --------------------------------------------------------------------------- #
# skew measure
# --------------------------------------------------------------------------- #
def label_skew(
    parts: FederatedData | Sequence[np.ndarray], y: np.ndarray | None = None, num_classes: int | None = None
) -> float:
    """Mean over clients of the total-variation distance between the client's
    label distribution and the label distribution of all clients' data together.

    0 = every client has the global mix; close to 1 = clients hold disjoint
    labels.  ``parts`` is a :class:`FederatedData` (all client data, local train
    and test) or a list of index arrays into ``y``.  Empty clients are ignored.
    """
    if isinstance(parts, FederatedData):
        counts = parts.client_label_counts("all")
    else:
        if y is None:
            raise ValueError("label_skew: y is required when parts is a list of index arrays")
        y = np.asarray(y, dtype=np.int64)
        if num_classes is None:
            num_classes = int(y.max()) + 1 if len(y) else 1
        idx, ptr = _to_csr([np.asarray(p, dtype=np.int64) for p in parts])
        counts = _csr_label_counts(y, idx, ptr, num_classes)
    sizes = counts.sum(axis=1)
    counts = counts[sizes > 0]
    if len(counts) == 0:
        return 0.0
    global_dist = counts.sum(axis=0) / counts.sum()
    local = counts / counts.sum(axis=1, keepdims=True)
    return float(np.mean(0.5 * np.abs(local - global_dist).sum(axis=1)))
