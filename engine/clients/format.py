"""The checkpoint file format: state blobs and client-state shards, with no engine imports.

A ``.pt`` file holds ``{"format", "meta" (a JSON string), "tensors"}`` written with
``torch.save`` and read with ``weights_only=True``: values are encoded by the one codec of
:mod:`algorithms.state`, so nothing is ever unpickled. A shard holds the states of the clients
of one client host, each encoded on its own, so that a host can load a subset; shards are read
memory-mapped, so a host that needs a few clients of a large shard reads only those.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from algorithms.state import decode, encode

BLOB_FORMAT = "hetsim-state/1"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, found or restored."""


def shard_name(host: int) -> str:
    return f"clients-{host:04d}.pt"


# ------------------------------------------------------------------------------ blobs
def _write(obj: dict, dest: str | Path | io.BufferedIOBase) -> int:
    """``torch.save`` to a path or a binary file object; returns the bytes written.

    Not fsynced: a checkpoint survives a crash of the process at any moment (the folder is
    renamed into place when complete), and fsync would cost most of the write time. After a
    power loss the newest checkpoint may be incomplete; its file sizes then do not match its
    ``checkpoint.json`` and resuming falls back to the one before (see ``checkpoint.keep``).
    """
    if isinstance(dest, (str, Path)):
        with open(dest, "wb") as f:
            torch.save(obj, f)
        return os.path.getsize(dest)
    start = dest.tell()
    torch.save(obj, dest)
    return dest.tell() - start


def save_blob(value: Any, dest: str | Path | io.BufferedIOBase, path: str = "state") -> int:
    """Encode ``value`` into ``dest`` (a path or a binary file object); returns its bytes."""
    tensors: list[torch.Tensor] = []
    tree = encode(value, tensors, path)
    return _write({"format": BLOB_FORMAT, "meta": json.dumps(tree, separators=(",", ":")), "tensors": tensors}, dest)


def _load_raw(src: str | Path | bytes) -> dict:
    try:
        if isinstance(src, (bytes, bytearray, memoryview)):
            obj = torch.load(io.BytesIO(src), weights_only=True)
        else:
            obj = torch.load(src, weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - torch and pickle raise several types for a damaged file
        what = src if not isinstance(src, (bytes, bytearray, memoryview)) else "a client-state shard"
        raise CheckpointError(f"{what} is damaged, not a checkpoint file torch can read "
                              f"({type(err).__name__}: {str(err).strip()[:200]})") from None
    if not isinstance(obj, dict) or obj.get("format") != BLOB_FORMAT:
        raise CheckpointError(f"{src if not isinstance(src, (bytes, bytearray, memoryview)) else 'shard'} "
                              f"is not a {BLOB_FORMAT} file")
    return obj


def load_blob(src: str | Path | bytes) -> Any:
    obj = _load_raw(src)
    return decode(json.loads(obj["meta"]), obj["tensors"], copy=not isinstance(src, (bytes, bytearray)))


# ------------------------------------------------------------------------------ client shards
def save_client_states(states: dict[int, dict[str, Any]], dest: str | Path | io.BufferedIOBase) -> dict:
    """One shard: every client's state, each encoded on its own (so a host can load a subset,
    and an error names the client)."""
    tensors: list[torch.Tensor] = []
    trees = [[int(cid), encode(state, tensors, f"client {cid} state")] for cid, state in states.items()]
    meta = json.dumps({"clients": trees}, separators=(",", ":"))
    nbytes = _write({"format": BLOB_FORMAT, "meta": meta, "tensors": tensors}, dest)
    return {"clients": len(trees), "bytes": nbytes}


def load_client_states(sources: Iterable[str | Path | bytes], owns: Callable[[int], bool]) -> dict[int, dict]:
    """The states of the clients ``owns`` accepts, from every shard in ``sources``."""
    out: dict[int, dict] = {}
    for src in sources:
        obj = _load_raw(src)
        copy = not isinstance(src, (bytes, bytearray))  # memory-mapped: take our own copy
        for cid, tree in json.loads(obj["meta"])["clients"]:
            if owns(cid):
                out[cid] = decode(tree, obj["tensors"], copy=copy)
    return dict(sorted(out.items()))


def shard_entries(info: dict, host: int, num_hosts: int) -> list[dict]:
    """checkpoint.json's entries for one host's shards (``ClientHost.save_states``'s ``files``,
    oldest first; ``linked``: hard-linked from the previous checkpoint, no bytes written)."""
    files = info.get("files") or [{"file": shard_name(host), "clients": info["clients"], "bytes": info["bytes"],
                                   "linked": False}]
    return [{"file": f["file"] or shard_name(host), "host": host, "num_hosts": num_hosts,
             "clients": f["clients"], "bytes": f["bytes"], "linked": bool(f.get("linked"))} for f in files]


def shards_for(shards: list[dict], num_hosts: int, host: int) -> list[dict]:
    """Shards host ``host`` of ``num_hosts`` must read: its own if the layout is unchanged."""
    same = [s for s in shards if s["num_hosts"] == num_hosts and s["host"] == host]
    return same if same and all(s["num_hosts"] == num_hosts for s in shards) else list(shards)
