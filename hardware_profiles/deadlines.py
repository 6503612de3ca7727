"""Deadline policies: when a synchronous round closes (``clock.deadline``).

A policy gives each round one deadline, in seconds after the round's start; the rules of the
clock (:func:`~hardware_profiles.clock.resolve_round`, :func:`~hardware_profiles.clock.round_seconds`)
then apply it as they apply ``clock.deadline_s``: a client whose upload ends strictly after it is
dropped with reason ``deadline``, and a server that needed a client lost in flight waits it out.

* ``fixed``: ``seconds`` every round (``clock.deadline_s`` is the short form);
* ``percentile``: the round closes when ``percent`` % of the dispatched (runnable) clients have
  arrived: the deadline is the arrival time of the ``ceil(percent / 100 * dispatched)``-th upload
  that can arrive (one that goes offline or runs empty first does not count); capped at
  ``max_s``. When fewer uploads can arrive, the deadline is ``max_s`` (none without it: the round
  ends with its last arrival, as a round without a deadline does);
* ``adaptive``: learned from the previous rounds: ``margin`` times the ``quantile`` of the
  arrival times (seconds after their round's start) of the uploads kept in the last ``window``
  rounds; ``initial_s`` (none: no deadline) until a kept upload has been seen. The server sees
  only what arrived, so the times it learns from are cut at the deadlines it set;
* ``cutoff``: by the wall of virtual time: the round closes at the first instant after its start
  that is ``offset_s`` plus a multiple of ``every_s`` on the virtual clock (0 = Monday 00:00;
  ``every_s: 3600`` closes rounds on the hour). With ``min_reporting`` the server waits past the
  cutoff until that many uploads have arrived (or all that can).

Pure numpy; :class:`~hardware_profiles.round_clock.RoundClock` asks :meth:`DeadlineTracker.deadline`
at each round's timing and tells :meth:`DeadlineTracker.observe` what arrived. ``docs/engine.md``
("Deadline policies") has worked examples; ``tests/hardware_profiles/test_deadlines.py`` checks
each against a hand-computed case.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Policy(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FixedDeadline(_Policy):
    policy: Literal["fixed"] = "fixed"
    seconds: float = Field(gt=0, allow_inf_nan=False, description="the deadline of every round")


class PercentileDeadline(_Policy):
    policy: Literal["percentile"] = "percentile"
    percent: float = Field(gt=0, le=100, description="share of the dispatched clients the round waits for")
    max_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="the deadline never exceeds this")


class AdaptiveDeadline(_Policy):
    policy: Literal["adaptive"] = "adaptive"
    quantile: float = Field(0.9, gt=0, le=1, description="quantile of the kept arrival times")
    margin: float = Field(1.2, gt=0, allow_inf_nan=False, description="factor on that quantile")
    window: int = Field(5, ge=1, description="rounds whose arrivals are remembered")
    initial_s: float | None = Field(None, gt=0, allow_inf_nan=False,
                                    description="the deadline before any upload was kept (null: none)")


class CutoffDeadline(_Policy):
    policy: Literal["cutoff"] = "cutoff"
    every_s: float = Field(gt=0, allow_inf_nan=False, description="cutoffs fall on multiples of this")
    offset_s: float = Field(0.0, ge=0, allow_inf_nan=False, description="shift of the cutoffs from Monday 00:00")
    min_reporting: int = Field(0, ge=0, description="uploads the server waits for past the cutoff")

    @model_validator(mode="after")
    def _offset_below_period(self) -> "CutoffDeadline":
        if self.offset_s >= self.every_s:
            raise ValueError(f"offset_s={self.offset_s!r} is not allowed: must be < every_s ({self.every_s!r})")
        return self


DeadlineSpec = Annotated[Union[FixedDeadline, PercentileDeadline, AdaptiveDeadline, CutoffDeadline],  # noqa: UP007
                         Field(discriminator="policy")]
POLICIES = ("fixed", "percentile", "adaptive", "cutoff")
ROUND_ONLY = ("percentile", "adaptive", "cutoff")  # need rounds to close: not asynchronous runs


def kth_arrival(total_s: np.ndarray, gone_s: np.ndarray | None, k: int) -> tuple[float | None, float | None]:
    """(time of the k-th upload that arrives, time of the last one): uploads whose ``total_s`` is
    at most ``gone_s`` (when the client goes offline or runs empty; None: never). None when fewer
    than k (or none) arrive."""
    arrive = total_s if gone_s is None else total_s[total_s <= gone_s]
    if len(arrive) == 0:
        return None, None
    last = float(arrive.max())
    if k < 1 or k > len(arrive):
        return None, last
    return float(np.partition(arrive, k - 1)[k - 1]), last


def next_cutoff(start_s: float, every_s: float, offset_s: float) -> float:
    """The first instant strictly after ``start_s`` of the grid ``offset_s + j * every_s``."""
    j = math.floor((start_s - offset_s) / every_s) + 1
    cut = offset_s + j * every_s
    while cut <= start_s:  # a start a rounding error below a grid point
        cut += every_s
    return cut


class DeadlineTracker:
    """One run's deadline policy and what it has learned (the adaptive policy's arrivals)."""

    def __init__(self, spec, deadline_s: float | None = None):
        self.spec = spec if spec is not None else (FixedDeadline(seconds=deadline_s) if deadline_s else None)
        window = spec.window if isinstance(spec, AdaptiveDeadline) else 1
        self.history: deque[np.ndarray] = deque(maxlen=window)

    @property
    def fixed_s(self) -> float | None:
        """The deadline when it is the same every round (fixed), else None."""
        return self.spec.seconds if isinstance(self.spec, FixedDeadline) else None

    def deadline(self, start_s: float, total_s: np.ndarray, gone_s: np.ndarray | None) -> float | None:
        """The deadline of a round starting at ``start_s`` (absolute virtual time) whose runnable
        clients' uploads end ``total_s`` after it, unless they are gone first (``gone_s``)."""
        spec = self.spec
        if spec is None or isinstance(spec, FixedDeadline):
            return None if spec is None else spec.seconds
        if isinstance(spec, PercentileDeadline):
            k = math.ceil(spec.percent / 100.0 * len(total_s) - 1e-9)
            at, _ = kth_arrival(total_s, gone_s, k)
            if at is None:
                return spec.max_s
            return at if spec.max_s is None else min(at, spec.max_s)
        if isinstance(spec, AdaptiveDeadline):
            seen = np.concatenate(list(self.history)) if self.history else np.zeros(0)
            if len(seen) == 0:
                return spec.initial_s
            return spec.margin * float(np.quantile(seen, spec.quantile))
        cut = next_cutoff(start_s, spec.every_s, spec.offset_s) - start_s
        if spec.min_reporting:
            at, last = kth_arrival(total_s, gone_s, spec.min_reporting)
            wait = at if at is not None else last
            if wait is not None:
                cut = max(cut, wait)
        return cut

    def before_round(self, start_s: float) -> float | None:
        """The deadline of a round starting at ``start_s`` as far as it is known before its clients
        run (a work policy plans by it): fixed and adaptive exactly, a cutoff without the wait for
        ``min_reporting`` (which only moves it later), a percentile not at all (None: it follows
        from the arrivals)."""
        spec = self.spec
        if isinstance(spec, PercentileDeadline):
            return None
        if isinstance(spec, CutoffDeadline):
            return next_cutoff(start_s, spec.every_s, spec.offset_s) - start_s
        return self.deadline(start_s, np.zeros(0), None)

    def observe(self, kept_s: np.ndarray) -> None:
        """The arrival times (after the round's start) of the uploads a round kept."""
        if isinstance(self.spec, AdaptiveDeadline):
            self.history.append(np.asarray(kept_s, dtype=np.float64).copy())

    def state(self) -> list[np.ndarray]:
        return list(self.history)

    def restore(self, state: list[np.ndarray] | None) -> None:
        self.history.clear()
        self.history.extend(np.asarray(a, dtype=np.float64) for a in (state or []))
