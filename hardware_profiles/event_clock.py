"""The virtual clock of an asynchronous run: :class:`EventClock`, :class:`RoundClock`'s
event-driven sibling.

A synchronous round asks its :class:`~hardware_profiles.round_clock.RoundClock` who can start,
when each phase ends, and how far the clock moves when the server has waited. An asynchronous run
has no rounds: each dispatched task ends at its own event (its upload arrives, or it is lost), and
the clock moves from one event to the next. :class:`EventClock` owns that time (``now``), the
events (a heap ordered by time, client id, dispatch sequence), the tasks in flight and the fleet's
batteries between events; it asks the round clock the same questions for each wave of dispatched
tasks (:meth:`begin`, :meth:`time_tasks`), so a task is timed, lost and charged exactly as a
round's client. The round clock's ``sim_time_s`` follows ``now``, so callbacks and checkpoints read
one time for both loops. Each dispatch attempt (a *wave*) draws new coins: :meth:`begin` numbers
them.
"""
from __future__ import annotations

import heapq

import numpy as np

from .round_clock import RoundClock, RoundStart, TaskTiming


class EventClock:
    def __init__(self, rounds: RoundClock):
        self.rounds = rounds
        self.start_s = rounds.policy.start_s
        self.now = self.start_s  # absolute virtual time
        self.events: list[tuple[float, int, int]] = []  # (time, client id, seq) of the tasks in flight
        self.tasks: dict[int, tuple[int, float, float]] = {}  # seq -> (client id, dispatch_s, event_s)
        self.wave = 0  # the next dispatch attempt's number (its coins)
        self.battery_s = self.now  # the batteries are advanced up to this time

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now = value
        self.rounds.sim_time_s = value - self.start_s

    @property
    def batteries(self):
        return self.rounds.batteries

    @property
    def profiles(self):
        return self.rounds.profiles

    # ------------------------------------------------------------------ a wave of tasks
    def too_low(self, ids: np.ndarray) -> np.ndarray:
        return self.rounds.too_low(ids)

    def begin(self, ids: np.ndarray) -> RoundStart:
        """Who of ``ids`` can start a task now: the round clock's answer with a new wave's coins."""
        wave, self.wave = self.wave, self.wave + 1
        return self.rounds.begin(wave, ids, start_s=self.now)

    def time_tasks(self, start: RoundStart, sent: dict[str, np.ndarray], host_fit_s) -> TaskTiming:
        return self.rounds.time_tasks(start, sent, host_fit_s)

    def schedule(self, start: RoundStart, timing: TaskTiming, seqs: list[int]) -> None:
        """The wave's tasks are in flight: their energy leaves the batteries now, and each one's
        event (arrival or loss) is due at ``timing.event_s``."""
        self.rounds.spend(start, timing)
        for seq, client, event_s in zip(seqs, start.runnable.tolist(), timing.event_s.tolist()):
            self.tasks[seq] = (client, self.now, event_s)
            heapq.heappush(self.events, (event_s, client, seq))

    # ------------------------------------------------------------------ moving on
    @property
    def idle(self) -> bool:
        """No task in flight."""
        return not self.events

    @property
    def instant_over(self) -> bool:
        """Every event due now has been taken (the server may refill its slots)."""
        return not self.events or self.events[0][0] > self.now

    def next_event(self) -> int:
        """Move to the next event and return its task's dispatch sequence number."""
        t, _, seq = heapq.heappop(self.events)
        self._batteries_to(t)
        self.now = t
        del self.tasks[seq]
        return seq

    def wait(self, seconds: float) -> None:
        """Nothing in flight: let ``seconds`` pass."""
        self._batteries_to(self.now + seconds)
        self.now += seconds

    def _batteries_to(self, t: float) -> None:
        """Batteries from ``battery_s`` to ``t``: charging (on the charger as at ``battery_s``, with
        the next wave's coins for ``charging: online``) and idle drain outside the tasks in flight
        (their energy left at dispatch)."""
        if self.batteries is None or t <= self.battery_s:
            return
        flying = list(self.tasks.values())
        ids = np.array([client for client, _, _ in flying], dtype=np.int64)
        busy = np.array([max(0.0, min(t, end) - max(self.battery_s, begun)) for _, begun, end in flying])
        self.rounds.elapse(t - self.battery_s, self.wave, self.battery_s, ids, busy)
        self.battery_s = t

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        return {"now": self.now, "events": list(self.events), "wave": self.wave, "battery_s": self.battery_s}

    def restore(self, state: dict, tasks: list[tuple[int, int, float, float]]) -> None:
        """Inverse of :meth:`state`; ``tasks``: (seq, client id, dispatch_s, event_s) of the tasks
        in flight, in dispatch order."""
        self.now, self.events, self.wave = state["now"], list(state["events"]), state["wave"]
        self.battery_s = state.get("battery_s", self.now)  # absent: a checkpoint from before batteries
        self.tasks = {seq: (client, begun, end) for seq, client, begun, end in tasks}
