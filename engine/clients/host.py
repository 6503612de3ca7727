"""Client runtime: hosts many virtual clients and runs their rounds.

A :class:`ClientHost` is a plain Python object. The in-process executor holds one; the Ray
executor wraps one in each client actor. Virtual clients are cheap: an id, an index range of
the shared dataset, a hardware profile and a small persistent ``state`` dict. Models are not
kept per client: the host owns one *workspace* model per architecture and resets it before each
client, so memory grows with the clients' own state only, not with their number. The workspace
is a copy of the driver's initial models where the host shares the driver's process (the
in-process executor: each architecture is built once per run, :mod:`engine.loop.parts`); a Ray
client actor is another process and builds its own from the seed (once per actor).

Every random draw a client makes comes from a generator seeded by (seed, round, client id), so
the results do not depend on which host runs a client or in which order.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from algorithms import ALGORITHMS
from algorithms.base import Broadcast, ClientContext, ClientResult, TrainSettings
from algorithms.metrics import metric_values
from algorithms.plugins import METRICS
from algorithms.training import evaluate, round_lr
from engine.clients.device import prepare_device, resolve_device
from engine.clients.shards import load_shards, save_shards
from engine.clients.states import ClientStates
from engine.config.schema import ExperimentConfig
from engine.data.partition import FederatedData
from engine.models.arch import arch_flops, build_arch_model, copy_models
from hardware_profiles.errors import PluginError, user_frames

LAST_TIMES = "last_times"  # the key of ``now[cid]`` that carries ctx.last_times (the rest: profile fields)
LOCAL_STEPS = "local_steps"  # the key of ``now[cid]`` that carries its work policy's steps (train.work)
NOT_PROFILE = (LAST_TIMES, LOCAL_STEPS)


@dataclass
class HostSetup:
    """Everything a client host needs once, at start-up (shipped through the object store)."""

    cfg: ExperimentConfig
    data: FederatedData
    profiles: Any  # hardware_profiles.ProfileTable
    arch_names: list[str]  # architecture name per code; "" when all clients share one model
    client_arch: np.ndarray  # int code per client (into arch_names)
    # the driver's initial model per architecture (never changed), for a host in its process to
    # copy; they stay in it (see __getstate__)
    initial_models: dict[str, torch.nn.Module] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a host in another process (a Ray client actor) builds its models from the seed: the
        # same weights, and nothing large travels through the object store
        return {**self.__dict__, "initial_models": None}


class ClientFailure(RuntimeError):
    """A client's local work raised; names the client and the round."""

    def __init__(self, client_id: int, round: int, cause: BaseException, frames: str = ""):
        self.client_id, self.round = client_id, round
        text = cause if isinstance(cause, PluginError) else f"{type(cause).__name__}: {cause}"
        super().__init__(f"client {client_id} failed in round {round}: {text}" + (f"\n{frames}" if frames else ""))

    def __reduce__(self):  # picklable across Ray processes
        return (_rebuild_failure, (type(self), self.client_id, self.round, str(self)))


class PluginClientFailure(ClientFailure, PluginError):
    """A client failed in a plugin's code (its method, model or metric): the user's to fix; the
    message ends with the plugin's own traceback frames."""


def client_failure(client_id: int, round: int, cause: BaseException) -> ClientFailure:
    """The failure of client ``client_id`` in ``round``: a :class:`PluginClientFailure` when the
    plugin's code raised (frames of the user's files in the traceback, or a plugin error)."""
    frames = user_frames(cause)
    if frames or isinstance(cause, PluginError):
        return PluginClientFailure(client_id, round, cause, frames)
    return ClientFailure(client_id, round, cause)


def _rebuild_failure(cls, client_id, round, message):
    err = cls.__new__(cls)
    err.client_id, err.round = client_id, round
    RuntimeError.__init__(err, message)
    return err


def client_rng(seed: int, round: int, client_id: int) -> np.random.Generator:
    return np.random.default_rng([seed, round, client_id])


def seed_torch(seed: int) -> None:
    """``torch.manual_seed`` for the devices in use, without its per-call cost.

    ``torch.manual_seed`` also queues a seed for CUDA (and XPU, MTIA) when they are not
    initialised, recording a stack trace each time (0.1-0.3 ms, ~1% of a light client). The CPU
    generator gets the same seed here; CUDA's only once this process uses CUDA.
    """
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


