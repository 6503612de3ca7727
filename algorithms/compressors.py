"""Compressors for model deltas: registered classes, error feedback as a wrapper, op counts.

A compressor is one class (subclass of :class:`Compressor`, decorated with :func:`register`):
its name, its op-count constants (``COSTS``), how it compresses, how its payload travels
(:meth:`Compressor.to_arrays` / :meth:`Compressor.from_arrays`) and where its values go
(:meth:`Compressor.positions`). Nothing else needs editing to add one: the configs accept its
name (``compressor:``, ASCEND's ``arms:``) and its op-cost keys (``op_costs: {<name>_<key>:
...}``). Registering does not make it one of ASCEND's default arms (those are listed there).

=============  ===========================================  ===================  ==============
compressor     what is sent                                 payload (bytes)      selection ops
=============  ===========================================  ===================  ==============
``topk``       the K largest ``|a_i|``                      4K values + 4K idx   O(d), large
``randomk``    K distinct indices from a 64-bit seed        4K values + 8        O(K)
``periodick``  contiguous block at ``(round*K) mod d``,     4K values + 4        O(K), tiny
               wrapping around
``qsgd8``      every coordinate, stochastically rounded to  d + 4 per bucket of  O(d)
               8 bits (QSGD-style, max-norm per bucket of   512 values
               512 values; K is not used)
=============  ===========================================  ===================  ==============

Sparsifiers send their values unscaled; error feedback (:class:`algorithms.error_feedback.ErrorFeedback`) keeps what was
not sent, and for ``qsgd8`` the quantisation error. The receiver rebuilds the dense vector from
the arrays alone (:func:`decode`: Random-K re-draws its indices from the seed, Periodic-K from
the offset, ``qsgd8`` dequantises), so ``Compressed.nbytes`` is exactly what travels.

The op count (``Compressed.ops``) is what the virtual clock prices at the device's training
speed (one op = one training-FLOP equivalent, ``hardware_profiles.clock.OPS_TO_FLOPS``); see
"Operation-count model" below for the constants and the measurements behind them.

This module is pure torch: no Ray, no I/O, no engine imports.

Over 400 lines because every compressor sits beside the one operation-count model and the one
encoding that prices and ships them all; each compressor's own code is a short class.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.base import FLOAT32_BYTES, INDEX_BYTES, INT8_BYTES, OFFSET_BYTES, SEED_BYTES
from algorithms.params import BUILTIN_COMPRESSOR_COSTS, check_k, validate_op_costs
from algorithms.plugins import COMPRESSORS as COMPRESSOR_REGISTRY
from algorithms.plugins import compressor_costs, register_compressor

# --------------------------------------------------------------------------------------------
# Operation-count model
# --------------------------------------------------------------------------------------------
# The clock turns ops into seconds as ``ops / (profile.gflops * 1e9)``: one op costs what one
# training FLOP costs on that device. We therefore express each compressor's cost in
# "training-FLOP equivalents": (host time of the operation) x (host training throughput).
#
# Calibration on the development host (x86, torch 2.x CPU, ONE thread, median of repeats;
# re-measured with a median-of-repeats timing of each compressor at one thread):
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
#   * 8-bit stochastic quantisation (this module's qsgd8: |a|, per-bucket max, one uniform
#     draw per value, floor, sign, int8): 4.8 ns per element of d (CPU time, d = 1e6), of
#     which the uniform draws are 2.1 ns.
#   Example ratios (two sessions, the second on a loaded host):
#     d = 1e6, K = 1e4: topk 8.3 / 8.9 ms vs randint+gather 0.11 / 0.09 ms  (~75-100x);
#     d = 1e7, K = 1e4: topk 114 / 141 ms vs randint+gather 0.15 / 0.14 ms  (~750-1000x);
#     randperm(d)[:K]+gather is O(d): 6-9 ms at d = 1e6, 260-340 ms at d = 1e7 - the reason
#     Random-K draws K indices instead. This module's randomk (randint + order-preserving
#     de-duplication via torch.unique) takes ~1.2 ms at d = 1e6, K = 1e4 on the host; the
#     de-duplication sort is a host convenience a device would do with a hash set in O(K).
#
# Constants (ns x REFERENCE_TRAIN_GFLOPS, rounded), each in its compressor's ``COSTS`` (the
# built-in ones are listed in algorithms/params.py, so that configs validate without torch):
#   * Top-K per element of d: the out-of-cache figure (10 ns -> 140): the models where the
#     choice matters (ResNet-18, 11M params = 44 MB) never fit in an edge device's cache, and
#     an edge CPU's memory bandwidth is relatively worse than a desktop's, not better.
#   * Top-K per K*log2(K): 5 ns -> 70 (the large-K asymptote; heap/partial-sort of the winners).
#   * Random-K per index: 15 ns -> 210 (PRNG draw + random-access gather + duplicate check).
#   * Periodic-K per index: 0.3 ns -> 4 (contiguous copy).
#   * qsgd8 per element of d: 5 ns -> 70 (a streaming pass; no sort).
# Error feedback's ``residual + delta`` is O(d) for every compressor alike and is not counted.
REFERENCE_TRAIN_GFLOPS = 14.0


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
    if isinstance(k, str) or k is None:
        raise ValueError(f"k={k!r} is not allowed: must be an int count in [1, d] or a float ratio in (0, 1]")
    k = check_k(k)
    if isinstance(k, int):
        if k > d:
            if clamp:
                return d
            raise ValueError(
                f"k={k} is not allowed: an int k is a count and must be in [1, d={d}] "
                "(pass a float ratio, or clamp=True to send every coordinate)"
            )
        return k
    return min(d, max(1, int(round(k * d))))


# --------------------------------------------------------------------------------------------
# Compressed payload
# --------------------------------------------------------------------------------------------
@dataclass(eq=False)  # numpy/torch fields: compare by identity
class Compressed:
    """What a compressor made of a length-``numel`` vector.

    ``values`` are the float32 numbers the receiver adds at :meth:`index_tensor` (for a
    quantiser: the dequantised values of every coordinate). ``indices`` is the explicit int64
    index tensor (Top-K) or None when the positions are implicit (Random-K: ``meta["seed"]``,
    Periodic-K: ``meta["offset"]``, qsgd8: all). ``nbytes`` is the exact size of the arrays
    that travel (:meth:`to_arrays`); ``ops`` the op count for the virtual clock.
    """

    indices: torch.Tensor | None
    values: torch.Tensor
    nbytes: int
    ops: float
    meta: dict[str, Any]
    numel: int
    _index_cache: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def compressor(self) -> str:
        """The compressor's registered name."""
        return self.meta["compressor"]

    @property
    def k(self) -> int:
        """Coordinates the receiver gets values for."""
        return int(self.values.numel())

    def index_tensor(self) -> torch.Tensor:
        """Positions of ``values`` in the dense vector (int64), re-derived when implicit."""
        if self.indices is not None:
            return self.indices
        if self._index_cache is None:
            self._index_cache = compressor_class(self.compressor).positions(self)
        return self._index_cache

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The numpy arrays that travel; their total size is ``nbytes``."""
        return compressor_class(self.compressor).to_arrays(self)

    @classmethod
    def from_arrays(cls, compressor: str, arrays: dict[str, np.ndarray], numel: int) -> "Compressed":
        """Rebuild a received payload (server side; ``ops`` is 0, the client paid it)."""
        return decode(compressor, arrays, numel)

    def dense(self) -> torch.Tensor:
        """The dense float32 vector this payload stands for (on the values' device)."""
        out = torch.zeros(self.numel, dtype=torch.float32, device=self.values.device)
        out[self.index_tensor().to(out.device)] = self.values
        return out


def _flat(a: torch.Tensor | np.ndarray) -> torch.Tensor:
    a = torch.as_tensor(a)
    if a.dtype != torch.float32:
        a = a.float()
    if a.dim() != 1:
        raise ValueError(f"compressors take a flat vector, got shape {tuple(a.shape)}")
    return a


# --------------------------------------------------------------------------------------------
# The compressor base class and the registry
# --------------------------------------------------------------------------------------------
# name -> class, over the compressor registry (algorithms.plugins); the built-in classes below are
# registered there by reference (algorithms/__init__.py), a user's with register_compressor
COMPRESSORS: Mapping[str, type["Compressor"]] = COMPRESSOR_REGISTRY.mapping()
register = register_compressor  # the class decorator


def compressor_class(name: str) -> type["Compressor"]:
    return COMPRESSOR_REGISTRY.get(name)


class Compressor:
    """One way to compress a flat float32 vector. Subclasses set ``name`` and ``COSTS`` and
    implement :meth:`compress`, :meth:`ops`, :meth:`positions` (unless every payload carries
    explicit ``indices``) and the wire format; then register them (``@register_compressor``).

    ``COSTS``: the op-count constants by key (config keys ``<name>_<key>``, overridable per
    experiment through :class:`OpCosts`). ``needs_seed`` / ``needs_round``: what
    :meth:`compress` needs besides the vector. ``uses_k``: whether K means anything to it.
    """

    name: ClassVar[str] = ""
    COSTS: ClassVar[dict[str, float]] = {}
    ARRAYS: ClassVar[tuple[str, ...]] = ()  # the payload's array names
    needs_seed: ClassVar[bool] = False
    needs_round: ClassVar[bool] = False
    uses_k: ClassVar[bool] = True

    def __init__(self, costs: "OpCosts | None" = None):
        self.cost = (costs or DEFAULT_OP_COSTS).of(self.name)

    # -- to implement --------------------------------------------------------------------
    def compress(self, a: torch.Tensor, k: int | float, *, seed: int | None = None,
                 round: int | None = None, clamp: bool = False) -> Compressed:
        raise NotImplementedError

    def ops(self, d: int, k: int) -> float:
        """Op count (training-FLOP equivalents) of compressing a length-d vector to K."""
        raise NotImplementedError

    @classmethod
    def wire_nbytes(cls, d: int, k: int) -> int:
        """Bytes of the payload of a length-d vector compressed to K (resolved): what
        :meth:`compress` reports and a ``clock.mode: timing_only`` run times without compressing.
        A compressor that does not override it cannot be timed without training."""
        raise NotImplementedError(f"compressor {cls.name!r} gives no wire_nbytes(d, k) rule")

    @classmethod
    def positions(cls, c: Compressed) -> torch.Tensor:
        raise ValueError(f"{cls.name!r} payload without explicit indices")

    @classmethod
    def to_arrays(cls, c: Compressed) -> dict[str, np.ndarray]:
        raise NotImplementedError

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], numel: int) -> Compressed:
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------
    @classmethod
    def restore(cls, residual: np.ndarray, c: Compressed) -> None:
        """Put what ``c`` sent back into the error-feedback residual ``e = a - sent`` (in place),
        so that it equals ``a`` again (a lost upload). Sparsifiers send ``a[idx]`` unscaled, so
        writing the values back is exact bit for bit (also for -0.0 and infinities)."""
        residual[c.index_tensor().cpu().numpy()] = c.values.cpu().numpy()

    def _payload(self, a: torch.Tensor, idx: torch.Tensor | None, values: torch.Tensor, nbytes: int,
                 k: int, meta: dict[str, Any], cache: torch.Tensor | None = None) -> Compressed:
        c = Compressed(indices=idx, values=values, nbytes=int(nbytes), ops=self.ops(a.numel(), k),
                       meta={"compressor": self.name, **meta}, numel=a.numel())
        c._index_cache = cache
        return c


