"""Clients on Ray actors.

* :class:`ClientActor` is a thin shell around :class:`engine.runtime.ClientHost`; each actor
  hosts many virtual clients (sticky: client ``c`` lives on actor ``c % A``), so 10,000
  clients do not mean 10,000 processes. Per-client state stays on its actor.
* The dataset, profiles and method travel once through the object store (``ray.put``) and
  are read zero-copy by every actor on a node; each round's broadcast is one ``ray.put``.
* The pool is sized from the cluster's CPUs, and checked against them before any actor is
  created, because an actor whose request cannot be met waits forever in Ray.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence

import numpy as np

from engine.config import ExperimentConfig
from engine.executor import Executor
from engine.runtime import ClientHost, HostSetup
from engine.trace import mark

# Measured with ray 2.60: these keep a local Ray quiet and fast to start.
QUIET_RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",  # no token-authentication warning or token file
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage reporting
    "RAY_worker_maximum_startup_concurrency": "64",  # no warning with many actors
    "RAY_AIR_NEW_OUTPUT": "0",
}


class ExecutorError(RuntimeError):
    """The Ray executor could not place or reach its actors."""


def init_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None):
    """Connect to ``address`` or start a quiet local Ray (no dashboard, loopback only).

    ``num_gpus`` declares the local Ray's GPUs (default: the ones Ray detects); Ray schedules
    declared GPUs even where none exist, which the tests use on CPU machines."""
    for key, value in QUIET_RAY_ENV.items():
        os.environ.setdefault(key, value)
    import logging

    import ray

    if ray.is_initialized():
        return ray
    mark("ray: init begins")
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        ray.init(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
    mark("ray: init done")
    return ray


def gpu_capacity(gpus_per_actor: float, cluster_gpus: float, node_gpus: Sequence[float] | None = None) -> int:
    """How many actors of ``gpus_per_actor`` GPUs fit: an actor's share must come from one node,
    so each node holds ``floor(node GPUs / share)`` of them; never more than the free total."""
    fit = int(math.floor(cluster_gpus / gpus_per_actor + 1e-9))
    if node_gpus is not None:
        fit = min(fit, sum(int(math.floor(g / gpus_per_actor + 1e-9)) for g in node_gpus))
    return fit


def plan_pool(
    num_clients: int,
    cluster_cpus: float,
    cpus_per_actor: float,
    num_actors: int | None = None,
    clients_per_actor: int | None = None,
    *,
    gpus_per_actor: float = 0.0,
    cluster_gpus: float = 0.0,
    node_gpus: Sequence[float] | None = None,
) -> int:
    """Number of client actors; raises if the request cannot be placed on the cluster.

    With ``gpus_per_actor`` the GPUs bound the pool like the CPUs do (``node_gpus``: each
    node's GPUs, for the per-node fit of fractional shares)."""
    capacity = int(math.floor(cluster_cpus / cpus_per_actor + 1e-9))
    if capacity < 1:
        raise ExecutorError(
            f"executor.cpus_per_actor={cpus_per_actor} exceeds the cluster's {cluster_cpus:g} CPUs"
        )
    gpu_fit = None
    if gpus_per_actor > 0:
        gpu_fit = gpu_capacity(gpus_per_actor, cluster_gpus, node_gpus)
        if gpu_fit < 1:
            raise ExecutorError(
                f"executor.gpus_per_actor={gpus_per_actor:g} does not fit the cluster's "
                f"{_gpu_text(cluster_gpus, node_gpus)}; Ray would wait forever. Lower gpus_per_actor "
                "or add GPU nodes (a local Ray declares them with ray.num_gpus)")
    if clients_per_actor is not None:
        wanted = math.ceil(num_clients / clients_per_actor)
        source = f"clients_per_actor={clients_per_actor} for {num_clients} clients needs {wanted} actors"
    elif num_actors is not None:
        wanted, source = num_actors, f"num_actors={num_actors}"
    else:
        return max(1, min(capacity, gpu_fit if gpu_fit is not None else capacity, num_clients))
    if gpu_fit is not None and wanted > gpu_fit:
        raise ExecutorError(
            f"executor: {source} x gpus_per_actor={gpus_per_actor:g} GPUs = {wanted * gpus_per_actor:g} "
            f"GPUs, but only {gpu_fit} such actors fit the cluster's {_gpu_text(cluster_gpus, node_gpus)}; "
            f"Ray would wait forever for the rest. Lower gpus_per_actor "
            f"(e.g. {_share_for(wanted, cluster_gpus, node_gpus):.3g}) or the number of actors."
        )
    if wanted > capacity:
        raise ExecutorError(
            f"executor: {source} x cpus_per_actor={cpus_per_actor} CPUs = {wanted * cpus_per_actor:g} "
            f"CPUs, but the cluster has {cluster_cpus:g}; Ray would wait forever for the rest. "
            f"Lower cpus_per_actor (e.g. {cluster_cpus / wanted:.3g}) or the number of actors."
        )
    return max(1, min(wanted, num_clients))


def _gpu_text(cluster_gpus: float, node_gpus: Sequence[float] | None) -> str:
    text = f"{cluster_gpus:g} free GPUs"
    if node_gpus is not None and len(node_gpus) > 1:
        text += f" (per node: {', '.join(f'{g:g}' for g in node_gpus)})"
    return text


def _share_for(wanted: int, cluster_gpus: float, node_gpus: Sequence[float] | None) -> float:
    """The largest GPU share at which ``wanted`` actors fit (a hint for the error message)."""
    nodes = list(node_gpus) if node_gpus is not None else [cluster_gpus]
    shares = sorted({min(1.0, g / k) for g in nodes if g > 0 for k in range(1, wanted + 1)}, reverse=True)
    for share in shares:
        share = math.floor(share * 1000) / 1000  # printed with 3 digits: round down, still fits
        if share > 0 and gpu_capacity(share, cluster_gpus, node_gpus) >= wanted:
            return share
    return 0.0


def _client_actor_class():
    import ray

    @ray.remote(max_restarts=0)
    class ClientActor:
        def __init__(self, setup: HostSetup, threads: int):
            from engine.device import DeviceError

            mark("client actor: up")
            self.device_error = None
            try:
                self.host = ClientHost(setup, threads=threads)
            except DeviceError as err:  # kept for ready(): a method's error keeps its type
                self.device_error = err
            mark("client actor: host ready")

        def ready(self) -> int:
            if self.device_error is not None:
                raise self.device_error
            return os.getpid()

        def placement(self) -> dict:
            """Where this actor's clients train: the resolved device and Ray's GPU ids."""
            import ray

            return {"device": self.host.device.type, "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

        def run_round(self, round, client_ids, broadcast, evaluate):
            return self.host.run_round(round, client_ids, broadcast, evaluate)

        def notify_dropped(self, round, client_ids) -> None:
            self.host.notify_dropped(round, client_ids)

        def state_nbytes(self) -> int:
            return self.host.state_nbytes()

        def rss_bytes(self) -> int:
            return _rss_bytes()

    return ClientActor


def _device_error(err: BaseException):
    """The :class:`engine.device.DeviceError` an actor's start-up raised, if that is what failed."""
    from engine.device import DeviceError

    as_cause = getattr(err, "as_instanceof_cause", None)  # a RayTaskError from ready()
    inner = as_cause() if as_cause is not None else err
    if isinstance(inner, DeviceError):
        return DeviceError(*inner.args)  # the plain message, without Ray's traceback header
    return None


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
        self.placements: list[dict] = []  # per actor: resolved device and Ray GPU ids

    def start(self, setup: HostSetup) -> None:
        ray = init_ray(self.cfg.ray.address, self.cfg.ray.num_cpus, self.cfg.ray.num_gpus)
        ex = self.cfg.executor
        n = setup.data.num_clients
        threads = ex.threads_per_actor or max(1, int(ex.cpus_per_actor))
        if self.placement_group is None:
            free = ray.available_resources()
            node_gpus = ([node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node["Alive"]]
                         if ex.gpus_per_actor > 0 else None)
            self.num_actors = plan_pool(
                n, free.get("CPU", 0.0), ex.cpus_per_actor, ex.num_actors, ex.clients_per_actor,
                gpus_per_actor=ex.gpus_per_actor, cluster_gpus=free.get("GPU", 0.0), node_gpus=node_gpus)
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
        setup_ref = ray.put(setup)
        actor_cls = _client_actor_class()
        mark("executor: actors requested")
        self.actors = [
            actor_cls.options(num_cpus=ex.cpus_per_actor, num_gpus=ex.gpus_per_actor, **opt)
            .remote(setup_ref, threads)
            for opt in options
        ]
        self._wait_ready()
        mark("executor: actors ready")
        self.placements = ray.get([a.placement.remote() for a in self.actors])

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
                    device_error = _device_error(err)
                    if device_error is not None:  # e.g. device: cuda on GPUs Ray only declared
                        raise device_error from None
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

        from engine.runtime import ClientFailure

        if not client_ids:
            return []
        ids = np.asarray(client_ids, dtype=np.int64)
        owners = self.actor_of(ids)
        broadcast_ref = ray.put(broadcast)
        futures, groups = [], []
        for a in np.unique(owners):
            group = ids[owners == a]
            groups.append(group)
            futures.append(self.actors[a].run_round.remote(round, group.tolist(), broadcast_ref, evaluate))
        by_id = {}
        for group, fut in zip(groups, futures):
            try:
                results = ray.get(fut)
            except ray.exceptions.RayTaskError as err:
                cause = err.as_instanceof_cause()
                if isinstance(cause, ClientFailure):  # names the client and the round
                    raise cause from None
                raise ExecutorError(
                    f"round {round}: actor hosting clients {group[:10].tolist()} failed: {err}"
                ) from None
            except ray.exceptions.RayActorError as err:
                raise ExecutorError(
                    f"round {round}: the actor hosting clients {group[:10].tolist()} died: {err}"
                ) from None
            by_id.update((r.client_id, r) for r in results)
        return [by_id[int(c)] for c in ids]

    def notify_dropped(self, round, client_ids) -> None:
        import ray

        if not client_ids:
            return
        ids = np.asarray(client_ids, dtype=np.int64)
        owners = self.actor_of(ids)
        ray.get([self.actors[a].notify_dropped.remote(round, ids[owners == a].tolist())
                 for a in np.unique(owners)])

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
        out = {"kind": "ray", "actors": self.num_actors, "cpus_per_actor": ex.cpus_per_actor}
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
        import ray

        return sum(ray.get([a.state_nbytes.remote() for a in self.actors]))

    def rss_bytes(self) -> int:
        import ray

        return sum(ray.get([a.rss_bytes.remote() for a in self.actors]))
