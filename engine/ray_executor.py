"""Clients on Ray actors.

* :class:`ClientActor` is a thin shell around :class:`engine.runtime.ClientHost`; each actor
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
"""
from __future__ import annotations

import io
import math
import os
import time
from pathlib import Path

import numpy as np

from engine.config import ExperimentConfig
from engine.executor import Executor
from engine.runtime import ClientHost, HostSetup

# Measured with ray 2.60: these keep a local Ray quiet and fast to start.
QUIET_RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",  # no token-authentication warning or token file
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage reporting
    "RAY_worker_maximum_startup_concurrency": "64",  # no warning with many actors
    "RAY_AIR_NEW_OUTPUT": "0",
}


CHUNK_BYTES = 64 << 20  # checkpoint shards travel between nodes in pieces of this size


class ExecutorError(RuntimeError):
    """The Ray executor could not place or reach its actors."""


def init_ray(address: str | None = None, num_cpus: int | None = None):
    """Connect to ``address`` or start a quiet local Ray (no dashboard, loopback only)."""
    for key, value in QUIET_RAY_ENV.items():
        os.environ.setdefault(key, value)
    import logging

    import ray

    if ray.is_initialized():
        return ray
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        ray.init(
            address="local",  # a new local instance, never a cluster found via /tmp/ray (ray start)
            num_cpus=num_cpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
    return ray


def plan_pool(
    num_clients: int,
    cluster_cpus: float,
    cpus_per_actor: float,
    num_actors: int | None = None,
    clients_per_actor: int | None = None,
) -> int:
    """Number of client actors; raises if the request cannot be placed on the cluster."""
    capacity = int(math.floor(cluster_cpus / cpus_per_actor + 1e-9))
    if capacity < 1:
        raise ExecutorError(
            f"executor.cpus_per_actor={cpus_per_actor} exceeds the cluster's {cluster_cpus:g} CPUs"
        )
    if clients_per_actor is not None:
        wanted = math.ceil(num_clients / clients_per_actor)
        source = f"clients_per_actor={clients_per_actor} for {num_clients} clients needs {wanted} actors"
    elif num_actors is not None:
        wanted, source = num_actors, f"num_actors={num_actors}"
    else:
        return max(1, min(capacity, num_clients))
    if wanted > capacity:
        raise ExecutorError(
            f"executor: {source} x cpus_per_actor={cpus_per_actor} CPUs = {wanted * cpus_per_actor:g} "
            f"CPUs, but the cluster has {cluster_cpus:g}; Ray would wait forever for the rest. "
            f"Lower cpus_per_actor (e.g. {cluster_cpus / wanted:.3g}) or the number of actors."
        )
    return max(1, min(wanted, num_clients))


def _client_actor_class():
    import ray

    @ray.remote(max_restarts=0)
    class ClientActor:
        def __init__(self, setup: HostSetup, threads: int):
            self.host = ClientHost(setup, threads=threads)
            self._outbox = None
            self._inbox: dict[str, bytearray] = {}

        def ready(self) -> int:
            return os.getpid()

        def where(self) -> tuple[int, str]:
            return os.getpid(), ray.get_runtime_context().get_node_id()

        # --- checkpoint shards: written / read in place, or shipped in chunks across nodes
        def save_states(self, path: str) -> dict:
            return self.host.save_states(path)

        def save_states_to_buffer(self) -> dict:
            buf = io.BytesIO()
            info = self.host.save_states(buf)
            self._outbox = buf.getbuffer()
            return info

        def read_outbox(self, offset: int, size: int) -> bytes:
            return bytes(self._outbox[offset:offset + size])

        def clear_outbox(self) -> None:
            self._outbox = None

        def receive_chunk(self, key: str, data: bytes) -> None:
            self._inbox.setdefault(key, bytearray()).extend(data)

        def load_states(self, paths: list[str], num_hosts: int, host: int) -> int:
            return self.host.load_states(paths, num_hosts, host)

        def load_received(self, num_hosts: int, host: int) -> int:
            sources, self._inbox = list(self._inbox.values()), {}
            return self.host.load_states(sources, num_hosts, host)

        def run_round(self, round, client_ids, broadcast, evaluate):
            return self.host.run_round(round, client_ids, broadcast, evaluate)

        def notify_dropped(self, round, client_ids) -> None:
            self.host.notify_dropped(round, client_ids)

        def state_nbytes(self) -> int:
            return self.host.state_nbytes()

        def rss_bytes(self) -> int:
            return _rss_bytes()

    return ClientActor


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RayExecutor(Executor):
    def __init__(self, cfg: ExperimentConfig, placement_group=None):
        """With ``placement_group`` (e.g. a Tune trial's), actor ``i`` goes to bundle ``i + 1``;
        bundle 0 is the caller's own."""
        self.cfg = cfg
        self.placement_group = placement_group
        self.startup_timeout_s = cfg.executor.startup_timeout_s
        self.actors: list = []
        self.num_actors = 0
        self.pids: list[int] = []
        self.nodes: list[str] = []
        self.state_transfer = "auto"  # "files" (same node), "chunks" (other node) or "auto"
        self._faults: list[dict] = []
        self._round = -1

    def start(self, setup: HostSetup) -> None:
        ray = init_ray(self.cfg.ray.address, self.cfg.ray.num_cpus)
        ex = self.cfg.executor
        n = setup.data.num_clients
        threads = ex.threads_per_actor or max(1, int(ex.cpus_per_actor))
        if self.placement_group is None:
            cpus = ray.available_resources().get("CPU", 0.0)
            self.num_actors = plan_pool(n, cpus, ex.cpus_per_actor, ex.num_actors, ex.clients_per_actor)
            options = [{}] * self.num_actors
        else:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundles = len(self.placement_group.bundle_specs) - 1
            self.num_actors = max(1, min(bundles, n))
            options = [
                {"scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=i + 1)}
                for i in range(self.num_actors)
            ]
        # kept for the executor's lifetime: replacement actors are built from the same setup
        self._setup_ref = ray.put(setup)
        self._actor_cls = _client_actor_class()
        self._options, self._threads = options, threads
        self.actors = [self._spawn(i) for i in range(self.num_actors)]
        self._wait_ready()
        self.loop_node = ray.get_runtime_context().get_node_id()
        located = ray.get([a.where.remote() for a in self.actors])
        self.pids, self.nodes = [p for p, _ in located], [n for _, n in located]

    def _spawn(self, i: int):
        opt = self._options[i]
        return self._actor_cls.options(num_cpus=self.cfg.executor.cpus_per_actor, **opt).remote(
            self._setup_ref, self._threads)

    def _wait_ready(self) -> None:
        import ray

        pending = {a.ready.remote(): i for i, a in enumerate(self.actors)}
        deadline = time.monotonic() + self.startup_timeout_s
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=5.0)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    ray.get(ref)
                except Exception as err:
                    self.close()
                    raise ExecutorError(f"client actor {i} failed to start: {err}") from None
            if pending and time.monotonic() > deadline:
                missing = sorted(pending.values())
                self.close()
                raise ExecutorError(
                    f"{len(missing)} client actor(s) {missing[:10]} not started after "
                    f"{self.startup_timeout_s:.0f} s; cluster resources now: "
                    f"{ray.available_resources()}"
                )

    def actor_of(self, client_ids) -> np.ndarray:
        return np.asarray(client_ids, dtype=np.int64) % self.num_actors

    def run_round(self, round, client_ids, broadcast, evaluate):
        import ray

        self._round = round
        if not client_ids:
            return []
        ids = np.asarray(client_ids, dtype=np.int64)
        owners = self.actor_of(ids)
        broadcast_ref = ray.put(broadcast)
        groups = {int(a): ids[owners == a].tolist() for a in np.unique(owners)}
        calls = {a: (lambda actor, g=g: actor.run_round.remote(round, g, broadcast_ref, evaluate))
                 for a, g in groups.items()}
        by_id = {}
        for results in self._gather(calls, round, state_round=round, rerun=groups).values():
            by_id.update((r.client_id, r) for r in results)
        return [by_id[int(c)] for c in ids]

    def notify_dropped(self, round, client_ids) -> None:
        if not client_ids:
            return
        ids = np.asarray(client_ids, dtype=np.int64)
        owners = self.actor_of(ids)
        calls = {int(a): (lambda actor, g=ids[owners == a].tolist(): actor.notify_dropped.remote(round, g))
                 for a in np.unique(owners)}
        # a replacement restored from a checkpoint has nothing of this round to give back
        self._gather(calls, round, state_round=round + 1)

    # ------------------------------------------------------------------ checkpoints
    def _local(self, a: int) -> bool:
        if self.state_transfer != "auto":
            return self.state_transfer == "files"
        return self.nodes[a] == self.loop_node

    def save_client_states(self, directory):
        import ray

        from engine.checkpoint import shard_name

        directory = Path(directory).resolve()

        def call(a):
            if self._local(a):
                return lambda actor: actor.save_states.remote(str(directory / shard_name(a)))
            return lambda actor: actor.save_states_to_buffer.remote()

        infos = self._gather({a: call(a) for a in range(self.num_actors)}, self._round,
                             state_round=self._round + 1)
        shards = []
        for a, info in sorted(infos.items()):
            if not self._local(a):  # fetch the serialized shard piece by piece
                actor = self.actors[a]
                with open(directory / shard_name(a), "wb") as f:
                    for offset in range(0, info["bytes"], CHUNK_BYTES):
                        f.write(ray.get(actor.read_outbox.remote(offset, CHUNK_BYTES)))
                    f.flush()
                    os.fsync(f.fileno())
                actor.clear_outbox.remote()
            shards.append({"file": shard_name(a), "host": a, "num_hosts": self.num_actors, **info})
        return shards

    def load_client_states(self, directory, shards):
        directory = Path(directory).resolve()
        calls = {a: (lambda actor, a=a: self._start_load(actor, a, directory, shards))
                 for a in range(self.num_actors)}
        self._gather(calls, self._round, state_round=None, restore_from=directory)

    def _start_load(self, actor, a: int, directory: Path, shards: list[dict]):
        """Start loading actor ``a``'s clients from a checkpoint; returns the task's ref."""
        import ray

        from engine.checkpoint import shards_for

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
        import ray

        from engine.runtime import ClientFailure

        refs = {a: make(self.actors[a]) for a, make in calls.items()}
        out = {}
        for a, ref in refs.items():
            try:
                out[a] = ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                cause = err.as_instanceof_cause()
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
        import ray

        from engine.checkpoint import read_meta

        dead_pid = self.pids[a]
        try:
            ray.kill(self.actors[a], no_restart=True)
        except Exception:  # noqa: BLE001 - it is dead already
            pass
        source = restore_from if restore_from is not None else self.recovery_checkpoint
        try:
            actor = self._spawn(a)
            self.actors[a] = actor
            self.pids[a], self.nodes[a] = ray.get(actor.where.remote(), timeout=self.startup_timeout_s)
            restored, meta = 0, None
            if source is not None:
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

    def close(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        self.actors = []

    def describe(self) -> dict:
        ex = self.cfg.executor
        out = {"kind": "ray", "actors": self.num_actors, "cpus_per_actor": ex.cpus_per_actor,
               "actor_pids": list(self.pids)}
        if self.placement_group is not None:
            out["placement_group"] = self.placement_group.id.hex()
        return out

    # --- introspection used by benchmarks
    def state_nbytes(self) -> int:
        import ray

        return sum(ray.get([a.state_nbytes.remote() for a in self.actors]))

    def rss_bytes(self) -> int:
        import ray

        return sum(ray.get([a.rss_bytes.remote() for a in self.actors]))
