"""The round loop: select, broadcast, run clients, time, aggregate, evaluate.

:class:`Simulation` is executor-agnostic (in-process or Ray actors) and knows nothing of files
or terminals: recording, progress, Tune reporting and checkpoints are callbacks
(:mod:`engine.callbacks`) that receive each finished round and may stop the loop.
"""
from __future__ import annotations

import copy
import logging
import time
from typing import Any

import numpy as np
import torch

from algorithms import ALGORITHMS
from algorithms.base import ClientResult, ServerContext
from algorithms.training import evaluate
from engine.loop.callbacks import CallbackLike, CallbackList, RoundRecord, RunContext, Stop  # noqa: F401 (RoundRecord re-exported)
from engine.config.schema import ExperimentConfig
from engine.execution.base import Executor, InProcessExecutor
from engine.data.partition import FederatedData
from engine.clients.host import HostSetup, build_arch_model
from engine.trace import mark
from hardware_profiles import clock
from hardware_profiles.sampler import assign_profiles

SELECT_SALT = 0x5E1EC7
log = logging.getLogger("hetsim")


def num_selected(cfg: ExperimentConfig, num_clients: int) -> int:
    return max(1, int(round(cfg.clients.participation * num_clients)))


def select_clients(cfg: ExperimentConfig, num_clients: int, round: int) -> tuple[np.ndarray, int]:
    """Seeded selection; cost depends on the number selected, not on ``num_clients``.

    Returns (selected ids sorted, target number of arrivals). With over-selection more clients
    are selected than needed and the first ``target`` to finish are kept.
    """
    target = num_selected(cfg, num_clients)
    m = cfg.clock.num_to_select(target, num_clients)
    rng = np.random.default_rng([cfg.seed, round, SELECT_SALT])
    return np.sort(rng.choice(num_clients, size=m, replace=False)), target


def build_data(cfg: ExperimentConfig) -> FederatedData:
    from engine.data.datasets import load_dataset_cached
    from engine.data.partition import build_federated_data

    ds_cfg, p = cfg.dataset, cfg.partition
    params = dict(ds_cfg.params)
    if ds_cfg.name == "synthetic":
        params.setdefault("num_clients", cfg.clients.num_clients)
    ds = load_dataset_cached(ds_cfg.name, root=ds_cfg.root, download=ds_cfg.download, seed=cfg.seed, **params)
    return build_federated_data(
        ds,
        num_clients=cfg.clients.num_clients,
        scheme=p.scheme,
        seed=cfg.seed,
        alpha=p.alpha,
        shards_per_client=p.shards_per_client,
        min_samples=p.min_samples,
        test_fraction=p.test_fraction,
        global_test_fraction=p.global_test_fraction,
        public_fraction=p.public_fraction,
    )


