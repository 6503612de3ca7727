"""Where run folders and sweeps live: a local path, a shared filesystem, or any URI pyarrow reads.

Storage follows Ray Tune's model (``RunConfig(storage_path, storage_filesystem)``): a location
is a pyarrow filesystem plus a path on it.

* ``/data/x`` or ``runs/x`` (relative to the current directory): the local filesystem; on a
  cluster this is only shared if every node mounts it (NFS) at the same path.
* ``s3://bucket/prefix``: :class:`pyarrow.fs.S3FileSystem`. Options (``storage_options`` of a
  sweep, ``output.storage_options`` of a run) are its keyword arguments, e.g.
  ``{endpoint_override: "http://10.0.0.9:9000", region: us-east-1}`` for an S3-compatible
  server; credentials come from the standard AWS variables (``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ...) or ``access_key`` / ``secret_key``.
  Query parameters of the URI (``?endpoint_override=...&scheme=http``) are options too.
* ``gs://bucket/prefix``: :class:`pyarrow.fs.GcsFileSystem` (options are its arguments);
  any other URI: :meth:`pyarrow.fs.FileSystem.from_uri`.

**Time-outs** (:mod:`engine.storage.remote`): on ``s3://`` and ``gs://`` a listing, probe,
creation or deletion gives up after ``HETSIM_STORAGE_TIMEOUT_S`` seconds (default 10); S3
connects within a third of it, a stalled request fails after half of it; GCS stops retrying
after a third of it (``storage_options`` may set ``connect_timeout``, ``request_timeout``,
``retry_time_limit``). Failures are a :class:`StorageUnreachable` naming the URI, the
filesystem and the likely cause.

Runs are always written on the local disk of the process that runs them; a run whose storage is
elsewhere is written to a local staging folder and copied there by :class:`DirectoryMirror`
(new and changed files only). :func:`engine.ray.node_disk.node_disk_filesystem` makes a local
folder of one node reachable from every node of a Ray cluster through a small actor on that
node (how a sweep with a local ``storage`` brings home the results of trials that ran on nodes
that do not share it).
"""
from __future__ import annotations

import datetime as dt
import io
import json
import os
import posixpath
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlparse

import pandas as pd
import pyarrow.fs as pafs

from engine.atomic import write_atomic
from engine.errors import UserError
from engine.storage.remote import (
    TIMEOUT_OPTIONS,
    StorageUnreachable,
    bounded,
    storage_timeout_s,
    timeout_defaults,
)

_BOOL_OPTIONS = ("allow_bucket_creation", "allow_bucket_deletion", "force_virtual_addressing",
                 "background_writes", "anonymous")


class StorageError(UserError, ValueError):
    """A storage location or option that cannot be used; the message says what to set."""


def is_uri(location: str | os.PathLike) -> bool:
    text = str(location)
    return "://" in text and not text.startswith("file://")


