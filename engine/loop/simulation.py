"""The round loop: select, broadcast, run clients, time, aggregate.

:class:`Simulation` is executor-agnostic (in-process or Ray actors) and knows nothing of files
or terminals: global evaluation, recording, progress, Tune reporting and checkpoints are
callbacks (:mod:`engine.loop.callbacks`) that receive each finished round and may stop the
loop. The clock's rules (availability, dropout, deadline) are :mod:`hardware_profiles.clock`'s;
the rows' layout is :mod:`engine.loop.rows`'.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from algorithms import ALGORITHMS
from algorithms.base import ServerContext
from engine.clients.device import prepare_device, resolve_device
from engine.clients.host import LAST_TIMES, LOCAL_STEPS, HostSetup
from engine.config.schema import ExperimentConfig
from engine.data.partition import FederatedData
from engine.errors import PluginError, UserError
from engine.execution.base import Executor
from engine.execution.inprocess import InProcessExecutor
from engine.loop import guards, rows
from engine.loop.asynchronous import AsyncLoop
from engine.loop.batching import UnbatchedNotice
from engine.loop.callbacks import CallbackLike, CallbackList, RoundRecord, RunContext, Stop
from engine.loop.evaluation import GlobalEvaluation, global_columns, is_evaluation_round
from engine.loop.parts import Parts, build_parts
from engine.loop.selection import ClientSelector, target_arrivals
from engine.loop.work import LocalWork, with_steps
from engine.trace import mark
from hardware_profiles.errors import user_frames
from hardware_profiles.event_clock import EventClock
from hardware_profiles.round_clock import RoundClock

log = logging.getLogger("hetsim")


def plugin_failure(err: BaseException, where: str) -> PluginError | None:
    """``err`` as a :class:`PluginError` naming ``where`` and the user's own frames, if the user's
    code (a plugin's method, selection policy, metric) raised it; None for hetsim's own errors."""
    if isinstance(err, UserError):
        return None
    frames = user_frames(err)
    if not frames:
        return None
    return PluginError(f"{where}: your plugin's code raised {type(err).__name__}: {err}\n{frames}")


class Simulation:
    def __init__(
        self,
        cfg: ExperimentConfig,
        executor: Executor | None = None,
        data: FederatedData | None = None,
        parts: Parts | None = None,
    ):
        """``parts``: what the validation built for ``cfg`` (:func:`engine.loop.parts.build_parts`),
        handed on; None: built here (``data``: federated data to build them with)."""
        self.cfg = cfg
        self.executor = executor or InProcessExecutor.for_config(cfg)  # threads as `hetsim run`'s
        parts = parts if parts is not None else build_parts(cfg, data=data)
        mark("sim: data built")
        self.data, self.profiles, self.conditions = parts.data, parts.profiles, parts.conditions
        n = self.data.num_clients
        self.batteries = parts.fresh_batteries()  # its charge changes as the run goes
        self.arch_names, self.client_arch = parts.arch_names, parts.client_arch
        self.initial_models = parts.models  # never changed: an in-process client host copies them
        self.models = parts.take_models()  # the server's to change
        spec = ALGORITHMS[cfg.algorithm.name]
        public_x, public_y = self.data.public_arrays() if self.data.num_public else (None, None)
        context = ServerContext(
            public_x=torch.from_numpy(public_x) if public_x is not None else None,
            public_y=torch.from_numpy(public_y) if public_y is not None else None,
            num_clients=n,
            client_arch=np.asarray(self.arch_names, dtype=object)[self.client_arch],
            eval_batch_size=cfg.evaluation.batch_size,
            clients_per_round=target_arrivals(cfg, n),
        )
        self.server = spec.server(cfg.algorithm, self.models, cfg.seed, context=context)
        self.reads_profile = spec.client.needs_profile  # (e.g. ASCEND's time term)
        # per client, the clock's phase times of its last round, for methods that read them
        # (ctx.last_times, e.g. ASCEND's time_model: measured); checkpointed; None: not kept
        self.last_times: dict[int, dict[str, float]] | None = (
            {} if spec.client.reads_phase_times(cfg.algorithm) else None)
        unbatched = spec.client.unbatched_reason()
        self.unbatched = UnbatchedNotice(cfg.executor.batch_clients, self.arch_names, self.client_arch, self.models,
                                         own_loss=f"{cfg.algorithm.name!r} {unbatched}" if unbatched else None)
        # The server aggregates on the CPU, where the uploads arrive (numpy) and a weighted sum
        # of a few vectors costs less than moving them; only global evaluation uses a GPU, when
        # this process holds one (in-process executor, or a driver actor with driver_gpus).
        self.eval_device = resolve_device("cpu" if cfg.executor.device == "cpu" else "auto")
        prepare_device(self.eval_device, cfg.executor.cuda_deterministic)
        self.evaluation = GlobalEvaluation(cfg, self.data, self.server, self.eval_device)
        # the fleet's virtual time, conditions and batteries, one round at a time
        self.clock = RoundClock(self.profiles, cfg.clock, cfg.seed, self.conditions, self.batteries)
        # which clients run: the configured policy (clients.selection), its view of the fleet and clock
        self.selector = ClientSelector(cfg, n, self.data.client_num_train(), self.clock)
        # how many local steps each does: the configured policy (train.work)
        self.work = LocalWork.build(cfg, self.clock, self.data, self.arch_names, self.client_arch, self.models,
                                    spec.server)
        self.next_round = 0  # the first round run() will run (a resumed run starts later)
        self.stop: Stop | None = None  # why the last run() ended early, if it did
        self.in_round = False  # True while a round runs (its state is then incomplete)
        self._warned_sleep = False
        self._started = False
        # asynchronous: server steps from a discrete-event loop instead of rounds (docs/async.md)
        self.asynchronous = self._async_loop()

    def _async_loop(self) -> AsyncLoop | None:
        """The asynchronous loop (``cfg.asynchronous``) on this run's clock, selector, server and hosts."""
        if self.cfg.asynchronous is None:
            return None
        return AsyncLoop(self.cfg, self.server, EventClock(self.clock), self.selector, self)

    # ------------------------------------------------------------------ set-up
    def host_setup(self) -> HostSetup:
        return HostSetup(
            cfg=self.cfg,
            data=self.data,
            profiles=self.profiles,
            arch_names=self.arch_names,
            client_arch=self.client_arch,
            initial_models=self.initial_models,
        )

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> None:
        if not self._started:
            self.executor.start(self.host_setup())
            self._started = True

    # ------------------------------------------------------------------ the loop
    def run(
        self, callbacks: list[CallbackLike] | CallbackList | None = None, run: RunContext | None = None
    ) -> str:
        """Run rounds ``next_round .. cfg.rounds - 1``; returns the final status.

        ``finished`` when every round ran, else the status of the :class:`Stop` a callback
        returned (kept in ``self.stop``). If a round raises, ``on_run_end`` sees ``failed``
        (``interrupted`` for Ctrl+C) and the exception propagates.
        """
        cbs = callbacks if isinstance(callbacks, CallbackList) else CallbackList(callbacks)
        cbs.callbacks.insert(0, self.evaluation)  # first: every other callback sees it evaluated
        run = run or RunContext(self.cfg, None, first_round=self.next_round, simulation=self)
        self.unbatched.warnings = run.info.setdefault("warnings", [])  # run.info: the manifest, in a run
        self.start()
        status = "failed"
        try:
            cbs.run_begin(run)
            mark("loop: rounds begin")
            status = "finished"
            while self.next_round < self.cfg.rounds:
                self.in_round = True
                try:
                    record = self.run_round(self.next_round)
                except Exception as err:  # noqa: BLE001 - a plugin's own code raised: the user's to fix
                    failure = plugin_failure(err, f"round {self.next_round}")
                    if failure is None:
                        raise
                    raise failure from err
                self.next_round += 1
                self.in_round = False
                self.stop = cbs.round_end(run, record)
                if self.stop is None and record.diverged is not None:
                    self.stop = Stop(record.diverged, "diverged")
                if self.stop is not None:
                    status = self.stop.status
                    break
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except BaseException:
            status = "failed"
            raise
        finally:
            mark("loop: rounds end")
            try:  # before the hosts go: an interrupted run's checkpoint gathers their state
                cbs.run_end(run, status)
            finally:
                self.executor.close()
        return status

    def train(self, r: int, ids: np.ndarray, broadcast, evaluating: bool, start_s: float, deadline_s: float | None):
        """Round (asynchronous: wave) ``r``'s clients ``ids`` train on ``broadcast`` from virtual
        time ``start_s``, each for the steps its work policy (``train.work``) gives it under
        ``deadline_s``, on the executor's hosts; returns the executor's reply."""
        self.unbatched.check(self.executor, ids, f"{'wave' if self.asynchronous else 'round'} {r}")
        steps = self.work.steps(r, ids, start_s, {a: p.nbytes for a, p in broadcast.items()}, deadline_s)
        return self.executor.run_round(r, ids.tolist(), broadcast, evaluating, self.clients_now(ids, start_s, steps))

    def notify_dropped(self, r: int, ids: list[int]) -> None:
        """The uploads of ``ids`` in round (wave) ``r`` were not aggregated (error feedback keeps them)."""
        self.executor.notify_dropped(r, ids)

    def with_last_times(self, ids: np.ndarray, now: dict | None) -> dict | None:
        """``now`` (the executor's per-client extras) with each client's last phase times, for
        methods that read them (``ctx.last_times``); unchanged when none does."""
        if self.last_times is None:
            return now
        now = now or {}
        for c in ids.tolist():
            if c in self.last_times:
                now.setdefault(c, {})[LAST_TIMES] = self.last_times[c]
        return now

    def keep_last_times(self, r: int, ids: np.ndarray, times: dict[str, np.ndarray]) -> None:
        """Remember the phase times of round (asynchronous: wave) ``r`` as the clock reports them
        (conditions included), for the clients' next participation; a no-op when no method reads them."""
        if self.last_times is not None:
            phases = ("download_s", "compute_s", "compress_s", "upload_s")
            for i, c in enumerate(ids.tolist()):
                self.last_times[c] = {"round": r, **{k: float(times[k][i]) for k in phases}}

    def run_round(self, r: int) -> RoundRecord:
        """One round: select, run the selected clients, time them on the virtual clock, keep
        those that arrive, aggregate; the record holds its rows (global evaluation is the
        :class:`~engine.loop.evaluation.GlobalEvaluation` callback's). Asynchronous runs: the
        next server step instead."""
        if self.asynchronous is not None:
            return self.asynchronous.step(r)
        cfg, wall0 = self.cfg, time.perf_counter()
        selection, target = self.selector.select(r, exclude=self.server.excluded_clients(r))
        start = self.clock.begin(r, selection.ids)
        runnable, evaluating = start.runnable, is_evaluation_round(cfg, r)
        broadcast = self.server.broadcast(r)
        reply = self.train(r, runnable, broadcast, evaluating, start.start_s,
                           self.clock.deadlines.before_round(start.start_s))
        results = reply.results
        sent = rows.payloads(broadcast, results)
        timing = self.clock.time(start, sent, [res.metrics["wall_fit_s"] for res in results], target)
        self.keep_last_times(r, runnable, timing.times)
        nonfinite = guards.reject_nonfinite(results, timing.outcome, cfg.train.on_nonfinite)
        made = timing.outcome.made_deadline
        self.selector.record(r, runnable, made, timing.times, results)
        arrived = [res for res, ok in zip(results, made) if ok]
        # a non-finite upload is not put back into error-feedback residuals
        lost = [res.client_id for res, ok, bad in zip(results, made, nonfinite) if not ok and not bad]
        if lost:
            self.notify_dropped(r, lost)
        server_metrics = self.server.aggregate(r, arrived) or {}
        diverged = guards.divergence(r, results, nonfinite, self.server.global_models(), cfg.train.on_nonfinite)
        round_s = self.clock.advance(start, timing, arrived=len(arrived), target=target)
        row, client_rows = self._rows(start, timing, results, arrived, nonfinite, sent, round_s, server_metrics,
                                      evaluating)
        rows.add_selection_columns(client_rows, selection)
        self._realtime_sleep(r, round_s)
        row["wall_s"] = time.perf_counter() - wall0
        tables = self.server.drain_tables()
        if reply.faults:
            tables["faults"] = reply.faults
        return RoundRecord(r, row, client_rows, tables, diverged=diverged)

    @property
    def sim_time_s(self) -> float:
        """Virtual seconds since ``clock.start`` (the clock's; checkpointed)."""
        return self.clock.sim_time_s

    @sim_time_s.setter
    def sim_time_s(self, value: float) -> None:
        self.clock.sim_time_s = value

    def clients_now(self, runnable, start_s: float, steps: np.ndarray | None = None) -> dict | None:
        """What the clients may read of their conditions and last phase times when they start
        at ``start_s`` (a round, or an asynchronous wave), and the steps their work policy gives them."""
        now = self.conditions.now(runnable, start_s) if self.conditions is not None and self.reads_profile else None
        return with_steps(self.with_last_times(runnable, now), runnable, steps, LOCAL_STEPS)

    def _rows(self, start, timing, results, arrived, nonfinite, sent, round_s, server_metrics, evaluating):
        """The round's rounds.parquet row (without wall_s) and clients.parquet rows."""
        cfg, r, batteries, selected = self.cfg, start.round, self.batteries, start.selected
        row = rows.round_row(
            r, selected=selected, runnable=start.runnable, arrived=arrived, available=start.available,
            dropped=start.dropped & ~start.low, round_s=round_s, sim_time_s=self.sim_time_s,
            bytes_down=sent["bytes_down"], nonfinite=nonfinite, personalized=results if evaluating else [],
            global_columns=global_columns(cfg, list(self.server.global_models()), r),
            server_metrics=server_metrics, start_s=start.start_s, deadline_s=timing.deadline_s,
            metrics=tuple(cfg.evaluation.metrics))
        row.update(rows.energy_summary(timing.energy, timing.outcome, start.low, batteries))
        client_rows = rows.client_rows(r, self.profiles, selected, start.not_run, results, timing.times,
                                       sent["bytes_down"], timing.outcome, timing.timeline, start.start_s,
                                       timing.energy)
        if batteries:
            rows.add_battery_columns(client_rows, start.level_start, batteries.fraction(selected),
                                     start.charging[selected])
        return row, client_rows

    def _realtime_sleep(self, r: int, round_s: float) -> None:
        """``clock.mode: realtime``: sleep the round's simulated seconds x ``time_scale``."""
        policy = self.cfg.clock
        if policy.mode != "realtime":
            return
        if round_s * policy.time_scale > policy.max_sleep_s and not self._warned_sleep:
            self._warned_sleep = True
            log.warning("hetsim: warning: round %d would sleep %.3g s (sim %.3g s x clock."
                        "time_scale %g); sleeping clock.max_sleep_s = %g s per round instead",
                        r, round_s * policy.time_scale, round_s, policy.time_scale, policy.max_sleep_s)
        time.sleep(policy.realtime_sleep_s(round_s))
