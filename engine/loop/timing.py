"""``clock.mode: timing_only``: the fleet on the clock, with nothing trained.

A :class:`TimingSimulation` runs the rounds of a :class:`~engine.loop.simulation.Simulation`
on the same :class:`~hardware_profiles.round_clock.RoundClock` with the same selection policy
(:class:`~engine.loop.selection.ClientSelector`): availability, dropout, conditions over time,
deadline policies, over-selection, energy and batteries, asynchronous steps. Only what training
gives the clock is replaced: per client the bytes down and up and the compression ops come from
the method's wire format (:meth:`algorithms.base.Server.timing_payload`), and the training
FLOPs from its model's count per sample times the samples its local work covers
(:func:`algorithms.training.local_samples`) - what a full run's clients report. So for a
method whose payload does not depend on training, every clock column of ``rounds.parquet``
and ``clients.parquet`` equals the full run's, bit for bit
(``tests/engine/test_timing_only.py``); the tables have no training or accuracy columns.

A synchronous round is a few numpy passes over the selected clients and one Arrow table of
their rows (:func:`engine.loop.rows.client_columns`), so a round of 10,000 clients costs
milliseconds whatever the fleet's size. Asynchronous runs go through the very same
:class:`~engine.loop.asynchronous.AsyncLoop`, with an executor that answers each dispatched
client with its sized, empty upload and a server that keeps no model. Checkpoints and
``hetsim run --resume`` work as for a full run. Not here: the rules of the clock
(:mod:`hardware_profiles`) and the wire formats (:mod:`algorithms`); docs/timing.md.
"""
from __future__ import annotations

import time
from functools import partial
from typing import Any

import numpy as np
import torch

from algorithms import ALGORITHMS
from algorithms.base import ArchShape, Broadcast, ClientResult, Payload, TimingPayload
from algorithms.training import flat_buffers, local_samples, num_params
from engine.clients.host import LOCAL_STEPS
from engine.config.schema import ExperimentConfig
from engine.execution.base import Executor, RoundReply
from engine.loop import rows
from engine.loop.callbacks import RoundRecord, RunCallback
from engine.loop.parts import build_parts
from engine.loop.selection import ClientSelector
from engine.loop.simulation import Simulation
from engine.loop.work import LocalWork
from engine.models.arch import arch_flops
from hardware_profiles.round_clock import RoundClock

# rounds.parquet columns of a full run that come from training or evaluation: not written
LEARNING_COLUMNS = ("train_loss", "num_nonfinite")
LEARNING_PREFIXES = ("pers_", "global_", "server_")


class TimingServer:
    """What the loops ask of a method's server, for a run that trains nothing: broadcasts of the
    sized wire format, a step that only tells the wire format which architectures it updated."""

    def __init__(self, payload: TimingPayload):
        self.payload = payload
        self.models: dict[str, Any] = {}  # none: the asynchronous loop keeps no base states

    def broadcast(self, round: int) -> Broadcast:
        return {arch: Payload({}, self.payload.download_bytes(arch)) for arch in self.payload.upload}

    def async_step(self, step: int, updates: list, rule) -> dict[str, Any]:
        self.payload.stepped({u.result.arch for u in updates}, synchronous=False)
        return {}

    def global_models(self) -> dict[str, Any]:
        return {}

    def drain_tables(self) -> dict[str, Any]:
        return {}

    def checkpoint_state(self) -> dict[str, Any]:
        return {"models": {}, "fields": {"payload": self.payload.state()}}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.payload.restore(state["fields"]["payload"])


class TimingExecutor(Executor):
    """Answers each client it is asked to run with its sized, empty upload (the asynchronous
    loop's dispatches); no host, no state."""

    def __init__(self, sim: TimingSimulation):
        self.sim = sim

    def start(self, setup) -> None:
        pass

    def run_round(self, round, client_ids, broadcast, evaluate, now=None) -> RoundReply:
        ids = np.asarray(client_ids, dtype=np.int64)
        steps = None
        if now and ids.size and LOCAL_STEPS in now.get(int(ids[0]), {}):  # a work policy's steps
            steps = np.array([now[c][LOCAL_STEPS] for c in ids.tolist()], dtype=np.int64)
        sent, arch, samples = self.sim.sent(ids, steps)
        done = self.sim.work.done(ids, steps).tolist() if steps is not None else [None] * len(ids)
        return RoundReply([
            ClientResult(client_id=c, arch=a, upload=Payload({}, int(up)), num_samples=int(k), train_flops=float(f),
                         compress_ops=float(ops), metrics={} if d is None else {LOCAL_STEPS: int(d)})
            for c, a, up, k, f, ops, d in zip(ids.tolist(), arch, sent["bytes_up"], samples, sent["train_flops"],
                                              sent["compress_ops"], done)])

    def notify_dropped(self, round, client_ids) -> None:
        pass

    def save_client_states(self, directory) -> list[dict]:
        return []

    def load_client_states(self, directory, shards) -> None:
        pass

    def describe(self) -> dict:
        return {"kind": "timing_only"}


class _NoNotice:
    """The loops' batching notice: nothing trains, so nothing is batched."""

    warnings: list[str] = []

    def check(self, executor, ids, where) -> None:
        pass