# --------------------------------------------------------------------------------------------
# The compressors
# --------------------------------------------------------------------------------------------
class TopK(Compressor):
    """The K coordinates of largest magnitude. Payload: K float32 values + K int32 indices."""

    name = "topk"
    COSTS = BUILTIN_COMPRESSOR_COSTS[name]
    ARRAYS = ("values", "indices")

    def compress(self, a, k, *, seed=None, round=None, clamp=False):
        a = _flat(a)
        d = a.numel()
        if d >= 2**31:
            raise ValueError(f"d={d} does not fit Top-K's int32 indices")
        kk = resolve_k(k, d, clamp=clamp)
        idx = torch.topk(a.abs(), kk, sorted=False).indices
        return self._payload(a, idx, a[idx], self.wire_nbytes(d, kk), kk, {})

    def ops(self, d, k):
        return self.cost["per_element"] * d + self.cost["per_selected_log"] * k * math.log2(max(k, 1))

    @classmethod
    def wire_nbytes(cls, d, k):
        return (FLOAT32_BYTES + INDEX_BYTES) * int(k)

    @classmethod
    def to_arrays(cls, c):
        return {"values": _f32(c.values), "indices": c.index_tensor().cpu().numpy().astype(np.int32)}

    @classmethod
    def from_arrays(cls, arrays, numel):
        idx = torch.from_numpy(arrays["indices"].astype(np.int64))
        return _received(cls.name, arrays, numel, idx, _values(arrays), {})


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


