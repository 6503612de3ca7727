"""One Ray node's local folder as a pyarrow filesystem usable from every node of the cluster.

How a sweep whose ``storage`` is a local path on a cluster brings home the results of trials
that ran on nodes that do not share that folder: the nodes that see the folder (the owner's
marker file is there with the same token) write to it directly, the others through a small
actor pinned to the owner's node (:func:`node_disk_filesystem`).

The marker's token and the actor's name stay the same for a folder: Tune keeps the handlers of
a sweep's trials in its saved state, so a resumed sweep (its first driver killed) must serve them
under that name again. The name is also the folder's lock on the cluster: while one driver's
actor holds it, another driver cannot use the folder.
"""
from __future__ import annotations

import io
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import ray
from ray.exceptions import ActorAlreadyExistsError, GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.atomic import write_atomic
from engine.errors import UserError
from engine.trace import mark

MARKER = ".hetsim-storage"  # written by the owner of a local storage: who sees it, shares it
HOLDER_WAIT_S = 30.0  # how long a killed driver's actor may keep the folder's name before it is refused


class StorageInUseError(UserError):
    """Another live Ray driver serves this storage folder: another sweep runs in it."""


class StorageActorGone(UserError, OSError):
    """A node that does not see the storage folder finds no actor serving it: its driver ended."""


