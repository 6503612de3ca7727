"""Clients on Ray actors.

* :class:`ClientActor` is a thin shell around :class:`engine.runtime.ClientHost`; each actor
  hosts many virtual clients (sticky: client ``c`` lives on actor ``c % A``), so 10,000
  clients do not mean 10,000 processes. Per-client state stays on its actor.
* The dataset, profiles and method travel once through the object store (``ray.put``) and
  are read zero-copy by every actor on a node; each round's broadcast is one ``ray.put``.
* The pool is sized from the cluster's CPUs, and checked against them before any actor is
  created, because an actor whose request cannot be met waits forever in Ray.
* Start-up overlaps: :meth:`RayExecutor.launch` creates the actors before the driver loads the
  data (each actor imports torch and the method meanwhile); :meth:`RayExecutor.start` then ships
  the dataset and waits until every host is built.
"""
from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from engine.config import ExperimentConfig
from engine.executor import Executor
from engine.trace import mark

if TYPE_CHECKING:  # engine.runtime imports torch: imported by the client actors themselves
    from engine.runtime import HostSetup

# Measured with ray 2.60: these keep a local Ray quiet and fast to start.
QUIET_RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",  # no token-authentication warning or token file
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage reporting
    "RAY_worker_maximum_startup_concurrency": "64",  # no warning with many actors
    "RAY_AIR_NEW_OUTPUT": "0",
}


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
    mark("ray: init begins")
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        with _without_unused_head_processes():
            ray.init(
                num_cpus=num_cpus,
                include_dashboard=False,
                logging_level=logging.WARNING,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
            )
    mark("ray: init done")
    return ray


# Head processes a local Ray of one hetsim command does without (see below).
UNUSED_HEAD_PROCESSES = ("start_monitor", "start_log_monitor", "start_api_server")


@contextmanager
def _without_unused_head_processes():
    """While a local Ray starts: no autoscaler monitor, no log monitor, no dashboard API server.

    A local single-node Ray scales nothing, we forward no worker logs (``log_to_driver=False``)
    and serve no dashboard, job or state API (``include_dashboard=False`` still starts an API
    server, and ``ray.init`` waits until it is up before it even starts the raylet). Each is a
    Python process that takes CPU while our actors start; the monitor alone also holds
    ``ray.shutdown()`` for 1 s (it outlives the SIGTERM grace period). ``ray.init`` has no switch
    for them, so these ``Node`` methods are skipped for the duration of the call (measured with
    ray 2.60 on 2 busy cores: 1-2 s less to start, 1 s less to stop; Tune needs none of them).
    Should a Ray version lack a method, it is left alone.
    """
    try:
        from ray._private.node import Node
    except ImportError:  # pragma: no cover - another Ray layout: start it as it comes
        yield
        return
    saved = {name: Node.__dict__[name] for name in UNUSED_HEAD_PROCESSES if name in Node.__dict__}
    try:
        for name in saved:
            setattr(Node, name, lambda self, *args, **kwargs: None)
        yield
    finally:
        for name, method in saved.items():
            setattr(Node, name, method)


def shutdown_ray() -> None:
    """End this process's Ray session now, if it has one.

    Call it once the results are written: nothing is left to flush. Ray's own exit hook would
    first sleep 0.5 s so that forwarded worker log lines can print, and we forward none
    (``log_to_driver=False``). A local Ray started by this process stops; an attached cluster
    keeps running.
    """
    import sys

    if "ray" not in sys.modules:
        return
    import ray

    if ray.is_initialized():
        mark("ray: shutdown begins")
        ray.shutdown()
        mark("ray: shutdown done")


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
        def __init__(self, cfg: ExperimentConfig, threads: int):
            mark("client actor: up")
            # Everything a host needs is imported now, while the driver loads the data: torch,
            # the method and the models.
            import torch

            from algorithms import ALGORITHMS

            torch.set_num_threads(threads)
            ALGORITHMS[cfg.algorithm.name]
            import engine.models  # noqa: F401
            import engine.runtime  # noqa: F401

            self.threads = threads
            self.host = None
            mark("client actor: imports done")

        def setup(self, setup: HostSetup) -> int:
            from engine.runtime import ClientHost

            self.host = ClientHost(setup, threads=self.threads)
            mark("client actor: host ready")
            return os.getpid()

        def run_round(self, round, client_ids, broadcast, evaluate):
            return self.host.run_round(round, client_ids, broadcast, evaluate)

        def notify_dropped(self, round, client_ids) -> None:
            self.host.notify_dropped(round, client_ids)

        def state_nbytes(self) -> int:
            return self.host.state_nbytes()

        def rss_bytes(self) -> int:
            return _rss_bytes()

    return ClientActor


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
        self._planned_clients = 0
        self._launched_at: float | None = None

    def launch(self, num_clients: int | None = None) -> None:
        """Create the client actors (without data) and return at once; idempotent.

        Call it before loading the data: the actors' processes start and import torch and the
        method in the meantime. The pool is sized for ``num_clients`` (default: the config's,
        which partitioning gives the data). :meth:`start` launches the actors if need be.
        """
        if self.actors:
            return
        ray = init_ray(self.cfg.ray.address, self.cfg.ray.num_cpus)
        ex = self.cfg.executor
        n = self._planned_clients = num_clients or self.cfg.clients.num_clients
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
        actor_cls = _client_actor_class()
        self.actors = [
            actor_cls.options(num_cpus=ex.cpus_per_actor, **opt).remote(self.cfg, threads)
            for opt in options
        ]
        self._launched_at = time.monotonic()
        mark("executor: actors requested")

    def prelaunch(self) -> None:
        """:meth:`launch` now, before the data is loaded; if that fails the error is left to
        :meth:`start`, which raises it again inside the run (where the manifest records it)."""
        try:
            self.launch()
        except Exception:  # noqa: BLE001 - raised again by start()
            self.close()

    def start(self, setup: HostSetup) -> None:
        """Ship the dataset, profiles and method to the actors (launched if need be); wait for them."""
        import ray

        if self.actors and setup.data.num_clients != self._planned_clients:
            self.close()  # sized for another number of clients (data passed in by hand)
        self.launch(setup.data.num_clients)
        setup_ref = ray.put(setup)
        self._wait_ready([a.setup.remote(setup_ref) for a in self.actors])
        mark("executor: actors ready")

    def _wait_ready(self, refs: list) -> None:
        import ray

        pending = {ref: i for i, ref in enumerate(refs)}
        # counted from the launch: the actors' start-up overlaps the driver's data loading
        deadline = (self._launched_at or time.monotonic()) + self.startup_timeout_s
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