def _check_seed(seed: int | None, name: str) -> int:
    if seed is None:
        raise ValueError(f"{name} needs a seed")
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed={seed} is not allowed: must be in [0, 2**64)")
    return seed


class RandomK(Compressor):
    """K coordinates chosen by a seed (values unscaled). Payload: K float32 values + the seed."""

    name = "randomk"
    COSTS = BUILTIN_COMPRESSOR_COSTS[name]
    ARRAYS = ("values", "seed")
    needs_seed = True

    def compress(self, a, k, *, seed=None, round=None, clamp=False):
        a = _flat(a)
        d = a.numel()
        kk = resolve_k(k, d, clamp=clamp)
        seed = _check_seed(seed, self.name)
        idx = randomk_indices(d, kk, seed).to(a.device)  # drawn on the CPU: the same on every device
        return self._payload(a, None, a[idx], self.wire_nbytes(d, kk), kk, {"seed": seed}, cache=idx)

    def ops(self, d, k):
        return self.cost["per_index"] * k

    @classmethod
    def wire_nbytes(cls, d, k):
        return FLOAT32_BYTES * int(k) + SEED_BYTES

    @classmethod
    def positions(cls, c):
        return randomk_indices(c.numel, c.k, c.meta["seed"])

    @classmethod
    def to_arrays(cls, c):
        return {"values": _f32(c.values), "seed": np.array([c.meta["seed"]], dtype=np.uint64)}

    @classmethod
    def from_arrays(cls, arrays, numel):
        return _received(cls.name, arrays, numel, None, _values(arrays), {"seed": int(arrays["seed"][0])})


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


