"""PFLlib's data protocol (``partition.scheme: pfllib``): its ``iid`` / ``pat`` / ``dir`` / ``exdir``
label splits and its per-client train/test split, drawn exactly as PFLlib draws them.

PFLlib (github.com/TsingZ0/PFLlib, ``dataset/utils/dataset_utils.py``: ``separate_data`` and
``split_data``) and the papers built on it, FedCSPACK's reference code among them, partition the
whole dataset (the official training and test rows together) over the clients, then split each
client's rows into its own train and test sets with scikit-learn's ``train_test_split``. Every draw
comes from numpy's one global legacy generator, seeded once (``np.random.seed(1)`` in its
``generate_*.py`` scripts): first the partition, then one permutation per client, in client order.
Here that is one ``np.random.RandomState(seed)`` consumed in the same order with the same calls,
so the same labels and seed give the same clients, row for row
(``tests/engine/data/test_pfllib.py`` checks it against PFLlib's own output).

``variant: fedcspack`` is the FedCSPACK reference's copy of that file (github.com/NigeloYang/FedCSPACK):
its non-IID ``pat`` shuffles the clients that may take each class, and its ``exdir`` has an
unbalanced form. What cannot be matched (PFLlib loops forever, crashes, or casts NaN to an
integer) is said where it happens and in docs/datasets.md.

Not here: the engine's own schemes (:mod:`engine.data.partition`, which calls :func:`pfllib_pool`).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["SPLITS", "VARIANTS", "GLOBAL_TESTS", "MAX_TRIES", "pfllib_clients", "pfllib_local_split",
           "pfllib_pool"]

SPLITS = ("iid", "pat", "dir", "exdir")
VARIANTS = ("pfllib", "fedcspack")
GLOBAL_TESTS = ("clients", "official")
# PFLlib redraws without end until its size rules hold; here a draw that never satisfies them stops
MAX_TRIES = 20_000
# exdir's second level redraws until every client holds this many rows (fixed in PFLlib's code)
EXDIR_MIN_SIZE = 10


def pfllib_pool(y: np.ndarray, n_train: int, *, num_clients: int, alpha: float, test_fraction: float,
                public_fraction: float, seed: int, pfllib: dict) -> tuple[np.ndarray, ...]:
    """:func:`engine.data.partition.partition_pool` for ``scheme: pfllib``: every pool row (the
    official test split included, after the training rows, as PFLlib concatenates them) is split
    over the clients, then each client's rows into train and test. ``pfllib``: the settings of
    ``partition.pfllib`` (``seed`` None: the experiment's ``seed``). Returns (train idx, train ptr,
    test idx, test ptr, global test, public)."""
    if public_fraction:
        raise ValueError(f"partition.public_fraction = {public_fraction!r} with partition.scheme = 'pfllib': "
                         "PFLlib's protocol gives every row to a client, so there is no server-side public "
                         "split; set public_fraction: 0 or use another scheme")
    opts = dict(pfllib)
    data_seed = opts.pop("seed", 1)
    global_test = opts.pop("global_test", "clients")
    if global_test == "official" and len(y) == n_train:
        raise ValueError("partition.pfllib.global_test = 'official': this dataset has no official test split; "
                         "use global_test: clients (the clients' local test rows together)")
    rng = np.random.RandomState(_legacy_seed(seed if data_seed is None else data_seed))
    train_ratio = 1.0 - test_fraction  # PFLlib's train_ratio; its test share is 1 - train_ratio
    clients = pfllib_clients(np.asarray(y), num_clients, alpha=alpha, rng=rng, train_ratio=train_ratio, **opts)
    tr_idx, tr_ptr, te_idx, te_ptr = pfllib_local_split(clients, train_ratio, rng)
    if global_test == "official":
        held = np.arange(n_train, len(y), dtype=np.int64)
    else:
        held = np.sort(te_idx)
    return tr_idx, tr_ptr, te_idx, te_ptr, held, np.zeros(0, np.int64)


def _legacy_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"partition.pfllib.seed = {seed!r} is invalid; allowed: an integer in "
                         "0..4294967295 (numpy's legacy generator), or null for the experiment's seed")
    return int(seed)


def pfllib_clients(y: np.ndarray, num_clients: int, *, split: str, balance: bool, class_per_client: int,
                   alpha: float, batch_size: int, train_ratio: float, rng: np.random.RandomState,
                   variant: str = "pfllib") -> list[np.ndarray]:
    """PFLlib's ``separate_data``: each client's positions into ``y``, in PFLlib's order (class by
    class, as drawn; ``exdir`` shuffles each client's list at the end). Rows no client takes (``pat``
    when the clients' class slots run out) belong to none."""
    if split not in SPLITS:
        raise ValueError(f"partition.pfllib.split = {split!r} is invalid; allowed: {list(SPLITS)}")
    if variant not in VARIANTS:
        raise ValueError(f"partition.pfllib.variant = {variant!r} is invalid; allowed: {list(VARIANTS)}")
    num_classes = _check_labels(y)
    n = len(y)
    # PFLlib: every client should hold one test batch: min(batch_size / test share, N / clients / 2)
    least = int(min(batch_size / (1 - train_ratio), n / num_clients / 2))
    if split in ("iid", "pat"):
        cpc = num_classes if split == "iid" else class_per_client
        shuffle_clients = variant == "fedcspack" and split == "pat"
        owner = _pat(y, num_clients, num_classes, cpc, balance, least, rng, shuffle_clients)
        return _lists_by_owner(owner, num_clients)
    if split == "dir":
        if not balance:
            raise ValueError("partition.pfllib.balance = false with split 'dir': PFLlib's dir split has no "
                             "unbalanced form (a client holding N / num_clients rows always stops taking "
                             "classes); remove balance or use split 'pat' or 'exdir'")
        return _dir(y, num_clients, num_classes, alpha, least, rng)
    if not balance and variant == "pfllib":
        raise ValueError("partition.pfllib.balance = false with split 'exdir': PFLlib's own exdir always "
                         "balances; its unbalanced form is the FedCSPACK reference's (variant: fedcspack)")
    return _exdir(y, num_clients, num_classes, class_per_client, alpha, balance, rng)


