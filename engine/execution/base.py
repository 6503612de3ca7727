"""Executors run the client side of a round; the driver's round loop is written against
:class:`Executor` only, so the in-process and the Ray executors are interchangeable."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from algorithms.base import Broadcast, ClientResult
from engine.clients.host import HostSetup


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