class PeriodicK(Compressor):
    """Contiguous block of K coordinates at ``(round*K) mod d``, wrapping around.
    Payload: K float32 values + one int32 offset."""

    name = "periodick"
    COSTS = BUILTIN_COMPRESSOR_COSTS[name]
    ARRAYS = ("values", "offset")
    needs_round = True

    def compress(self, a, k, *, seed=None, round=None, clamp=False):
        if round is None:
            raise ValueError("periodick needs the round")
        a = _flat(a)
        d = a.numel()
        if d >= 2**31:
            raise ValueError(f"d={d} does not fit Periodic-K's int32 offset")
        kk = resolve_k(k, d, clamp=clamp)
        off = periodick_offset(d, kk, round)
        end = off + kk
        values = a[off:end].clone() if end <= d else torch.cat([a[off:], a[: end - d]])
        return self._payload(a, None, values, self.wire_nbytes(d, kk), kk,
                             {"offset": off, "round": int(round)})

    def ops(self, d, k):
        return self.cost["per_index"] * k

    @classmethod
    def wire_nbytes(cls, d, k):
        return FLOAT32_BYTES * int(k) + OFFSET_BYTES

    @classmethod
    def positions(cls, c):
        return periodick_indices(c.numel, c.k, offset=c.meta["offset"])

    @classmethod
    def to_arrays(cls, c):
        return {"values": _f32(c.values), "offset": np.array([c.meta["offset"]], dtype=np.int32)}

    @classmethod
    def from_arrays(cls, arrays, numel):
        return _received(cls.name, arrays, numel, None, _values(arrays), {"offset": int(arrays["offset"][0])})


