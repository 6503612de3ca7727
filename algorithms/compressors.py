"""Sparsifying compressors for model deltas, error feedback and their operation-count model.

Three ways to send ``K`` of the ``d`` coordinates of a flat float32 vector ``a``:

=============  ===========================================  ==================  ==============
strategy       coordinates                                  payload (bytes)     selection ops
=============  ===========================================  ==================  ==============
``topk``       the K largest ``|a_i|``                      4K values + 4K idx  O(d), large
``randomk``    K distinct indices from a 64-bit seed        4K values + 8       O(K)
``periodick``  contiguous block at ``(round*K) mod d``,     4K values + 4       O(K), tiny
               wrapping around
=============  ===========================================  ==================  ==============

Values are sent unscaled: error feedback (:class:`ErrorFeedback`) keeps what was not sent.
The receiver rebuilds the dense vector with :func:`decompress` (Random-K re-draws its indices
from the seed, Periodic-K from the offset), so the only arrays that travel are the ones in
:meth:`Compressed.to_arrays`, and ``Compressed.nbytes`` is exactly their size.

The op count (``Compressed.ops``) is what the virtual clock prices at the device's training
speed (one op = one training-FLOP equivalent, ``hardware_profiles.clock.OPS_TO_FLOPS``); see
"Operation-count model" below for the constants and the measurements behind them.

This module is pure torch: no Ray, no I/O, no engine imports.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from algorithms.params import (  # noqa: F401 (re-exported: the names and constants live there)
    PERIODICK_OPS_PER_INDEX,
    RANDOMK_OPS_PER_INDEX,
    STRATEGIES,
    TOPK_OPS_PER_ELEMENT,
    TOPK_OPS_PER_SELECTED_LOG,
    Strategy,
)

FLOAT32_BYTES = 4
INDEX_BYTES = 4  # Top-K indices travel as int32 (d < 2**31)
SEED_BYTES = 8  # Random-K: one 64-bit seed
OFFSET_BYTES = 4  # Periodic-K: one 32-bit offset

# --------------------------------------------------------------------------------------------
# Operation-count model
# --------------------------------------------------------------------------------------------
# The clock turns ops into seconds as ``ops / (profile.gflops * 1e9)``: one op costs what one
# training FLOP costs on that device. We therefore express each compressor's cost in
# "training-FLOP equivalents": (host time of the operation) x (host training throughput).
#
# Calibration on the development host (x86, torch 2.x CPU, ONE thread, median of repeats;
# re-measure with :func:`measure_selection_costs`):
#   * training throughput, LeNet5 batch 16/64 fwd+bwd+SGD step:   ~14 GFLOP/s
#     (REFERENCE_TRAIN_GFLOPS; the catalog's "effective GFLOP/s" are for such small CNNs)
#   * torch.topk(|a|, K, sorted=False), K << d:
#       d = 1e5..1e6 (in cache):      2.0 - 2.6 ns per element  (K <= 1e3)
#       d = 3e6..1e7 (out of cache):  9.3 - 10.6 ns per element (K <= 1e3)
#     plus a K-dependent part: d=1e7: K=1e5 +78 ms, K=1e6 +97 ms (~5 ns per K*log2 K at
#     large K; up to ~45 ns per K*log2 K around K = 1e4-1e5 where torch switches algorithm).
#   * Random-K, K random indices (torch.randint on a seeded Generator) + gather:
#       8 - 15 ns per index for K >= 1e4 (d = 1e6 and 1e7); small K is dominated by the
#       ~10 us Python/dispatch overhead, which a device implementation does not pay.
#   * Periodic-K, one or two contiguous slices: 0.1 - 0.45 ns per index for K >= 1e4 (memcpy).
#   Example ratios (two sessions, the second on a loaded host):
#     d = 1e6, K = 1e4: topk 8.3 / 8.9 ms vs randint+gather 0.11 / 0.09 ms  (~75-100x);
#     d = 1e7, K = 1e4: topk 114 / 141 ms vs randint+gather 0.15 / 0.14 ms  (~750-1000x);
#     randperm(d)[:K]+gather is O(d): 6-9 ms at d = 1e6, 260-340 ms at d = 1e7 - the reason
#     Random-K draws K indices instead. This module's randomk (randint + order-preserving
#     de-duplication via torch.unique) takes ~1.2 ms at d = 1e6, K = 1e4 on the host; the
#     de-duplication sort is a host convenience a device would do with a hash set in O(K).
#
# Constants (ns x REFERENCE_TRAIN_GFLOPS, rounded):
#   * Top-K per element of d: the out-of-cache figure (10 ns -> 140): the models where the
#     choice matters (ResNet-18, 11M params = 44 MB) never fit in an edge device's cache, and
#     an edge CPU's memory bandwidth is relatively worse than a desktop's, not better.
#   * Top-K per K*log2(K): 5 ns -> 70 (the large-K asymptote; heap/partial-sort of the winners).
#   * Random-K per index: 15 ns -> 210 (PRNG draw + random-access gather + duplicate check).
#   * Periodic-K per index: 0.3 ns -> 4 (contiguous copy).
# Error feedback's ``residual + delta`` is O(d) for every strategy alike and is not counted.
# The values live in algorithms/params.py (the experiment config's defaults, importable
# without torch); they are re-exported here.
REFERENCE_TRAIN_GFLOPS = 14.0


@dataclass(frozen=True)
class OpCosts:
    """The op-count constants, overridable per experiment (defaults: the module constants)."""

    topk_per_element: float = TOPK_OPS_PER_ELEMENT
    topk_per_selected_log: float = TOPK_OPS_PER_SELECTED_LOG
    randomk_per_index: float = RANDOMK_OPS_PER_INDEX
    periodick_per_index: float = PERIODICK_OPS_PER_INDEX

    def __post_init__(self):
        for name, v in self.__dict__.items():
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"OpCosts.{name}={v!r} is not allowed: must be a finite number >= 0")


DEFAULT_OP_COSTS = OpCosts()


def selection_ops(strategy: str, d: int, k: int, costs: OpCosts | None = None) -> float:
    """Operation count (training-FLOP equivalents) of selecting and gathering K of d values."""
    c = costs or DEFAULT_OP_COSTS
    if strategy == "topk":
        return c.topk_per_element * d + c.topk_per_selected_log * k * math.log2(max(k, 1))
    if strategy == "randomk":
        return c.randomk_per_index * k
    if strategy == "periodick":
        return c.periodick_per_index * k
    raise ValueError(f"unknown compressor {strategy!r}; choose one of {sorted(COMPRESSORS)}")


# --------------------------------------------------------------------------------------------
# K
# --------------------------------------------------------------------------------------------
def resolve_k(k: int | float, d: int, *, clamp: bool = False) -> int:
    """Number of coordinates to send: an int is a count in [1, d]; a float a ratio in (0, 1].

    A ratio gives ``max(1, round(k * d))``. With ``clamp``, a count above ``d`` becomes ``d``
    (every coordinate) instead of an error.
    """
    d = int(d)
    if d < 1:
        raise ValueError(f"d={d} is not allowed: the vector must have at least one element")
    if isinstance(k, bool) or not isinstance(k, (int, float, np.integer, np.floating)):
        raise ValueError(f"k={k!r} is not allowed: must be an int count in [1, d] or a float ratio in (0, 1]")
    if isinstance(k, (int, np.integer)):
        k = int(k)
        if k < 1:
            raise ValueError(f"k={k} is not allowed: an int k is a count and must be in [1, d={d}]")
        if k > d:
            if clamp:
                return d
            raise ValueError(
                f"k={k} is not allowed: an int k is a count and must be in [1, d={d}] "
                "(pass a float ratio, or clamp=True to send every coordinate)"
            )
        return k
    k = float(k)
    if not (math.isfinite(k) and 0.0 < k <= 1.0):
        raise ValueError(
            f"k={k!r} is not allowed: a float k is a ratio of d and must be in (0, 1] "
            "(pass an int for a count)"
        )
    return min(d, max(1, int(round(k * d))))


# --------------------------------------------------------------------------------------------
# Compressed payload
# --------------------------------------------------------------------------------------------
@dataclass(eq=False)  # numpy/torch fields: compare by identity
class Compressed:
    """K selected values of a length-``numel`` vector, and how to find their positions.

    ``indices`` is the explicit int64 index tensor (Top-K) or None when the positions are
    implicit (Random-K: ``meta["seed"]``, Periodic-K: ``meta["offset"]``); use
    :meth:`index_tensor` to get them in every case. ``nbytes`` is the exact size of the arrays
    that travel (:meth:`to_arrays`); ``ops`` the selection op count for the virtual clock.
    """

    indices: torch.Tensor | None
    values: torch.Tensor
    nbytes: int
    ops: float
    meta: dict[str, Any]
    numel: int
    _index_cache: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def strategy(self) -> str:
        return self.meta["strategy"]

    @property
    def k(self) -> int:
        return int(self.values.numel())

    def index_tensor(self) -> torch.Tensor:
        """Positions of ``values`` in the dense vector (int64), re-derived when implicit."""
        if self.indices is not None:
            return self.indices
        if self._index_cache is None:
            s = self.strategy
            if s == "randomk":
                self._index_cache = randomk_indices(self.numel, self.k, self.meta["seed"])
            elif s == "periodick":
                self._index_cache = periodick_indices(self.numel, self.k, offset=self.meta["offset"])
            else:
                raise ValueError(f"{s!r} payload without explicit indices")
        return self._index_cache

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The numpy arrays that travel; their total size is ``nbytes``."""
        values = self.values.detach().cpu().numpy().astype(np.float32, copy=True)  # off the device
        s = self.strategy
        if s == "topk":
            return {"values": values, "indices": self.index_tensor().cpu().numpy().astype(np.int32)}
        if s == "randomk":
            return {"values": values, "seed": np.array([self.meta["seed"]], dtype=np.uint64)}
        if s == "periodick":
            return {"values": values, "offset": np.array([self.meta["offset"]], dtype=np.int32)}
        raise ValueError(f"unknown compressor {s!r}")

    @classmethod
    def from_arrays(cls, strategy: str, arrays: dict[str, np.ndarray], numel: int) -> "Compressed":
        """Rebuild a received payload (server side; ``ops`` is 0, the client paid it)."""
        values = torch.from_numpy(np.ascontiguousarray(arrays["values"], dtype=np.float32))
        nbytes = int(sum(a.nbytes for a in arrays.values()))
        meta: dict[str, Any] = {"strategy": strategy}
        indices = None
        if strategy == "topk":
            indices = torch.from_numpy(arrays["indices"].astype(np.int64))
        elif strategy == "randomk":
            meta["seed"] = int(arrays["seed"][0])
        elif strategy == "periodick":
            meta["offset"] = int(arrays["offset"][0])
        else:
            raise ValueError(f"unknown compressor {strategy!r}; choose one of {sorted(COMPRESSORS)}")
        return cls(indices=indices, values=values, nbytes=nbytes, ops=0.0, meta=meta, numel=int(numel))