def _check_labels(y: np.ndarray) -> int:
    """PFLlib's class count (``len(set(labels))``); its loops visit labels 0..K-1, so they must be those."""
    labels = np.unique(y)
    k = len(labels)
    if k == 0 or labels[0] != 0 or labels[-1] != k - 1:
        raise ValueError(f"partition.scheme = 'pfllib' needs the labels 0..K-1, each present (PFLlib visits "
                         f"range(len(set(labels)))); this dataset's labels are {labels[:10].tolist()}"
                         f"{' ...' if k > 10 else ''}")
    return k


def _pat(y, num_clients, num_classes, cpc, balance, least, rng, shuffle_clients) -> tuple[np.ndarray, np.ndarray]:
    """Class by class, the first clients with a class slot left (the fedcspack variant: shuffled
    first) take it; ``ceil(num_clients / K * cpc)`` clients a class, equal shares or random ones.
    Returns each position's client (-1: none) and its rank in the order the clients took them."""
    if isinstance(cpc, bool) or not isinstance(cpc, (int, np.integer)) or cpc < 1:
        raise ValueError(f"partition.pfllib.class_per_client = {cpc!r} is invalid; allowed: an integer >= 1")
    owner = np.full(len(y), -1, dtype=np.int64)
    # PFLlib appends rows to a client's list class by class; rank keeps that order for the lists
    rank = np.zeros(len(y), dtype=np.int64)
    slots = np.full(num_clients, cpc, dtype=np.int64)
    per_class = int(np.ceil((num_clients / num_classes) * cpc))
    taken = 0
    for k in range(num_classes):
        chosen = np.flatnonzero(slots > 0)
        if len(chosen) == 0:
            break
        if shuffle_clients:
            rng.shuffle(chosen)
        chosen = chosen[:per_class]
        members = np.flatnonzero(y == k)
        share = len(members) / len(chosen)
        if balance:
            sizes = [int(share)] * (len(chosen) - 1)
        else:
            low = max(share / 10, least / num_classes)
            try:
                sizes = rng.randint(low, share, len(chosen) - 1).tolist()
            except ValueError:
                raise ValueError(
                    f"partition.pfllib.balance = false: PFLlib draws each of the {len(chosen)} clients' share of "
                    f"class {k} as randint(max(n/10, least/K), n/clients) = randint({low:g}, {share:g}), which has "
                    "no integer here (PFLlib's own code fails the same way); use balance: true or fewer "
                    "clients") from None
        sizes.append(len(members) - sum(sizes))
        owner[members] = np.repeat(chosen, sizes)
        rank[members] = taken + np.arange(len(members))
        taken += len(members)
        slots[chosen] -= 1
    return owner, rank