class NodeDiskHandler(pafs.FileSystemHandler):
    """A pyarrow filesystem handler for the local disk of one Ray node (the owner).

    On the owner, and on any node that sees the same folder (a shared mount: the owner's marker
    file is there with the same token), operations go straight to the local filesystem; on the
    others they go through the owner's :func:`_node_disk_actor`. Pickles to its few fields, so
    it can travel inside Tune's storage context to every trial.
    """

    def __init__(self, actor_name: str, namespace: str, root: str, token: str):
        self.actor_name, self.namespace, self.root, self.token = actor_name, namespace, root, token
        self._local: bool | None = None
        self._actor = None

    def __reduce__(self):
        return (NodeDiskHandler, (self.actor_name, self.namespace, self.root, self.token))

    def is_local(self) -> bool:
        if self._local is None:
            try:
                self._local = (Path(self.root) / MARKER).read_text().strip() == self.token
            except OSError:
                self._local = False
        return self._local

    def _call(self, name: str, *args):
        if self.is_local():
            return getattr(_LOCAL_OPS, name)(*args)
        if self._actor is None:
            try:
                self._actor = ray.get_actor(self.actor_name, namespace=self.namespace)
            except ValueError:
                raise StorageActorGone(
                    f"storage {self.root} is the local disk of another Ray node and its actor "
                    f"{self.actor_name} is gone (the sweep that served it ended): resume the sweep with "
                    f"`hetsim sweep --resume {self.root} --address <cluster>` on the node that holds it"
                ) from None
        return ray.get(getattr(self._actor, name).remote(*args))

    # the FileSystemHandler interface
    def get_type_name(self):
        return "hetsim-node-disk"

    def normalize_path(self, path):
        return path

    def equals(self, other):
        return isinstance(other, NodeDiskHandler) and (other.actor_name, other.root) == (self.actor_name, self.root)

    def get_file_info(self, paths):
        return [pafs.FileInfo(p, pafs.FileType(t), size=s, mtime_ns=m)
                for p, (t, s, m) in zip(paths, self._call("file_info", list(paths)))]

    def get_file_info_selector(self, selector):
        rows = self._call("file_info_selector", selector.base_dir, selector.allow_not_found,
                          selector.recursive)
        return [pafs.FileInfo(p, pafs.FileType(t), size=s, mtime_ns=m) for p, t, s, m in rows]

    def create_dir(self, path, recursive):
        self._call("create_dir", path, recursive)

    def delete_dir(self, path):
        self._call("delete_dir", path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self._call("delete_dir_contents", path, missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("refusing to delete the contents of the root folder")

    def delete_file(self, path):
        self._call("delete_file", path)

    def move(self, src, dest):
        self._call("move", src, dest)

    def copy_file(self, src, dest):
        self._call("copy_file", src, dest)

    def open_input_stream(self, path):
        return pa.BufferReader(self._call("read", path))

    def open_input_file(self, path):
        return self.open_input_stream(path)

    def open_output_stream(self, path, metadata):
        return pa.PythonFile(_UploadOnClose(self, path, append=False), mode="w")

    def open_append_stream(self, path, metadata):
        return pa.PythonFile(_UploadOnClose(self, path, append=True), mode="w")


class _UploadOnClose(io.RawIOBase):
    """A writable file whose bytes are written at the owner when it is closed."""

    def __init__(self, handler: NodeDiskHandler, path: str, append: bool):
        self.handler, self.path, self.append = handler, path, append
        self.buf = io.BytesIO()

    def writable(self):
        return True

    def write(self, data):
        return self.buf.write(data)

    def close(self):
        if not self.closed:
            self.handler._call("write", self.path, self.buf.getvalue(), self.append)
        super().close()


class _LocalOps:
    """The operations a :class:`NodeDiskHandler` needs, on this process's local disk."""

    fs = pafs.LocalFileSystem()

    def file_info(self, paths):
        return [(int(i.type), i.size, i.mtime_ns) for i in self.fs.get_file_info(paths)]

    def file_info_selector(self, base_dir, allow_not_found, recursive):
        sel = pafs.FileSelector(base_dir, allow_not_found=allow_not_found, recursive=recursive)
        return [(i.path, int(i.type), i.size, i.mtime_ns) for i in self.fs.get_file_info(sel)]

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def read(self, path) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write(self, path, data: bytes, append: bool) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if append:
            with open(path, "ab") as f:
                f.write(data)
            return
        write_atomic(path, lambda f: f.write(data))


_LOCAL_OPS = _LocalOps()


def _node_disk_actor_class():
    @ray.remote(num_cpus=0, max_concurrency=8, max_restarts=0)
    class NodeDisk(_LocalOps):
        def __init__(self, job_id: str):
            self.job_id = job_id  # the driver that owns it (the actor ends with that driver)

        def ready(self) -> str:
            return ray.get_runtime_context().get_node_id()

        def owner(self) -> str:
            return self.job_id

    return NodeDisk


def folder_token(root: Path) -> str:
    """The token in ``root``'s marker, written there first if it has none (or a damaged one)."""
    marker = root / MARKER
    try:
        token = marker.read_text().strip()
    except FileNotFoundError:
        token = ""
    if not re.fullmatch(r"[0-9a-f]{32}", token):
        token = uuid.uuid4().hex
        write_atomic(marker, lambda f: f.write(f"{token}\n".encode()))
    return token


def node_disk_filesystem(root: str | Path, namespace: str = "hetsim",
                         holder_wait_s: float = HOLDER_WAIT_S) -> pafs.PyFileSystem:
    """A pyarrow filesystem for the local folder ``root`` of this node, usable from every node
    of the Ray cluster (call it in the Ray driver; the actor lives as long as the driver).

    ``<root>/.hetsim-storage`` holds the folder's token (kept when it is there: see the module
    docstring): nodes that find it with that token share the folder and write directly, the
    others go through an actor pinned to this node, named after the token. The name held by
    another driver's actor is waited for ``holder_wait_s`` (a killed driver's actor goes within
    seconds), then :class:`StorageInUseError`.
    """
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    token = folder_token(root)
    name = f"hetsim-storage-{token[:16]}"
    _KEEP_ALIVE[name] = _start_actor(name, namespace, root, holder_wait_s)  # the handle keeps it alive
    return pafs.PyFileSystem(NodeDiskHandler(name, namespace, root.as_posix(), token))


def _owner(name: str, namespace: str) -> str | None:
    """The job id of the driver whose actor holds ``name``, or None (none, or it is ending)."""
    try:
        return ray.get(ray.get_actor(name, namespace=namespace).owner.remote(), timeout=10)
    except (ValueError, RayActorError, GetTimeoutError):
        return None


def _start_actor(name: str, namespace: str, root: Path, holder_wait_s: float):
    """The actor ``name`` of this driver: started, or the one it started before."""
    here = ray.get_runtime_context().get_node_id()
    job = ray.get_runtime_context().get_job_id()
    deadline = time.monotonic() + holder_wait_s
    while True:
        try:
            actor = _node_disk_actor_class().options(
                name=name, namespace=namespace,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(job)
        except ActorAlreadyExistsError:
            holder = _owner(name, namespace)
            if holder == job:  # the creating handle: the actor ends once it is dropped
                return _KEEP_ALIVE.get(name) or ray.get_actor(name, namespace=namespace)
            if time.monotonic() > deadline:
                raise StorageInUseError(
                    f"storage {root} is in use by another driver on this Ray cluster (job {holder}, "
                    f"actor {name}): another sweep runs in this folder; wait for it to end or stop it"
                ) from None
            mark(f"storage: {name} held by job {holder}, waiting")
            time.sleep(0.5)
            continue
        ray.get(actor.ready.remote())
        mark(f"storage: {name} started")
        return actor


_KEEP_ALIVE: dict[str, Any] = {}


def nodes_sharing(root: str | Path, timeout_s: float = 60.0) -> dict[str, bool]:
    """For every alive Ray node: does it see ``<root>/.hetsim-storage`` as this node wrote it?

    Runs one tiny task per node (0 CPUs). Returns ``{node_ip (node id prefix): shared}``.
    """
    marker = (Path(root) / MARKER).read_text()

    @ray.remote(num_cpus=0, max_retries=0)
    def _sees(path: str, expected: str) -> bool:
        try:
            return Path(path).read_text() == expected
        except OSError:
            return False

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = {
        f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})": _sees.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(str(Path(root) / MARKER), marker)
        for n in nodes
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    return {name: (ref in ready and bool(ray.get(ref))) for name, ref in refs.items()}