def assign_architectures(cfg: ExperimentConfig, profiles) -> tuple[list[str], np.ndarray]:
    """Architecture per client: ``[""]`` (one shared model) unless ``model.zoo``/``per_client``.

    Each client gets the first zoo rule whose bounds its profile satisfies, else
    ``model.name``; ``per_client`` entries win. Vectorised over clients.
    """
    m = cfg.model
    n = len(profiles)
    if not m.heterogeneous:
        return [""], np.zeros(n, dtype=np.int16)
    choice = np.full(n, m.name, dtype=object)
    unassigned = np.ones(n, dtype=bool)
    for rule in m.zoo:
        fits = unassigned.copy()
        if rule.max_gflops is not None:
            fits &= profiles.gflops <= rule.max_gflops
        if rule.max_memory_gb is not None:
            fits &= profiles.memory_gb <= rule.max_memory_gb
        choice[fits] = rule.arch
        unassigned &= ~fits
    for cid, arch in m.per_client.items():
        if not 0 <= cid < n:
            raise ValueError(f"model.per_client: client id {cid} out of range [0, {n})")
        choice[cid] = arch
    names, codes = np.unique(choice.astype(str), return_inverse=True)
    return names.tolist(), codes.astype(np.int16)


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
        self.arch_names, self.client_arch = assign_architectures(cfg, self.profiles)
        self.models = {
            arch: build_arch_model(cfg, arch, self.data.input_shape, self.data.num_classes)
            for arch in self.arch_names
        }
        spec = ALGORITHMS[cfg.algorithm.name]
        public = self.data.public_idx
        context = ServerContext(
            public_x=torch.from_numpy(self.data.x[public]) if len(public) else None,
            public_y=torch.from_numpy(self.data.y[public]) if len(public) else None,
            num_clients=n,
            client_arch=np.asarray(self.arch_names, dtype=object)[self.client_arch],
            eval_batch_size=cfg.evaluation.batch_size,
        )
        self.server = spec.server(cfg.algorithm, self.models, cfg.seed, context=context)
        # The server aggregates on the CPU, where the uploads arrive (numpy) and a weighted sum
        # of a few vectors costs less than moving them; only global evaluation uses a GPU, when
        # this process holds one (in-process executor, or a driver actor with driver_gpus).
        from engine.clients.device import prepare_device, resolve_device

        self.eval_device = resolve_device("cpu" if cfg.executor.device == "cpu" else "auto")
        prepare_device(self.eval_device, cfg.executor.cuda_deterministic)
        self._eval_models: dict[str, torch.nn.Module] = {}
        self.sim_time_s = 0.0
        self.next_round = 0  # the first round run() will run (a resumed run starts later)
        self.stop: Stop | None = None  # why the last run() ended early, if it did
        self.in_round = False  # True while a round runs (its state is then incomplete)
        self._warned_sleep = False
        self._started = False

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
        run = run or RunContext(self.cfg, None, first_round=self.next_round, simulation=self)
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

    def run_round(self, r: int) -> RoundRecord:
        cfg, policy = self.cfg, self.cfg.clock
        wall0 = time.perf_counter()
        n = self.data.num_clients
        selected, target = select_clients(cfg, n, r)
        available = clock.draw_availability(self.profiles, selected, cfg.seed, r)
        dropped = clock.draw_dropout(self.profiles, selected, cfg.seed, r)
        if not policy.apply_availability:
            available[:] = True
        if not policy.apply_dropout:
            dropped[:] = False
        runnable = selected[available & ~dropped]
        is_eval = (r + 1) % cfg.evaluation.eval_every == 0 or r == cfg.rounds - 1

        broadcast = self.server.broadcast(r)
        results = self.executor.run_round(r, runnable.tolist(), broadcast, is_eval)

        bytes_down = np.array([broadcast[res.arch].nbytes for res in results], dtype=np.float64)
        bytes_up = np.array([res.upload.nbytes for res in results], dtype=np.float64)
        train_flops = np.array([res.train_flops for res in results], dtype=np.float64)
        compress_ops = np.array([res.compress_ops for res in results], dtype=np.float64)
        measured = None
        if policy.mode == "measured":
            host_s = np.array([res.metrics["wall_fit_s"] for res in results], dtype=np.float64)
            measured = policy.measured_compute_s(host_s)
        times = clock.client_times(
            self.profiles, runnable, bytes_down, bytes_up, train_flops, compress_ops,
            measured_compute_s=measured,
        )
        outcome = clock.resolve_round(times, runnable, policy, target_k=target)
        nonfinite = nonfinite_results(results)
        guard = cfg.train.on_nonfinite
        if guard != "ignore" and nonfinite.any():
            # the server received these uploads and rejects them (they are not aggregated)
            outcome.made_deadline &= ~nonfinite
            outcome.drop_reason[nonfinite] = "nonfinite"
        arrived = [res for res, ok in zip(results, outcome.made_deadline) if ok]
        # a non-finite upload is not put back into error-feedback residuals
        lost = [res.client_id for res, ok, bad in zip(results, outcome.made_deadline, nonfinite)
                if not ok and not bad]
        if lost:
            self.executor.notify_dropped(r, lost)
        server_metrics = self.server.aggregate(r, arrived) or {}
        diverged = None
        if guard != "ignore":
            bad_ids = [res.client_id for res, bad in zip(results, nonfinite) if bad]
            if bad_ids and guard == "stop":
                diverged = (f"round {r}: client(s) {bad_ids[:10]} uploaded non-finite values "
                            "(NaN or inf); train.on_nonfinite is 'stop' ('skip_client' drops such "
                            "uploads, 'ignore' keeps them); lower train.lr?")
            elif not all(_finite_model(m) for m in self.server.global_models().values()):
                diverged = (f"round {r}: the global model has non-finite weights after "
                            "aggregation; lower train.lr?")
        round_s = outcome.round_time_s
        # The server cannot tell a client that dropped out or is late from a slow one: if one
        # of them was needed to reach the target, it waits until the deadline.
        lost_in_flight = bool((available & dropped).any()) or bool((outcome.drop_reason == "deadline").any())
        if policy.deadline_s is not None and lost_in_flight and len(arrived) < target:
            round_s = max(round_s, policy.deadline_s)
        self.sim_time_s += round_s

        row: dict[str, Any] = {
            "round": r,
            "num_selected": len(selected),
            "num_run": len(runnable),
            "num_arrived": len(arrived),
            "num_unavailable": int((~available).sum()),
            "num_dropout": int((available & dropped).sum()),
            "sim_round_s": round_s,
            "sim_time_s": self.sim_time_s,
            "bytes_up": int(sum(res.upload.nbytes for res in arrived)),
            "bytes_down": int(bytes_down.sum()),
            "train_loss": _mean([res.metrics.get("train_loss") for res in arrived]),
            "num_nonfinite": int(nonfinite.sum()),
        }
        row.update(_personalized_summary(results) if is_eval else _personalized_summary([]))
        row.update(self.evaluate_global() if is_eval else self._empty_global())
        row.update({f"server_{k}": v for k, v in server_metrics.items()})
        client_rows = self._client_rows(
            r, selected, available, dropped, results, times, bytes_down, outcome
        )
        if policy.mode == "realtime":
            if round_s * policy.time_scale > policy.max_sleep_s and not self._warned_sleep:
                self._warned_sleep = True
                log.warning("hetsim: warning: round %d would sleep %.3g s (sim %.3g s x clock."
                            "time_scale %g); sleeping clock.max_sleep_s = %g s per round instead",
                            r, round_s * policy.time_scale, round_s, policy.time_scale,
                            policy.max_sleep_s)
            time.sleep(policy.realtime_sleep_s(round_s))
        row["wall_s"] = time.perf_counter() - wall0
        tables = self.server.drain_tables()
        faults = self.executor.drain_faults()
        if faults:
            tables["faults"] = faults
        return RoundRecord(r, row, client_rows, tables, diverged=diverged)

    # ------------------------------------------------------------------ evaluation
    def _global_test(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not hasattr(self, "_gtest"):
            idx = self.data.global_test_idx
            self._gtest = (torch.from_numpy(self.data.x[idx]).to(self.eval_device),
                           torch.from_numpy(self.data.y[idx]).to(self.eval_device))
        return self._gtest

    def _eval_model(self, arch: str, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` itself on the CPU; else a copy on the evaluation device, refreshed."""
        if self.eval_device.type == "cpu":
            return model
        mirror = self._eval_models.get(arch)
        if mirror is None:
            mirror = self._eval_models[arch] = copy.deepcopy(model).to(self.eval_device)
        mirror.load_state_dict(model.state_dict())
        return mirror

    def evaluate_global(self) -> dict[str, float]:
        if not self.cfg.evaluation.global_model:
            return self._empty_global()
        x, y = self._global_test()
        out: dict[str, float] = {}
        accs, losses = [], []
        for arch, model in self.server.global_models().items():
            loss_sum, correct, n = evaluate(self._eval_model(arch, model), x, y,
                                            self.cfg.evaluation.batch_size)
            accs.append(correct / n)
            losses.append(loss_sum / n)
            if arch:
                out[f"global_acc_{arch}"] = correct / n
        out["global_acc"] = float(np.mean(accs))
        out["global_loss"] = float(np.mean(losses))
        return out

    @staticmethod
    def _empty_global() -> dict[str, float]:
        return {"global_acc": float("nan"), "global_loss": float("nan")}

    # ------------------------------------------------------------------ records
    def _client_rows(self, r, selected, available, dropped, results, times, bytes_down, outcome):
        by_id = {res.client_id: i for i, res in enumerate(results)}
        prof = self.profiles
        rows = []
        for sel_pos, cid in enumerate(selected.tolist()):
            row: dict[str, Any] = {
                "round": r,
                "client_id": cid,
                "tier": prof.tier[cid],
                "net_tier": prof.net_tier[cid],
            }
            i = by_id.get(cid)
            if i is None:
                row["made_deadline"] = False
                row["drop_reason"] = "unavailable" if not available[sel_pos] else "dropout"
                rows.append(row)
                continue
            res: ClientResult = results[i]
            row.update(
                {
                    "arch": res.arch,
                    "num_samples": res.num_samples,
                    "bytes_up": res.upload.nbytes,
                    "bytes_down": int(bytes_down[i]),
                    "train_flops": res.train_flops,
                    "compress_ops": res.compress_ops,
                    "sim_download_s": times["download_s"][i],
                    "sim_compute_s": times["compute_s"][i],
                    "sim_compress_s": times["compress_s"][i],
                    "sim_upload_s": times["upload_s"][i],
                    "sim_total_s": times["total_s"][i],
                    "made_deadline": bool(outcome.made_deadline[i]),
                    "drop_reason": outcome.drop_reason[i],
                }
            )
            row.update(res.metrics)
            rows.append(row)
        return rows


def nonfinite_results(results: list[ClientResult]) -> np.ndarray:
    """True where a client's upload (any float array) or training loss is NaN or inf."""
    bad = np.zeros(len(results), dtype=bool)
    for i, res in enumerate(results):
        loss = res.metrics.get("train_loss")
        if loss is not None and not np.isfinite(loss):
            bad[i] = True
            continue
        for a in res.upload.arrays.values():
            a = np.asarray(a)
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                bad[i] = True
                break
    return bad


def _finite_model(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in (*model.parameters(), *model.buffers())
               if t.is_floating_point())


def _mean(values) -> float:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else float("nan")


def _personalized_summary(results: list[ClientResult]) -> dict[str, float]:
    accs = np.array([r.metrics["pers_acc"] for r in results if "pers_acc" in r.metrics], dtype=float)
    ns = np.array([r.metrics["test_samples"] for r in results if "pers_acc" in r.metrics], dtype=float)
    losses = [r.metrics["pers_loss"] for r in results if "pers_loss" in r.metrics]
    if len(accs) == 0 or ns.sum() == 0:
        nan = float("nan")
        return {k: nan for k in ("pers_acc", "pers_acc_weighted", "pers_acc_worst", "pers_acc_std", "pers_loss")}
    return {
        "pers_acc": float(np.nanmean(accs)),
        "pers_acc_weighted": float(np.nansum(accs * ns) / ns.sum()),
        "pers_acc_worst": float(np.nanmin(accs)),
        "pers_acc_std": float(np.nanstd(accs)),
        "pers_loss": float(np.mean(losses)),
    }
