"""The ``clients.profiles.conditions`` section: condition sets of processes over virtual time.

A fleet's conditions are named *sets*, given to clients the way tiers are: by ``share``
(exact counts, seeded) or per client (``condition_of``). A set may give the down link, the up
link, the compute speed and the availability of its clients a process; what it leaves out
stays as today (the profile's constant Mbps and GFLOP/s, the per-round availability coin).
Link values are factors of each client's profile Mbps (``unit: factor``, the default of a
Markov chain) or absolute Mbps (``unit: mbps``, the default of a trace); compute values are
factors of its GFLOP/s. Validation only: the processes are :mod:`hardware_profiles.conditions`'.
"""
from __future__ import annotations

import math
import re
from typing import Any, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .suggest import unknown

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

# Presets: what a name stands for. Each is a modelling assumption unless a source says more.
PRESETS: dict[str, dict[str, Any]] = {
    # Gilbert (1960) / Elliott (1963) two-state channel. The numbers are assumptions: a good
    # state at the profile's rate, a bad one at a tenth of it; mean sojourns of 20 and 6.7
    # slots (about 75 % of the time good), slot of 1 s.
    "gilbert_elliott": {"kind": "markov", "states": {"good": 1.0, "bad": 0.1},
                        "transition": [[0.95, 0.05], [0.15, 0.85]], "slot_s": 1.0,
                        "start": {"good": 1.0}},
    # Throttling after sustained load: assumption (mobile SoCs drop to roughly half speed
    # when hot; minutes-scale dynamics).
    "thermal_throttling": {"kind": "markov", "states": {"cool": 1.0, "hot": 0.5},
                           "transition": [[0.9, 0.1], [0.2, 0.8]], "slot_s": 60.0,
                           "start": {"cool": 1.0}},
    # A phone eligible at night, while charging and idle (Bonawitz et al., MLSys 2019, report
    # strongly diurnal participation); the hourly shape is an assumption: mostly 22:00-06:00.
    "night_charging": {"kind": "diurnal",
                       "hourly": [0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.5, 0.2, 0.05, 0.05, 0.05, 0.05,
                                  0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.1, 0.1, 0.2, 0.4, 0.7, 0.9]},
}


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Uniform(_Spec):
    low: float
    high: float

    @model_validator(mode="after")
    def _order(self) -> "Uniform":
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"low={self.low!r}, high={self.high!r}: need finite low <= high")
        return self


class Constant(_Spec):
    kind: Literal["constant"] = "constant"


class Markov(_Spec):
    """A chain over named states with values (factors or Mbps), one step per ``slot_s``."""

    kind: Literal["markov"] = "markov"
    states: dict[str, float]
    transition: list[list[float]]
    slot_s: float = Field(1.0, gt=0)
    start: dict[str, float] | None = None  # default: uniform over the states
    unit: Literal["factor", "mbps"] = "factor"

    @model_validator(mode="after")
    def _check(self) -> "Markov":
        k = len(self.states)
        if k == 0:
            raise ValueError("states is empty; give at least one state with its value")
        for name, v in self.states.items():
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"states.{name} = {v!r}: a state's value must be > 0")
        if len(self.transition) != k or any(len(row) != k for row in self.transition):
            raise ValueError(f"transition must be {k}x{k} (one row and column per state, in the order of states)")
        for i, row in enumerate(self.transition):
            if any(not (math.isfinite(p) and p >= 0) for p in row) or abs(sum(row) - 1) > 1e-9:
                raise ValueError(f"transition row {i} = {row!r}: must be probabilities >= 0 summing to 1 "
                                 "(row-stochastic)")
        if self.start is not None:
            unknown = sorted(set(self.start) - set(self.states))
            if unknown:
                raise ValueError(f"start names unknown states {unknown}; states: {sorted(self.states)}")
            if any(not (math.isfinite(p) and p >= 0) for p in self.start.values()) or \
                    abs(sum(self.start.values()) - 1) > 1e-9:
                raise ValueError(f"start = {self.start!r}: must be probabilities >= 0 summing to 1")
        return self

    def start_vector(self) -> list[float]:
        if self.start is None:
            return [1.0 / len(self.states)] * len(self.states)
        return [self.start.get(name, 0.0) for name in self.states]


class Trace(_Spec):
    """Replayed pieces from a trace file (schema: docs/conditions.md)."""

    kind: Literal["trace"] = "trace"
    file: str
    # which traces, and their shares; "by_client": client c follows the trace whose id is c
    traces: list[str] | dict[str, float] | Literal["by_client"] | None = None
    loop: bool = True  # past the end: loop, or hold the last value
    offset_s: float | Literal["random"] = "random"
    unit: Literal["factor", "mbps"] = "mbps"


