"""Executors run the client side of a round; the driver's round loop is written against
:class:`Executor` only, so the in-process and the Ray executors are interchangeable."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from algorithms.base import Broadcast, ClientResult

if TYPE_CHECKING:  # engine.runtime imports torch: only the processes that host clients need it
    from engine.clients.host import ClientHost, HostSetup


class Executor(ABC):
    # set by the run's checkpoint callback: where a replacement client host restores from
    recovery_checkpoint: Path | None = None
    run_dir: Path | None = None

    @abstractmethod
    def start(self, setup: HostSetup) -> None:
        """Ship the dataset, profiles and method to the client hosts (once)."""

    @abstractmethod
    def run_round(
        self, round: int, client_ids: list[int], broadcast: Broadcast, evaluate: bool
    ) -> list[ClientResult]:
        """Run the given clients; results come back in the order of ``client_ids``."""

    @abstractmethod
    def notify_dropped(self, round: int, client_ids: list[int]) -> None:
        """Tell the hosts which clients' uploads did not arrive in ``round``."""

    @abstractmethod
    def save_client_states(self, directory: Path) -> list[dict]:
        """Write every client's state into ``directory`` (one shard per host); returns the
        shards' descriptions (file, host, num_hosts, clients, bytes)."""

    @abstractmethod
    def load_client_states(self, directory: Path, shards: list[dict]) -> None:
        """Give every host the states of its clients from a checkpoint's shards."""

    def drain_faults(self) -> list[dict]:
        """Incidents (a host died and was replaced) since the last call: faults.parquet rows."""
        return []

    def close(self) -> None:
        """Release hosts and resources."""

    def describe(self) -> dict:
        return {"kind": type(self).__name__}


class InProcessExecutor(Executor):
    """All clients in this process, one after another: the reference for determinism."""

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.host: ClientHost | None = None
        self._caller_threads: int | None = None

    def start(self, setup: HostSetup) -> None:
        import torch

        from engine.clients.host import ClientHost

        self._caller_threads = torch.get_num_threads()
        self._caller_deterministic = (torch.are_deterministic_algorithms_enabled(),
                                      torch.is_deterministic_algorithms_warn_only_enabled())
        self.host = ClientHost(setup, threads=self.threads)

    def close(self) -> None:
        import torch

        if self._caller_threads is not None:  # the host shares this process: give it back
            torch.set_num_threads(self._caller_threads)
            self._caller_threads = None
            mode, warn_only = self._caller_deterministic
            # only if the host changed it (a CUDA host): the call imports torch._inductor (~1 s)
            if (torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled()) != (mode, warn_only):
                torch.use_deterministic_algorithms(mode, warn_only=warn_only)

    def run_round(self, round, client_ids, broadcast, evaluate):
        assert self.host is not None, "start() first"
        return self.host.run_round(round, client_ids, broadcast, evaluate)

    def notify_dropped(self, round, client_ids):
        self.host.notify_dropped(round, client_ids)

    def save_client_states(self, directory):
        from engine.checkpoint.snapshot import shard_name

        info = self.host.save_states(Path(directory) / shard_name(0))
        return [{"file": shard_name(0), "host": 0, "num_hosts": 1, **info}]

    def load_client_states(self, directory, shards):
        from engine.checkpoint.snapshot import shards_for

        self.host.load_states([Path(directory) / s["file"] for s in shards_for(shards, 1, 0)], 1, 0)

    def describe(self) -> dict:
        from engine.clients.device import describe_device

        out = {"kind": "inprocess", "hosts": 1}
        if self.host is not None:
            out.update(describe_device(self.host.device))
        return out