def _lists_by_owner(owner_rank, num_clients: int) -> list[np.ndarray]:
    owner, rank = owner_rank
    held = np.flatnonzero(owner >= 0)
    order = held[np.lexsort((rank[held], owner[held]))]
    counts = np.bincount(owner[held], minlength=num_clients)
    return np.split(order.astype(np.int64), np.cumsum(counts)[:-1])


def _cuts(p: np.ndarray, n: int) -> np.ndarray | None:
    """PFLlib's cut points of ``n`` rows by the proportions ``p`` (normalised), ``None`` when every
    proportion is 0: PFLlib then divides 0 by 0 and casts NaN to an integer."""
    total = p.sum()
    if not total > 0:
        return None
    return (np.cumsum(p / total) * n).astype(np.int64)[:-1]


def _sizes(cuts: np.ndarray, n: int) -> np.ndarray:
    """Rows each client gets from ``np.split(rows, cuts)`` (cuts ascending within 0..n)."""
    return np.diff(np.concatenate([[0], np.clip(cuts, 0, n), [n]]))


def _dir(y, num_clients, num_classes, alpha, least, rng) -> list[np.ndarray]:
    """Per class, proportions ~ Dirichlet(alpha) over the clients still under N / num_clients rows,
    redrawn whole until every client holds ``least`` rows."""
    n = len(y)
    if least < 1:
        raise ValueError(f"PFLlib's dir split needs at least 2 rows per client ({n} rows for {num_clients} "
                         "clients): its code never draws otherwise; lower clients.num_clients")
    for _ in range(MAX_TRIES):
        streams, owners = [], []
        counts = np.zeros(num_clients, dtype=np.int64)
        for k in range(num_classes):
            members = np.flatnonzero(y == k)
            rng.shuffle(members)
            p = rng.dirichlet(np.repeat(alpha, num_clients))
            cuts = _cuts(p * (counts < n / num_clients), len(members))
            # all 0: PFLlib's 0/0 casts to INT64_MIN (x86-64) or 0 (ARM): the whole class to the last client
            sizes = _sizes(cuts, len(members)) if cuts is not None else _all_to(num_clients - 1, num_clients,
                                                                                len(members))
            streams.append(members)
            owners.append(np.repeat(np.arange(num_clients), sizes))
            counts += sizes
        if counts.min() >= least:
            return _lists(np.concatenate(streams), np.concatenate(owners), num_clients)
    raise ValueError(
        f"PFLlib's dir split found no draw in {MAX_TRIES} where every client holds at least {least} rows "
        f"(min(batch_size / test_fraction, N / clients / 2); PFLlib itself would redraw forever): raise "
        "partition.alpha, lower partition.pfllib.batch_size or clients.num_clients")


def _all_to(client: int, num_clients: int, n: int) -> np.ndarray:
    sizes = np.zeros(num_clients, dtype=np.int64)
    sizes[client] = n
    return sizes


def _lists(stream: np.ndarray, owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Each client's rows in the order they were dealt (a stable sort by client)."""
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=num_clients)
    return np.split(stream[order].astype(np.int64), np.cumsum(counts)[:-1])