@dataclass
class Storage:
    """A folder on a pyarrow filesystem: ``fs`` and ``path`` (without scheme) plus the ``uri``
    as the user gave it (absolute for local paths)."""

    fs: pafs.FileSystem
    path: str
    uri: str
    options: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------ locations
    def child(self, *parts: str) -> "Storage":
        rel = posixpath.join(*parts) if parts else ""
        return Storage(self.fs, self._join(rel), self.uri.rstrip("/") + ("/" + rel if rel else ""),
                       self.options)

    def _join(self, rel: str = "") -> str:
        return posixpath.join(self.path, rel) if rel else self.path

    def local_path(self) -> Path | None:
        """This folder as a local path, if it is on this process's own disk; else None."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            return Path(self.path)
        # a handler that can tell (engine.ray.node_disk's) says whether it is this process's disk
        is_local = getattr(getattr(self.fs, "handler", None), "is_local", None)
        if callable(is_local) and is_local():
            return Path(self.path)
        return None

    @property
    def is_remote(self) -> bool:
        return is_uri(self.uri)

    def __str__(self) -> str:
        return self.uri

    # ------------------------------------------------------------ reading
    @property
    def bounded(self) -> bool:
        """Operations here are bounded by time-outs (object storage: :func:`bounded`)."""
        return isinstance(self.fs, (pafs.S3FileSystem, pafs.GcsFileSystem))

    @property
    def watchdog_s(self) -> float:
        """How long one listing, probe or deletion may take: the configured bound, or longer
        where ``storage_options`` gave the filesystem longer time-outs of its own (``options``
        are the given ones; the defaults of :func:`timeout_defaults` stay within the bound)."""
        own = [v.total_seconds() if isinstance(v, dt.timedelta) else v
               for k, v in self.options.items() if k in TIMEOUT_OPTIONS and isinstance(v, (int, float, dt.timedelta))]
        return max([storage_timeout_s(), *(2 * float(v) for v in own)])

    def _info(self, rel: str, what: str) -> pafs.FileInfo:
        return bounded(self, f"{what} {self._join(rel)!r}", lambda: self.fs.get_file_info(self._join(rel)))

    def exists(self, rel: str = "") -> bool:
        return self._info(rel, "looking up").type != pafs.FileType.NotFound

    def is_dir(self, rel: str = "") -> bool:
        return self._info(rel, "looking up").type == pafs.FileType.Directory

    def read_bytes(self, rel: str) -> bytes:
        def read():
            with self.fs.open_input_stream(self._join(rel)) as f:
                return f.read()

        return bounded(self, f"reading {self._join(rel)!r}", read, watchdog=False)

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def read_json(self, rel: str) -> dict[str, Any]:
        return json.loads(self.read_text(rel))

    def read_parquet(self, rel: str):
        def read():
            with self.fs.open_input_file(self._join(rel)) as f:
                return pd.read_parquet(f)

        return bounded(self, f"reading {self._join(rel)!r}", read, watchdog=False)

    def list(self, rel: str = "", dirs: bool | None = None) -> list[str]:
        """Names in a folder (sorted; [] if missing). ``dirs``: only folders / only files."""
        infos = bounded(self, f"listing {self._join(rel)!r}", lambda: self.fs.get_file_info(
            pafs.FileSelector(self._join(rel), allow_not_found=True)))
        out = []
        for info in infos:
            is_dir = info.type == pafs.FileType.Directory
            if dirs is None or dirs == is_dir:
                out.append(posixpath.basename(info.path.rstrip("/")))
        return sorted(out)

    def files(self, rel: str = "") -> list[str]:
        """Every file under a folder, as paths relative to it."""
        base = self._join(rel).rstrip("/")
        infos = bounded(self, f"listing {base!r}", lambda: self.fs.get_file_info(
            pafs.FileSelector(base, allow_not_found=True, recursive=True)))
        return sorted(posixpath.relpath(i.path, base) for i in infos if i.type == pafs.FileType.File)

    # ------------------------------------------------------------ writing
    def makedirs(self, rel: str = "") -> None:
        bounded(self, f"creating {self._join(rel)!r}", lambda: self.fs.create_dir(self._join(rel), recursive=True))

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a file whole. Local files are replaced atomically (temp file + rename)."""
        target = self._join(rel)
        parent = posixpath.dirname(target)
        if parent:
            self.fs.create_dir(parent, recursive=True)
        if isinstance(self.fs, pafs.LocalFileSystem):
            write_atomic(target, lambda f: f.write(data))
            return

        def put():
            with self.fs.open_output_stream(target) as f:  # object stores: a PUT is atomic
                f.write(data)

        bounded(self, f"writing {target!r}", put, watchdog=False)

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def write_parquet(self, rel: str, df) -> None:
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        self.write_bytes(rel, buf.getvalue())

    def delete(self, rel: str) -> None:
        info = self._info(rel, "looking up")
        target = self._join(rel)
        if info.type == pafs.FileType.Directory:
            bounded(self, f"deleting {target!r}", lambda: self.fs.delete_dir(target))
        elif info.type == pafs.FileType.File:
            bounded(self, f"deleting {target!r}", lambda: self.fs.delete_file(target))

    def upload(self, local_dir: str | Path) -> None:
        """Copy a local folder here (every file; see :class:`DirectoryMirror` for increments)."""
        DirectoryMirror(local_dir, self).sync()

    def download(self, local_dir: str | Path) -> None:
        """Copy this folder's files into a local folder."""
        local_dir = Path(local_dir)
        for rel in self.files():
            target = local_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.read_bytes(rel))


# ---------------------------------------------------------------- opening a location


def _filesystem_for(scheme: str, options: dict[str, Any]) -> pafs.FileSystem:
    try:
        if scheme in ("s3", "s3a"):
            return pafs.S3FileSystem(**options)
        if scheme in ("gs", "gcs"):
            return pafs.GcsFileSystem(**options)
    except TypeError as err:  # an option the filesystem does not take
        name = "S3FileSystem" if scheme in ("s3", "s3a") else "GcsFileSystem"
        raise StorageError(f"storage options for {scheme}:// (pyarrow.fs.{name}): {err}") from None
    raise StorageError(f"storage options are only supported for s3:// and gs:// (got {scheme}://)")


