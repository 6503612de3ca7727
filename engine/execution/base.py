"""Executors run the client side of a round; the driver's round loop is written against
:class:`Executor` only, so the in-process and the Ray executors are interchangeable.

One call a round reaches the hosts: :meth:`Executor.run_round` carries the previous round's
lost uploads to them (:meth:`Executor.notify_dropped` only records them) and brings back, with
the results, the incidents of the hosts since the last call.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from algorithms.base import Broadcast, ClientResult

if TYPE_CHECKING:  # the client host imports torch; the Ray executor's module must not
    from engine.clients.host import HostSetup


@dataclass
class RoundReply:
    """What one :meth:`Executor.run_round` brings back."""

    results: list[ClientResult]  # in the order of the client ids asked for
    faults: list[dict] = field(default_factory=list)  # hosts that died and were replaced: faults.parquet rows


class Executor(ABC):
    # set by the run's checkpoint callback: where a replacement client host restores from
    recovery_checkpoint: Path | None = None
    run_dir: Path | None = None

    @abstractmethod
    def start(self, setup: HostSetup) -> None:
        """Ship the dataset, profiles and method to the client hosts (once)."""

    @abstractmethod
    def run_round(
        self, round: int, client_ids: list[int], broadcast: Broadcast, evaluate: bool,
        now: dict[int, dict[str, float]] | None = None,
    ) -> RoundReply:
        """Run the given clients (after delivering the lost uploads recorded since the last
        call); results come back in the order of ``client_ids``. ``now``: per client, the profile
        fields at the round's start (fleets with conditions over time)."""

    @abstractmethod
    def notify_dropped(self, round: int, client_ids: list[int]) -> None:
        """Record which clients' uploads did not arrive in ``round``; the hosts hear of it before
        they next run a client or save their states (with that call, not one of its own)."""

    @abstractmethod
    def save_client_states(self, directory: Path) -> list[dict]:
        """Write every client's state into ``directory`` (one shard per host); returns the
        shards' descriptions (file, host, num_hosts, clients, bytes)."""

    @abstractmethod
    def load_client_states(self, directory: Path, shards: list[dict]) -> None:
        """Give every host the states of its clients from a checkpoint's shards."""

    def host_of(self, client_ids) -> np.ndarray:
        """The host (0 .. hosts - 1) that runs each client; one host unless overridden."""
        return np.zeros(len(client_ids), dtype=np.int64)

    def drain_faults(self) -> list[dict]:
        """Incidents not yet returned by :meth:`run_round` (e.g. during the last checkpoint)."""
        return []

    def close(self) -> None:  # noqa: B027 - optional: an executor without resources keeps it
        """Release hosts and resources."""

    def describe(self) -> dict:
        return {"kind": type(self).__name__}