def _exdir(y, num_clients, num_classes, cpc, alpha, balance, rng) -> list[np.ndarray]:
    """Extended Dirichlet (Li et al., arXiv 2311.03154, PFLlib's form): each client draws
    ``class_per_client`` classes; then per class, Dirichlet(alpha) proportions over the clients that
    drew it (and, balanced, that hold under N / num_clients rows), redrawn until every client holds
    10 rows; finally each client's list is shuffled."""
    if isinstance(cpc, bool) or not isinstance(cpc, (int, np.integer)) or not 1 <= cpc <= num_classes:
        raise ValueError(f"partition.pfllib.class_per_client = {cpc!r} is invalid for split 'exdir'; allowed: "
                         f"an integer in 1..{num_classes} (each client draws that many of the {num_classes} "
                         "classes)")
    if num_clients < 2:
        raise ValueError("PFLlib's exdir split needs clients.num_clients >= 2 (its code indexes the cut "
                         "before the last client)")
    need = max(cpc * num_clients // num_classes // 2, 1)
    for _ in range(MAX_TRIES):
        holders = np.zeros((num_classes, num_clients), dtype=bool)
        for i in range(num_clients):
            holders[rng.choice(num_classes, cpc, replace=False), i] = True
        if holders.sum(axis=1).min() >= need:
            break
    else:
        raise ValueError(
            f"PFLlib's exdir split found no draw in {MAX_TRIES} where every class is drawn by at least {need} "
            f"clients (class_per_client x num_clients // K // 2; PFLlib would redraw forever): with "
            f"class_per_client = {cpc} the {num_clients} clients draw {cpc * num_clients} classes for "
            f"{num_classes}; raise class_per_client or clients.num_clients")
    n = len(y)
    for _ in range(MAX_TRIES):
        streams, owners = [], []
        counts = np.zeros(num_clients, dtype=np.int64)
        for k in range(num_classes):
            members = np.flatnonzero(y == k)
            rng.shuffle(members)
            p = rng.dirichlet(np.repeat(alpha, num_clients))
            allowed = holders[k] & (counts < n / num_clients) if balance else holders[k]
            last = int(np.flatnonzero(holders[k])[-1])
            cuts = _cuts(p * allowed, len(members))
            if cuts is None:  # NaN cuts (INT64_MIN or 0), then the remainder rule: all to `last`
                sizes = _all_to(last, num_clients, len(members))
            else:
                if cuts[-1] != len(members):  # PFLlib's remainder rule: the rest to the last holder
                    cuts[last:] = len(members)
                sizes = _sizes(cuts, len(members))
            streams.append(members)
            owners.append(np.repeat(np.arange(num_clients), sizes))
            counts += sizes
        if counts.min() >= EXDIR_MIN_SIZE:
            lists = _lists(np.concatenate(streams), np.concatenate(owners), num_clients)
            for rows in lists:  # one shuffle per client, in client order: PFLlib's draws, one after another
                rng.shuffle(rows)
            return lists
    raise ValueError(
        f"PFLlib's exdir split found no draw in {MAX_TRIES} where every client holds {EXDIR_MIN_SIZE} rows "
        "(PFLlib would redraw forever): raise partition.alpha or partition.pfllib.class_per_client, or lower "
        "clients.num_clients")


def pfllib_local_split(clients: list[np.ndarray], train_ratio: float,
                       rng: np.random.RandomState) -> tuple[np.ndarray, ...]:
    """PFLlib's ``split_data``: scikit-learn's ``train_test_split(train_size=train_ratio, shuffle=True)``
    per client, in client order, on the same generator: ``floor(train_ratio * n)`` rows train, the rest
    test, the test rows first in one permutation. Returns (train idx, train ptr, test idx, test ptr)."""
    train, test = [], []
    for c, rows in enumerate(clients):  # one permutation per client, in order: the generator is sequential
        n_train = math.floor(train_ratio * len(rows))
        if len(rows) == 0:
            raise ValueError(f"PFLlib's split gives client {c} no rows (its random shares of its classes are all "
                             "0; PFLlib's own code then fails in split_data, where scikit-learn refuses an empty "
                             "client): use partition.pfllib.balance: true or fewer clients")
        if n_train == 0:
            raise ValueError(f"client {c} holds {len(rows)} row(s): its train share floor({train_ratio:g} x "
                             f"{len(rows)}) is empty (scikit-learn, in PFLlib, refuses it too); lower "
                             "partition.test_fraction or clients.num_clients")
        perm = rng.permutation(len(rows))
        n_test = len(rows) - n_train
        test.append(rows[perm[:n_test]])
        train.append(rows[perm[n_test:]])
    return (*_csr(train), *_csr(test))


def _csr(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=ptr[1:])
    return np.concatenate(parts).astype(np.int64), ptr
