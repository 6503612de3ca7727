"""Clients on Ray actors.

* :class:`~engine.ray.client_actor.ClientActor` is a thin shell around
  :class:`engine.clients.host.ClientHost`; each actor
  hosts many virtual clients (sticky: client ``c`` lives on actor ``c % A``), so 10,000
  clients do not mean 10,000 processes. Per-client state stays on its actor.
* The dataset, profiles and method travel once through the object store (``ray.put``) and
  are read zero-copy by every actor on a node; each round's broadcast is one ``ray.put``.
* The pool is sized from the cluster's CPUs, and checked against them before any actor is
  created, because an actor whose request cannot be met waits forever in Ray.
* Checkpoints: each actor writes its own shard of client states (on the loop's node straight
  into the checkpoint folder; on another node it serializes the shard and the loop fetches it
  in ``CHUNK_BYTES`` pieces), so the loop never holds every client's state.
* A client actor that dies (killed, OOM, node lost: ``ray.exceptions.RayActorError``) is
  replaced by a new actor, which restores its clients' states from the newest checkpoint (their
  initial state if there is none) and reruns the lost work; each incident becomes a
  ``faults.parquet`` row. If the replacement dies too, the run stops with the resume command.
  Actors are created with ``max_restarts=0``: Ray's own restart would rerun the constructor
  but not restore the clients' states, and a retried task would run clients without them.
* Start-up overlaps: :meth:`RayExecutor.launch` creates the actors before the driver loads the
  data (each actor imports torch and the method meanwhile); :meth:`RayExecutor.start` then ships
  the dataset and waits until every host is built.
* Warm actors (``executor.keep_warm``): :meth:`RayExecutor.close` parks the actors without their
  hosts and :meth:`RayExecutor.reuse` hands them to the next run that asks for the same pool.

Over 400 lines because it is one class, the client actors' whole life: start, rounds,
checkpoint shards, replacement after a failure and reuse.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from engine.clients.device import DeviceError
from engine.config.schema import ExperimentConfig
from engine.errors import PluginError
from engine.execution.base import Executor, RoundReply
from engine.plugin_transport import plugins_key
from engine.ray.client_actor import DataNotOnNodeError, client_actor_class
from engine.ray.cluster import ExecutorError, init_ray
from engine.ray.pool import plan_pool, plan_when_free
from engine.trace import mark

if TYPE_CHECKING:
    from engine.clients.host import HostSetup

# No torch at import (checkpoint format, client host): the driver actor imports this module to
# start the client actors, and a second of torch there delays their start.

CHUNK_BYTES = 64 << 20  # checkpoint shards travel between nodes in pieces of this size


def pool_key(cfg: ExperimentConfig) -> tuple:
    """What decides a run's client-actor pool, and the per-process CUDA settings its actors make
    once (engine.clients.device.prepare_device): runs with equal keys can share warm actors."""
    ex = cfg.executor
    return (cfg.ray.address, cfg.clients.num_clients, ex.num_actors, ex.clients_per_actor, ex.cpus_per_actor,
            ex.threads_per_actor, ex.gpus_per_actor, ex.device, ex.cuda_deterministic,
            plugins_key(cfg.plugins))  # a process imports a plugin once


def _plain_error(err: BaseException):
    """The :class:`engine.clients.device.DeviceError`, :class:`DataNotOnNodeError` or plugin error
    an actor's start-up raised, if that is what failed (each is the user's to fix)."""
    as_cause = getattr(err, "as_instanceof_cause", None)  # a RayTaskError from ready()
    inner = as_cause() if as_cause is not None else err
    for kind in (DeviceError, DataNotOnNodeError, PluginError):
        if isinstance(inner, kind):
            return kind(*inner.args)  # the plain message, without Ray's traceback header
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


class RayExecutor(Executor):
    def __init__(self, cfg: ExperimentConfig, placement_group=None):
        """With ``placement_group`` (e.g. a Tune trial's), actor ``i`` goes to bundle ``i + 1``;
        bundle 0 is the caller's own."""
        self.cfg = cfg
        self.placement_group = placement_group
        self.startup_timeout_s = cfg.executor.startup_timeout_s
        self.actors: list = []
        self.num_actors = 0
        self.placements: list[dict] = []  # per actor: resolved device and Ray GPU ids
        self.pids: list[int] = []
        self.nodes: list[str] = []
        self.state_transfer = "auto"  # "files" (same node), "chunks" (other node) or "auto"
        self._faults: list[dict] = []
        self._lost: dict[int, list[tuple[int, list[int]]]] = {}  # per actor: (round, client ids) not yet told
        self._round = -1
        self._planned_clients = 0
        self._launched_at: float | None = None
        self._caller_threads: int | None = None  # this process's torch threads before start()
        # set by the driver actor (executor.keep_warm): close() parks the actors for reuse()
        self.keep_actors = False
        self.parked: list = []

    def launch(self, num_clients: int | None = None) -> None:
        """Create the client actors (without data) and return at once; idempotent.

        Call it before loading the data: the actors' processes start and import torch and the
        method in the meantime. The pool is sized for ``num_clients`` (default: the config's,
        which partitioning gives the data). :meth:`start` launches the actors if need be.
        """
        if self.actors:
            return
        ray = init_ray(self.cfg.ray.address, self.cfg.ray.num_cpus, num_gpus=self.cfg.ray.num_gpus,
                       connect_timeout_s=self.cfg.ray.connect_timeout_s)
        ex = self.cfg.executor
        n = self._planned_clients = num_clients or self.cfg.clients.num_clients
        threads = ex.threads_per_actor or max(1, int(ex.cpus_per_actor))
        if self.placement_group is None:
            node_gpus = ([node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node["Alive"]]
                         if ex.gpus_per_actor > 0 else None)
            self.num_actors = plan_when_free(lambda res: plan_pool(
                n, res.get("CPU", 0.0), ex.cpus_per_actor, ex.num_actors, ex.clients_per_actor,
                gpus_per_actor=ex.gpus_per_actor, cluster_gpus=res.get("GPU", 0.0), node_gpus=node_gpus),
                ray.available_resources, ray.cluster_resources(), self.startup_timeout_s)
            options = [{}] * self.num_actors
        else:
            bundles = len(self.placement_group.bundle_specs) - 1
            self.num_actors = max(1, min(bundles, n))
            options = [
                {"scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=i + 1)}
                for i in range(self.num_actors)
            ]
        self._actor_cls = client_actor_class()
        self._options, self._threads = options, threads
        self._pool_key = pool_key(self.cfg)
        self.actors = [self._spawn(i) for i in range(self.num_actors)]
        self._launched_at = time.monotonic()
        mark("executor: actors requested")

    def _spawn(self, i: int):
        """Actor ``i`` (new, or a replacement): it imports what a host needs, then waits for
        :meth:`ClientActor.setup`."""
        ex = self.cfg.executor
        return self._actor_cls.options(num_cpus=ex.cpus_per_actor, num_gpus=ex.gpus_per_actor,
                                       **self._options[i]).remote(self.cfg, self._threads)

    def prelaunch(self) -> None:
        """:meth:`launch` now, before the data is loaded; if that fails the error is left to
        :meth:`start`, which raises it again inside the run (where the manifest records it)."""
        try:
            self.launch()
        except Exception:  # noqa: BLE001 - raised again by start()
            self._drop_actors()

    def start(self, setup: HostSetup) -> None:
        """Ship the dataset, profiles and method to the actors (launched if need be); wait for them."""
        if self.actors and setup.data.num_clients != self._planned_clients:
            self._drop_actors()  # sized for another number of clients (data passed in by hand)
        self.launch(setup.data.num_clients)
        self._pin_loop_threads()
        # kept for the executor's lifetime: replacement actors are built from the same setup
        self._setup_ref = ray.put(setup)
        self._wait_ready([a.setup.remote(self._setup_ref) for a in self.actors])
        mark("executor: actors ready")
        self.placements = ray.get([a.placement.remote() for a in self.actors])
        self.loop_node = ray.get_runtime_context().get_node_id()
        located = ray.get([a.where.remote() for a in self.actors])
        self.pids, self.nodes = [p for p, _ in located], [n for _, n in located]

    def _wait_ready(self, refs: list) -> None:
        pending = {ref: i for i, ref in enumerate(refs)}
        # counted from the launch: the actors' start-up overlaps the driver's data loading
        deadline = (self._launched_at or time.monotonic()) + self.startup_timeout_s
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=5.0)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    ray.get(ref)
                except Exception as err:  # noqa: BLE001 - any start-up failure: said below, with the actor
                    self._drop_actors()
                    plain = _plain_error(err)
                    if plain is not None:  # e.g. device: cuda on GPUs Ray only declared
                        raise plain from None
                    raise ExecutorError(f"client actor {i} failed to start: {err}") from None
            if pending and time.monotonic() > deadline:
                missing = sorted(pending.values())
                self._drop_actors()
                raise ExecutorError(
                    f"{len(missing)} client actor(s) {missing[:10]} not started after "
                    f"{self.startup_timeout_s:.0f} s; cluster resources now: "
                    f"{ray.available_resources()}"
                )

    def host_of(self, client_ids) -> np.ndarray:
        return np.asarray(client_ids, dtype=np.int64) % self.num_actors

    def run_round(self, round, client_ids, broadcast, evaluate, now=None):
        self._round = round
        ids = np.asarray(client_ids, dtype=np.int64)
        owners = self.host_of(ids)
        groups = {int(a): ids[owners == a].tolist() for a in np.unique(owners)}
        if not groups and not self._lost:
            return RoundReply([], self.drain_faults())
        broadcast_ref = ray.put(broadcast)
        # an actor with lost uploads to hear of and no client this round gets an empty call
        work = {a: (groups.get(a, []), self._lost.get(a, []), {c: now[c] for c in groups.get(a, []) if c in now}
                    if now else None) for a in sorted({*groups, *self._lost})}
        calls = {a: (lambda actor, g=g, lost=lost, mine=mine:
                     actor.run_round.remote(round, g, broadcast_ref, evaluate, lost, mine))
                 for a, (g, lost, mine) in work.items()}
        by_id = {}
        for results in self._gather(calls, round, state_round=round, rerun=groups).values():
            by_id.update((r.client_id, r) for r in results)
        self._lost = {}
        return RoundReply([by_id[int(c)] for c in ids], self.drain_faults())

    def notify_dropped(self, round, client_ids) -> None:
        ids = np.asarray(client_ids, dtype=np.int64)
        owners = self.host_of(ids)
        for a in np.unique(owners):
            self._lost.setdefault(int(a), []).append((round, ids[owners == a].tolist()))

    # ------------------------------------------------------------------ checkpoints
    def _local(self, a: int) -> bool:
        if self.state_transfer != "auto":
            return self.state_transfer == "files"
        return self.nodes[a] == self.loop_node

    def save_client_states(self, directory):
        # torch: see the note above the class
        from engine.clients.format import shard_entries, shard_name

        directory = Path(directory).resolve()

        def call(a):
            lost = self._lost.get(a, [])  # heard of first: a checkpoint holds the states after them
            if self._local(a):
                return lambda actor: actor.save_states.remote(str(directory / shard_name(a)), lost)
            return lambda actor: actor.save_states_to_buffer.remote(lost)

        infos = self._gather({a: call(a) for a in range(self.num_actors)}, self._round,
                             state_round=self._round + 1)
        self._lost = {}
        shards = []
        for a, info in sorted(infos.items()):
            if not self._local(a):  # fetch the serialized shard piece by piece
                actor = self.actors[a]
                with open(directory / shard_name(a), "wb") as f:
                    for offset in range(0, info["bytes"], CHUNK_BYTES):
                        f.write(ray.get(actor.read_outbox.remote(offset, CHUNK_BYTES)))
                actor.clear_outbox.remote()
            shards += shard_entries(info, host=a, num_hosts=self.num_actors)
        return shards

    def load_client_states(self, directory, shards):
        directory = Path(directory).resolve()
        calls = {a: (lambda actor, a=a: self._start_load(actor, a, directory, shards))
                 for a in range(self.num_actors)}
        self._gather(calls, self._round, state_round=None, restore_from=directory)
        self._lost = {}  # the states they were about were replaced

    def _start_load(self, actor, a: int, directory: Path, shards: list[dict]):
        """Start loading actor ``a``'s clients from a checkpoint; returns the task's ref."""
        from engine.clients.format import shards_for  # torch: see the note above the class

        mine = shards_for(shards, self.num_actors, a)
        if self._local(a):
            return actor.load_states.remote([str(directory / s["file"]) for s in mine], self.num_actors, a)
        for s in mine:  # push the shard piece by piece (bounded memory on both sides)
            with open(directory / s["file"], "rb") as f:
                while data := f.read(CHUNK_BYTES):
                    ray.get(actor.receive_chunk.remote(s["file"], data))
        return actor.load_received.remote(self.num_actors, a)

    # ------------------------------------------------------------------ actor failure
    def _gather(self, calls: dict, round: int, state_round: int | None, rerun: dict | None = None,
                restore_from: Path | None = None) -> dict:
        """Run ``calls[a](actor)`` on every actor ``a`` and collect the results. An actor that
        died is replaced (its clients restored from ``restore_from`` or the recovery
        checkpoint) and its call is made again on the replacement."""
        refs: dict = {}
        for a, make in calls.items():
            try:  # pushing a shard in chunks already talks to the actor
                refs[a] = make(self.actors[a])
            except ray.exceptions.RayActorError as err:
                refs[a] = err
        out = {}
        for a, ref in refs.items():
            try:
                if isinstance(ref, BaseException):
                    raise ref
                out[a] = ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                cause = err.as_instanceof_cause()
                from engine.clients.host import ClientFailure  # torch: see the note above the class

                if isinstance(cause, ClientFailure):  # names the client and the round
                    raise cause from None
                group = (rerun or {}).get(a, [])
                raise ExecutorError(
                    f"round {round}: actor {a} hosting clients {group[:10]} failed: {err}") from None
            except ray.exceptions.RayActorError as err:
                t0 = time.monotonic()
                fault = self._replace(a, err, round, state_round, (rerun or {}).get(a, []), restore_from)
                try:
                    out[a] = ray.get(calls[a](self.actors[a]))
                except ray.exceptions.RayActorError as again:
                    raise ExecutorError(self._fatal(a, round, err, again)) from None
                fault["seconds_lost"] = time.monotonic() - t0
        return out

    def _replace(self, a: int, cause: BaseException, round: int, state_round: int | None,
                 clients: list[int], restore_from: Path | None) -> dict:
        """Start a new actor ``a`` and restore its clients' states; returns the fault row."""
        dead_pid = self.pids[a]
        try:
            ray.kill(self.actors[a], no_restart=True)
        except Exception:  # noqa: BLE001 - it is dead already
            pass
        source = restore_from if restore_from is not None else self.recovery_checkpoint
        try:
            actor = self._spawn(a)
            self.actors[a] = actor
            ray.get(actor.setup.remote(self._setup_ref), timeout=self.startup_timeout_s)
            self.pids[a], self.nodes[a] = ray.get(actor.where.remote(), timeout=self.startup_timeout_s)
            restored, meta = 0, None
            if source is not None:
                from engine.checkpoint.snapshot import read_meta  # torch: see the note above the class

                meta = read_meta(source)
                restored = ray.get(self._start_load(actor, a, Path(source), meta["client_states"]))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as again:
            raise ExecutorError(self._fatal(a, round, cause, again)) from None
        ckpt_round = int(meta["next_round"]) if meta is not None else 0
        fault = {
            "round": round,
            "actor": a,
            "pid": dead_pid,
            "clients": list(clients),
            "clients_restored": restored,
            "cause": _first_line(cause),
            "recovery": (f"replaced; client states from checkpoint {Path(source).name}" if source is not None
                         else "replaced; client states reset to their initial state (no checkpoint yet)"),
            "checkpoint": Path(source).name if source is not None else "",
            "state_rounds_lost": max(0, state_round - ckpt_round) if state_round is not None else 0,
            "seconds_lost": float("nan"),
        }
        self._faults.append(fault)
        return fault

    def _fatal(self, a: int, round: int, cause: BaseException, again: BaseException) -> str:
        ckpt = self.recovery_checkpoint
        where = f"checkpoint {Path(ckpt).name}" if ckpt is not None else "round 0 (no checkpoint yet)"
        resume = f"hetsim run --resume {self.run_dir}" if self.run_dir is not None else "hetsim run --resume RUN_DIR"
        return (f"round {round}: client actor {a} died ({_first_line(cause)}) and its replacement failed "
                f"too ({_first_line(again)}); the run stops. Continue it from {where} with: {resume}")

    def drain_faults(self) -> list[dict]:
        out, self._faults = self._faults, []
        return out

    def _pin_loop_threads(self) -> None:
        """The round loop's own torch work (aggregation, server steps, evaluation) runs in this
        process: with the threads the in-process executor gives it (``threads_per_actor`` or 1),
        not with whatever this process had, so that both executors give the same numbers (with 2
        threads here an ASCEND run rolled back in another round)."""
        import torch  # deferred: see the note above the class (the data is loaded by now)

        if self._caller_threads is None:
            self._caller_threads = torch.get_num_threads()
        torch.set_num_threads(self.cfg.executor.threads_per_actor or 1)

    def reuse(self, cfg: ExperimentConfig) -> RayExecutor | None:
        """A new executor for ``cfg``'s run on this one's parked actors (their processes have
        torch and the methods imported), or None if ``cfg`` asks for another pool. Each actor
        drops what it held and builds its host afresh in :meth:`start`, so a run on warm actors
        equals one on new actors (tests/engine/test_matrix.py)."""
        if not self.parked or pool_key(cfg) != self._pool_key:
            return None
        new = RayExecutor(cfg)
        new.actors, self.parked = self.parked, []
        new.num_actors, new._planned_clients, new._pool_key = len(new.actors), self._planned_clients, self._pool_key
        new._actor_cls, new._options, new._threads = self._actor_cls, self._options, self._threads
        for actor in new.actors:  # before setup(): an actor runs one caller's calls in order
            actor.reset.remote(cfg, new._threads)
        new._launched_at = time.monotonic()
        return new

    def close(self) -> None:
        """Release the actors: parked for :meth:`reuse` if ``keep_actors`` (the run ended),
        else killed."""
        self._drop_actors(park=self.keep_actors)

    def _drop_actors(self, park: bool = False) -> None:
        """Park the actors without their hosts, or kill them and any parked before (a failed
        start-up always kills)."""
        if park:
            for a in self.actors:
                a.release.remote()  # the run's data and client states, no longer pinned
            self.parked, self.actors = self.parked + self.actors, []
            self._setup_ref = None
        for a in [*self.actors, *([] if park else self.parked)]:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - gone already, or Ray is: nothing left to release
                pass
        self.actors = []
        if not park:
            self.parked = []
        if self._caller_threads is not None:  # this process's threads, as start() found them
            import torch  # deferred: see the note above the class

            torch.set_num_threads(self._caller_threads)
            self._caller_threads = None

    def describe(self) -> dict:
        ex = self.cfg.executor
        out = {"kind": "ray", "actors": self.num_actors, "cpus_per_actor": ex.cpus_per_actor,
               "actor_pids": list(self.pids), "actor_nodes": list(self.nodes)}
        if self.placements:
            devices = sorted({p["device"] for p in self.placements})
            out["device"] = devices[0] if len(devices) == 1 else "mixed"
        if ex.gpus_per_actor:
            out["gpus_per_actor"] = ex.gpus_per_actor
            out["gpu_ids"] = [p["gpu_ids"] for p in self.placements]
        if self.placement_group is not None:
            out["placement_group"] = self.placement_group.id.hex()
        return out

    # --- introspection used by benchmarks
    def state_nbytes(self) -> int:
        return sum(ray.get([a.state_nbytes.remote() for a in self.actors]))

    def rss_bytes(self) -> int:
        return sum(ray.get([a.rss_bytes.remote() for a in self.actors]))
