"""A federated Parquet table read from disk client by client (``parquet`` with ``on_disk: true``).

Parquet cannot read an arbitrary row range cheaply (a row group is the smallest read), so the
first use of a table writes a *row cache*: its features as raw float32 and its labels as int64,
in client order (each client's training rows, then its test rows), plus per-client counts.
Building it streams the table twice (the label, client and split columns, then the features
one record batch at a time), so the peak memory is a few int64 per row, never the features.
After that a client's rows are two ``pread`` calls: a round reads its clients' rows only, and a
process maps nothing it does not read.

The cache is a folder under ``dataset.params.cache_dir`` (default: the user cache,
:func:`engine.cache.cache_dir`, ``tables/``), named by the files' paths, sizes and
modification times and the column choices; a changed table gets a new one. Deleting it is
safe. It is written to a temporary folder and renamed, so an interrupted build leaves nothing
half-written. Every process that hosts clients reads it: on a cluster whose nodes do not share
a disk, put ``cache_dir`` on a disk they all mount, or use the in-memory ``parquet`` (its rows
travel through Ray's object store); a client actor on a node without the cache refuses to start,
naming the node (:func:`engine.ray.client_actor.check_data_on_node`).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib

import numpy as np

from engine.cache import cache_dir as user_cache_dir
from engine.data.tabular import (
    TableDatasetError,
    _to_matrix,
    batch_is_test,
    batch_labels,
    check_labels,
    open_table,
    sample_shape,
)

FORMAT = 1  # bump when the cache's layout changes
_FLUSH_BYTES = 256 << 20  # remap the feature file after this many bytes: its pages stay out of RSS


class DiskTableSource:
    """Client rows from a row cache (see the module docstring); picklable (reopens its files)."""

    def __init__(self, folder: str):
        self.folder = folder
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        self.name, self.num_classes = meta["name"], int(meta["num_classes"])
        self.width = int(meta["width"])
        self.input_shape = tuple(meta["shape"]) if meta["shape"] else (self.width,)
        self.client_names = meta["client_names"]
        with np.load(os.path.join(folder, "counts.npz"), allow_pickle=False) as npz:
            self.sizes, test = npz["train"], npz["test"]
        self.test_sizes = test if meta["has_split"] else None
        self.start = np.zeros(len(self.sizes) + 1, dtype=np.int64)  # first row of each client's block
        np.cumsum(self.sizes + test, out=self.start[1:])
        self._fds: tuple[int, int] | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fds"] = None  # file descriptors are per process
        return state

    @classmethod
    def open(cls, *, path, label_column: str = "label", client_column: str | None = None,
             split_column: str | None = None, features=None, shape=None, num_classes: int | None = None,
             cache_dir: str | None = None, storage_options: dict | None = None) -> "DiskTableSource":
        """The table's row cache, built first if it is missing."""
        if client_column is None:
            raise ValueError("parquet: on_disk: true needs dataset.params.client_column (the natural clients "
                             "whose rows are read when they take part)")
        try:
            files, data, cols = open_table(path, label_column, client_column, split_column, features,
                                           storage_options)
            folder = _cache_folder(data, cache_dir, [label_column, client_column, split_column, cols, shape,
                                                     num_classes])
            if not os.path.exists(os.path.join(folder, "meta.json")):
                _build(folder, str(path), data, cols, label_column, client_column, split_column, shape, num_classes)
            return cls(folder)
        except TableDatasetError as err:
            raise ValueError(f"parquet: {err}") from None

    def rows(self, c: int):
        fx, fy = self._open()
        s, n, t = int(self.start[c]), int(self.sizes[c]), int(self.start[c + 1] - self.start[c] - self.sizes[c])
        x, y = _read(fx, s * self.width, (n + t) * self.width, np.float32), _read(fy, s, n + t, np.int64)
        x = x.reshape((n + t, *self.input_shape))
        if self.test_sizes is None:
            return x, y, None, None
        return x[:n], y[:n], x[n:], y[n:]

    def _open(self) -> tuple[int, int]:
        if self._fds is None:
            self._fds = (os.open(os.path.join(self.folder, "features.f32"), os.O_RDONLY),
                         os.open(os.path.join(self.folder, "labels.i64"), os.O_RDONLY))
        return self._fds


def _read(fd: int, first: int, count: int, dtype) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    buf = os.pread(fd, count * size, first * size)
    if len(buf) != count * size:
        raise OSError(f"row cache truncated: wanted {count * size} bytes at {first * size}, got {len(buf)}")
    return np.frombuffer(buf, dtype=dtype).copy()  # writable, as the eager arrays are


