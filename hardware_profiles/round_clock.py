"""A round on the virtual clock, as a loop drives it: :class:`RoundClock` owns the fleet's time
(``sim_time_s``), its conditions and its batteries, and answers the loop's three questions.

1. :meth:`RoundClock.begin`: who of the selected clients can work when the round starts
   (availability, dropout, battery too low, who is on the charger);
2. :meth:`RoundClock.time`: when each runnable client's phases end (its times and timeline,
   through the conditions), who arrives (deadline, offline, battery empty) and what it spent;
3. :meth:`RoundClock.advance`: how long the server waited, and the fleet after it (the clock
   moves on, the batteries drain or charge).

The synchronous loop (:meth:`engine.loop.simulation.Simulation.run_round`) uses it; the
asynchronous loop (:mod:`engine.loop.asynchronous`) can adopt it: :meth:`begin` and :meth:`time`
take any set of clients and a start time (``start_s``), and :meth:`advance` any waited seconds.
The rules themselves stay in :mod:`hardware_profiles.clock`, :mod:`~hardware_profiles.conditions`
and :mod:`~hardware_profiles.energy`; nothing here draws a random number of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .clock import RoundOutcome, RoundPolicy, client_times, resolve_round, round_seconds
from .conditions import FleetConditions, participation
from .energy import FleetBatteries, empties_at, ledger


@dataclass
class RoundStart:
    """The selected clients at the round's start (arrays aligned with ``selected``)."""

    round: int
    start_s: float  # virtual time of the round's start (clock.start_s + sim_time_s)
    selected: np.ndarray
    available: np.ndarray
    dropped: np.ndarray  # will drop out (whether or not available)
    low: np.ndarray  # available, but its battery is below the participation threshold
    leaves: np.ndarray  # virtual time each one goes offline (inf: it stays)
    charging: np.ndarray | None  # every client: on the charger this round (None: no batteries)
    level_start: np.ndarray | None  # the selected clients' battery levels (fraction)

    @property
    def run_mask(self) -> np.ndarray:
        return self.available & ~self.low & ~self.dropped

    @property
    def runnable(self) -> np.ndarray:
        return self.selected[self.run_mask]

    @property
    def not_run(self) -> np.ndarray:
        """Why each selected client did not run (meaningless where it ran)."""
        return np.where(~self.available, "unavailable", np.where(self.low, "battery", "dropout"))


@dataclass
class RoundTiming:
    """The runnable clients' round on the clock (arrays aligned with ``start.runnable``)."""

    times: dict[str, np.ndarray]  # phase seconds (clock.client_times; conditions applied)
    timeline: dict[str, np.ndarray]  # virtual time each phase ends (and left_s with conditions/batteries)
    outcome: RoundOutcome
    stopped: np.ndarray  # seconds after the start at which it stopped (inf: it did not)
    energy: dict[str, np.ndarray]  # the ledger up to ``stopped``


class RoundClock:
    def __init__(self, profiles, policy: RoundPolicy, seed: int, conditions: FleetConditions | None = None,
                 batteries: FleetBatteries | None = None):
        self.profiles, self.policy, self.seed = profiles, policy, seed
        self.conditions, self.batteries = conditions, batteries
        self.sim_time_s = 0.0  # virtual seconds since clock.start (checkpointed by the loop's owner)

    def begin(self, r: int, selected: np.ndarray, start_s: float | None = None) -> RoundStart:
        """Round ``r``'s start for ``selected`` (default start: now on the clock)."""
        start_s = self.policy.start_s + self.sim_time_s if start_s is None else start_s
        available, dropped, leaves = participation(self.conditions, self.profiles, selected, self.seed, r,
                                                   self.policy, start_s)
        b = self.batteries
        low = b.too_low(selected) & available if b else np.zeros(len(selected), dtype=bool)
        charging = self.on_charger(r, start_s) if b else None
        level_start = b.fraction(selected) if b else None
        return RoundStart(r, start_s, selected, available, dropped, low, leaves, charging, level_start)

    def on_charger(self, r: int, start_s: float) -> np.ndarray:
        """Who is on the charger for round ``r`` (every client; ``charging: online`` asks the
        battery-powered ones' availability at the round's start, the same draw as selection's)."""
        b, online = self.batteries, None
        if b.spec.charging == "online":
            ids = np.flatnonzero(b.has)
            online = np.zeros(len(b.has), dtype=bool)
            online[ids] = participation(self.conditions, self.profiles, ids, self.seed, r, self.policy, start_s)[0]
        return b.on_charger(start_s, online)

    def time(self, start: RoundStart, sent: dict[str, np.ndarray], host_fit_s, target: int) -> RoundTiming:
        """The runnable clients' phases, arrivals and energy. ``sent``: per runnable client,
        ``bytes_down``, ``bytes_up``, ``train_flops``, ``compress_ops``; ``host_fit_s``: their
        training seconds on the host (used by ``clock.mode: measured``)."""
        policy, runnable, start_s = self.policy, start.runnable, start.start_s
        measured = policy.measured_compute_s(host_fit_s) if policy.mode == "measured" else None
        times = client_times(self.profiles, runnable, sent["bytes_down"], sent["bytes_up"], sent["train_flops"],
                             sent["compress_ops"], measured_compute_s=measured)
        timeline = phase_timeline(self.conditions, runnable, start_s, times, sent, measured)
        leaves = start.leaves[start.run_mask] - start_s
        b = self.batteries
        empties = empties_at(self.profiles, runnable, times, b.charge_j(runnable, start.charging)) if b else None
        outcome = resolve_round(times, runnable, policy, target_k=target, leaves_s=leaves, empties_s=empties)
        stopped = np.select([outcome.drop_reason == "offline", outcome.drop_reason == "battery"],
                            [leaves, empties if empties is not None else leaves], np.inf)
        if self.conditions is not None or b:
            timeline["left_s"] = np.where(np.isfinite(stopped), start_s + stopped, np.nan)
        return RoundTiming(times, timeline, outcome, stopped, ledger(self.profiles, runnable, times, stopped))

    def advance(self, start: RoundStart, timing: RoundTiming, *, arrived: int, target: int) -> float:
        """The seconds the server waited (:func:`~hardware_profiles.clock.round_seconds`); the
        clock and the batteries move on by them. Returns them."""
        dropped_in_flight = bool((start.available & ~start.low & start.dropped).any())
        round_s = round_seconds(timing.outcome, self.policy, dropped_in_flight=dropped_in_flight, arrived=arrived,
                                target=target)
        self.sim_time_s += round_s
        if self.batteries:
            self.batteries.advance(round_s, start.runnable, timing.energy["energy_j"],
                                   np.minimum(timing.times["total_s"], timing.stopped),
                                   timing.outcome.drop_reason == "battery", start.charging)
        return round_s


def phase_timeline(conditions: FleetConditions | None, runnable, start_s: float, times: dict, sent: dict,
                   measured) -> dict[str, np.ndarray]:
    """Where each runnable client's phases end in virtual time, from ``start_s``: through its
    processes when the fleet has conditions (``times`` is then updated in place), else back to
    back with today's durations."""
    if conditions is not None:
        return conditions.timeline(runnable, start_s, times, sent["bytes_down"], sent["bytes_up"],
                                   sent["train_flops"], sent["compress_ops"], measured)
    download_end = start_s + times["download_s"]
    train_end = download_end + times["compute_s"]
    compress_end = train_end + times["compress_s"]
    return {"download_end_s": download_end, "train_end_s": train_end, "compress_end_s": compress_end,
            "upload_end_s": compress_end + times["upload_s"]}