def _flat(a: torch.Tensor | np.ndarray) -> torch.Tensor:
    a = torch.as_tensor(a)
    if a.dtype != torch.float32:
        a = a.float()
    if a.dim() != 1:
        raise ValueError(f"compressors take a flat vector, got shape {tuple(a.shape)}")
    return a


# --------------------------------------------------------------------------------------------
# The three compressors
# --------------------------------------------------------------------------------------------
def topk(a: torch.Tensor, k: int | float, *, costs: OpCosts | None = None, clamp: bool = False) -> Compressed:
    """The K coordinates of largest magnitude. Payload: K float32 values + K int32 indices."""
    a = _flat(a)
    d = a.numel()
    if d >= 2**31:
        raise ValueError(f"d={d} does not fit Top-K's int32 indices")
    kk = resolve_k(k, d, clamp=clamp)
    idx = torch.topk(a.abs(), kk, sorted=False).indices
    return Compressed(
        indices=idx,
        values=a[idx],
        nbytes=(FLOAT32_BYTES + INDEX_BYTES) * kk,
        ops=selection_ops("topk", d, kk, costs),
        meta={"strategy": "topk"},
        numel=d,
    )


def randomk_indices(d: int, k: int | float, seed: int) -> torch.Tensor:
    """K distinct indices in [0, d), a deterministic function of (d, k, seed) only.

    For K <= d/4, indices are drawn i.i.d. with ``torch.randint`` and the first K distinct
    ones (in draw order) are kept - a uniformly random K-subset, costing O(K) draws. Larger K
    uses ``randperm(d)[:K]``.
    """
    d = int(d)
    kk = resolve_k(k, d)
    g = torch.Generator()
    g.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    if 4 * kk > d:
        return torch.randperm(d, generator=g)[:kk]
    draws: list[torch.Tensor] = []
    need = kk + kk * kk // d + 16  # expected duplicates ~ K^2 / 2d
    while True:
        draws.append(torch.randint(d, (need,), generator=g, dtype=torch.int64))
        x = torch.cat(draws) if len(draws) > 1 else draws[0]
        uniq, inv = torch.unique(x, return_inverse=True)
        if uniq.numel() >= kk:
            break
        need = kk - uniq.numel() + 16
    m = x.numel()
    first = torch.full((uniq.numel(),), m, dtype=torch.int64)
    first.scatter_reduce_(0, inv, torch.arange(m), reduce="amin", include_self=True)
    return x[torch.sort(first).values[:kk]]


