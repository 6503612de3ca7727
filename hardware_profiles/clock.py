"""Deterministic virtual clock: FLOPs, compression ops and bytes → simulated seconds.

Nothing here reads the host clock. Per client and round:

* download_s = latency_s + 8 · bytes_down / (down_mbps · 1e6)
* compute_s  = train_flops / (gflops · 1e9)
* compress_s = compress_ops · OPS_TO_FLOPS / (gflops · 1e9)
* upload_s   = latency_s + 8 · bytes_up / (up_mbps · 1e6)
* total_s    = sum of the above (sequential: download, train, compress, upload)

Latency is paid once per transfer, even for 0 bytes (the message still goes).
Compression cost is whatever op count the algorithm reports, priced at the
device's training speed: one op = one flop-equivalent (``OPS_TO_FLOPS``).
Compressor specifics (e.g. Top-K's selection cost) live in the algorithm's op
count, not here. A method that prices selection in seconds from the device tier
(ASCEND's selection cost v3: :func:`select_seconds`, the profile's ``select``
fields) reports the op count :func:`ops_for_seconds` gives, so that the engine's
``compress_s`` is exactly those seconds; every other method is unchanged.

Availability and dropout are drawn per (seed, round, client id) with a
counter-based hash, so a client's draw does not depend on which other clients
are in the call, the batch order or the executor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from .condition_spec import parse_start
from .deadlines import ROUND_ONLY, DeadlineSpec, FixedDeadline
from .sampler import ProfileTable

OPS_TO_FLOPS = 1.0  # one reported compression op costs one training flop

DROP_REASONS = ("", "unavailable", "battery", "dropout", "offline", "deadline", "over_selected", "nonfinite",
                "stale")  # stale: an asynchronous update older than max_staleness (engine/loop/asynchronous.py)

# Salts keep the availability and dropout streams independent.
SALT_AVAILABILITY = 0xA7A1
SALT_DROPOUT = 0xD209

TimeDict = dict[str, np.ndarray]
POLICY = object()  # a deadline_s argument left out: the policy's fixed deadline


# --------------------------------------------------------------------------- scalar formulas


def transfer_seconds(num_bytes, mbps, latency_s):
    """latency + 8·bytes / (Mbps·1e6); numpy-broadcasting."""
    return np.asarray(latency_s, dtype=np.float64) + 8.0 * np.asarray(num_bytes, dtype=np.float64) / (
        np.asarray(mbps, dtype=np.float64) * 1e6
    )


def compute_seconds(flops, gflops):
    """flops / (GFLOP/s · 1e9)."""
    return np.asarray(flops, dtype=np.float64) / (np.asarray(gflops, dtype=np.float64) * 1e9)


def compress_seconds(ops, gflops):
    """compress ops priced as flop-equivalents at the device speed."""
    return compute_seconds(np.asarray(ops, dtype=np.float64) * OPS_TO_FLOPS, gflops)


# Selection cost in seconds (ASCEND's selection cost v3; constants per device tier in
# catalog.yaml): compressor -> (profile field of its ns, what the ns multiply). Top-K's field is
# chosen by whether the 4·d-byte vector fits the tier's cache_bytes.
SELECT_RULES: dict[str, tuple[str, str]] = {
    "topk": ("topk_ns_in_cache|topk_ns_out_of_cache", "d"),
    "randomk": ("randomk_ns_per_kept", "k"),
    "periodick": ("periodick_ns_per_kept", "k"),
    "qsgd8": ("quant_ns_per_elem", "d"),
}
VALUE_BYTES = 4  # float32: what decides whether a d-vector fits the cache


def select_seconds(compressor: str, d: int, k: int, profile) -> float:
    """Seconds of compressing a d-vector to K on ``profile``'s device; NaN when the profile does
    not give the constant (a user tier without the select fields) or ``compressor`` has no rule
    here (the caller then prices it with its op count)."""
    rule = SELECT_RULES.get(compressor)
    if rule is None:
        return math.nan
    fields, per = rule
    if "|" in fields:
        inside, outside = fields.split("|")
        cache = float(getattr(profile, "cache_bytes", math.nan))
        fields = inside if VALUE_BYTES * d <= cache else outside  # NaN cache: out of cache
    ns = float(getattr(profile, fields, math.nan))
    return ns * 1e-9 * (d if per == "d" else k)


def ops_for_seconds(seconds, gflops):
    """The op count that :func:`compress_seconds` prices at ``seconds`` on a ``gflops`` device."""
    return np.asarray(seconds, dtype=np.float64) * np.asarray(gflops, dtype=np.float64) * 1e9 / OPS_TO_FLOPS


def _ids(profiles: ProfileTable, client_ids) -> np.ndarray:
    ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= len(profiles)):
        bad = ids[(ids < 0) | (ids >= len(profiles))][0]
        raise IndexError(f"client id {int(bad)} out of range [0, {len(profiles)})")
    return ids


def _per_client(name: str, value, n: int) -> np.ndarray:
    a = np.asarray(value, dtype=np.float64)
    try:
        a = np.broadcast_to(a, (n,))
    except ValueError:
        raise ValueError(f"{name} has shape {a.shape}; expected a scalar or ({n},)") from None
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must be finite and >= 0; got min {a.min() if n else 0!r}")
    return a


def client_times(
    profiles: ProfileTable,
    client_ids,
    bytes_down,
    bytes_up,
    train_flops,
    compress_ops=0.0,
    *,
    measured_compute_s=None,
) -> TimeDict:
    """Per-client phase times (float64 arrays aligned with ``client_ids``).

    ``bytes_down``/``bytes_up``/``train_flops``/``compress_ops`` are scalars or
    per-client arrays. In measured mode pass ``measured_compute_s`` (already
    scaled, see :meth:`RoundPolicy.measured_compute_s`); it replaces the
    FLOP-based compute time.
    """
    ids = _ids(profiles, client_ids)
    n = ids.size
    gf = profiles.gflops[ids]
    lat = profiles.latency_s[ids]
    down = transfer_seconds(_per_client("bytes_down", bytes_down, n), profiles.down_mbps[ids], lat)
    up = transfer_seconds(_per_client("bytes_up", bytes_up, n), profiles.up_mbps[ids], lat)
    if measured_compute_s is None:
        comp = compute_seconds(_per_client("train_flops", train_flops, n), gf)
    else:
        comp = _per_client("measured_compute_s", measured_compute_s, n).copy()
    cmp_ = compress_seconds(_per_client("compress_ops", compress_ops, n), gf)
    return {
        "download_s": down,
        "compute_s": comp,
        "compress_s": cmp_,
        "upload_s": up,
        "total_s": down + comp + cmp_ + up,
    }


# --------------------------------------------------------------------------- policy


class RoundPolicy(BaseModel):
    """How a round's clients are cut (deadline, over-selection) and timed.

    mode:
      * ``virtual``  – compute time from FLOPs and the profile (default).
      * ``measured`` – compute time = host seconds × ``host_to_device_ratio``
        (the engine measures host time; everything else stays virtual).
      * ``realtime`` – virtual times, and the engine sleeps
        sim_seconds × ``time_scale`` per round, at most ``max_sleep_s``
        (exposed by :meth:`realtime_sleep_s`).
      * ``timing_only`` – virtual times, and nothing trains: the engine times each client from
        its model's FLOP count and the method's wire format (``engine/loop/timing.py``).

    deadline: a deadline policy (:mod:`hardware_profiles.deadlines`: fixed, percentile,
    adaptive, cutoff); ``deadline_s`` is the short form of a fixed one (give one of the two).
    """

    model_config = ConfigDict(extra="forbid")

    deadline_s: float | None = None
    deadline: DeadlineSpec | None = None  # a deadline policy: {policy: fixed | percentile | adaptive | cutoff, ...}
    over_selection: float = 1.0
    apply_availability: bool = True
    apply_dropout: bool = True
    mode: Literal["virtual", "measured", "realtime", "timing_only"] = "virtual"
    host_to_device_ratio: float = 1.0
    time_scale: float = 1.0
    max_sleep_s: float = 3600.0  # realtime: the longest the engine sleeps for one round
    start: str = "00:00"  # virtual time of round 0's start: a time of day, optionally "Tue 08:00"

    @model_validator(mode="after")
    def _check(self) -> "RoundPolicy":
        if self.deadline_s is not None and not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise ValueError(f"deadline_s={self.deadline_s!r} is not allowed: must be > 0 or null")
        if self.deadline_s is not None and self.deadline is not None:
            raise ValueError(f"deadline_s={self.deadline_s!r} and deadline={self.deadline.model_dump()!r}: give one "
                             "of the two (deadline_s: S is deadline: {policy: fixed, seconds: S})")
        if not (math.isfinite(self.over_selection) and self.over_selection >= 1.0):
            raise ValueError(f"over_selection={self.over_selection!r} is not allowed: must be >= 1.0")
        if not (math.isfinite(self.host_to_device_ratio) and self.host_to_device_ratio > 0):
            raise ValueError(f"host_to_device_ratio={self.host_to_device_ratio!r} is not allowed: must be > 0")
        if not (math.isfinite(self.time_scale) and self.time_scale >= 0):
            raise ValueError(f"time_scale={self.time_scale!r} is not allowed: must be >= 0")
        if not (math.isfinite(self.max_sleep_s) and self.max_sleep_s > 0):
            raise ValueError(f"max_sleep_s={self.max_sleep_s!r} is not allowed: must be > 0")
        parse_start(self.start)  # raises with the allowed forms
        return self

    @property
    def fixed_deadline_s(self) -> float | None:
        """The deadline every round has (``deadline_s``, or a fixed ``deadline``); None when there
        is none or a policy sets one per round."""
        if isinstance(self.deadline, FixedDeadline):
            return self.deadline.seconds
        return self.deadline_s

    @property
    def per_round_deadline(self) -> str | None:
        """The name of a policy that sets each round's deadline (percentile, adaptive, cutoff)."""
        return self.deadline.policy if self.deadline is not None and self.deadline.policy in ROUND_ONLY else None

    @property
    def start_s(self) -> float:
        """Round 0's start in seconds of virtual time (0 = Monday 00:00)."""
        return parse_start(self.start)

    def num_to_select(self, k: int, pool_size: int | None = None) -> int:
        """ceil(k × over_selection), capped at the pool size if given."""
        m = math.ceil(k * self.over_selection - 1e-9)  # 10 × 1.1 must be 11, not 12
        return m if pool_size is None else min(m, pool_size)

    def measured_compute_s(self, host_seconds):
        return np.asarray(host_seconds, dtype=np.float64) * self.host_to_device_ratio

    def realtime_sleep_s(self, sim_seconds: float) -> float:
        """sim_seconds x time_scale, at most ``max_sleep_s`` (a huge scale must not sleep for days)."""
        return min(float(sim_seconds) * self.time_scale, self.max_sleep_s)


