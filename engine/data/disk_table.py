"""A federated Parquet table read from disk client by client (``parquet`` with ``on_disk: true``).

Parquet cannot read an arbitrary row range cheaply (a row group is the smallest read), so the
first use of a table writes a *row cache*: its features as raw float32 and its labels as int64,
plus per-client counts. With a client column (``partition.scheme: natural``) the rows are in
client order (each client's training rows, then its test rows); without one (``iid``,
``dirichlet``, ``shards``) they are in the in-memory loader's pool order (the training rows in
table order, then the test rows), so row ``r`` of the cache is position ``r`` of the eager pool.
Building it streams the table twice (the label, client and split columns, then the features
one record batch at a time), so the peak memory is a few int64 per row, never the features.
After that a natural client's rows are two ``pread`` calls, and any set of rows
(:meth:`DiskTableSource.take`) is read sorted, in contiguous runs (gaps under
:data:`GAP_BYTES` read through rather than split into another call).

Images (one binary column of PNG/JPEG bytes) are decoded into the row cache when it is built,
unless ``decode_images: per_round`` (or ``auto``, the default, and the decoded float32 cache
would take more than 90 % of the free space of the cache's disk): the cache then keeps the
encoded bytes (``images.bin``, in table order, with each cache row's offset and length), and a
round decodes its clients' images only, after a header check of every image at build time.

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
    decode_images,
    is_image_column,
    open_table,
    sample_shape,
)

FORMAT = 1  # bump when the cache's layout changes
_FLUSH_BYTES = 256 << 20  # remap the feature file after this many bytes: its pages stay out of RSS
GAP_BYTES = 64 << 10  # rows this close together are read in one call (the gap read and dropped)
DECODE_MODES = ("auto", "on_build", "per_round")  # dataset.params.decode_images
_FIT_SHARE = 0.9  # auto: decode per round when the decoded cache needs more of the free disk than this


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
        self.image_column = meta.get("image_column")  # set: the cache holds encoded images, decoded per read
        if self.image_column is not None:
            with np.load(os.path.join(folder, "images.npz"), allow_pickle=False) as npz:
                self.blob_start, self.blob_len = npz["start"], npz["length"]  # per cache row, into images.bin
        self._fds: tuple[int, ...] | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fds"] = None  # file descriptors are per process
        return state

    @classmethod
    def open(cls, *, path, label_column: str = "label", client_column: str | None = None,
             split_column: str | None = None, features=None, shape=None, num_classes: int | None = None,
             cache_dir: str | None = None, storage_options: dict | None = None,
             decode_images: str = "auto") -> "DiskTableSource":
        """The table's row cache, built first if it is missing. Without ``client_column`` the
        rows are in pool order (one block: the training rows, then the test rows)."""
        if decode_images not in DECODE_MODES:
            raise TableDatasetError(f"parquet: dataset.params.decode_images = {decode_images!r} is invalid; allowed: "
                             f"{list(DECODE_MODES)}")
        try:
            files, data, cols = open_table(path, label_column, client_column, split_column, features,
                                           storage_options)
            choices = [label_column, client_column, split_column, cols, shape, num_classes]
            if decode_images != "auto":  # auto keeps the key of caches built before the choice existed
                choices.append(decode_images)
            folder = _cache_folder(data, cache_dir, choices)
            if not os.path.exists(os.path.join(folder, "meta.json")):
                _build(folder, str(path), data, cols, label_column, client_column, split_column, shape, num_classes,
                       decode_images)
            return cls(folder)
        except TableDatasetError as err:  # still a TableDatasetError: the validation blames the dataset
            raise TableDatasetError(f"parquet: {err}") from None

    def rows(self, c: int):
        s, n, t = int(self.start[c]), int(self.sizes[c]), int(self.start[c + 1] - self.start[c] - self.sizes[c])
        x, y = self.take(np.arange(s, s + n + t, dtype=np.int64))
        if self.test_sizes is None:
            return x, y, None, None
        return x[:n], y[:n], x[n:], y[n:]

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cache rows ``rows`` (ascending, distinct) as (x float32 shaped as the samples, y int64),
        read in contiguous runs: one ``pread`` per run and file."""
        rows = np.asarray(rows, dtype=np.int64)
        fds = self._open()
        y = np.empty(len(rows), dtype=np.int64)
        w = self.width
        x = np.empty((len(rows), w), dtype=np.float32)
        for lo, hi, a, b in _runs(rows, GAP_BYTES // (4 * max(w, 1))):
            picked = slice(None) if b - a == hi - lo else rows[a:b] - lo  # a gapless run: no copy to pick
            y[a:b] = _read(fds[1], lo, hi - lo, np.int64)[picked]
            if self.image_column is None:
                x[a:b] = _read(fds[0], lo * w, (hi - lo) * w, np.float32).reshape(hi - lo, w)[picked]
        if self.image_column is not None and len(rows):
            x[:] = decode_images(self._blobs(fds[2], rows), self.image_column, self.folder)
        return x.reshape((len(rows), *self.input_shape)), y

    def take_labels(self) -> np.ndarray:
        """Every cache row's label (8 bytes a row): what an index of rows per client is built from."""
        return np.fromfile(os.path.join(self.folder, "labels.i64"), dtype=np.int64)

    def _blobs(self, fd: int, rows: np.ndarray) -> list[bytes]:
        """The encoded images of ``rows``, read in runs of the file (sorted by offset)."""
        first, size = self.blob_start[rows], self.blob_len[rows]
        order = np.argsort(first, kind="stable")
        lo_s, hi_s = first[order], first[order] + size[order]
        reach = np.maximum.accumulate(hi_s)
        cuts = np.flatnonzero(lo_s[1:] > reach[:-1] + GAP_BYTES) + 1
        out: list[bytes] = [b""] * len(rows)
        for a, b in zip([0, *cuts], [*cuts, len(rows)]):
            base = int(lo_s[a])
            buf = _read(fd, base, int(reach[b - 1]) - base, np.uint8).data
            for i in range(a, b):
                out[order[i]] = buf[lo_s[i] - base:hi_s[i] - base]
        return out

    def _open(self) -> tuple[int, ...]:
        if self._fds is None:
            names = ["labels.i64", "images.bin"] if self.image_column is not None else ["labels.i64"]
            feats = os.open(os.path.join(self.folder, "features.f32"), os.O_RDONLY) if self.image_column is None \
                else -1
            self._fds = (feats, *(os.open(os.path.join(self.folder, n), os.O_RDONLY) for n in names))
        return self._fds


def _runs(rows: np.ndarray, max_gap: int):
    """(first cache row, end, first index, end index) of each run of ``rows`` whose gaps are at
    most ``max_gap`` rows."""
    if not len(rows):
        return []
    cuts = np.flatnonzero(np.diff(rows) > max_gap + 1) + 1
    a, b = np.concatenate([[0], cuts]), np.concatenate([cuts, [len(rows)]])
    return zip(rows[a].tolist(), (rows[b - 1] + 1).tolist(), a.tolist(), b.tolist())


def _read(fd: int, first: int, count: int, dtype) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    buf = os.pread(fd, count * size, first * size)
    if len(buf) != count * size:
        raise OSError(f"row cache truncated: wanted {count * size} bytes at {first * size}, got {len(buf)}")
    return np.frombuffer(buf, dtype=dtype)  # read-only: the callers copy what they keep into their own arrays


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


def _build(folder: str, path: str, data, cols, label_column, client_column, split_column, shape, num_classes,
           decode: str = "auto"):
    n = data.count_rows()
    if n == 0:
        raise TableDatasetError(f"dataset path {path!r} has no rows")
    # pass 1: labels, clients and splits (a few bytes per row)
    y = np.empty(n, dtype=np.int64)
    is_test = np.zeros(n, dtype=bool)
    owners, at = [], 0
    wanted = [label_column, *(c for c in (client_column, split_column) if c)]
    for batch in data.to_batches(columns=wanted):
        rows = batch.num_rows
        y[at:at + rows] = batch_labels(batch, label_column)
        if client_column:
            owners.append(batch.column(client_column))
        if split_column:
            is_test[at:at + rows] = batch_is_test(batch, split_column)
        at += rows
    k = check_labels(y, label_column, num_classes)
    if client_column:
        code, names = _client_codes(owners)
    else:  # one block in pool order: the training rows, then the test rows (the eager loader's pool)
        code, names = np.zeros(n, dtype=np.int64), None
    del owners
    train = np.bincount(code[~is_test], minlength=len(names or [0]))
    test = np.bincount(code[is_test], minlength=len(names or [0]))
    empty = np.flatnonzero(train == 0)
    if empty.size and names is None:
        raise TableDatasetError("every row is a test row: the clients have nothing to train on")
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
        image_column = None
        if is_image_column(data.schema, cols) and _per_round(decode, data, cols[0], n, folder):
            image_column = cols[0]
            width = _write_images(tmp, data, image_column, dest, path)
        else:
            width = _write_features(os.path.join(tmp, "features.f32"), data, cols, dest, n, path)
        shape = sample_shape(shape, width)
        np.savez(os.path.join(tmp, "counts.npz"), train=train, test=test)
        meta = dict(format=FORMAT, name=f"parquet:{os.path.basename(path.rstrip('/'))}", num_classes=k,
                    width=width, shape=list(shape) if shape else None, has_split=bool(split_column and test.any()),
                    client_names=names, rows=n, image_column=image_column)
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        try:
            os.rename(tmp, folder)
        except OSError:  # another process built it first: theirs is as good
            if not os.path.exists(os.path.join(folder, "meta.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _image_header(blob, column: str, path: str, i: int) -> tuple[int, int, int]:
    """(channels, height, width) of an encoded image, from its header (nothing decoded)."""
    import io  # here: with Pillow, only for image columns

    from PIL import Image, UnidentifiedImageError  # here: only image columns need Pillow (torchvision's)

    if blob is None:
        raise TableDatasetError(f"{path}: column {column!r} has missing (null) rows")
    try:
        img = Image.open(io.BytesIO(blob))
    except (UnidentifiedImageError, OSError) as err:
        raise TableDatasetError(f"{path}: column {column!r} row {i} is not an image Pillow can decode "
                                f"({err})") from None
    return len(img.getbands()), img.size[1], img.size[0]


def _per_round(decode: str, data, column: str, n: int, folder: str) -> bool:
    """Whether the images stay encoded in the cache: asked for, or (auto) their decoded float32
    rows would take more than 90 % of the cache disk's free space."""
    if decode != "auto":
        return decode == "per_round"
    first = data.head(1, columns=[column]).column(column)[0].as_py()
    decoded = n * int(np.prod(_image_header(first, column, "the table", 0))) * 4
    return decoded > _FIT_SHARE * shutil.disk_usage(os.path.dirname(folder)).free


def _write_images(tmp: str, data, column: str, dest: np.ndarray, path: str) -> int:
    """pass 2 for images kept encoded: their bytes appended to ``images.bin`` in table order, each
    cache row's offset and length in ``images.npz``; every header checked (same size)."""
    n = len(dest)
    start, length = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    at, offset, shape = 0, 0, None
    with open(os.path.join(tmp, "images.bin"), "wb") as out:
        for batch in data.to_batches(columns=[column]):
            blobs = batch.column(column).to_pylist()
            for i, blob in enumerate(blobs):
                got = _image_header(blob, column, path, at + i)
                if shape is None:
                    shape = got
                elif got != shape:
                    raise TableDatasetError(f"{path}: column {column!r} holds images of different sizes "
                                            f"({list(shape)} and {list(got)} at row {at + i}); every sample "
                                            "needs the same")
            sizes = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))
            rows = dest[at:at + len(blobs)]
            start[rows] = offset + np.cumsum(sizes) - sizes
            length[rows] = sizes
            out.write(b"".join(blobs))
            offset += int(sizes.sum())
            at += len(blobs)
    np.savez(os.path.join(tmp, "images.npz"), start=start, length=length)
    return int(np.prod(shape))


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