def randomk(
    a: torch.Tensor, k: int | float, seed: int, *, costs: OpCosts | None = None, clamp: bool = False
) -> Compressed:
    """K coordinates chosen by ``seed`` (values unscaled). Payload: K float32 values + the seed."""
    a = _flat(a)
    d = a.numel()
    kk = resolve_k(k, d, clamp=clamp)
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed={seed} is not allowed: must be in [0, 2**64)")
    idx = randomk_indices(d, kk, seed).to(a.device)  # drawn on the CPU: the same on every device
    c = Compressed(
        indices=None,
        values=a[idx],
        nbytes=FLOAT32_BYTES * kk + SEED_BYTES,
        ops=selection_ops("randomk", d, kk, costs),
        meta={"strategy": "randomk", "seed": seed},
        numel=d,
    )
    c._index_cache = idx
    return c


def periodick_offset(d: int, k: int, round: int) -> int:
    return (int(round) * int(k)) % int(d)


def periodick_indices(d: int, k: int | float, round: int | None = None, *, offset: int | None = None) -> torch.Tensor:
    """The block ``offset, offset+1, ..., offset+K-1`` (mod d); offset = (round*K) mod d."""
    d = int(d)
    kk = resolve_k(k, d)
    if offset is None:
        if round is None:
            raise ValueError("periodick_indices needs round or offset")
        offset = periodick_offset(d, kk, round)
    return (torch.arange(kk, dtype=torch.int64) + int(offset)) % d