# --------------------------------------------------------------------------- seeded draws


def _u64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.uint64)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    # SplitMix64 finaliser; uint64 array arithmetic wraps mod 2**64.
    x = (x ^ (x >> _u64(30))) * _u64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _u64(27))) * _u64(0x94D049BB133111EB)
    return x ^ (x >> _u64(31))


def client_uniforms(client_ids, seed: int, round: int, salt: int) -> np.ndarray:
    """U[0,1) per client, a pure function of (seed, round, salt, client id).

    The (seed, round, salt) key comes from ``np.random.SeedSequence`` (as
    ``default_rng([seed, round, salt])`` would use); each client id is then
    hashed with it (counter-based), so draws are batch-independent and O(N)
    vectorised with no per-client generator objects.
    """
    if seed < 0 or round < 0:
        raise ValueError(f"seed={seed!r} and round={round!r} must be >= 0")
    k0, k1 = np.random.SeedSequence([int(seed), int(round), int(salt)]).generate_state(2, np.uint64)
    ids = _u64(np.asarray(client_ids, dtype=np.int64).reshape(-1))
    with np.errstate(over="ignore"):
        h = _splitmix64(_splitmix64(ids * _u64(0x9E3779B97F4A7C15) + k0) ^ k1)
    return (h >> _u64(11)).astype(np.float64) * (1.0 / (1 << 53))