class DiurnalSpec(_Spec):
    kind: Literal["diurnal"] = "diurnal"
    hourly: list[float]
    tz_offset_h: float | Uniform = 0.0

    @field_validator("hourly")
    @classmethod
    def _hours(cls, v: list[float]) -> list[float]:
        if len(v) != 24:
            raise ValueError(f"hourly has {len(v)} values; give 24 (hours 0..23 of the client's local day)")
        bad = [p for p in v if not (math.isfinite(p) and 0 <= p <= 1)]
        if bad:
            raise ValueError(f"hourly holds {bad[0]!r}: every value must be a probability in [0, 1]")
        return v

    @field_validator("tz_offset_h")
    @classmethod
    def _zone(cls, v):
        lo, hi = (v, v) if isinstance(v, (int, float)) else (v.low, v.high)
        if lo < -12 or hi > 14:
            raise ValueError(f"tz_offset_h {v!r}: time zones lie in [-12, 14] hours")
        return v


class IntervalsSpec(_Spec):
    kind: Literal["intervals"] = "intervals"
    file: str
    traces: list[str] | dict[str, float] | Literal["by_client"] | None = None
    loop: bool = True
    offset_s: float | Literal["random"] = 0.0


class Bernoulli(_Spec):
    kind: Literal["bernoulli"] = "bernoulli"


LinkSpec = Union[Constant, Markov, Trace]
AvailabilitySpec = Union[Bernoulli, DiurnalSpec, IntervalsSpec]


def _expand_preset(v: Any) -> Any:
    if isinstance(v, str):
        v = {"preset": v}
    if isinstance(v, Mapping) and "preset" in v:
        name = v["preset"]
        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(unknown("preset", name, PRESETS, "presets"))
        v = {**PRESETS[name], **{k: x for k, x in v.items() if k != "preset"}}
    return v


class ConditionSet(_Spec):
    """The processes of one group of clients; what it leaves out stays constant."""

    share: float | None = Field(None, ge=0, le=1)
    down: LinkSpec = Field(default_factory=Constant, discriminator="kind")
    up: LinkSpec = Field(default_factory=Constant, discriminator="kind")
    compute: Union[Constant, Markov, Trace] = Field(default_factory=Constant, discriminator="kind")
    availability: AvailabilitySpec = Field(default_factory=Bernoulli, discriminator="kind")

    _presets = field_validator("down", "up", "compute", "availability", mode="before")(
        classmethod(lambda cls, v: _expand_preset(v)))

    @model_validator(mode="after")
    def _units(self) -> "ConditionSet":
        for name in ("compute",):
            p = getattr(self, name)
            if getattr(p, "unit", "factor") != "factor":
                raise ValueError(f"{name}.unit = {p.unit!r}: a compute process gives factors of the device's "
                                 "GFLOP/s (unit: factor)")
        return self

    @property
    def varies(self) -> bool:
        return not all(isinstance(getattr(self, f), Constant) for f in ("down", "up", "compute"))


def parse_start(text: str) -> float:
    """``"08:00"`` or ``"Tue 08:00"`` (days from Monday) -> seconds of virtual time."""
    m = re.fullmatch(r"\s*(?:(mon|tue|wed|thu|fri|sat|sun)[a-z]*\s+)?(\d{1,2}):(\d{2})(?::(\d{2}))?\s*",
                     str(text).lower())
    if not m or int(m.group(2)) > 23 or int(m.group(3)) > 59 or int(m.group(4) or 0) > 59:
        raise ValueError(f"start = {text!r}: give a time of day HH:MM[:SS], optionally after a day "
                         "of the week (e.g. '08:00' or 'Tue 22:30')")
    day = DAYS.index(m.group(1)) if m.group(1) else 0
    return day * 86400.0 + int(m.group(2)) * 3600.0 + int(m.group(3)) * 60.0 + int(m.group(4) or 0)


class ConditionsSpec(_Spec):
    """``clients.profiles.conditions``: named sets with shares, and per-client sets."""

    sets: dict[str, ConditionSet] = {}
    condition_of: dict[int, str] = {}

    @model_validator(mode="after")
    def _shares(self) -> "ConditionsSpec":
        if not self.sets:
            if self.condition_of:
                raise ValueError("condition_of names sets, but no condition sets are given")
            return self
        shares = {k: s.share for k, s in self.sets.items()}
        if len(shares) == 1 and next(iter(shares.values())) is None:
            return self  # one set: every client's
        missing = [k for k, v in shares.items() if v is None]
        if missing:
            raise ValueError(f"sets {missing} have no share; with several sets give each a share (summing to 1)")
        if abs(sum(shares.values()) - 1) > 1e-6:
            raise ValueError(f"set shares sum to {sum(shares.values())!r}; they must sum to 1")
        unknown = sorted({v for v in self.condition_of.values() if v not in self.sets})
        if unknown:
            raise ValueError(f"condition_of names unknown sets {unknown}; sets: {sorted(self.sets)}")
        return self