def periodick(
    a: torch.Tensor, k: int | float, round: int, *, costs: OpCosts | None = None, clamp: bool = False
) -> Compressed:
    """Contiguous block of K coordinates at ``(round*K) mod d``, wrapping around.

    Payload: K float32 values + one int32 offset.
    """
    a = _flat(a)
    d = a.numel()
    if d >= 2**31:
        raise ValueError(f"d={d} does not fit Periodic-K's int32 offset")
    kk = resolve_k(k, d, clamp=clamp)
    off = periodick_offset(d, kk, round)
    end = off + kk
    values = a[off:end].clone() if end <= d else torch.cat([a[off:], a[: end - d]])
    return Compressed(
        indices=None,
        values=values,
        nbytes=FLOAT32_BYTES * kk + OFFSET_BYTES,
        ops=selection_ops("periodick", d, kk, costs),
        meta={"strategy": "periodick", "offset": off, "round": int(round)},
        numel=d,
    )


def decompress(c: Compressed, d: int | None = None) -> torch.Tensor:
    """Dense float32 vector of length d (default ``c.numel``) with ``values`` scattered in."""
    d = c.numel if d is None else int(d)
    if d != c.numel:
        raise ValueError(f"payload is for a vector of length {c.numel}, not d={d}")
    out = torch.zeros(d, dtype=torch.float32, device=c.values.device)
    out[c.index_tensor().to(out.device)] = c.values
    return out


