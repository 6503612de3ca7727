"""Asynchronous server steps (FedBuff, FedAsync) as a discrete-event simulation on the virtual clock.

The server keeps ``asynchronous.concurrency`` clients in flight, each training from the model
version current at its dispatch. The time, the events (an upload's arrival, or its loss) and the
batteries between them are the :class:`~hardware_profiles.event_clock.EventClock`'s, which times
each task as the round clock times a round's client. After every event of one instant the free
slots are refilled with the selection policy's pick of the idle clients that can start, all in
ONE call to the hosts (a *wave*, whose number seeds their local RNG alike on every executor).
:meth:`AsyncLoop.step` runs events until the next server step (``rounds`` counts them), whose math
is the method's (``Server.async_step``; :mod:`algorithms.asynchronous` by default). docs/async.md
describes the model, each method's rule and the columns.
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Protocol

import numpy as np

from algorithms.asynchronous import AsyncUpdate, StepRule, apply_states, staleness_weight
from algorithms.training import flat_state
from engine.loop import guards, rows
from engine.loop.async_updates import Update, update_of, update_state
from engine.loop.callbacks import RoundRecord
from engine.loop.evaluation import global_columns
from engine.loop.selection import SALT_DISPATCH, ClientSelector
from hardware_profiles.event_clock import EventClock

MAX_IDLE_RETRIES = 100_000  # nobody online for this many retries: the fleet can never run


class Hosts(Protocol):
    """What the loop asks of the client hosts (the :class:`~engine.loop.simulation.Simulation`)."""

    def train(self, r: int, ids: np.ndarray, broadcast, evaluating: bool, start_s: float,
              deadline_s: float | None): ...

    def keep_last_times(self, r: int, ids: np.ndarray, times: dict[str, np.ndarray]) -> None: ...

    def notify_dropped(self, r: int, ids: list[int]) -> None: ...


class AsyncLoop:
    def __init__(self, cfg, server, clock: EventClock, selector: ClientSelector, hosts: Hosts):
        self.cfg, self.spec, self.server, self.clock = cfg, cfg.asynchronous, server, clock
        self.selector, self.hosts = selector, hosts
        self.version = self.seq = 0
        self.flight: dict[int, Update] = {}  # seq -> update in flight
        self.buffer: list[Update] = []  # FedBuff: arrived, not yet applied
        self.bases: dict[int, dict[str, np.ndarray]] = {}  # version -> global flat state per arch
        self.resolved: list[Update] = []  # applied or dropped since the last record
        self.server_metrics: dict[str, Any] = {}  # the last step's (Server.async_step)
        self.dispatched: list[tuple[int, float]] = []  # (client id, bytes down) since the last record
        self.faults: list[dict] = []
        self.last_step_s = clock.now
        self.started = False

    def dispatch(self) -> None:
        """Fill the free slots now with the policy's pick of the idle clients that can start (a wave)."""
        clock, free = self.clock, self.spec.concurrency - len(self.flight)
        if free <= 0:
            return
        busy = np.zeros(self.selector.num_clients, dtype=bool)
        busy[[u.client_id for u in [*self.flight.values(), *self.buffer]]] = True  # buffered: not yet free
        idle = np.flatnonzero(~busy)
        idle = idle[~clock.too_low(idle)]  # below the threshold: not dispatched (it may charge meanwhile)
        if len(idle) == 0:
            return
        begin = clock.begin(idle)  # every attempt draws new coins (a retry must not meet the same ones)
        wave = begin.round
        chosen = self.selector.choose(wave, free, idle[begin.run_mask], SALT_DISPATCH, start_s=clock.now)
        pick = np.searchsorted(idle, chosen.ids)  # (idle is sorted)
        if len(pick) == 0:
            return
        start = begin.only(pick)
        ids = start.runnable
        broadcast = self.server.broadcast(self.version)
        if self.version not in self.bases:  # the state the broadcast stands for (full: parameters, buffers)
            self.bases[self.version] = {arch: flat_state(m).cpu().numpy().astype(np.float64)
                                        for arch, m in self.server.models.items()}
        reply = self.hosts.train(wave, ids, broadcast, False, clock.now, self.cfg.clock.fixed_deadline_s)
        self.faults.extend(reply.faults)
        results = reply.results
        sent = rows.payloads(broadcast, results)
        timing = clock.time_tasks(start, sent, [res.metrics.get("wall_fit_s", 0.0) for res in results])
        self.hosts.keep_last_times(wave, ids, timing.times)
        n = len(ids)
        outcome = SimpleNamespace(made_deadline=np.zeros(n, dtype=bool), drop_reason=np.full(n, "", dtype="<U13"))
        client_rows = rows.client_rows(-1, clock.profiles, ids, np.full(n, ""), results, timing.times,
                                       sent["bytes_down"], outcome, timing.timeline, clock.now, timing.energy)
        rows.add_selection_columns(client_rows, chosen)
        seqs = list(range(self.seq, self.seq + n))
        self.seq += n
        clock.schedule(start, timing, seqs)  # the energy leaves the batteries at dispatch
        if clock.batteries is not None:
            rows.add_battery_columns(client_rows, start.level_start, clock.batteries.fraction(ids),
                                     start.charging[ids])
        nonfinite = guards.nonfinite_results(results) & (self.cfg.train.on_nonfinite != "ignore")
        for i, (seq, res) in enumerate(zip(seqs, results)):
            reason = str(timing.lost_reason[i])
            self.flight[seq] = Update(seq, wave, int(ids[i]), self.version, clock.now, float(timing.event_s[i]),
                                      bool(reason), res, client_rows[i], bool(nonfinite[i]), reason or "offline")
            self.dispatched.append((int(ids[i]), float(sent["bytes_down"][i])))

    def step(self, r: int) -> RoundRecord:
        """Handle events until the server applies its next step (version ``r + 1``)."""
        wall0 = time.perf_counter()
        if not self.started:
            self.started = True
            self.dispatch()
        applied: list[Update] | None = None
        while applied is None:
            if self.clock.idle:
                self._wait_for_clients()
                continue
            applied = self._handle(self.flight.pop(self.clock.next_event()), r)
            if self.clock.instant_over:
                self.dispatch()
        return self._record(r, applied, wall0)

    def _wait_for_clients(self) -> None:
        """Nobody in flight: retry the dispatch every ``idle_retry_s`` until someone is online."""
        for _ in range(MAX_IDLE_RETRIES):
            self.clock.wait(self.spec.idle_retry_s)
            self.dispatch()
            if not self.clock.idle:
                return
        raise RuntimeError(f"asynchronous: no client could be dispatched for {MAX_IDLE_RETRIES} x "
                           f"idle_retry_s = {MAX_IDLE_RETRIES * self.spec.idle_retry_s:g} s of virtual time")

    def _handle(self, u: Update, r: int) -> list[Update] | None:
        """Resolve one event; returns the updates of a server step if one is applied now."""
        # the server hears of the client now: what the clock measured of its task (selection history)
        self.selector.record(u.wave, np.array([u.client_id]), np.array([not u.lost]),
                             {"total_s": np.array([u.row["sim_total_s"]]),
                              "compute_s": np.array([u.row["sim_compute_s"]])}, [u.result])
        staleness = self.version - u.base
        u.row.update(base_version=u.base, staleness=staleness, dispatch_seq=u.seq, wave=u.wave,
                     resolved_s=self.clock.now, arrived=not u.lost)
        cut = self.spec.max_staleness
        reason = (u.lost_reason if u.lost else "stale" if cut is not None and staleness > cut else
                  "nonfinite" if u.nonfinite else "")
        if reason:
            u.row.update(made_deadline=False, drop_reason=reason, applied_version=-1)
            self.resolved.append(u)
            if reason != "nonfinite":  # as a synchronous round: a non-finite upload is not put back
                self.hosts.notify_dropped(u.wave, [u.client_id])
            return None
        self.buffer.append(u)
        if self.spec.mode == "fedasync" or len(self.buffer) >= self.spec.buffer_size:
            applied, self.buffer = self.buffer, []
            self._apply(applied, r)
            return applied
        return None

    def _apply(self, updates: list[Update], r: int) -> None:
        """Server step ``r`` over ``updates`` (FedBuff: the buffer; FedAsync: one update): the
        method's ``async_step`` (algorithms/asynchronous.py by default)."""
        spec = self.spec
        tau = np.array([self.version - u.base for u in updates], dtype=np.float64)
        weight = staleness_weight(spec.staleness.kind, tau, spec.staleness.a, spec.staleness.b)
        batch = [AsyncUpdate(u.result, self.bases[u.base].get(u.result.arch), u.base, int(t), float(w), u.wave)
                 for u, t, w in zip(updates, tau.tolist(), weight.tolist())]
        rule = StepRule(spec.mode, spec.server_lr, spec.mixing)
        metrics = self.server.async_step(r, batch, rule)
        if metrics is None:  # no step of its own: FedBuff/FedAsync over the full states
            apply_states(self.server.models, batch, rule)
        self.server_metrics = metrics or {}
        self.version += 1
        for u, w in zip(updates, weight.tolist()):
            u.row.update(made_deadline=True, drop_reason="", applied_version=self.version, staleness_weight=w)
        self.resolved.extend(updates)
        keep = {u.base for u in self.flight.values()} | {u.base for u in self.buffer} | {self.version}
        self.bases = {v: s for v, s in self.bases.items() if v in keep}  # versions nobody trains from go

    def state(self) -> dict[str, Any]:
        """Everything the next step depends on (between steps: nothing is resolved but unrecorded),
        for engine/checkpoint/snapshot.py: the version, the clock (time, events, wave), the updates
        in flight and in the buffer (their uploads and rows), the base versions, the counters."""
        return {"version": self.version, **self.clock.state(), "bases": self.bases, "seq": self.seq,
                "flight": [update_state(u) for u in self.flight.values()],
                "buffer": [update_state(u) for u in self.buffer],
                "last_step_s": self.last_step_s, "started": self.started}

    def restore(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`."""
        self.version, self.seq, self.bases = state["version"], state["seq"], state["bases"]
        self.flight = {u.seq: u for u in map(update_of, state["flight"])}
        self.buffer = [update_of(u) for u in state["buffer"]]
        self.clock.restore(state, [(u.seq, u.client_id, u.dispatch_s, u.event_s) for u in self.flight.values()])
        self.last_step_s, self.started = state["last_step_s"], state["started"]
        self.resolved, self.dispatched, self.faults = [], [], []

    def _record(self, r: int, applied: list[Update], wall0: float) -> RoundRecord:
        cfg, clock = self.cfg, self.clock
        resolved, self.resolved = self.resolved, []
        dispatched, self.dispatched = self.dispatched, []
        nonfinite = np.array([u.nonfinite for u in resolved], dtype=bool)
        row = rows.step_row(r, [u.row for u in resolved], [u.result for u in applied], dispatched, nonfinite,
                            start_s=self.last_step_s, now=clock.now, clock_start_s=clock.start_s,
                            global_columns=global_columns(cfg, list(self.server.global_models()), r),
                            server_metrics=self.server_metrics, deadline_s=cfg.clock.fixed_deadline_s,
                            metrics=tuple(cfg.evaluation.metrics), version=self.version,
                            in_flight=len(self.flight), buffered=len(self.buffer), batteries=clock.batteries)
        self.last_step_s = clock.now
        diverged = guards.divergence(r, [u.result for u in resolved], nonfinite, self.server.global_models(),
                                     cfg.train.on_nonfinite)
        for u in resolved:
            u.row["round"] = r
        row["wall_s"] = time.perf_counter() - wall0
        tables = self.server.drain_tables()
        if self.faults:
            tables["faults"], self.faults = self.faults, []
        return RoundRecord(r, row, [u.row for u in resolved], tables, diverged=diverged)
