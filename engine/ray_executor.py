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

import logging
import math
import os
import secrets
import socket
import time
from pathlib import Path

import numpy as np

from engine.config import ExperimentConfig
from engine.errors import UserError
from engine.executor import Executor
from engine.runtime import ClientHost, HostSetup

# Measured with ray 2.60: these keep a local Ray quiet and fast to start.
QUIET_RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage reporting
    "RAY_worker_maximum_startup_concurrency": "64",  # no warning with many actors
    "RAY_AIR_NEW_OUTPUT": "0",
}
LOOPBACK = ("127.0.0.1", "::1")
DEFAULT_CONNECT_TIMEOUT_S = 30.0
log = logging.getLogger("hetsim.ray")
_local_token: str | None = None  # the token of the local Ray this process started, if any


class ExecutorError(RuntimeError):
    """The Ray executor could not place or reach its actors."""


class PoolSizeError(ExecutorError, UserError):
    """The requested actor pool does not fit the cluster (a config mistake)."""


class RayConnectError(UserError, ConnectionError):
    """The Ray cluster named by ``ray.address`` cannot be reached or joined."""


def init_ray(address: str | None = None, num_cpus: int | None = None,
             connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S):
    """The one place hetsim starts or joins Ray (see docs/security.md).

    * ``address`` None or ``"local"``: start a private local Ray that listens on loopback only
      and requires a random per-session token (``RAY_AUTH_MODE=token``). A stray
      ``RAY_ADDRESS`` or a cluster someone started with ``ray start`` is never joined.
    * ``"auto"``: join the cluster in ``RAY_ADDRESS`` or the one ``ray start`` recorded.
    * ``"host:port"`` / ``"ray://host:port"``: join that cluster; if it cannot be reached within
      ``connect_timeout_s`` a :class:`RayConnectError` says so (Ray itself would wait forever).
    """
    for key, value in QUIET_RAY_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    if ray.is_initialized():
        return ray
    if address in (None, "local"):
        _start_local_ray(ray, num_cpus)
    else:
        _join_cluster(ray, address, connect_timeout_s)
    return ray


def _start_local_ray(ray, num_cpus: int | None) -> None:
    global _local_token
    stray = os.environ.get("RAY_ADDRESS")
    if stray:
        log.warning("hetsim: ignoring RAY_ADDRESS=%s and starting a private local Ray; "
                    "set ray.address: auto (or the address) to run on that cluster", stray)
    from ray._private import ray_constants

    _local_token = secrets.token_hex(32)
    # Set only while Ray starts its processes (they inherit them), then restored, so neither
    # the token nor the modes leak into whatever this process starts or joins later.
    session_env = {
        # token authentication: every gRPC call to the GCS, raylets and workers must carry
        # this token; it lives in the environment of Ray's processes (no token file)
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": _local_token,
        # loopback: ray.init turns _node_ip_address="127.0.0.1" into the machine's external
        # address unless Ray's local-only mode (its default on macOS and Windows) is on; then
        # every gRPC server binds 127.0.0.1 (ray/_private/services.py resolve_ip_for_localhost)
        ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR: "0",
    }
    saved_env = {key: os.environ.get(key) for key in session_env}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(session_env)
    ray_constants.ENABLE_RAY_CLUSTER = False  # Ray reads the variable once, at import
    try:
        _reload_auth_settings()  # this process (the driver) caches mode and token until reloaded
        ray.init(
            address="local",  # never RAY_ADDRESS or /tmp/ray/ray_current_cluster
            num_cpus=num_cpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    node_ip = ray.util.get_node_ip_address()
    if node_ip not in LOOPBACK:  # fail closed: never run open to the network
        ray.shutdown()
        raise ExecutorError(f"the local Ray bound to {node_ip}, not to loopback; refusing to run")


def _join_cluster(ray, address: str, timeout_s: float) -> None:
    if _local_token is not None:
        # forget the cached mode and token of an earlier private local Ray of this process
        _reload_auth_settings()
    target = resolve_address(address)
    check_reachable(target, timeout_s, address)
    try:
        ray.init(address=target, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise RayConnectError(f"ray.address = {address!r}: could not join the Ray cluster at "
                              f"{target}: {err}") from None


def _reload_auth_settings() -> None:
    # Ray caches RAY_AUTH_MODE (in its config) and the token when ray is imported; refresh both,
    # as Ray's own authentication_token_setup._enable_token_auth does.
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def resolve_address(address: str) -> str:
    """``auto`` -> the address in ``RAY_ADDRESS`` or recorded by ``ray start``; else unchanged."""
    if address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env
    # where `ray start` records its cluster (ray/_common/utils.py get_default_system_temp_dir)
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    recorded = Path(tmp) / "ray" / "ray_current_cluster"
    try:
        found = recorded.read_text().strip()
    except OSError:
        found = ""
    if not found:
        raise RayConnectError(
            "ray.address = 'auto': no running cluster found (RAY_ADDRESS is not set and "
            f"{recorded} does not exist); start one with `ray start --head` or give its address")
    return found


# HTTP/2 client preface and an empty SETTINGS frame: every gRPC server (Ray's GCS and client
# server are gRPC) answers with its own SETTINGS frame at once.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def check_reachable(target: str, timeout_s: float, address: str | None = None) -> None:
    """Raise :class:`RayConnectError` unless a gRPC server answers at ``target`` in time.

    Ray's own ``ray.init`` retries an unreachable or silent address for minutes; this check
    takes at most ``timeout_s`` (connect, then the server's first HTTP/2 frame).
    """
    shown = repr(address or target)
    hostport = target.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise RayConnectError(f"ray.address = {shown}: not host:port, ray://host:port, 'auto' or null")
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return  # a TLS cluster: the plain HTTP/2 probe does not apply
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.sendall(_H2_PREFACE)
            head = sock.recv(9)
    except OSError as err:
        why = "timed out" if isinstance(err, socket.timeout) else (err.strerror or str(err))
        raise RayConnectError(
            f"ray.address = {shown}: cannot reach {host}:{port} ({why}; waited at most "
            f"{timeout_s:g} s, ray.connect_timeout_s). Is the cluster running and the port open?"
        ) from None
    if len(head) < 9 or head[3] != 0x04:  # frame type 4 = SETTINGS
        raise RayConnectError(
            f"ray.address = {shown}: {host}:{port} answers, but not as a Ray cluster (no gRPC "
            "reply); check the address and port (the GCS port, 6379 by default)")


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
        raise PoolSizeError(
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
        raise PoolSizeError(
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

        def ready(self) -> int:
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

    def start(self, setup: HostSetup) -> None:
        ray = init_ray(self.cfg.ray.address, self.cfg.ray.num_cpus, self.cfg.ray.connect_timeout_s)
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
        setup_ref = ray.put(setup)
        actor_cls = _client_actor_class()
        self.actors = [
            actor_cls.options(num_cpus=ex.cpus_per_actor, **opt).remote(setup_ref, threads)
            for opt in options
        ]
        self._wait_ready()

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
