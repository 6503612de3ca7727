"""Planning the client-actor pool: how many actors fit the cluster's CPUs and GPUs.

Checked before any actor is created, because an actor whose request cannot be met waits
forever in Ray. Pure arithmetic: no Ray import.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from engine.errors import UserError
from engine.ray.cluster import ExecutorError


class PoolSizeError(ExecutorError, UserError):
    """The requested actor pool does not fit the cluster (a config mistake)."""


def gpu_capacity(gpus_per_actor: float, cluster_gpus: float, node_gpus: Sequence[float] | None = None) -> int:
    """How many actors of ``gpus_per_actor`` GPUs fit: an actor's share must come from one node,
    so each node holds ``floor(node GPUs / share)`` of them; never more than the free total."""
    fit = int(math.floor(cluster_gpus / gpus_per_actor + 1e-9))
    if node_gpus is not None:
        fit = min(fit, sum(int(math.floor(g / gpus_per_actor + 1e-9)) for g in node_gpus))
    return fit


# Head processes a local Ray of one hetsim command does without (see below).

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


def plan_when_free(plan: Callable[[dict], int], free: Callable[[], dict], cluster: dict, timeout_s: float) -> int:
    """``plan(resources)`` (a :func:`plan_pool` call) on the ``free()`` resources. A pool that fits
    the ``cluster`` but not what is free waits, up to ``timeout_s``, for CPUs that dead actors
    hold: Ray gives them back asynchronously (a resume right after a killed run found none free).
    A pool the whole cluster cannot hold is refused at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return plan(free())
        except PoolSizeError:
            if time.monotonic() >= deadline:
                raise
            plan(cluster)  # more than the whole cluster: said at once
        time.sleep(0.1)


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
