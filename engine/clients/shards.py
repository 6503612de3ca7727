"""A client host's checkpoint shards, written incrementally.

:func:`save_shards` writes the states that changed since the host's previous checkpoint
(:attr:`engine.clients.states.ClientStates.dirty`) into the new shard and *hard-links* the host's
shards of that checkpoint into the new folder (``clients-<host>-000.pt``, ``-001``, ...; no bytes
written), so a checkpoint costs what changed, not every state again, and each checkpoint folder
stays complete on its own (pruning, falling back to an older one and copying a folder work as
before). The files are listed oldest first; a later one's state of a client replaces an earlier
one's (:func:`load_shards`, :func:`engine.clients.format.load_client_states`).

One full shard is written instead when linking would make the files hold more than twice the
live states (+8) or :data:`MAX_LINKED` files, after a restore into another host layout, after a
state was removed, when the previous files are not the committed ones (a failed write: inode and
size are checked), and when the shard goes to a file object (shipped to another node, whose disk
holds nothing to link).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from engine.clients.format import load_client_states, save_client_states, shard_name
from engine.clients.states import ClientStates

MAX_LINKED = 16  # previous shards a checkpoint may link before it writes one full shard again
_TMP_SUFFIX = re.compile(r"\.tmp-\d+$")  # engine.checkpoint.snapshot writes into <name>.tmp-<pid>, then renames


def save_shards(states: ClientStates, dest, previous: list[dict] | None) -> tuple[dict, list[dict] | None]:
    """Write ``states`` to ``dest`` (a path or a file object), linking ``previous`` where it may.

    Returns ``({"clients", "bytes", "files": [{"file", "clients", "bytes", "linked"}]}, previous)``:
    the shard entries (oldest first; ``bytes``: written, linked files excluded) and what the next
    call may link (these files, where they are once the checkpoint is committed)."""
    linked = _linkable(states, dest, previous)
    if linked is None:
        info = save_client_states(states, dest)
        files = [{"file": _name(dest), "clients": info["clients"], "bytes": info["bytes"], "linked": False}]
    else:
        folder, stem = Path(dest).parent, Path(dest).stem
        files = []
        for i, prev in enumerate(linked):
            name = f"{stem}-{i:03d}.pt"
            os.link(prev["path"], folder / name)
            files.append({"file": name, "clients": prev["clients"], "bytes": prev["bytes"], "linked": True})
        delta = save_client_states({cid: states.peek(cid) for cid in sorted(states.dirty) if cid in states}, dest)
        files.append({"file": _name(dest), "clients": delta["clients"], "bytes": delta["bytes"], "linked": False})
    states.dirty.clear()
    states.removed = False
    after = None  # shipped to another node: nothing here to link next time
    if isinstance(dest, (str, Path)):
        written, final = Path(dest).parent, _committed_folder(Path(dest).parent)
        after = [{**f, "path": final / f["file"], "id": _file_id(written / f["file"])} for f in files]
    info = {"clients": len(states), "bytes": sum(f["bytes"] for f in files if not f["linked"]), "files": files}
    return info, after


def load_shards(states: ClientStates, sources: list, num_hosts: int, host: int) -> list[dict] | None:
    """Fill ``states`` with the clients of ``host`` from ``sources`` (paths or bytes, oldest
    first); returns what the next :func:`save_shards` may link: the files, when they are this
    host's own (a changed layout reads every host's shards: the next checkpoint is full)."""
    owns = lambda cid: cid % num_hosts == host  # noqa: E731
    previous = []
    for src in sources:  # in order: a later shard's state of a client replaces an earlier one's
        loaded = load_client_states([src], owns)
        states.update(loaded)
        if isinstance(src, (str, Path)):
            previous.append({"path": Path(src), "clients": len(loaded), "bytes": os.path.getsize(src),
                             "id": _file_id(Path(src))})
    states.dirty.clear()
    stem = shard_name(host).removesuffix(".pt")
    own = [p for p in previous if p["path"].name.startswith(stem)]
    return previous if previous and len(own) == len(previous) == len(sources) else None


def _linkable(states: ClientStates, dest, previous: list[dict] | None) -> list[dict] | None:
    if previous is None or states.removed or not isinstance(dest, (str, Path)) or len(previous) >= MAX_LINKED:
        return None
    if sum(p["clients"] for p in previous) + len(states.dirty) > 2 * len(states) + 8:
        return None  # mostly superseded states: compact into one full shard
    try:
        if any(_file_id(p["path"]) != p["id"] for p in previous):
            return None  # that checkpoint was not committed, or was replaced
    except OSError:
        return None
    return previous


def _name(dest) -> str:
    return Path(dest).name if isinstance(dest, (str, Path)) else ""


def _committed_folder(folder: Path) -> Path:
    return folder.with_name(_TMP_SUFFIX.sub("", folder.name))


def _file_id(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size
