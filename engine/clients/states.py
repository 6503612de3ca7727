"""The per-client state a client host keeps (FedCSPACK's packs, ASCEND's bandit, error-feedback
residuals), within a memory budget.

In a large fleet every client that ever took part keeps its state: 100,000 FedCSPACK clients
of a 100k-parameter model would hold 40 GB. :class:`ClientStates` is a mapping that keeps at most
``executor.state_memory_mb`` in memory and spills the least recently used states beyond that
to one file each in a folder of this host (the checkpoint codec, :func:`engine.clients.format.
save_blob`: no pickle). Reading a spilled state brings it back into memory (a method may change
it in place), so only the clients of the current round need to be in memory at once.

Iteration is in client order whether a state is in memory or on disk, so a checkpoint shard
(:func:`engine.clients.format.save_client_states`) is the same either way.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np
import torch

from engine.clients.format import load_blob, save_blob


def state_nbytes(state: dict[str, Any]) -> int:
    """Bytes of a state's numpy arrays and tensors (what the budget counts)."""
    total = 0
    for v in state.values():
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, dict):
            total += state_nbytes(v)
    return total


class ClientStates(MutableMapping):
    """Client id -> state dict, in memory up to ``limit_bytes`` (None: no limit), the rest on disk."""

    def __init__(self, limit_bytes: int | None = None, spill_dir: str | None = None):
        self.limit = limit_bytes
        self._spill_root = spill_dir
        self._dir: str | None = None  # created at the first spill
        self._memory: OrderedDict[int, dict] = OrderedDict()  # least recently used first
        self._sizes: dict[int, int] = {}
        self._on_disk: dict[int, int] = {}  # client -> bytes of its spill file
        self.memory_bytes = 0
        # since the last checkpoint shard (engine.clients.host.ClientHost.save_states): the clients
        # whose state was set or read for change, and whether a state was removed (a shard that only
        # adds states cannot say that)
        self.dirty: set[int] = set()
        self.removed = False

    # ------------------------------------------------------------------ mapping
    def __getitem__(self, cid: int) -> dict:
        cid = int(cid)
        if cid in self._memory:
            self._memory.move_to_end(cid)
            return self._memory[cid]
        if cid in self._on_disk:
            path = self._path(cid)
            state = load_blob(path)
            os.remove(path)
            del self._on_disk[cid]
            self._keep(cid, state)
            return state
        raise KeyError(cid)

    def __setitem__(self, cid: int, state: dict) -> None:
        cid = int(cid)
        self._forget(cid)
        self._keep(cid, state)
        self.dirty.add(cid)

    def __delitem__(self, cid: int) -> None:
        cid = int(cid)
        if cid not in self:
            raise KeyError(cid)
        self._forget(cid)
        self.removed = True

    def __contains__(self, cid) -> bool:
        return int(cid) in self._memory or int(cid) in self._on_disk

    def __iter__(self) -> Iterator[int]:
        return iter(sorted([*self._memory, *self._on_disk]))

    def __len__(self) -> int:
        return len(self._memory) + len(self._on_disk)

    def items(self):  # without promoting every spilled state into memory (a checkpoint reads them all)
        for cid in self:
            yield cid, self.peek(cid)

    def peek(self, cid: int) -> dict:
        """The state, read from disk if spilled, without bringing it back into memory."""
        return self._memory[cid] if cid in self._memory else load_blob(self._path(cid))

    # ------------------------------------------------------------------ budget
    @property
    def spilled(self) -> int:
        return len(self._on_disk)

    @property
    def disk_bytes(self) -> int:
        return sum(self._on_disk.values())

    def _keep(self, cid: int, state: dict) -> None:
        size = state_nbytes(state)
        self._memory[cid] = state
        self._sizes[cid] = size
        self.memory_bytes += size
        if self.limit is not None:
            while self.memory_bytes > self.limit and len(self._memory) > 1:
                self._spill(next(iter(self._memory)))

    def _spill(self, cid: int) -> None:
        state = self._memory.pop(cid)
        self.memory_bytes -= self._sizes.pop(cid)
        self._on_disk[cid] = save_blob(state, self._path(cid), f"client {cid} state")

    def _forget(self, cid: int) -> None:
        if cid in self._memory:
            del self._memory[cid]
            self.memory_bytes -= self._sizes.pop(cid)
        elif cid in self._on_disk:
            os.remove(self._path(cid))
            del self._on_disk[cid]

    def _path(self, cid: int) -> str:
        if self._dir is None:
            root = self._spill_root or tempfile.gettempdir()
            os.makedirs(root, exist_ok=True)
            self._dir = tempfile.mkdtemp(prefix="hetsim-states-", dir=root)
        return os.path.join(self._dir, f"{cid}.pt")

    def close(self) -> None:
        """Delete the spill folder (the states on disk are lost: checkpoint first)."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._on_disk.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to clean with
            pass
