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
* Start-up overlaps: :meth:`RayExecutor.launch` creates the actors before the driver loads the
  data (each actor imports torch and the method meanwhile); :meth:`RayExecutor.start` then ships
  the dataset and waits until every host is built.
"""
from __future__ import annotations

import io
import logging
import math
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from engine.config.schema import ExperimentConfig
from engine.errors import UserError
from engine.execution.base import Executor
from engine.trace import mark

if TYPE_CHECKING:  # engine.runtime imports torch: imported by the client actors themselves
    from engine.clients.host import HostSetup

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


CHUNK_BYTES = 64 << 20  # checkpoint shards travel between nodes in pieces of this size


T = TypeVar("T")


class ExecutorError(RuntimeError):
    """The Ray executor could not place or reach its actors."""


class PoolSizeError(ExecutorError, UserError):
    """The requested actor pool does not fit the cluster (a config mistake)."""


class RayConnectError(UserError, ConnectionError):
    """The Ray cluster named by ``ray.address`` cannot be reached or joined."""


def init_ray(address: str | None = None, num_cpus: int | None = None, *,
             num_gpus: int | None = None, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S):
    """The one place hetsim starts or joins Ray (see docs/security.md).

    * ``address`` None or ``"local"``: start a private local Ray that listens on loopback only
      and requires a random per-session token (``RAY_AUTH_MODE=token``). A stray
      ``RAY_ADDRESS`` or a cluster someone started with ``ray start`` is never joined.
    * ``"auto"``: join the cluster in ``RAY_ADDRESS`` or the one ``ray start`` recorded.
    * ``"host:port"`` / ``"ray://host:port"``: join that cluster; if it cannot be reached within
      ``connect_timeout_s`` a :class:`RayConnectError` says so (Ray itself would wait forever).

    ``num_gpus`` declares the local Ray's GPUs (default: the ones Ray detects); Ray schedules
    declared GPUs even where none exist, which the tests use on CPU machines.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    mark("ray: init begins")
    if address in (None, "local"):
        _start_local_ray(ray, num_cpus, num_gpus)
    else:
        _join_cluster(ray, address, connect_timeout_s)
    mark("ray: init done")
    return ray


def import_ray():
    """``import ray`` with the settings Ray reads at import."""
    for key, value in QUIET_RAY_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    return ray