class TimingSimulation(Simulation):
    """A :class:`~engine.loop.simulation.Simulation` whose clients are timed, not trained. It
    keeps the loop (:meth:`Simulation.run`, callbacks, checkpoints) and replaces the set-up
    and the synchronous round; raises :class:`~algorithms.base.TimingUnsupported` when the
    method's payload depends on training."""

    def __init__(self, cfg: ExperimentConfig, executor: Executor | None = None, data=None, parts=None):
        # not Simulation.__init__: no server, no evaluation, no client hosts
        self.cfg = cfg
        parts = parts if parts is not None else build_parts(cfg, data=data)
        self.data, self.profiles, self.conditions = parts.data, parts.profiles, parts.conditions
        self.batteries = parts.fresh_batteries()
        self.arch_names, self.client_arch = parts.arch_names, parts.client_arch
        shapes = {arch: ArchShape(num_params(m), int(flat_buffers(m).numel())) for arch, m in parts.models.items()}
        self.payload = ALGORITHMS[cfg.algorithm.name].server.timing_payload(cfg.algorithm, shapes)
        self.arch_flops = np.array([arch_flops(cfg, a, self.data.input_shape, self.data.num_classes)
                                    for a in self.arch_names], dtype=np.float64)
        t = cfg.train
        self.local_samples = partial(local_samples, batch_size=t.batch_size, epochs=t.local_epochs,
                                     steps=t.local_steps)
        self.n_train = self.data.client_num_train()
        self.server = TimingServer(self.payload)
        self.executor = executor if executor is not None else TimingExecutor(self)
        self.evaluation = RunCallback()
        self.eval_device = torch.device("cpu")
        self.reads_profile, self.last_times = False, None
        self.unbatched = _NoNotice()
        self.clock = RoundClock(self.profiles, cfg.clock, cfg.seed, self.conditions, self.batteries)
        self.selector = ClientSelector(cfg, self.data.num_clients, self.n_train, self.clock)
        self.work = LocalWork(cfg, self.clock, self.n_train, self.arch_names, self.client_arch, self.arch_flops,
                              self.payload)
        self.next_round, self.stop, self.in_round = 0, None, False
        self._warned_sleep = self._started = False
        self.asynchronous = self._async_loop()

    def start(self) -> None:
        self._started = True

    def sent(self, ids: np.ndarray, steps: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], list[str],
                                                                             np.ndarray]:
        """What ``ids`` send and spend (``rows.payloads``' arrays) when they do ``steps`` (None: the
        configured work), their architectures and their training rows (``num_samples``, the
        aggregation weight)."""
        code = self.client_arch[ids]
        names = self.arch_names
        down = np.array([self.payload.download_bytes(a) for a in names], dtype=np.float64)
        up, ops = (np.array(x, dtype=np.float64) for x in zip(*(self.payload.upload_bytes(a) for a in names)))
        rows_ = self.n_train[ids]
        samples = np.asarray(self.work.samples(ids, steps, self.local_samples), dtype=np.int64)
        sent = {"bytes_down": down[code], "bytes_up": up[code],
                "train_flops": self.payload.train_flops(self.arch_flops[code], samples),
                "compress_ops": ops[code]}
        return sent, [names[c] for c in code.tolist()] if len(names) > 1 else [names[0]] * len(ids), rows_

    def run_round(self, r: int) -> RoundRecord:
        """One round on the clock; asynchronous runs: the next server step (without the columns
        of training and evaluation)."""
        if self.asynchronous is not None:
            return _without_learning(self.asynchronous.step(r))
        wall0 = time.perf_counter()
        selection, target = self.selector.select(r)
        selected = selection.ids
        start = self.clock.begin(r, selected)
        runnable = start.runnable
        download = {a: self.payload.download_bytes(a) for a in self.arch_names}
        steps = self.work.steps(r, runnable, start.start_s, download, self.clock.deadlines.before_round(start.start_s))
        sent, arch, num_samples = self.sent(runnable, steps)
        timing = self.clock.time(start, sent, None, target)
        made = timing.outcome.made_deadline
        self.selector.record(r, runnable, made, timing.times, None)
        arrived = int(made.sum())
        self.payload.stepped({self.arch_names[c] for c in np.unique(self.client_arch[runnable[made]])}, True)
        round_s = self.clock.advance(start, timing, arrived=arrived, target=target)
        row = rows.clock_row(r, num_selected=len(selected), num_run=len(runnable), num_arrived=arrived,
                             available=start.available, dropped=start.dropped & ~start.low, round_s=round_s,
                             sim_time_s=self.sim_time_s, deadline_s=timing.deadline_s,
                             bytes_up=int(sent["bytes_up"][made].sum()), bytes_down=sent["bytes_down"])
        row["round_start_s"] = start.start_s
        row.update(rows.energy_summary(timing.energy, timing.outcome, start.low, self.batteries))
        battery = None
        if self.batteries is not None:
            battery = {"battery_level": start.level_start, "battery_level_end": self.batteries.fraction(selected),
                       "on_charger": start.charging[selected]}
        clients = rows.client_columns(r, self.profiles, selected, start.not_run, start.run_mask, arch, sent,
                                      num_samples, timing.times, timing.outcome, timing.timeline, start.start_s,
                                      timing.energy, battery, selection,
                                      None if steps is None else {LOCAL_STEPS: self.work.done(runnable, steps)})
        row["wall_s"] = time.perf_counter() - wall0
        return RoundRecord(r, row, clients)


def _without_learning(record: RoundRecord) -> RoundRecord:
    """An asynchronous step's record without the columns of training and evaluation."""
    record.row = {k: v for k, v in record.row.items()
                  if k not in LEARNING_COLUMNS and not k.startswith(LEARNING_PREFIXES)}
    return record


def make_simulation(cfg: ExperimentConfig, executor: Executor | None = None, data=None, parts=None) -> Simulation:
    """The run's simulation (``parts``: what the validation built, handed on): a
    :class:`TimingSimulation` for ``clock.mode: timing_only``."""
    if cfg.clock.mode == "timing_only":
        return TimingSimulation(cfg, executor, data, parts)
    return Simulation(cfg, executor, data, parts)
