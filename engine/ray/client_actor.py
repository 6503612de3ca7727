"""The client actor: a thin Ray shell around one :class:`engine.clients.host.ClientHost`.

Each actor hosts many virtual clients (the executor assigns them, sticky), so 10,000 clients
do not mean 10,000 processes; per-client state stays on its actor. The shell adds only what
crossing processes needs: where it runs, and checkpoint shards written in place or shipped
in chunks to a loop on another node, and a check that this node can read the dataset's files.
:func:`client_actor_class` registers it with Ray once per process (as Ray Tune's class cache
does), not once per executor.
"""
from __future__ import annotations

import functools
import io
import os

import ray

from engine.clients.device import set_ray_gpu_ids
from engine.config.schema import ExperimentConfig
from engine.errors import UserError
from engine.gcpause import imports_without_gc, own_process
from engine.plugin_transport import NotLoaded
from engine.ray.cluster import ExecutorError
from engine.trace import mark


class DataNotOnNodeError(ExecutorError, UserError):
    """A client actor's node cannot read files the dataset's rows are read from (on-demand data
    on a cluster whose nodes do not share a disk)."""


def check_data_on_node(data) -> None:
    """Refuse, naming the node, on-demand data whose files this node lacks: otherwise the first
    client of the round fails with a bare ``FileNotFoundError`` deep in this actor."""
    folder = getattr(getattr(data, "source", None), "folder", None)  # DiskTableSource's row cache
    if folder is None or os.path.exists(os.path.join(folder, "meta.json")):
        return
    node = ray.get_runtime_context().get_node_id()
    raise DataNotOnNodeError(
        f"dataset.params.on_disk: the row cache {folder} of the table is not on node {node} (a client actor "
        "there reads its clients' rows from it; the loop's node built it). Give the row cache at the same "
        "path on every node (dataset.params.cache_dir on a disk they share), or use the in-memory parquet "
        "(on_disk: false): its rows travel through Ray's object store")


class ClientActor:
    def __init__(self, cfg: ExperimentConfig, threads: int):
        mark("client actor: up")
        own_process()
        set_ray_gpu_ids([str(g) for g in ray.get_gpu_ids()])
        # a config whose plugins do not load here: said by setup(), whose error reaches the caller
        # with its type (an error here would reach it as a dead actor, without its cause)
        self._not_loaded = cfg if isinstance(cfg, NotLoaded) else None
        if self._not_loaded is not None:
            self.release()
            return
        with imports_without_gc():  # torch, the method, the models: see engine.gcpause
            self.reset(cfg, threads)
        mark("client actor: imports done")

    def reset(self, cfg: ExperimentConfig, threads: int) -> None:
        """Ready for a run of ``cfg`` with no host (at start, and when a warm actor is handed
        to the next run, ``executor.keep_warm``): :meth:`setup` then builds the host afresh."""
        # Everything a host needs is imported now, while the driver loads the data: torch,
        # the method and the models.
        import torch

        from algorithms import ALGORITHMS
        from engine.clients.host import ClientHost

        torch.set_num_threads(threads)
        ALGORITHMS[cfg.algorithm.name]
        self._not_loaded = None
        self._host_class = ClientHost
        self.threads = threads
        self.release()

    def release(self) -> None:
        """Drop the host, its data and client states (a warm actor between runs holds none)."""
        self.host = None
        self._outbox = None
        self._inbox: dict[str, bytearray] = {}

    def setup(self, setup) -> int:
        """Build the host from the shipped data (a device error keeps its type for the caller)."""
        if self._not_loaded is not None:
            self._not_loaded.check()
        check_data_on_node(setup.data)
        self.host = self._host_class(setup, threads=self.threads)
        mark("client actor: host ready")
        return os.getpid()

    def placement(self) -> dict:
        """Where this actor's clients train: the resolved device and Ray's GPU ids."""
        return {"device": self.host.device.type, "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def where(self) -> tuple[int, str]:
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def _hear_of(self, lost) -> None:
        """The uploads of this actor's clients that did not arrive, as (round, client ids)."""
        for round, client_ids in lost:
            self.host.notify_dropped(round, client_ids)

    # --- checkpoint shards: written / read in place, or shipped in chunks across nodes
    def save_states(self, path: str, lost=()) -> dict:
        self._hear_of(lost)
        return self.host.save_states(path)

    def save_states_to_buffer(self, lost=()) -> dict:
        self._hear_of(lost)
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

    def run_round(self, round, client_ids, broadcast, evaluate, lost=(), now=None):
        self._hear_of(lost)
        return self.host.run_round(round, client_ids, broadcast, evaluate, now) if client_ids else []

    def state_nbytes(self) -> int:
        return self.host.state_nbytes()

    def rss_bytes(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@functools.cache
def client_actor_class():
    """:class:`ClientActor` as a Ray actor class (``max_restarts=0``: see engine.ray.executor)."""
    return ray.remote(max_restarts=0)(ClientActor)
