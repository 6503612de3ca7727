"""Executors run the client side of a round; the driver's round loop is written against
:class:`Executor` only, so the in-process and the Ray executors are interchangeable."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from algorithms.base import Broadcast, ClientResult

if TYPE_CHECKING:  # engine.runtime imports torch: only the processes that host clients need it
    from engine.runtime import ClientHost, HostSetup


class Executor(ABC):
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

        from engine.runtime import ClientHost

        self._caller_threads = torch.get_num_threads()
        self.host = ClientHost(setup, threads=self.threads)

    def close(self) -> None:
        import torch

        if self._caller_threads is not None:  # the host shares this process: give it back
            torch.set_num_threads(self._caller_threads)
            self._caller_threads = None

    def run_round(self, round, client_ids, broadcast, evaluate):
        assert self.host is not None, "start() first"
        return self.host.run_round(round, client_ids, broadcast, evaluate)

    def notify_dropped(self, round, client_ids):
        self.host.notify_dropped(round, client_ids)

    def describe(self) -> dict:
        return {"kind": "inprocess", "hosts": 1}