@dataclass
class _Started:
    """A client between receive/evaluation and local training."""

    ctx: ClientContext
    payload: Any
    eval_metrics: dict[str, Any]
    train_ids: torch.Tensor  # its training samples' indices into the host's x / y
    torch_seed: int


class ClientHost:
    def __init__(self, setup: HostSetup, threads: int | None = None, device: torch.device | None = None):
        """``device``: where the clients train; default: ``executor.device`` resolved in this
        process (:func:`engine.clients.device.resolve_device`)."""
        if threads:
            torch.set_num_threads(threads)
        self.setup = setup
        cfg = setup.cfg
        self.cfg = cfg
        self.device = device if device is not None else resolve_device(
            cfg.executor.device, where="this client host")
        prepare_device(self.device, cfg.executor.cuda_deterministic)
        self.client = ALGORITHMS[cfg.algorithm.name].client(cfg.algorithm)
        self.metrics = {m: METRICS.get(m) for m in cfg.evaluation.metrics}  # evaluation.metrics
        data = setup.data
        # on-demand data: x / y hold only this round's clients' rows (see _load_rows)
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if data.on_demand:
            self.x = self.y = None
        else:
            with warnings.catch_warnings():
                # arrays from Ray's object store are read-only; we never write to them
                warnings.simplefilter("ignore", UserWarning)
                # moved to the device once per host, not per round (on the CPU: no copy)
                self.x = torch.from_numpy(data.x).to(self.device)
                self.y = torch.from_numpy(data.y).to(self.device)
        self.workspace: dict[str, torch.nn.Module] = {}
        # per architecture: the workspace's state tensors and their initial values, so that the
        # reset before each client is one copy per tensor (load_state_dict: 5x the time)
        self.pristine: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self.flops_per_sample: dict[str, float] = {}
        # in the driver's process a copy of its initial models; in another, built from the seed
        archs = sorted(set(setup.arch_names[c] for c in np.unique(setup.client_arch)))
        initial = (copy_models({a: setup.initial_models[a] for a in archs}) if setup.initial_models is not None
                   else {a: build_arch_model(cfg, a, data.input_shape, data.num_classes) for a in archs})
        for arch, model in initial.items():
            model = model.to(self.device)
            self.workspace[arch] = model
            state = list(model.state_dict().values())
            self.pristine[arch] = (state, [t.clone() for t in state])
            self.flops_per_sample[arch] = arch_flops(cfg, arch, data.input_shape, data.num_classes)
        self.states = self._new_states()
        self._previous: list[dict] | None = None  # this host's shards of its last checkpoint (save_states)
        t = cfg.train
        self.train_settings = TrainSettings(
            local_epochs=t.local_epochs,
            local_steps=t.local_steps,
            batch_size=t.batch_size,
            lr=t.lr,
            momentum=t.momentum,
            weight_decay=t.weight_decay,
            lr_decay=t.lr_decay,
        )

    def run_round(
        self, round: int, client_ids: list[int], broadcast: Broadcast, evaluate_clients: bool,
        now: dict[int, dict[str, float]] | None = None,
    ) -> list[ClientResult]:
        """``now``: fleets with conditions over time, per client the profile fields as they are
        at the round's start (a method that reads ``ctx.profile`` sees them); under the key
        ``last_times`` the clock's phase times of the client's last round (``ctx.last_times``)."""
        self._now = now or {}
        if self.setup.data.on_demand:
            self._load_rows(client_ids, evaluate_clients and self.cfg.evaluation.personalized)
        if self.cfg.executor.batch_clients and len(client_ids) > 1:
            return self.run_round_batched(round, client_ids, broadcast, evaluate_clients)
        results = []
        for c in client_ids:
            try:
                results.append(self.run_client(round, int(c), broadcast, evaluate_clients))
            except Exception as err:
                raise client_failure(int(c), round, err) from err
        return results

    def _load_rows(self, client_ids, with_test: bool) -> None:
        """On-demand data: build this round's clients' rows (only theirs) into x / y."""
        x, y, self._rows = self.setup.data.gather(client_ids, with_test)
        self.x = torch.from_numpy(x).to(self.device)
        self.y = torch.from_numpy(y).to(self.device)

    def _indices(self, cid: int, test: bool) -> np.ndarray:
        data = self.setup.data
        if data.on_demand:
            return self._rows[cid][1 if test else 0]
        return data.test_indices(cid) if test else data.train_indices(cid)

    def run_client(
        self, round: int, cid: int, broadcast: Broadcast, evaluate_client: bool
    ) -> ClientResult:
        return self._finish_client(self._start_client(round, cid, broadcast, evaluate_client))

    def _start_client(self, round: int, cid: int, broadcast: Broadcast, evaluate_client: bool) -> _Started:
        """Everything before local training: reset the workspace, receive, evaluate."""
        setup = self.setup
        fault = self.cfg.executor.inject_failure
        if fault is not None and (fault.round, fault.client) == (round, cid):
            raise RuntimeError("failure injected by executor.inject_failure")
        arch = setup.arch_names[setup.client_arch[cid]]
        model = self.workspace[arch]
        with torch.no_grad():
            for tensor, initial in zip(*self.pristine[arch]):
                tensor.copy_(initial)
        train_idx = torch.from_numpy(self._indices(cid, test=False)).to(self.device)
        state = self.states.get(cid, {})
        steps = getattr(self, "_now", {}).get(cid, {}).get(LOCAL_STEPS)
        ctx = ClientContext(
            client_id=cid,
            round=round,
            arch=arch,
            model=model,
            state=state,
            train_x=self.x[train_idx],
            train_y=self.y[train_idx],
            rng=client_rng(self.cfg.seed, round, cid),
            train=self.train_settings if steps is None else replace(self.train_settings, local_epochs=1,
                                                                     local_steps=int(steps)),
            flops_per_sample=self.flops_per_sample[arch],
            profile=self._profile(cid) if self.client.needs_profile and setup.profiles is not None else None,
            last_times=getattr(self, "_now", {}).get(cid, {}).get(LAST_TIMES),
        )
        torch_seed = int(ctx.rng.integers(2**62))
        seed_torch(torch_seed)
        payload = broadcast[arch]
        self.client.receive(ctx, payload)
        eval_metrics = {}
        if evaluate_client and self.cfg.evaluation.personalized:
            test_idx = torch.from_numpy(self._indices(cid, test=True)).to(self.device)
            y = self.y[test_idx]
            res = evaluate(model, self.x[test_idx], y, self.cfg.evaluation.batch_size, outputs=bool(self.metrics))
            loss_sum, correct, n = res[:3]
            eval_metrics = {
                "pers_loss": loss_sum / max(n, 1),
                "pers_acc": correct / n if n else float("nan"),
                "test_samples": n,
            }
            if self.metrics and n:
                values = metric_values(self.metrics, res[3], y, f"client {cid}'s test set in round {round}")
                eval_metrics.update({f"pers_{m}": v for m, v in values.items()})
        return _Started(ctx, payload, eval_metrics, train_idx, torch_seed)

    def _profile(self, cid: int):
        profile = self.setup.profiles.profile(cid)
        now = {k: v for k, v in getattr(self, "_now", {}).get(cid, {}).items() if k not in NOT_PROFILE}
        return profile.model_copy(update=now) if now else profile

    def _finish_client(self, started: _Started, extra_wall_s: float = 0.0) -> ClientResult:
        """Local training (or, batched, its result) and the upload."""
        ctx = started.ctx
        t0 = time.perf_counter()
        result = self.client.fit(ctx, started.payload)
        result.metrics["wall_fit_s"] = time.perf_counter() - t0 + extra_wall_s
        if LOCAL_STEPS in getattr(self, "_now", {}).get(ctx.client_id, {}):  # a work policy: what it did
            result.metrics[LOCAL_STEPS] = ctx.steps_done
        result.metrics.update(started.eval_metrics)
        if ctx.pretrained is not None and not ctx.pretrained.used:
            raise RuntimeError("batch_clients: fit did not call local_sgd, so the batched training "
                               "was not used; set executor.batch_clients: false for this method")
        if ctx.state or ctx.client_id in self.states:  # re-set: its size changed, or it was spilled meanwhile
            self.states[ctx.client_id] = ctx.state
        return result

    def run_round_batched(
        self, round: int, client_ids: list[int], broadcast: Broadcast, evaluate_clients: bool
    ) -> list[ClientResult]:
        """``executor.batch_clients``: receive and evaluate every client one by one, train the
        clients of each architecture together (:func:`algorithms.batched_training.train_batched`),
        then let each client's ``fit`` take its trained model and build its upload. A client's
        batches are drawn over the rows its method trains on (``Client.train_rows``).

        An architecture with a single client this round, or a model that draws random numbers
        (dropout), trains sequentially (the driver says so once per run: engine/loop/batching.py).
        ``wall_fit_s`` is the client's own fit time plus an equal share of its group's batched
        training. A failure in a group's batched training is reported on the group's first client.
        """
        # torch.func: only batched training needs it
        from algorithms.batched_training import BatchJob, draw_batches, has_randomness, train_batched

        started: dict[int, _Started] = {}
        snapshots: dict[int, tuple[dict, dict, bool]] = {}
        by_arch: dict[str, list[int]] = {}
        for c in map(int, client_ids):
            try:
                st = started[c] = self._start_client(round, c, broadcast, evaluate_clients)
            except Exception as err:
                raise client_failure(c, round, err) from err
            model = st.ctx.model  # the workspace: keep what this client received
            snapshots[c] = ({n: p.detach().clone() for n, p in model.named_parameters()},
                            {n: b.detach().clone() for n, b in model.named_buffers()}, model.training)
            by_arch.setdefault(st.ctx.arch, []).append(c)
        shares: dict[int, float] = {}
        s = self.train_settings
        for arch, members in by_arch.items():
            model = self.workspace[arch]
            if len(members) < 2 or has_randomness(model) or self.client.unbatched_reason() is not None:
                continue
            try:
                t0 = time.perf_counter()
                jobs = []
                for c in members:
                    ctx = started[c].ctx
                    rows = self.client.train_rows(ctx)  # the method's training rows (ASCEND v3: no probe)
                    ids = started[c].train_ids if rows is None else started[c].train_ids[rows]
                    t = ctx.train  # a work policy's steps for this client
                    batches = draw_batches(ctx.rng, ids, t.batch_size, t.local_epochs, t.local_steps)
                    jobs.append(BatchJob(snapshots[c][0], snapshots[c][1], batches, rows=len(ids)))
                updates = train_batched(
                    model, jobs, self.x, self.y, lr=round_lr(started[members[0]].ctx),
                    momentum=s.momentum, weight_decay=s.weight_decay, prox_mu=self.client.prox_mu())
                share = (time.perf_counter() - t0) / len(members)
            except Exception as err:
                raise client_failure(members[0], round, err) from err
            for c, update in zip(members, updates):
                update.rng_state = started[c].ctx.rng.bit_generator.state
                started[c].ctx.pretrained = update
                shares[c] = share
        results = []
        for c in map(int, client_ids):
            st = started[c]
            params, buffers, training = snapshots[c]
            try:
                with torch.no_grad():  # the workspace back to what this client received
                    for n, p in st.ctx.model.named_parameters():
                        p.copy_(params[n])
                    for n, b in st.ctx.model.named_buffers():
                        b.copy_(buffers[n])
                st.ctx.model.train(training)
                seed_torch(st.torch_seed)
                results.append(self._finish_client(st, shares.get(c, 0.0)))
            except Exception as err:
                raise client_failure(c, round, err) from err
        return results

    def notify_dropped(self, round: int, client_ids: list[int]) -> None:
        """Tell the method which of this host's clients' uploads were lost in ``round``."""
        for cid in client_ids:
            state = self.states.get(int(cid))
            if state is not None:
                self.client.on_dropped(state, round)
                self.states.dirty.add(int(cid))  # changed in place

    def save_states(self, dest) -> dict:
        """Write the hosted clients' states as checkpoint shards (``dest``: a path or a file
        object), incrementally where it can (:func:`engine.clients.shards.save_shards`)."""
        info, self._previous = save_shards(self.states, dest, self._previous)
        return info

    def load_states(self, sources, num_hosts: int = 1, host: int = 0) -> int:
        """Replace the hosted clients' states by those in the shards ``sources`` (paths or
        bytes) of the clients this host serves (``client % num_hosts == host``); clients
        without a saved state start from their initial (empty) state. Returns how many."""
        self.states.close()
        self.states = self._new_states()
        self._previous = load_shards(self.states, list(sources), num_hosts, host)
        return len(self.states)

    def _new_states(self) -> ClientStates:
        ex = self.cfg.executor
        limit = None if ex.state_memory_mb is None else int(ex.state_memory_mb * 2**20)
        return ClientStates(limit, ex.state_spill_dir)

    def state_nbytes(self) -> int:
        """Bytes of per-client state held in memory (numpy arrays and tensors only; spilled
        states are in ``self.states.disk_bytes``)."""
        return self.states.memory_bytes
