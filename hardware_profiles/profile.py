"""One client's injected hardware profile, plus the validation rules shared
with the vectorised :class:`~hardware_profiles.sampler.ProfileTable`.

Out-of-range bandwidth (outside the catalog range 5–500 Mbps) is rejected
unless explicitly allowed, either with the model field
``HardwareProfile(..., allow_out_of_range=True)`` or with the validation
context ``HardwareProfile.model_validate(d, context={"allow_out_of_range": True})``.
Non-positive speeds/memory, negative latency and probabilities outside [0, 1]
are always errors.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator


class SelectionCosts(BaseModel):
    """The selection-cost model's numbers (hardware_profiles.clock.select_seconds, ASCEND's
    selection cost v3), declared once for a catalog device tier and for a profile: ns per element
    of d for Top-K in and out of cache (which applies: 4·d bytes against cache_bytes), per kept
    element for Random-K / Periodic-K, per element for quantisation. NaN means "not given": the
    method then prices selection with its op-count model. Each class checks them by its
    ``"select"`` rule (:func:`rule_violation`)."""

    cache_bytes: float = math.nan
    topk_ns_in_cache: float = math.nan
    topk_ns_out_of_cache: float = math.nan
    randomk_ns_per_kept: float = math.nan
    periodick_ns_per_kept: float = math.nan
    quant_ns_per_elem: float = math.nan


# The bandwidth range the catalog (and the FL scenarios it models) covers:
# from rural broadband / weak cellular up to fibre. Inclusive on both ends.
BANDWIDTH_MIN_MBPS = 5.0
BANDWIDTH_MAX_MBPS = 500.0

# Numeric fields in canonical order and the rule each must obey.
#   "pos"  : finite and > 0
#   "nonneg": finite and >= 0
#   "prob" : finite and in [0, 1]
#   "bw"   : like "pos", plus the catalog bandwidth range unless allowed
#   "power": NaN (not given) or finite and >= 0
#   "select": NaN (not given) or finite and >= 0 (the fields of SelectionCosts)
SELECT_FIELDS: tuple[str, ...] = tuple(SelectionCosts.model_fields)
NUMERIC_FIELDS: tuple[str, ...] = (
    "gflops",
    "down_mbps",
    "up_mbps",
    "latency_s",
    "memory_gb",
    "availability",
    "dropout",
    *("train_w", "idle_w", "rx_w", "tx_w", "tail_j", "battery_wh"),
    *SELECT_FIELDS,
)
# The power model (hardware_profiles.energy): NaN in a profile means "not given" (a user tier
# without power numbers); its energy columns are then NaN, never a made-up 0.
POWER_FIELDS: tuple[str, ...] = ("train_w", "idle_w", "rx_w", "tx_w", "tail_j")
LABEL_FIELDS: tuple[str, ...] = ("tier", "net_tier")
FIELD_RULES: dict[str, str] = {
    "gflops": "pos",
    "down_mbps": "bw",
    "up_mbps": "bw",
    "latency_s": "nonneg",
    "memory_gb": "pos",
    "availability": "prob",
    "dropout": "prob",
    **{f: "power" for f in POWER_FIELDS},
    "battery_wh": "nonneg",  # 0: no battery (mains-powered)
    **{f: "select" for f in SELECT_FIELDS},
}
OPTIONAL_RULES = ("power", "select")  # NaN allowed: not given

RANGE_HINT = "pass allow_out_of_range=True to permit bandwidths outside the catalog range"


def rule_violation(field: str, value: float, allow_out_of_range: bool = False) -> str | None:
    """Return why ``value`` is not allowed for ``field`` (None if it is fine).

    The message always names the field, the value and what is allowed.
    """
    rule = FIELD_RULES[field]
    v = float(value)
    if rule in OPTIONAL_RULES and math.isnan(v):
        return None
    if rule == "power" and v < 0:
        return f"{field}={v!r} is not allowed: a power or energy must be >= 0 (or left out)"
    if rule == "select" and v < 0:
        return f"{field}={v!r} is not allowed: a selection cost or cache size must be >= 0 (or left out)"
    if not math.isfinite(v):
        return f"{field}={v!r} is not allowed: must be a finite number"
    if rule in ("pos", "bw") and v <= 0:
        return f"{field}={v!r} is not allowed: must be > 0"
    if rule == "nonneg" and v < 0:
        return f"{field}={v!r} is not allowed: must be >= 0"
    if rule == "prob" and not (0.0 <= v <= 1.0):
        return f"{field}={v!r} is not allowed: must be in [0, 1]"
    if rule == "bw" and not allow_out_of_range and not (BANDWIDTH_MIN_MBPS <= v <= BANDWIDTH_MAX_MBPS):
        return f"{field}={v!r} Mbps is outside the catalog range " + bandwidth_advice(v)
    return None


def plain_number(x: float) -> str:
    """``x`` as a user writes it: 5000000 and 0.5, not 5e+06 and 0.500000."""
    x = float(x)
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.6g}"


# No client link is this fast (100 Gbit/s): a bandwidth from here up was written in bit/s.
BITS_PER_SECOND_FROM = 1e5


def bandwidth_advice(mbps: float) -> str:
    """What to do about a bandwidth outside the catalog range: a value in bit/s is converted
    (allowing it out of range would let the wrong unit through); otherwise the range hint."""
    span = f"[{BANDWIDTH_MIN_MBPS:g}, {BANDWIDTH_MAX_MBPS:g}] Mbps"
    if mbps >= BITS_PER_SECOND_FROM:
        mbit = plain_number(mbps / 1e6)
        return f"{span}; {plain_number(mbps)} looks like bit/s: {mbit} Mbps? give {mbit} (the unit is Mbps)"
    return f"{span}; {RANGE_HINT}"


class _ProfileHead(BaseModel):
    """The fields of :class:`HardwareProfile` before its selection costs (pydantic puts a base's
    fields first, so this keeps the profile's field order: name ... battery_wh, costs, tier ...)."""

    name: str
    gflops: float  # effective training throughput, GFLOP/s
    down_mbps: float
    up_mbps: float
    latency_s: float  # one-way, added once per transfer
    memory_gb: float
    availability: float  # P(online in a round)
    dropout: float  # P(fails mid-round | online)
    train_w: float = math.nan  # whole-device power while training or compressing, W
    idle_w: float = math.nan  # whole-device power while idle (awake, screen off), W
    rx_w: float = math.nan  # radio power while receiving, on top of idle_w, W
    tx_w: float = math.nan  # radio power while transmitting, on top of idle_w, W
    tail_j: float = math.nan  # radio tail energy after each transfer, J
    battery_wh: float = 0.0  # battery capacity; 0: mains-powered


class HardwareProfile(SelectionCosts, _ProfileHead):
    """Effective hardware of one simulated client (immutable): :class:`_ProfileHead`'s fields,
    the :class:`SelectionCosts`, then these."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tier: str = ""
    net_tier: str = ""
    allow_out_of_range: bool = False

    @model_validator(mode="after")
    def _check_rules(self, info: ValidationInfo) -> "HardwareProfile":
        ctx: dict[str, Any] = info.context or {}
        allow = self.allow_out_of_range or bool(ctx.get("allow_out_of_range", False))
        problems = [
            msg
            for f in NUMERIC_FIELDS
            if (msg := rule_violation(f, getattr(self, f), allow)) is not None
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self