def scatter_add_(out: torch.Tensor, c: Compressed, weight: float = 1.0) -> torch.Tensor:
    """``out += weight * decompress(c)`` without building the dense vector (in place)."""
    if out.numel() != c.numel:
        raise ValueError(f"payload is for a vector of length {c.numel}, not {out.numel()}")
    v = c.values.to(out.device, out.dtype)
    out.index_add_(0, c.index_tensor().to(out.device), v if weight == 1.0 else v * weight)
    return out


# --------------------------------------------------------------------------------------------
# Error feedback
# --------------------------------------------------------------------------------------------
class ErrorFeedback:
    """Residual accumulation: ``a = e + delta``; send ``C(a)``; keep ``e = a - sent``.

    ``update_residual`` subtracts only at the sent positions, so ``decompress(c) + e == a``
    holds bit for bit (sent positions: ``v + (a_i - v) = v + 0``; others: ``0 + a_i``).
    """

    @staticmethod
    def accumulate(residual: torch.Tensor | np.ndarray | None, delta: torch.Tensor) -> torch.Tensor:
        delta = _flat(delta)
        if residual is None:
            return delta.clone()
        residual = _flat(residual).to(delta.device)
        if residual.numel() != delta.numel():
            raise ValueError(f"residual has {residual.numel()} elements but the delta {delta.numel()}")
        return residual + delta

    @staticmethod
    def update_residual(a: torch.Tensor, c: Compressed) -> torch.Tensor:
        a = _flat(a)
        if a.numel() != c.numel:
            raise ValueError(f"payload is for a vector of length {c.numel}, not {a.numel()}")
        idx = c.index_tensor().to(a.device)
        e = a.clone()
        e[idx] = a[idx] - c.values
        return e


# --------------------------------------------------------------------------------------------
# Registry and single entry point
# --------------------------------------------------------------------------------------------

COMPRESSORS: dict[str, Callable[..., Compressed]] = {
    "topk": topk,
    "randomk": randomk,
    "periodick": periodick,
}


def compress(
    name: str,
    a: torch.Tensor,
    k: int | float,
    *,
    seed: int | None = None,
    round: int | None = None,
    costs: OpCosts | None = None,
    clamp: bool = False,
) -> Compressed:
    """Compress ``a`` with ``name``; Random-K needs ``seed``, Periodic-K needs ``round``."""
    if name == "topk":
        return topk(a, k, costs=costs, clamp=clamp)
    if name == "randomk":
        if seed is None:
            raise ValueError("randomk needs a seed")
        return randomk(a, k, seed, costs=costs, clamp=clamp)
    if name == "periodick":
        if round is None:
            raise ValueError("periodick needs the round")
        return periodick(a, k, round, costs=costs, clamp=clamp)
    raise ValueError(f"unknown compressor {name!r}; choose one of {sorted(COMPRESSORS)}")


# --------------------------------------------------------------------------------------------
# Calibration helper (not used at run time)
# --------------------------------------------------------------------------------------------
def measure_selection_costs(d: int = 1_000_000, k: int = 10_000, repeats: int = 5) -> dict[str, float]:
    """Median host seconds of each compressor's selection on a random vector (one thread).

    Multiply by the host's training throughput (FLOP/s) to re-derive the op constants.
    """
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(d, generator=torch.Generator().manual_seed(0))
        fns = {
            "topk": lambda: topk(a, k),
            "randomk": lambda: randomk(a, k, 12345),
            "randint_gather": lambda: a[torch.randint(d, (k,), generator=torch.Generator().manual_seed(1))],
            "periodick": lambda: periodick(a, k, 3),
        }
        out = {}
        for name, fn in fns.items():
            fn()
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            out[name] = float(np.median(ts))
        return out
    finally:
        torch.set_num_threads(prev)
