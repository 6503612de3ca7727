"""The in-process executor: every client in this process, one after another.

The reference for determinism (same seed, same results as the Ray executor) and what unit tests
use; it runs the very same :class:`~engine.clients.host.ClientHost` a Ray client actor wraps.
"""
from __future__ import annotations

from pathlib import Path

import torch

from engine.clients.device import describe_device
from engine.clients.format import shard_entries, shard_name, shards_for
from engine.clients.host import ClientHost, HostSetup
from engine.execution.base import Executor, RoundReply


class InProcessExecutor(Executor):
    """All clients in this process, one after another: the reference for determinism."""

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.host: ClientHost | None = None
        self._caller_threads: int | None = None

    @classmethod
    def for_config(cls, cfg) -> "InProcessExecutor":
        """The executor a run of ``cfg`` gets in this process: ``executor.threads_per_actor``
        torch threads, or one. On 2 cores small models train as fast with 1 thread as with 2,
        and 2 threads slow down ~7x (spinning on both cores) once another process competes."""
        return cls(threads=cfg.executor.threads_per_actor or 1)

    def start(self, setup: HostSetup) -> None:
        self._caller_threads = torch.get_num_threads()
        self._caller_deterministic = (torch.are_deterministic_algorithms_enabled(),
                                      torch.is_deterministic_algorithms_warn_only_enabled())
        self.host = ClientHost(setup, threads=self.threads)

    def close(self) -> None:
        if self._caller_threads is not None:  # the host shares this process: give it back
            torch.set_num_threads(self._caller_threads)
            self._caller_threads = None
            mode, warn_only = self._caller_deterministic
            # only if the host changed it (a CUDA host): the call imports torch._inductor (~1 s)
            if (torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled()) != (mode, warn_only):
                torch.use_deterministic_algorithms(mode, warn_only=warn_only)

    def run_round(self, round, client_ids, broadcast, evaluate, now=None):
        assert self.host is not None, "start() first"
        return RoundReply(self.host.run_round(round, client_ids, broadcast, evaluate, now))

    def notify_dropped(self, round, client_ids):
        self.host.notify_dropped(round, client_ids)  # same process: told at once, nothing travels

    def save_client_states(self, directory):
        info = self.host.save_states(Path(directory) / shard_name(0))
        return shard_entries(info, host=0, num_hosts=1)

    def load_client_states(self, directory, shards):
        self.host.load_states([Path(directory) / s["file"] for s in shards_for(shards, 1, 0)], 1, 0)

    def describe(self) -> dict:
        out = {"kind": "inprocess", "hosts": 1}
        if self.host is not None:
            out.update(describe_device(self.host.device))
        return out