def _start_local_ray(ray, num_cpus: int | None, num_gpus: int | None = None) -> None:
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
        with _without_unused_head_processes():
            ray.init(
                address="local",  # never RAY_ADDRESS or /tmp/ray/ray_current_cluster
                num_cpus=num_cpus,
                num_gpus=num_gpus,
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


def gpu_capacity(gpus_per_actor: float, cluster_gpus: float, node_gpus: Sequence[float] | None = None) -> int:
    """How many actors of ``gpus_per_actor`` GPUs fit: an actor's share must come from one node,
    so each node holds ``floor(node GPUs / share)`` of them; never more than the free total."""
    fit = int(math.floor(cluster_gpus / gpus_per_actor + 1e-9))
    if node_gpus is not None:
        fit = min(fit, sum(int(math.floor(g / gpus_per_actor + 1e-9)) for g in node_gpus))
    return fit


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
    if not ray_is_up():
        return
    import ray

    if ray.is_initialized():
        mark("ray: shutdown begins")
        ray.shutdown()
        mark("ray: shutdown done")


def ray_is_up() -> bool:
    """Whether this process is connected to a Ray (without importing Ray)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def check_while_ray_starts(check: Callable[[], T], start: Callable[[], Any]) -> tuple[T, Any]:
    """Run ``check`` (a validation that loads data: seconds of CPU for torch, the dataset and
    the models) in a thread while ``start`` (starting or joining Ray: mostly waiting for Ray's
    processes) runs in this one; returns both results.

    The check's error wins over the start's (it is the user's mistake), and a Ray that ``start``
    brought up for a config that failed is shut down again. The check must not depend on
    whether Ray is up (``validate_experiment(..., ray_running=)`` pins it).
    """
    import_ray()  # first: imports in two threads take turns on the GIL and the import lock
    was_up = ray_is_up()
    box: dict[str, Any] = {}

    def work():
        try:
            box["value"] = check()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    worker = threading.Thread(target=work, name="hetsim-validation", daemon=True)
    worker.start()
    try:
        started = start()
    except BaseException:
        worker.join()
        if "error" in box:
            raise box["error"] from None
        raise
    worker.join()
    if "error" in box:
        if not was_up:
            shutdown_ray()
        raise box["error"]
    return box["value"], started


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
        raise PoolSizeError(
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
        raise PoolSizeError(
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
        def __init__(self, cfg: ExperimentConfig, threads: int):
            mark("client actor: up")
            # Everything a host needs is imported now, while the driver loads the data: torch,
            # the method and the models.
            import torch

            from algorithms import ALGORITHMS

            torch.set_num_threads(threads)
            ALGORITHMS[cfg.algorithm.name]
            import engine.models.zoo  # noqa: F401
            import engine.clients.host  # noqa: F401

            self.threads = threads
            self.host = None
            self._outbox = None
            self._inbox: dict[str, bytearray] = {}
            mark("client actor: imports done")

        def setup(self, setup: HostSetup) -> int:
            """Build the host from the shipped data (a device error keeps its type for the caller)."""
            from engine.clients.host import ClientHost

            self.host = ClientHost(setup, threads=self.threads)
            mark("client actor: host ready")
            return os.getpid()

        def placement(self) -> dict:
            """Where this actor's clients train: the resolved device and Ray's GPU ids."""
            import ray

            return {"device": self.host.device.type, "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

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


def _device_error(err: BaseException):
    """The :class:`engine.device.DeviceError` an actor's start-up raised, if that is what failed."""
    from engine.clients.device import DeviceError

    as_cause = getattr(err, "as_instanceof_cause", None)  # a RayTaskError from ready()
    inner = as_cause() if as_cause is not None else err
    if isinstance(inner, DeviceError):
        return DeviceError(*inner.args)  # the plain message, without Ray's traceback header
    return None


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
        self.placements: list[dict] = []  # per actor: resolved device and Ray GPU ids
        self.pids: list[int] = []
        self.nodes: list[str] = []
        self.state_transfer = "auto"  # "files" (same node), "chunks" (other node) or "auto"
        self._faults: list[dict] = []
        self._round = -1
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
        ray = init_ray(self.cfg.ray.address, self.cfg.ray.num_cpus, num_gpus=self.cfg.ray.num_gpus,
                       connect_timeout_s=self.cfg.ray.connect_timeout_s)
        ex = self.cfg.executor
        n = self._planned_clients = num_clients or self.cfg.clients.num_clients
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
        self._actor_cls = _client_actor_class()
        self._options, self._threads = options, threads
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
            self.close()

    def start(self, setup: HostSetup) -> None:
        """Ship the dataset, profiles and method to the actors (launched if need be); wait for them."""
        import ray

        if self.actors and setup.data.num_clients != self._planned_clients:
            self.close()  # sized for another number of clients (data passed in by hand)
        self.launch(setup.data.num_clients)
        # kept for the executor's lifetime: replacement actors are built from the same setup
        self._setup_ref = ray.put(setup)
        self._wait_ready([a.setup.remote(self._setup_ref) for a in self.actors])
        mark("executor: actors ready")
        self.placements = ray.get([a.placement.remote() for a in self.actors])
        self.loop_node = ray.get_runtime_context().get_node_id()
        located = ray.get([a.where.remote() for a in self.actors])
        self.pids, self.nodes = [p for p, _ in located], [n for _, n in located]

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

        from engine.checkpoint.snapshot import shard_name

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

        from engine.checkpoint.snapshot import shards_for

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

        from engine.clients.host import ClientFailure

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

        from engine.checkpoint.snapshot import read_meta

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