class QSGD8(Compressor):
    """8-bit stochastic quantisation of every coordinate (QSGD-style, Alistarh et al. 2017).

    Per bucket of ``BUCKET`` values: scale ``s = max |a_i|``; ``q_i = sign(a_i) *
    floor(127 |a_i| / s + xi_i)`` with ``xi_i ~ U[0, 1)`` from the seed (unbiased:
    ``E[q_i s / 127] = a_i``), sent as int8; the receiver adds ``q_i s / 127``. Payload: d int8
    + one float32 scale per bucket. K is not used (dense). The max-norm per bucket, rather than
    QSGD's 2-norm of the whole vector, keeps the variance at most ``(s/127)^2 / 4`` per value.
    """

    name = "qsgd8"
    COSTS = BUILTIN_COMPRESSOR_COSTS[name]
    ARRAYS = ("q", "scale")
    needs_seed = True
    uses_k = False
    BUCKET: ClassVar[int] = 512
    LEVELS: ClassVar[int] = 127

    def compress(self, a, k=None, *, seed=None, round=None, clamp=False):
        a = _flat(a)
        d = a.numel()
        seed = _check_seed(seed, self.name)
        nb = -(-d // self.BUCKET)
        x = F.pad(a, (0, nb * self.BUCKET - d)).view(nb, self.BUCKET)
        mag = x.abs()
        scale = mag.amax(1)
        inv = self.LEVELS / torch.where(scale > 0, scale, torch.ones_like(scale))
        g = torch.Generator().manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
        xi = torch.rand(x.shape, generator=g).to(a.device)  # drawn on the CPU: the same on every device
        level = torch.floor(mag * inv[:, None] + xi).clamp_(max=self.LEVELS)  # 127 + xi may round up
        q = torch.copysign(level, x).to(torch.int8).reshape(-1)[:d]
        values = _dequantise(q, scale, self.BUCKET, self.LEVELS)
        return self._payload(a, None, values, self.wire_nbytes(d, d), d, {"q": q, "scale": scale})

    def ops(self, d, k):
        return self.cost["per_element"] * d

    @classmethod
    def wire_nbytes(cls, d, k):
        return INT8_BYTES * int(d) + FLOAT32_BYTES * -(-int(d) // cls.BUCKET)  # k is not used: every value

    @classmethod
    def positions(cls, c):
        return torch.arange(c.numel, dtype=torch.int64)

    @classmethod
    def to_arrays(cls, c):
        return {"q": c.meta["q"].cpu().numpy().astype(np.int8, copy=True), "scale": _f32(c.meta["scale"])}

    @classmethod
    def from_arrays(cls, arrays, numel):
        q = torch.from_numpy(np.array(arrays["q"], dtype=np.int8))
        scale = torch.from_numpy(np.array(arrays["scale"], dtype=np.float32))
        if q.numel() != numel or scale.numel() != -(-numel // cls.BUCKET):
            raise ValueError(f"qsgd8 payload of {q.numel()} values / {scale.numel()} scales for d={numel}")
        values = _dequantise(q, scale, cls.BUCKET, cls.LEVELS)
        nbytes = int(sum(np.asarray(x).nbytes for x in arrays.values()))
        return Compressed(indices=None, values=values, nbytes=nbytes, ops=0.0,
                          meta={"compressor": cls.name, "q": q, "scale": scale}, numel=numel)

    @classmethod
    def restore(cls, residual, c):
        """``e + sent`` (the residual holds ``a - sent``): equal to ``a`` up to one rounding per
        value, not bit for bit (a quantiser does not send ``a`` itself)."""
        residual += c.values.cpu().numpy()


def _dequantise(q: torch.Tensor, scale: torch.Tensor, bucket: int, levels: int) -> torch.Tensor:
    d = q.numel()
    step = (scale / levels).repeat_interleave(bucket)[:d]
    return q.float() * step


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32, copy=True)  # the payload leaves the device


def _values(arrays: dict[str, np.ndarray]) -> torch.Tensor:
    v = np.ascontiguousarray(arrays["values"], dtype=np.float32)
    if not v.flags.writeable:  # e.g. from Ray's object store: torch warns on read-only arrays
        v = v.copy()
    return torch.from_numpy(v)


def _received(name, arrays, numel, idx, values, meta) -> Compressed:
    nbytes = int(sum(np.asarray(a).nbytes for a in arrays.values()))
    return Compressed(indices=idx, values=values, nbytes=nbytes, ops=0.0,
                      meta={"compressor": name, **meta}, numel=int(numel))


# --------------------------------------------------------------------------------------------
# Op-cost overrides
# --------------------------------------------------------------------------------------------
class OpCosts:
    """The op-count constants of every registered compressor, with overrides by config key
    ``<compressor>_<key>`` (e.g. ``topk_per_element``); unknown keys and values that are not
    finite and >= 0 are rejected with the key, the value and what is allowed."""

    def __init__(self, **overrides: float):
        self.overrides = validate_op_costs(overrides)

    @staticmethod
    def keys() -> dict[str, float]:
        """Every config key with its default."""
        return {f"{name}_{key}": v for name, costs in compressor_costs().items() for key, v in costs.items()}

    def of(self, name: str) -> dict[str, float]:
        """The constants of compressor ``name`` (defaults with the overrides applied)."""
        cls = compressor_class(name)
        return {key: self.overrides.get(f"{name}_{key}", v) for key, v in cls.COSTS.items()}

    def __getattr__(self, key: str) -> float:
        if key.startswith("_") or key == "overrides":
            raise AttributeError(key)
        defaults = self.keys()
        if key not in defaults:
            raise AttributeError(key)
        return self.overrides.get(key, defaults[key])


DEFAULT_OP_COSTS = OpCosts()


# --------------------------------------------------------------------------------------------
# The single entry points (error feedback around any compressor: algorithms.error_feedback)
# --------------------------------------------------------------------------------------------
def get_compressor(name: str, costs: OpCosts | None = None) -> Compressor:
    return compressor_class(name)(costs)


def compress(name: str, a: torch.Tensor, k: int | float, *, seed: int | None = None, round: int | None = None,
             costs: OpCosts | None = None, clamp: bool = False) -> Compressed:
    """Compress ``a`` with compressor ``name``; Random-K / qsgd8 need ``seed``, Periodic-K ``round``."""
    return get_compressor(name, costs).compress(a, k, seed=seed, round=round, clamp=clamp)


def selection_ops(name: str, d: int, k: int, costs: OpCosts | None = None) -> float:
    """Operation count (training-FLOP equivalents) of compressing a length-d vector to K."""
    return get_compressor(name, costs).ops(int(d), int(k))


def decode(name: str, arrays: dict[str, np.ndarray], numel: int) -> Compressed:
    """The one decoder of a received payload: the arrays that travelled -> :class:`Compressed`
    (positions and values; ``.dense()`` for the dense vector). Arrays that are not the
    compressor's (e.g. dense buffers travelling alongside) are ignored."""
    cls = compressor_class(name)
    missing = [k for k in cls.ARRAYS if k not in arrays]
    if missing:
        raise ValueError(f"{name} payload lacks the arrays {missing}")
    return cls.from_arrays({k: arrays[k] for k in cls.ARRAYS}, int(numel))


def scatter_add_(out: torch.Tensor, c: Compressed, weight: float = 1.0) -> torch.Tensor:
    """``out += weight * c.dense()`` without building the dense vector (in place)."""
    if out.numel() != c.numel:
        raise ValueError(f"payload is for a vector of length {c.numel}, not {out.numel()}")
    v = c.values.to(out.device, out.dtype)
    out.index_add_(0, c.index_tensor().to(out.device), v if weight == 1.0 else v * weight)
    return out