def draw_availability(profiles: ProfileTable, client_ids, seed: int, round: int) -> np.ndarray:
    """True where the client is online this round (P = its availability)."""
    ids = _ids(profiles, client_ids)
    return client_uniforms(ids, seed, round, SALT_AVAILABILITY) < profiles.availability[ids]


def draw_dropout(profiles: ProfileTable, client_ids, seed: int, round: int) -> np.ndarray:
    """True where the client fails mid-round (P = its dropout)."""
    ids = _ids(profiles, client_ids)
    return client_uniforms(ids, seed, round, SALT_DROPOUT) < profiles.dropout[ids]


def draw_participation(profiles: ProfileTable, client_ids, seed: int, round: int,
                       policy: RoundPolicy) -> tuple[np.ndarray, np.ndarray]:
    """(available, dropped) per selected client of this round: the seeded draws, with the
    policy's switches applied (``apply_availability: false``: everyone is online;
    ``apply_dropout: false``: nobody drops out)."""
    available = draw_availability(profiles, client_ids, seed, round)
    dropped = draw_dropout(profiles, client_ids, seed, round)
    if not policy.apply_availability:
        available[:] = True
    if not policy.apply_dropout:
        dropped[:] = False
    return available, dropped


# --------------------------------------------------------------------------- resolution