def _cache_folder(data, cache_dir: str | None, choices: list) -> str:
    """Named by the files' locations, sizes and modification times (local or object storage)."""
    import pyarrow.fs as pafs  # here: see engine.data.tabular._feature_columns

    fs = data.filesystem
    local = isinstance(fs, pafs.LocalFileSystem)
    names = [os.path.realpath(f) if local else f"{fs.type_name}://{f}" for f in data.files]
    stats = [(n, i.size, i.mtime_ns) for n, i in zip(names, fs.get_file_info(data.files))]
    key = zlib.crc32(json.dumps([FORMAT, stats, choices], default=str).encode())
    base = os.path.expanduser(cache_dir) if cache_dir else os.path.join(user_cache_dir(), "tables")
    common = os.path.commonpath([n.split("://", 1)[-1] for n in names]) if len(names) > 1 else names[0]
    stem = os.path.basename(common.split("://", 1)[-1].rstrip("/")).removesuffix(".parquet") or "table"
    return os.path.join(base, f"{stem}-{key:08x}")


def _client_codes(chunks: list) -> tuple[np.ndarray, list[str]]:
    """Client numbers 0..N-1 in sorted order of the values as text (the eager loader's rule)."""
    import pyarrow as pa  # here: see engine.data.tabular._feature_columns
    import pyarrow.compute as pc

    column = pa.chunked_array(chunks)
    if column.null_count:
        raise TableDatasetError("the client column has missing (null) rows")
    encoded = pc.dictionary_encode(column).combine_chunks()
    values = np.asarray(encoded.dictionary.to_pylist(), dtype=object).astype(str)
    order = np.argsort(values, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[encoded.indices.to_numpy(zero_copy_only=False)], [str(v) for v in values[order]]


def _build(folder: str, path: str, data, cols, label_column, client_column, split_column, shape, num_classes):
    n = data.count_rows()
    if n == 0:
        raise TableDatasetError(f"dataset path {path!r} has no rows")
    # pass 1: labels, clients and splits (a few bytes per row)
    y = np.empty(n, dtype=np.int64)
    is_test = np.zeros(n, dtype=bool)
    owners, at = [], 0
    for batch in data.to_batches(columns=[label_column, client_column, *([split_column] if split_column else [])]):
        rows = batch.num_rows
        y[at:at + rows] = batch_labels(batch, label_column)
        owners.append(batch.column(client_column))
        if split_column:
            is_test[at:at + rows] = batch_is_test(batch, split_column)
        at += rows
    k = check_labels(y, label_column, num_classes)
    code, names = _client_codes(owners)
    del owners
    train = np.bincount(code[~is_test], minlength=len(names))
    test = np.bincount(code[is_test], minlength=len(names))
    empty = np.flatnonzero(train == 0)
    if empty.size:
        raise TableDatasetError(f"client {names[empty[0]]!r} has no training rows (only test rows); "
                                f"{empty.size} client(s) like it")
    order = np.lexsort((is_test, code))  # client-major, its training rows first; stable within each
    del code, is_test
    dest = np.empty(n, dtype=np.int64)
    dest[order] = np.arange(n, dtype=np.int64)
    y = y[order]
    del order
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=os.path.dirname(folder))
    try:
        y.tofile(os.path.join(tmp, "labels.i64"))
        del y
        width = _write_features(os.path.join(tmp, "features.f32"), data, cols, dest, n, path)
        shape = sample_shape(shape, width)
        np.savez(os.path.join(tmp, "counts.npz"), train=train, test=test)
        meta = dict(format=FORMAT, name=f"parquet:{os.path.basename(path.rstrip('/'))}", num_classes=k,
                    width=width, shape=list(shape) if shape else None, has_split=bool(split_column and test.any()),
                    client_names=names, rows=n)
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        try:
            os.rename(tmp, folder)
        except OSError:  # another process built it first: theirs is as good
            if not os.path.exists(os.path.join(folder, "meta.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_features(file: str, data, cols, dest: np.ndarray, n: int, path: str) -> int:
    """pass 2: each record batch's features scattered to their rows' places in ``file``."""
    out, width, at, written = None, None, 0, 0
    for batch in data.to_batches(columns=cols):
        rows = batch.num_rows
        if not rows:
            continue
        feats = _to_matrix(batch, cols, path)
        if not np.isfinite(feats).all():
            raise TableDatasetError("the features have NaN or infinite values")
        if width is None:
            width = feats.shape[1]
            # raw rows, no header: a client's rows are then one pread at row * width * 4
            out = np.memmap(file, mode="w+", dtype=np.float32, shape=(n, width))
        elif out is None:
            out = np.memmap(file, mode="r+", dtype=np.float32, shape=(n, width))
        out[dest[at:at + rows]] = feats
        at += rows
        written += feats.nbytes
        if written >= _FLUSH_BYTES:  # unmap: written pages leave this process's RSS
            out.flush()
            out, written = None, 0
    if out is not None:
        out.flush()
        del out
    if os.path.getsize(file) != n * width * 4:
        raise OSError(f"row cache {file}: {os.path.getsize(file)} bytes written, {n * width * 4} expected")
    return width