def _query_options(query: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in parse_qsl(query):
        out[key] = value.lower() in ("1", "true", "yes") if key in _BOOL_OPTIONS else value
    return out


def _aws_environment() -> dict[str, Any]:
    """The standard AWS variables of this process as S3FileSystem options.

    pyarrow reads them lazily where the filesystem is used, so a filesystem pickled to another
    node (a Tune trial) would use *that* node's environment; as options they travel with it.
    Without credentials here, each node keeps its own default chain (e.g. an instance role).
    """
    env = os.environ
    out: dict[str, Any] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        out["endpoint_override"] = endpoint
    # without a region pyarrow may ask AWS where the bucket is (no network on clusters with
    # private S3-compatible servers); us-east-1 is what such servers accept
    out["region"] = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        out["access_key"], out["secret_key"] = env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            out["session_token"] = env["AWS_SESSION_TOKEN"]
    return out


def open_storage(location: str | os.PathLike | Storage, options: dict[str, Any] | None = None) -> Storage:
    """A :class:`Storage` for a local path or a URI (see the module docstring)."""
    if isinstance(location, Storage):
        return location
    text = str(location)
    options = dict(options or {})
    if not is_uri(text):
        if options:
            raise StorageError(
                f"storage options {sorted(options)} apply to URIs (s3://, gs://), not to the local "
                f"path {text!r}")
        if text.startswith("file://"):
            text = text[len("file://"):]
        path = Path(text).expanduser().resolve()
        return Storage(pafs.LocalFileSystem(), path.as_posix(), str(path))
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if scheme in ("s3", "s3a", "gs", "gcs"):
        if not parsed.netloc:
            raise StorageError(f"storage {text!r}: the URI has no bucket ({scheme}://BUCKET/prefix)")
        opts = {**_query_options(parsed.query), **options}
        if scheme in ("s3", "s3a"):
            opts = {**_aws_environment(), **opts}
        fs = _filesystem_for(scheme, timeout_defaults(scheme, opts))  # opts: as given, for readers
        path = (parsed.netloc + parsed.path).rstrip("/")
        uri = f"{scheme}://{path}"
        return Storage(fs, path, uri, opts)
    if options:
        _filesystem_for(scheme, options)  # raises: options unsupported for this scheme
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except Exception as err:  # noqa: BLE001 - pyarrow raises ArrowInvalid / OSError for unknown schemes
        raise StorageError(f"storage {text!r}: pyarrow cannot open this URI: {err}") from None
    return Storage(fs, path.rstrip("/"), text.rstrip("/"), {})


def check_writable(storage: Storage) -> None:
    """Create the folder and write/read/delete a probe file: fail early with a clear message."""
    probe = f".hetsim-probe-{uuid.uuid4().hex[:8]}"
    try:
        storage.makedirs()
        storage.write_bytes(probe, b"ok")
        ok = storage.read_bytes(probe) == b"ok"
        storage.delete(probe)
    except StorageUnreachable:  # its message already names the URI and the likely cause
        raise
    except Exception as err:  # noqa: BLE001 - whatever the filesystem raises, said with the hint below
        raise StorageError(
            f"storage {storage.uri}: cannot write there ({type(err).__name__}: {err}); check the "
            "path, the bucket, the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and "
            "endpoint options") from None
    if not ok:
        raise StorageError(f"storage {storage.uri}: a file written there reads back differently")


# ---------------------------------------------------------------- mirroring a local folder


class DirectoryMirror:
    """Keeps ``remote`` a copy of the local folder ``local_dir``.

    :meth:`sync` uploads files that are new or changed (size or mtime) since the last sync and
    deletes remote files that were removed locally (e.g. a run's ``_parts/`` once compacted).
    ``manifest.json`` and ``trial.json`` go last, so a reader never sees a status that is newer
    than the tables. The first sync also removes remote files that do not exist locally (left
    by an earlier attempt).
    """

    LAST = ("manifest.json", "trial.json")

    def __init__(self, local_dir: str | Path, remote: Storage):
        self.local_dir = Path(local_dir)
        self.remote = remote
        self._sent: dict[str, tuple[int, int]] | None = None

    def _local_files(self) -> dict[str, tuple[int, int]]:
        out = {}
        if not self.local_dir.exists():
            return out
        for root, _, names in os.walk(self.local_dir):
            for name in names:
                if ".tmp" in name:  # a file being written atomically (temp + rename)
                    continue
                if name.startswith("."):  # this machine's own (the run folder's lock)
                    continue
                p = Path(root) / name
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                out[p.relative_to(self.local_dir).as_posix()] = (st.st_size, st.st_mtime_ns)
        return out

    def sync(self) -> int:
        """Upload what changed; returns the number of files uploaded."""
        if self._sent is None:
            self._sent = {rel: (-1, -1) for rel in self.remote.files()}
        now = self._local_files()
        changed = [rel for rel, stamp in now.items() if self._sent.get(rel) != stamp]
        changed.sort(key=lambda rel: (posixpath.basename(rel) in self.LAST, rel))
        for rel in changed:
            try:
                data = (self.local_dir / rel).read_bytes()
            except FileNotFoundError:  # removed while we were syncing: next time
                continue
            self.remote.write_bytes(rel, data)
            self._sent[rel] = now[rel]
        gone = [rel for rel in self._sent if rel not in now]
        for rel in gone:
            self.remote.delete(rel)
            del self._sent[rel]
        folders = set()
        for rel in gone:  # every folder above a deleted file that no longer exists locally
            folder = posixpath.dirname(rel)
            while folder and not (self.local_dir / folder).exists():
                folders.add(folder)
                folder = posixpath.dirname(folder)
        for folder in sorted(folders, key=len, reverse=True):
            self.remote.delete(folder)
        return len(changed)