@dataclass(eq=False)
class RoundOutcome:
    client_ids: np.ndarray
    made_deadline: np.ndarray  # bool: finished in time and kept for aggregation
    drop_reason: np.ndarray  # str per client, one of DROP_REASONS
    round_time_s: float



def resolve_round(
    times: TimeDict,
    client_ids,
    policy: RoundPolicy,
    available=None,
    dropped=None,
    target_k: int | None = None,
    leaves_s=None,
    empties_s=None,
    deadline_s: float | None | object = POLICY,
) -> RoundOutcome:
    """Decide who completes the round and how long it takes.

    Precedence of drop reasons: unavailable > dropout > offline (``leaves_s``: seconds after
    the round's start at which the client goes offline, before its upload is done) or battery
    (``empties_s``: when its battery runs empty; whichever comes first) > deadline
    (total_s strictly greater than ``deadline_s``) > over_selected (finishers beyond
    the fastest ``target_k``; ties broken by lower client id).
    ``available``/``dropped`` default to all-available / none-dropped and are
    ignored when the policy's ``apply_*`` flag is off. ``deadline_s``: this round's deadline
    (a policy's, :mod:`hardware_profiles.deadlines`; default: the policy's fixed one).

    round_time_s = the slowest kept client's total_s (the server proceeds as
    soon as the last kept update arrives). If nobody is kept it is the
    deadline when one is set (the server waited it out), else 0.
    """
    deadline_s = policy.fixed_deadline_s if deadline_s is POLICY else deadline_s
    ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
    n = ids.size
    total = np.asarray(times["total_s"], dtype=np.float64).reshape(-1)
    if total.size != n:
        raise ValueError(f"times['total_s'] has {total.size} entries for {n} client ids")

    def _mask(name, a):
        if a is None:
            return np.zeros(n, dtype=bool)
        a = np.asarray(a, dtype=bool).reshape(-1)
        if a.size != n:
            raise ValueError(f"{name} has {a.size} entries for {n} client ids")
        return a

    unavailable = ~_mask("available", available) if available is not None else np.zeros(n, dtype=bool)
    if not policy.apply_availability:
        unavailable[:] = False
    drop = _mask("dropped", dropped) & ~unavailable
    if not policy.apply_dropout:
        drop[:] = False
    reason = np.full(n, "", dtype="<U13")
    reason[unavailable] = "unavailable"
    reason[drop] = "dropout"
    alive = ~(unavailable | drop)
    if leaves_s is not None or empties_s is not None:
        leave = np.full(n, np.inf) if leaves_s is None else np.asarray(leaves_s, dtype=np.float64).reshape(-1)
        empty = np.full(n, np.inf) if empties_s is None else np.asarray(empties_s, dtype=np.float64).reshape(-1)
        gone = alive & (total > np.minimum(leave, empty))
        reason[gone] = np.where(empty[gone] < leave[gone], "battery", "offline")
        alive &= ~gone
    if deadline_s is not None:
        late = alive & (total > deadline_s)
        reason[late] = "deadline"
        alive &= ~late
    if target_k is not None:
        if target_k < 0:
            raise ValueError(f"target_k={target_k!r} is not allowed: must be >= 0")
        cand = np.flatnonzero(alive)
        order = cand[np.lexsort((ids[cand], total[cand]))]  # by time, then id
        extra = order[target_k:]
        reason[extra] = "over_selected"
        alive[extra] = False
    if alive.any():
        round_time = float(total[alive].max())
    else:
        round_time = float(deadline_s) if deadline_s is not None else 0.0
    return RoundOutcome(client_ids=ids, made_deadline=alive, drop_reason=reason, round_time_s=round_time)


def round_seconds(outcome: RoundOutcome, policy: RoundPolicy, *, dropped_in_flight: bool,
                  arrived: int, target: int, deadline_s: float | None | object = POLICY) -> float:
    """How long the server waits in a round: until the slowest kept upload
    (``outcome.round_time_s``), or until the deadline if a client lost in flight (it dropped
    out, went offline, ran out of battery, or is late) was needed to reach the target: the
    server cannot tell such a client from a slow one. ``deadline_s``: as :func:`resolve_round`'s."""
    deadline_s = policy.fixed_deadline_s if deadline_s is POLICY else deadline_s
    lost = ("deadline", "offline", "battery")
    lost_in_flight = dropped_in_flight or bool(np.isin(outcome.drop_reason, lost).any())
    if deadline_s is not None and lost_in_flight and arrived < target:
        return max(outcome.round_time_s, deadline_s)
    return outcome.round_time_s
