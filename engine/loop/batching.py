"""``executor.batch_clients``: say, once per run and reason, when clients train one by one anyway.

A client host trains its clients of one architecture together only when it has two or more of
them in the call and the model draws no random numbers (dropout); otherwise those clients train
sequentially (:meth:`engine.clients.host.ClientHost.run_round_batched`). The driver knows which
host runs which client (:meth:`engine.execution.base.Executor.host_of`), so it can say so: the
hosts may be Ray actors whose logs go nowhere.
"""
from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import torch

log = logging.getLogger("hetsim")


def _arch(name: str) -> str:
    return f"architecture {name!r}" if name else "the model"


class UnbatchedNotice:
    """Logs at most one line per reason per run (a round that falls back says nothing more), and
    adds it to ``warnings`` (the manifest's list, set by the loop; under Ray the driver actor's log
    reaches no terminal, the manifest does)."""

    def __init__(self, batch_clients: bool, arch_names, client_arch: np.ndarray,
                 models: dict[str, torch.nn.Module], own_loss: str | None = None):
        """``own_loss``: the method and why batched training cannot train its clients
        (``Client.unbatched_reason``, e.g. its own ``batch_loss``: every client trains one by one),
        None if it can."""
        self.on = batch_clients
        self.own_loss = own_loss
        self.arch_of = np.asarray(arch_names, dtype=object)[np.asarray(client_arch)]
        self.random: set[str] = set()
        if batch_clients:  # only batched runs import the batched training
            from algorithms.batched_training import has_randomness

            self.random = {a for a, m in models.items() if has_randomness(m)}
        self.said: set[str] = set()
        self.warnings: list[str] = []

    def check(self, executor, client_ids, when: str) -> None:
        """``when``: the round (or wave) the clients run in, for the message."""
        if not self.on or len(self.said) == 2 or len(client_ids) == 0 or "loss" in self.said:
            return
        if self.own_loss is not None:
            self.said.add("loss")
            self._say(f"executor.batch_clients: method {self.own_loss}: its clients train one by one")
            return
        ids = np.asarray(client_ids, dtype=np.int64)
        archs = self.arch_of[ids]
        for a in sorted(self.random & set(archs)):
            if "dropout" not in self.said:
                self.said.add("dropout")
                self._say(f"executor.batch_clients: {_arch(a)} has dropout, whose draws a vmap over clients "
                          "cannot give each client as its own training would: its clients train one by one")
        if "single" in self.said:
            return
        hosts = executor.host_of(ids)
        for h in np.unique(hosts):
            counts = Counter(archs[hosts == h])
            alone = [a for a, n in counts.items() if n == 1 and a not in self.random]
            if alone:
                self.said.add("single")
                c = int(ids[(hosts == h) & (archs == alone[0])][0])
                self._say(f"executor.batch_clients: {when} gave a client host a single client of {_arch(alone[0])} "
                          f"(client {c}), which trains one by one: batching needs two or more clients of one "
                          "architecture on a host (said once per run)")
                return

    def _say(self, text: str) -> None:
        log.warning("hetsim: warning: %s", text)
        if text not in self.warnings:  # (a resumed run's manifest may have it already)
            self.warnings.append(text)
