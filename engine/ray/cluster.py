"""Starting and joining Ray: the one place hetsim does either (see docs/security.md).

A local Ray listens on loopback only and requires a random per-session token; a cluster is
joined only when ``ray.address`` names one, after a bounded reachability check (Ray itself
would retry an unreachable address for minutes). Importing this module does not import Ray:
validation checks an address, and the CLI asks whether Ray is up, without paying for it.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from engine.errors import UserError
from engine.trace import mark

LOOPBACK = ("127.0.0.1", "::1")
DEFAULT_CONNECT_TIMEOUT_S = 30.0
log = logging.getLogger("hetsim.ray")
_local_token: str | None = None  # the token of the local Ray this process started, if any

T = TypeVar("T")


class ExecutorError(RuntimeError):
    """The Ray executor could not place or reach its actors."""



class DriverDiedError(RuntimeError):
    """The driver actor (the round loop) died; the run folder holds every finished round."""


class RayConnectError(UserError, ConnectionError):
    """The Ray cluster named by ``ray.address`` cannot be reached or joined."""


def joins_cluster(address: str | None) -> bool:
    """Whether :func:`init_ray` joins a cluster at ``address`` (None and "local" start a private Ray)."""
    return address not in (None, "local")


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
    if not joins_cluster(address):
        _start_local_ray(ray, num_cpus, num_gpus)
    else:
        _join_cluster(ray, address, connect_timeout_s)
    mark("ray: init done")
    return ray


def import_ray():
    """``import ray``, deferred: importing this module must not cost Ray's import (~0.6 s). The
    settings Ray reads at import are in the environment already (:mod:`engine.ray`)."""
    import ray  # deferred: see the docstring

    return ray


def _start_local_ray(ray, num_cpus: int | None, num_gpus: int | None = None) -> None:
    global _local_token
    stray = os.environ.get("RAY_ADDRESS")
    if stray:
        log.warning("hetsim: ignoring RAY_ADDRESS=%s and starting a private local Ray; "
                    "set ray.address: auto (or the address) to run on that cluster", stray)
    from ray._private import ray_constants  # Ray's: deferred as in import_ray

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
        from ray._private.node import Node  # Ray's: deferred as in import_ray
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
    ray = import_ray()
    if ray.is_initialized():
        mark("ray: shutdown begins")
        ray.shutdown()
        mark("ray: shutdown done")


def cluster_cpus() -> float:
    """The CPUs of the Ray this process is connected to."""
    return import_ray().cluster_resources().get("CPU", 0.0)


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
