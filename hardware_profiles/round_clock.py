"""A round on the virtual clock, as a loop drives it: :class:`RoundClock` owns the fleet's time
(``sim_time_s``), its conditions and its batteries, and answers the loops' questions.

1. :meth:`RoundClock.begin`: who of the selected clients can work when the round starts
   (availability, dropout, battery too low, who is on the charger);
2. :meth:`RoundClock.time`: when each runnable client's phases end (its times and timeline,
   through the conditions), who arrives (deadline, offline, battery empty) and what it spent;
3. :meth:`RoundClock.advance`: how long the server waited, and the fleet after it (the clock
   moves on, the batteries drain or charge).

The synchronous loop (:meth:`engine.loop.simulation.Simulation.run_round`) asks these three. The
asynchronous loop asks through :class:`~hardware_profiles.event_clock.EventClock`, which owns its
time and events and asks :meth:`begin` for each wave of dispatched clients (:meth:`RoundStart.only`
keeps those it picks), :meth:`time_tasks` for their tasks, each resolved on its own (no round to
wait for), :meth:`spend` for their energy and :meth:`elapse` for the fleet between events.
The rules themselves stay in :mod:`hardware_profiles.clock`, :mod:`~hardware_profiles.conditions`,
:mod:`~hardware_profiles.energy` and :mod:`~hardware_profiles.deadlines` (each round's deadline,
from ``clock.deadline``'s policy); nothing here draws a random number of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .clock import RoundOutcome, RoundPolicy, client_times, resolve_round, round_seconds
from .conditions import FleetConditions, online_at, participation
from .deadlines import DeadlineTracker
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

    def only(self, picked: np.ndarray) -> "RoundStart":
        """The start of the selected clients at positions ``picked`` (the asynchronous loop's
        dispatched ones)."""
        level = self.level_start[picked] if self.level_start is not None else None
        return RoundStart(self.round, self.start_s, self.selected[picked], self.available[picked],
                          self.dropped[picked], self.low[picked], self.leaves[picked], self.charging, level)


@dataclass
class RoundTiming:
    """The runnable clients' round on the clock (arrays aligned with ``start.runnable``)."""

    times: dict[str, np.ndarray]  # phase seconds (clock.client_times; conditions applied)
    timeline: dict[str, np.ndarray]  # virtual time each phase ends (and left_s with conditions/batteries)
    outcome: RoundOutcome
    stopped: np.ndarray  # seconds after the start at which it stopped (inf: it did not)
    energy: dict[str, np.ndarray]  # the ledger up to ``stopped``
    deadline_s: float | None = None  # the round's deadline, seconds after its start (None: none)


@dataclass
class TaskTiming:
    """Asynchronous tasks on the clock (arrays aligned with ``start.runnable``)."""

    times: dict[str, np.ndarray]
    timeline: dict[str, np.ndarray]
    lost_reason: np.ndarray  # "" (its upload arrives), "offline", "battery" or "deadline"
    event_s: np.ndarray  # virtual time the server hears of it: the arrival, or the loss
    stopped: np.ndarray  # seconds after the dispatch at which it stopped (inf: it did not)
    energy: dict[str, np.ndarray]  # the ledger up to ``stopped``


