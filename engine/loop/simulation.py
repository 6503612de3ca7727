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
from engine.clients.host import LAST_TIMES, HostSetup
from engine.config.schema import ExperimentConfig
from engine.data.build import build_data
from engine.data.partition import FederatedData
from engine.execution.base import Executor
from engine.execution.inprocess import InProcessExecutor
from engine.loop import guards, rows
from engine.loop.asynchronous import AsyncLoop
from engine.loop.batching import UnbatchedNotice
from engine.loop.callbacks import CallbackLike, CallbackList, RoundRecord, RunContext, Stop
from engine.loop.evaluation import GlobalEvaluation, global_columns, is_evaluation_round
from engine.loop.selection import select_clients
from engine.models.arch import assign_architectures, build_arch_model
from engine.trace import mark
from hardware_profiles import clock
from hardware_profiles.conditions import FleetConditions, participation
from hardware_profiles.energy import FleetBatteries, empties_at, ledger
from hardware_profiles.sampler import assign_profiles

log = logging.getLogger("hetsim")


class Simulation:
    def __init__(
        self,
        cfg: ExperimentConfig,
        executor: Executor | None = None,
        data: FederatedData | None = None,
    ):
        self.cfg = cfg
        self.executor = executor or InProcessExecutor()
        self.data = data if data is not None else build_data(cfg)
        mark("sim: data built")
        n = self.data.num_clients
        self.profiles = assign_profiles(cfg.clients.profiles, n, seed=cfg.seed)
        changing = cfg.clients.profiles.conditions
        # processes over virtual time; None: every client's conditions are constant (as before)
        self.conditions = (FleetConditions(changing, self.profiles, cfg.seed, origin_s=cfg.clock.start_s)
                           if changing and changing.sets else None)
        battery = cfg.clients.profiles.battery
        zones = self.conditions.columns().get("tz_offset_h") if self.conditions is not None else None
        self.batteries = FleetBatteries(battery, self.profiles, cfg.seed, zones) if battery else None
        self.arch_names, self.client_arch = assign_architectures(cfg, self.profiles)
        self.models = {
            arch: build_arch_model(cfg, arch, self.data.input_shape, self.data.num_classes)
            for arch in self.arch_names
        }
        spec = ALGORITHMS[cfg.algorithm.name]
        public_x, public_y = self.data.public_arrays() if self.data.num_public else (None, None)
        context = ServerContext(
            public_x=torch.from_numpy(public_x) if public_x is not None else None,
            public_y=torch.from_numpy(public_y) if public_y is not None else None,
            num_clients=n,
            client_arch=np.asarray(self.arch_names, dtype=object)[self.client_arch],
            eval_batch_size=cfg.evaluation.batch_size,
        )
        self.server = spec.server(cfg.algorithm, self.models, cfg.seed, context=context)
        self.reads_profile = spec.client.needs_profile  # (e.g. ASCEND's time term)
        # per client, the clock's phase times of its last round, for methods that read them
        # (ctx.last_times, e.g. ASCEND's time_model: measured); checkpointed; None: not kept
        self.last_times: dict[int, dict[str, float]] | None = (
            {} if spec.client.reads_phase_times(cfg.algorithm) else None)
        self.unbatched = UnbatchedNotice(cfg.executor.batch_clients, self.arch_names, self.client_arch, self.models)
        # The server aggregates on the CPU, where the uploads arrive (numpy) and a weighted sum
        # of a few vectors costs less than moving them; only global evaluation uses a GPU, when
        # this process holds one (in-process executor, or a driver actor with driver_gpus).
        self.eval_device = resolve_device("cpu" if cfg.executor.device == "cpu" else "auto")
        prepare_device(self.eval_device, cfg.executor.cuda_deterministic)
        self.evaluation = GlobalEvaluation(cfg, self.data, self.server, self.eval_device)
        self.sim_time_s = 0.0
        self.next_round = 0  # the first round run() will run (a resumed run starts later)
        self.stop: Stop | None = None  # why the last run() ended early, if it did
        self.in_round = False  # True while a round runs (its state is then incomplete)
        self._warned_sleep = False
        self._started = False
        # asynchronous: server steps from a discrete-event loop instead of rounds (docs/async.md)
        self.asynchronous = AsyncLoop(self) if cfg.asynchronous is not None else None

    # ------------------------------------------------------------------ set-up
    def host_setup(self) -> HostSetup:
        return HostSetup(
            cfg=self.cfg,
            data=self.data,
            profiles=self.profiles,
            arch_names=self.arch_names,
            client_arch=self.client_arch,
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
                record = self.run_round(self.next_round)
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
        cfg, policy = self.cfg, self.cfg.clock
        wall0 = time.perf_counter()
        start_s = policy.start_s + self.sim_time_s  # virtual time: the round starts S_r
        selected, target = select_clients(cfg, self.data.num_clients, r)
        available, dropped, leaves = participation(self.conditions, self.profiles, selected, cfg.seed, r,
                                                   policy, start_s)
        batteries = self.batteries
        low = batteries.too_low(selected) & available if batteries else np.zeros(len(selected), dtype=bool)
        charging = self._on_charger(r, start_s) if batteries else None
        level_start = batteries.fraction(selected) if batteries else None
        run_mask = available & ~low & ~dropped
        runnable = selected[run_mask]
        evaluating = is_evaluation_round(cfg, r)
        broadcast = self.server.broadcast(r)
        now = self.conditions.now(runnable, start_s) if self.conditions is not None and self.reads_profile else None
        now = self.with_last_times(runnable, now)
        self.unbatched.check(self.executor, runnable, f"round {r}")
        reply = self.executor.run_round(r, runnable.tolist(), broadcast, evaluating, now)
        results = reply.results

        sent = rows.payloads(broadcast, results)
        measured = None
        if policy.mode == "measured":
            measured = policy.measured_compute_s([res.metrics["wall_fit_s"] for res in results])
        times = clock.client_times(self.profiles, runnable, sent["bytes_down"], sent["bytes_up"],
                                   sent["train_flops"], sent["compress_ops"], measured_compute_s=measured)
        timeline = rows.timeline(self.conditions, runnable, start_s, times, sent, measured)
        self.keep_last_times(r, runnable, times)
        leaves = leaves[run_mask] - start_s
        empties = (empties_at(self.profiles, runnable, times, batteries.charge_j(runnable, charging))
                   if batteries else None)
        outcome = clock.resolve_round(times, runnable, policy, target_k=target, leaves_s=leaves, empties_s=empties)
        stopped = np.select([outcome.drop_reason == "offline", outcome.drop_reason == "battery"],
                            [leaves, empties if empties is not None else leaves], np.inf)
        if self.conditions is not None or batteries:
            timeline["left_s"] = np.where(np.isfinite(stopped), start_s + stopped, np.nan)
        energy = ledger(self.profiles, runnable, times, stopped)
        nonfinite = guards.reject_nonfinite(results, outcome, cfg.train.on_nonfinite)
        arrived = [res for res, ok in zip(results, outcome.made_deadline) if ok]
        # a non-finite upload is not put back into error-feedback residuals
        lost = [res.client_id for res, ok, bad in zip(results, outcome.made_deadline, nonfinite)
                if not ok and not bad]
        if lost:
            self.executor.notify_dropped(r, lost)
        server_metrics = self.server.aggregate(r, arrived) or {}
        diverged = guards.divergence(r, results, nonfinite, self.server.global_models(), cfg.train.on_nonfinite)
        round_s = clock.round_seconds(outcome, policy, dropped_in_flight=bool((available & ~low & dropped).any()),
                                      arrived=len(arrived), target=target)
        self.sim_time_s += round_s
        if batteries:
            batteries.advance(round_s, runnable, energy["energy_j"], np.minimum(times["total_s"], stopped),
                              outcome.drop_reason == "battery", charging)

        not_run = np.where(~available, "unavailable", np.where(low, "battery", "dropout"))
        row = rows.round_row(
            r, selected=selected, runnable=runnable, arrived=arrived, available=available,
            dropped=dropped & ~low, round_s=round_s, sim_time_s=self.sim_time_s, bytes_down=sent["bytes_down"],
            nonfinite=nonfinite, personalized=results if evaluating else [],
            global_columns=global_columns(cfg, list(self.server.global_models()), r),
            server_metrics=server_metrics, start_s=start_s)
        row.update(rows.energy_summary(energy, outcome, low, batteries))
        client_rows = rows.client_rows(r, self.profiles, selected, not_run, results, times,
                                       sent["bytes_down"], outcome, timeline, start_s, energy)
        if batteries:
            rows.add_battery_columns(client_rows, level_start, batteries.fraction(selected),
                                     charging[selected])
        self._realtime_sleep(r, round_s)
        row["wall_s"] = time.perf_counter() - wall0
        tables = self.server.drain_tables()
        if reply.faults:
            tables["faults"] = reply.faults
        return RoundRecord(r, row, client_rows, tables, diverged=diverged)

    def _on_charger(self, r: int, start_s: float) -> np.ndarray:
        """Who is on the charger for round ``r`` (every client; ``charging: online`` asks the
        battery-powered ones' availability at the round's start, the same draw as selection's)."""
        online = None
        if self.batteries.spec.charging == "online":
            ids = np.flatnonzero(self.batteries.has)
            online = np.zeros(len(self.batteries.has), dtype=bool)
            online[ids] = participation(self.conditions, self.profiles, ids, self.cfg.seed, r, self.cfg.clock,
                                        start_s)[0]
        return self.batteries.on_charger(start_s, online)

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
