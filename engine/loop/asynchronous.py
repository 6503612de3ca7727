"""Asynchronous server steps (FedBuff, FedAsync) as a discrete-event simulation on the virtual clock.

The server keeps ``asynchronous.concurrency`` clients in flight. A dispatched client gets the
current model version; its events are the clock's: its upload arrives at ``upload_end_s`` of its
timeline (download, train, compress, upload through its profile and the fleet's conditions, as a
synchronous round's), or it is lost at the exact time its availability process takes it offline
(``left_s``). Events are handled in the order (time, client id, dispatch sequence); after every
event of one instant the server refills the free slots, so clients freed at the same instant see
the same version. Who is dispatched: a seeded draw among the idle clients that are online and pass
their dropout coin (per (seed, wave, client), as a round's participation). The clock is the
synchronous loop's :class:`~hardware_profiles.round_clock.RoundClock`: who can start
(``begin``), each task's phases and loss (``time_tasks``), its energy (``spend``) and the
batteries between events (``elapse``); the loop keeps the events and its absolute time ``now``.

All clients dispatched at one instant train on one version in ONE ``executor.run_round`` call (a
*wave*), so a Ray pool trains them together; their ``round`` (the seed of their local RNG) is the
wave's index, which every executor sees alike. :meth:`AsyncLoop.step` runs events until the next
server step and returns its :class:`RoundRecord`: ``rounds`` counts server steps. The math of a
step is the method's (``Server.async_step``: :mod:`algorithms.asynchronous`'s FedBuff/FedAsync by
default); docs/async.md describes the model, each method's rule and the columns.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

import numpy as np

from algorithms.asynchronous import AsyncUpdate, StepRule, apply_states, staleness_weight
from algorithms.base import ClientResult, Payload
from algorithms.training import flat_state
from engine.loop import guards, rows
from engine.loop.callbacks import RoundRecord
from engine.loop.evaluation import global_columns
from engine.loop.selection import SALT_DISPATCH
from hardware_profiles.energy import ENERGY_COLUMNS

MAX_IDLE_RETRIES = 100_000  # nobody online for this many retries: the fleet can never run


@dataclass(eq=False)
class Update:
    """One dispatched client, from dispatch until the server applies or drops its update."""

    seq: int  # dispatch sequence number (the tie-break after the client id)
    wave: int
    client_id: int
    base: int  # the model version it trained from
    dispatch_s: float
    event_s: float  # when the server hears of it: its arrival, or when it went offline
    lost: bool  # offline before its upload was done
    result: ClientResult
    row: dict[str, Any]  # its clients.parquet row, completed when it is resolved
    nonfinite: bool
    lost_reason: str = "offline"  # why it is lost (lost): offline, battery (ran empty) or deadline


class AsyncLoop:
    """The event loop of one :class:`~engine.loop.simulation.Simulation` (its ``asynchronous``)."""

    def __init__(self, sim):
        self.sim, self.spec = sim, sim.cfg.asynchronous
        self.version = 0
        self.now = sim.cfg.clock.start_s  # absolute virtual time
        self.events: list[tuple[float, int, int]] = []  # (time, client id, seq)
        self.flight: dict[int, Update] = {}  # seq -> update in flight
        self.buffer: list[Update] = []  # FedBuff: arrived, not yet applied
        self.bases: dict[int, dict[str, np.ndarray]] = {}  # version -> global flat state per arch
        self.wave = self.seq = 0
        self.resolved: list[Update] = []  # applied or dropped since the last record
        self.server_metrics: dict[str, Any] = {}  # the last step's (Server.async_step)
        self.dispatched: list[tuple[int, float]] = []  # (client id, bytes down) since the last record
        self.faults: list[dict] = []
        self.last_step_s = self.now
        self.battery_s = self.now  # the batteries are advanced up to this time
        self.started = False

    # ------------------------------------------------------------------ dispatch
    def dispatch(self) -> None:
        """Fill the free slots at ``now`` with a seeded draw of idle, online clients (one wave)."""
        sim, cfg = self.sim, self.sim.cfg
        free = self.spec.concurrency - len(self.flight)
        if free <= 0:
            return
        busy = np.zeros(sim.data.num_clients, dtype=bool)
        busy[[u.client_id for u in self.flight.values()]] = True
        busy[[u.client_id for u in self.buffer]] = True  # arrived but not applied: not yet free
        idle = np.flatnonzero(~busy)
        clock = sim.clock
        idle = idle[~clock.too_low(idle)]  # below the threshold: not dispatched (it may charge meanwhile)
        if len(idle) == 0:
            return
        # every attempt draws new coins (a retry must not meet the same ones); wave = its number
        wave, self.wave = self.wave, self.wave + 1
        begin = clock.begin(wave, idle, start_s=self.now)
        # the selection policy picks among the idle clients that can start now (idle is sorted)
        chosen = sim.selector.choose(wave, free, idle[begin.run_mask], SALT_DISPATCH, start_s=self.now)
        pick = np.searchsorted(idle, chosen.ids)
        if len(pick) == 0:
            return
        start = begin.only(pick)
        ids = start.runnable
        broadcast = sim.server.broadcast(self.version)
        if self.version not in self.bases:  # the state the broadcast stands for (full: parameters, buffers)
            self.bases[self.version] = {arch: flat_state(m).cpu().numpy().astype(np.float64)
                                        for arch, m in sim.server.models.items()}
        sim.unbatched.check(sim.executor, ids, f"wave {wave}")
        steps = sim.work.steps(wave, ids, self.now, {a: p.nbytes for a, p in broadcast.items()},
                               cfg.clock.fixed_deadline_s)
        reply = sim.executor.run_round(wave, ids.tolist(), broadcast, False, sim.clients_now(ids, self.now, steps))
        self.faults.extend(reply.faults)
        results = reply.results
        sent = rows.payloads(broadcast, results)
        timing = clock.time_tasks(start, sent, [res.metrics.get("wall_fit_s", 0.0) for res in results])
        sim.keep_last_times(wave, ids, timing.times)
        n = len(ids)
        outcome = SimpleNamespace(made_deadline=np.zeros(n, dtype=bool), drop_reason=np.full(n, "", dtype="<U13"))
        client_rows = rows.client_rows(-1, sim.profiles, ids, np.full(n, ""), results, timing.times,
                                       sent["bytes_down"], outcome, timing.timeline, self.now, timing.energy)
        rows.add_selection_columns(client_rows, chosen)
        clock.spend(start, timing)  # a task's energy leaves the battery at its dispatch
        if sim.batteries is not None:
            rows.add_battery_columns(client_rows, start.level_start, sim.batteries.fraction(ids), start.charging[ids])
        nonfinite = guards.nonfinite_results(results) & (cfg.train.on_nonfinite != "ignore")
        for i, res in enumerate(results):
            seq, self.seq = self.seq, self.seq + 1
            reason = str(timing.lost_reason[i])
            self.flight[seq] = Update(seq, wave, int(ids[i]), self.version, self.now, float(timing.event_s[i]),
                                      bool(reason), res, client_rows[i], bool(nonfinite[i]), reason or "offline")
            heapq.heappush(self.events, (float(timing.event_s[i]), int(ids[i]), seq))
            self.dispatched.append((int(ids[i]), float(sent["bytes_down"][i])))

    # ------------------------------------------------------------------ events
    def step(self, r: int) -> RoundRecord:
        """Handle events until the server applies its next step (version ``r + 1``)."""
        wall0 = time.perf_counter()
        if not self.started:
            self.started = True
            self.dispatch()
        applied: list[Update] | None = None
        while applied is None:
            if not self.events:
                self._wait_for_clients()
                continue
            t, _, seq = heapq.heappop(self.events)
            self._advance_batteries(t)
            self.now = t
            update = self.flight.pop(seq)
            applied = self._handle(update, r)
            if not self.events or self.events[0][0] > t:  # every event of this instant is handled
                self.dispatch()
        return self._record(r, applied, wall0)

    def _wait_for_clients(self) -> None:
        """Nobody in flight: retry the dispatch every ``idle_retry_s`` until someone is online."""
        for _ in range(MAX_IDLE_RETRIES):
            self._advance_batteries(self.now + self.spec.idle_retry_s)
            self.now += self.spec.idle_retry_s
            self.dispatch()
            if self.events:
                return
        raise RuntimeError(f"asynchronous: no client could be dispatched for {MAX_IDLE_RETRIES} x "
                           f"idle_retry_s = {MAX_IDLE_RETRIES * self.spec.idle_retry_s:g} s of virtual time")

    def _advance_batteries(self, t: float) -> None:
        """Batteries from ``battery_s`` to ``t``: charging (on the charger as at ``battery_s``, with
        the next wave's coins for ``charging: online``) and idle drain outside the tasks in flight
        (their energy was taken at dispatch)."""
        if self.sim.batteries is None or t <= self.battery_s:
            return
        flying = list(self.flight.values())
        ids = np.array([u.client_id for u in flying], dtype=np.int64)
        busy = np.array([max(0.0, min(t, u.event_s) - max(self.battery_s, u.dispatch_s)) for u in flying])
        self.sim.clock.elapse(t - self.battery_s, self.wave, self.battery_s, ids, busy)
        self.battery_s = t

    def _handle(self, u: Update, r: int) -> list[Update] | None:
        """Resolve one event; returns the updates of a server step if one is applied now."""
        # the server hears of the client now: what the clock measured of its task (selection history)
        self.sim.selector.record(u.wave, np.array([u.client_id]), np.array([not u.lost]),
                                 {"total_s": np.array([u.row["sim_total_s"]]),
                                  "compute_s": np.array([u.row["sim_compute_s"]])}, [u.result])
        staleness = self.version - u.base
        u.row.update(base_version=u.base, staleness=staleness, dispatch_seq=u.seq, wave=u.wave,
                     resolved_s=self.now, arrived=not u.lost)
        reason = (u.lost_reason if u.lost else
                  "stale" if self.spec.max_staleness is not None and staleness > self.spec.max_staleness else
                  "nonfinite" if u.nonfinite else "")
        if reason:
            self._drop(u, reason)
            return None
        self.buffer.append(u)
        if self.spec.mode == "fedasync" or len(self.buffer) >= self.spec.buffer_size:
            applied, self.buffer = self.buffer, []
            self._apply(applied, r)
            return applied
        return None

    def _drop(self, u: Update, reason: str) -> None:
        u.row.update(made_deadline=False, drop_reason=reason, applied_version=-1)
        self.resolved.append(u)
        if reason != "nonfinite":  # as a synchronous round: a non-finite upload is not put back
            self.sim.executor.notify_dropped(u.wave, [u.client_id])

    def _apply(self, updates: list[Update], r: int) -> None:
        """Server step ``r`` over ``updates`` (FedBuff: the buffer; FedAsync: one update): the
        method's ``async_step`` (algorithms/asynchronous.py by default)."""
        spec = self.spec
        tau = np.array([self.version - u.base for u in updates], dtype=np.float64)
        weight = staleness_weight(spec.staleness.kind, tau, spec.staleness.a, spec.staleness.b)
        batch = [AsyncUpdate(u.result, self.bases[u.base].get(u.result.arch), u.base, int(t), float(w), u.wave)
                 for u, t, w in zip(updates, tau.tolist(), weight.tolist())]
        rule = StepRule(spec.mode, spec.server_lr, spec.mixing)
        metrics = self.sim.server.async_step(r, batch, rule)
        if metrics is None:  # no step of its own: FedBuff/FedAsync over the full states
            apply_states(self.sim.server.models, batch, rule)
        self.server_metrics = metrics or {}
        self.version += 1
        for u, w in zip(updates, weight.tolist()):
            u.row.update(made_deadline=True, drop_reason="", applied_version=self.version, staleness_weight=w)
        self.resolved.extend(updates)
        keep = {u.base for u in self.flight.values()} | {u.base for u in self.buffer} | {self.version}
        self.bases = {v: s for v, s in self.bases.items() if v in keep}  # versions nobody trains from go

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """Everything the next step depends on (between steps: nothing is resolved but unrecorded),
        for engine/checkpoint/snapshot.py: the version, the clock, the heap, the updates in flight
        and in the buffer (their uploads and rows), the base versions, the counters."""
        return {"version": self.version, "now": self.now, "events": list(self.events),
                "flight": [_update_state(u) for u in self.flight.values()],
                "buffer": [_update_state(u) for u in self.buffer], "bases": self.bases,
                "wave": self.wave, "seq": self.seq, "last_step_s": self.last_step_s, "started": self.started,
                "battery_s": self.battery_s}

    def restore(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`."""
        self.version, self.now, self.events = state["version"], state["now"], list(state["events"])
        self.flight = {u.seq: u for u in map(_update_of, state["flight"])}
        self.buffer = [_update_of(u) for u in state["buffer"]]
        self.bases, self.wave, self.seq = state["bases"], state["wave"], state["seq"]
        self.last_step_s, self.started = state["last_step_s"], state["started"]
        self.battery_s = state.get("battery_s", self.now)  # absent: a checkpoint from before batteries
        self.resolved, self.dispatched, self.faults = [], [], []

    # ------------------------------------------------------------------ rows
    def _record(self, r: int, applied: list[Update], wall0: float) -> RoundRecord:
        sim, cfg = self.sim, self.sim.cfg
        resolved, self.resolved = self.resolved, []
        dispatched, self.dispatched = self.dispatched, []
        arrived = [u.result for u in applied]
        nonfinite = np.array([u.nonfinite for u in resolved], dtype=bool)
        n_disp = len(dispatched)
        row = rows.round_row(
            r, selected=np.zeros(n_disp), runnable=np.zeros(n_disp), arrived=arrived,
            available=np.ones(n_disp, dtype=bool), dropped=np.zeros(n_disp, dtype=bool),
            round_s=self.now - self.last_step_s, sim_time_s=self.now - cfg.clock.start_s,
            bytes_down=np.array([b for _, b in dispatched], dtype=np.float64), nonfinite=nonfinite,
            personalized=[], global_columns=global_columns(cfg, list(sim.server.global_models()), r),
            server_metrics=self.server_metrics, start_s=self.last_step_s, deadline_s=cfg.clock.fixed_deadline_s,
            metrics=tuple(cfg.evaluation.metrics))
        applied_mask = np.array([u.row["made_deadline"] for u in resolved], dtype=bool)
        for name in ENERGY_COLUMNS:
            row[name] = float(sum(u.row[name] for u in resolved))
        row["energy_wasted_j"] = float(sum(u.row["energy_j"] for u, ok in zip(resolved, applied_mask) if not ok))
        tau = np.array([u.row["staleness"] for u in applied], dtype=np.float64)
        reasons = [u.row["drop_reason"] for u in resolved]
        row.update(version=self.version, num_stale=reasons.count("stale"), num_offline=reasons.count("offline"),
                   num_deadline=reasons.count("deadline"),
                   in_flight=len(self.flight), buffered=len(self.buffer),
                   staleness_mean=float(tau.mean()), staleness_max=int(tau.max()))
        if sim.batteries is not None:  # as a round's (rows.energy_summary): drops, the fleet's levels
            levels = sim.batteries.level[sim.batteries.has] / sim.batteries.capacity[sim.batteries.has]
            row.update(num_battery=reasons.count("battery"), battery_mean=float(levels.mean()),
                       battery_min=float(levels.min()))
        self.last_step_s = self.now
        sim.sim_time_s = self.now - cfg.clock.start_s
        diverged = guards.divergence(r, [u.result for u in resolved], nonfinite, sim.server.global_models(),
                                     cfg.train.on_nonfinite)
        client_rows = []
        for u in resolved:
            u.row["round"] = r
            client_rows.append(u.row)
        row["wall_s"] = time.perf_counter() - wall0
        tables = sim.server.drain_tables()
        if self.faults:
            tables["faults"], self.faults = self.faults, []
        return RoundRecord(r, row, client_rows, tables, diverged=diverged)


def _update_state(u: Update) -> dict[str, Any]:
    """An update as plain values (the checkpoint codec takes no unregistered dataclasses)."""
    res = u.result
    out = {f.name: getattr(u, f.name) for f in fields(Update) if f.name != "result"}
    out["row"] = _plain(u.row)
    out["result"] = {f.name: getattr(res, f.name) for f in fields(ClientResult) if f.name != "upload"}
    out["result"]["metrics"] = _plain(res.metrics)
    out["upload"] = {"arrays": res.upload.arrays, "nbytes": res.upload.nbytes, "meta": res.upload.meta}
    return out


def _update_of(state: dict[str, Any]) -> Update:
    state = dict(state)
    result = ClientResult(**state.pop("result"), upload=Payload(**state.pop("upload")))
    return Update(**state, result=result)


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """numpy scalars as Python values (exact; the codec cannot store an empty numpy string)."""
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in row.items()}