class RoundClock:
    def __init__(self, profiles, policy: RoundPolicy, seed: int, conditions: FleetConditions | None = None,
                 batteries: FleetBatteries | None = None):
        self.profiles, self.policy, self.seed = profiles, policy, seed
        self.conditions, self.batteries = conditions, batteries
        self.sim_time_s = 0.0  # virtual seconds since clock.start (checkpointed by the loop's owner)
        self.deadlines = DeadlineTracker(policy.deadline, policy.deadline_s)  # (checkpointed: state())

    def state(self) -> dict:
        """What the clock learned that its next round depends on (the adaptive deadline's arrivals);
        ``sim_time_s`` and the batteries are checkpointed by the loop's owner."""
        return {"deadlines": self.deadlines.state()}

    def restore(self, state: dict | None) -> None:
        self.deadlines.restore((state or {}).get("deadlines"))

    def too_low(self, ids: np.ndarray) -> np.ndarray:
        """Where a client's battery is below the participation threshold (none without batteries)."""
        return self.batteries.too_low(ids) if self.batteries else np.zeros(len(ids), dtype=bool)

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
            online[ids] = online_at(self.conditions, self.profiles, ids, self.seed, r, self.policy, start_s)
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
        gone = leaves if empties is None else np.minimum(leaves, empties)
        deadline_s = self.deadlines.deadline(start_s, times["total_s"], gone)
        outcome = resolve_round(times, runnable, policy, target_k=target, leaves_s=leaves, empties_s=empties,
                                deadline_s=deadline_s)
        stopped = np.select([outcome.drop_reason == "offline", outcome.drop_reason == "battery"],
                            [leaves, empties if empties is not None else leaves], np.inf)
        if self.conditions is not None or b:
            timeline["left_s"] = np.where(np.isfinite(stopped), start_s + stopped, np.nan)
        return RoundTiming(times, timeline, outcome, stopped, ledger(self.profiles, runnable, times, stopped),
                           deadline_s)

    def advance(self, start: RoundStart, timing: RoundTiming, *, arrived: int, target: int) -> float:
        """The seconds the server waited (:func:`~hardware_profiles.clock.round_seconds`); the
        clock and the batteries move on by them. Returns them."""
        dropped_in_flight = bool((start.available & ~start.low & start.dropped).any())
        round_s = round_seconds(timing.outcome, self.policy, dropped_in_flight=dropped_in_flight, arrived=arrived,
                                target=target, deadline_s=timing.deadline_s)
        self.deadlines.observe(timing.times["total_s"][timing.outcome.made_deadline])
        self.sim_time_s += round_s
        if self.batteries:
            self.batteries.advance(round_s, start.runnable, timing.energy["energy_j"],
                                   np.minimum(timing.times["total_s"], timing.stopped),
                                   timing.outcome.drop_reason == "battery", start.charging)
        return round_s

    # ------------------------------------------------------------------ asynchronous tasks
    def time_tasks(self, start: RoundStart, sent: dict[str, np.ndarray], host_fit_s) -> TaskTiming:
        """Tasks dispatched at ``start.start_s`` (``start``'s runnable clients), each resolved on
        its own: its upload arrives at its timeline's ``upload_end_s`` unless it is lost first,
        offline (its availability), battery (it runs empty; on the charger: never) or deadline
        (the server abandons a task the fixed deadline after its dispatch); a tie of offline
        and battery is offline, as a round's. ``sent``, ``host_fit_s``: as :meth:`time`'s."""
        policy, ids, now = self.policy, start.runnable, start.start_s
        measured = policy.measured_compute_s(host_fit_s) if policy.mode == "measured" else None
        times = client_times(self.profiles, ids, sent["bytes_down"], sent["bytes_up"], sent["train_flops"],
                             sent["compress_ops"], measured_compute_s=measured)
        timeline = phase_timeline(self.conditions, ids, now, times, sent, measured)
        arrive, leaves = timeline["upload_end_s"], start.leaves[start.run_mask]
        deadline_s = policy.fixed_deadline_s  # (a per-round policy is refused for asynchronous runs)
        cut = now + (deadline_s if deadline_s is not None else np.inf)
        b = self.batteries
        empties = now + empties_at(self.profiles, ids, times, b.charge_j(ids, start.charging)) if b else \
            np.full(len(ids), np.inf)
        offline = (leaves < np.minimum(arrive, cut)) & (leaves <= empties)
        flat = ~offline & (empties < np.minimum(arrive, cut))
        late = ~offline & ~flat & (arrive > cut)
        stopped = np.select([offline, flat, late], [leaves - now, empties - now, cut - now], np.inf)
        if self.conditions is not None or b:
            timeline["left_s"] = np.select([offline, flat], [leaves, empties], np.nan)
        reason = np.select([offline, flat, late], ["offline", "battery", "deadline"], "")
        event_s = np.select([offline, flat, late], [leaves, empties, cut], arrive)
        return TaskTiming(times, timeline, reason, event_s, stopped, ledger(self.profiles, ids, times, stopped))

    def spend(self, start: RoundStart, timing: TaskTiming) -> None:
        """Asynchronous tasks' energy leaves the batteries at their dispatch (one that runs empty: at 0)."""
        if self.batteries:
            ids = start.runnable
            self.batteries.advance(0.0, ids, timing.energy["energy_j"], np.zeros(len(ids)),
                                   timing.lost_reason == "battery", np.zeros(len(self.batteries.level), bool))

    def elapse(self, seconds: float, r: int, at_s: float, busy: np.ndarray, busy_s: np.ndarray) -> None:
        """The batteries over ``seconds`` from virtual time ``at_s`` on, between asynchronous
        events: charging (on the charger as at ``at_s``, with round (wave) ``r``'s coins for
        ``charging: online``) and idle drain outside the tasks in flight (``busy``, each busy for
        ``busy_s`` of them; their energy left at dispatch: :meth:`spend`)."""
        if self.batteries:
            self.batteries.advance(seconds, busy, np.zeros(len(busy)), busy_s, np.zeros(len(busy), dtype=bool),
                                   self.on_charger(r, at_s))


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
