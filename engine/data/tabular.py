"""Federated datasets a user brings: a Parquet table (one row per sample) and LEAF's JSON files.

The table format (``dataset: {name: parquet, params: {path: ...}}``), one row per sample:

* a label column (``label_column``, default ``label``): integers >= 0;
* features: a list of numeric scalar columns, or one column holding a fixed-size list (or
  equal-length lists) of numbers per row (``features``; default: every other numeric column,
  or the single list column), or one binary column of encoded images (PNG, JPEG: decoded with
  Pillow to [0, 1], channels first, when the table is read or its row cache built); ``shape``
  reshapes each sample (e.g. ``[1, 28, 28]``);
* optionally a client column (``client_column``): its values (ints or strings) are the natural
  clients, numbered 0..N-1 in sorted order of the values, for ``partition.scheme: natural``;
* optionally a split column (``split_column``) with ``train`` / ``test``: with natural clients a
  client's ``test`` rows are its local test set (as LEAF splits them); with the other schemes
  the ``test`` rows are the official test split (the global test set).

``path`` is a file, a folder of ``.parquet`` files, or a list of files; they are read with
pyarrow's dataset API one record batch at a time into preallocated arrays, so the peak memory is
the arrays themselves (the table is never held whole as Arrow and numpy at once).

LEAF (``dataset: {name: leaf, params: {path: <folder with train/ and test/>}}``): the JSON files
of Caldas et al.'s benchmark, ``{"users": [...], "num_samples": [...], "user_data": {user:
{"x": [...], "y": [...]}}}``, read directly; :func:`leaf_to_parquet` converts them to the table
format. Loaders return plain arrays; :mod:`engine.data.datasets` wraps them as datasets.

Over 400 lines because the format's every check is here, next to the format it checks: the
columns and types of each file of a table (one schema, checked column by column), the labels,
splits, images and LEAF's files; split by check, a reader would lose the one place that says what
a table may hold.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

import numpy as np

from hardware_profiles.suggest import suggestion

SPLITS = ("train", "test")


class TableDatasetError(ValueError):
    """A federated table or LEAF folder that cannot be read as one (names the file and column)."""


@dataclass
class TableArrays:
    """What a table holds, as arrays: training pool, official test rows, natural clients."""

    x: np.ndarray
    y: np.ndarray
    test_x: np.ndarray | None
    test_y: np.ndarray | None
    clients: list[np.ndarray] | None  # per client: indices into x
    test_clients: list[np.ndarray] | None  # per client: indices into test_x
    client_names: list[str] | None
    num_classes: int


# --------------------------------------------------------------------------- Parquet


def _remote_files(paths: list[str], storage_options: dict | None):
    """``s3://`` / ``gs://`` files or folders through the storage layer sweeps use (its
    filesystems, options, credentials and time-outs)."""
    from engine.storage.locations import open_storage  # here: only tables on object storage need it

    fs, out = None, []
    for p in paths:
        store = open_storage(p, storage_options)
        if fs is not None and type(store.fs) is not type(fs):
            raise TableDatasetError(f"dataset.params.path mixes filesystems ({paths}); give one kind of location")
        fs = store.fs
        if store.is_dir():
            found = [f"{store.path}/{f}" for f in store.files() if f.endswith(".parquet")]
            if not found:
                raise TableDatasetError(f"dataset path {p!r} is a folder without .parquet files")
            out += found
        elif store.exists():
            out.append(store.path)
        else:
            raise TableDatasetError(f"dataset path {p!r} does not exist (give a .parquet file, a folder of them, "
                                    "or a list of files)")
    return out, fs


def _files(path, storage_options: dict | None = None):
    """The table's files and their pyarrow filesystem (None: the local disk)."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if any("://" in str(p) and not str(p).startswith("file://") for p in paths):
        return _remote_files([str(p) for p in paths], storage_options)
    if storage_options:
        raise TableDatasetError(f"dataset.params.storage_options apply to s3:// or gs:// paths, not to {path!r}")
    out: list[str] = []
    for p in map(str, paths):
        p = os.path.expanduser(p)
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "**", "*.parquet"), recursive=True))
            if not found:
                raise TableDatasetError(f"dataset path {p!r} is a folder without .parquet files")
            out += found
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise TableDatasetError(f"dataset path {p!r} does not exist (give a .parquet file, a folder of them, "
                                    "or a list of files)")
    return out, None


def _feature_columns(schema, label: str, client: str | None, split: str | None, features) -> list[str]:
    import pyarrow as pa  # here: pyarrow is needed only to read tables

    names = list(schema.names)
    if features is None:
        skip = {label, client, split}
        kinds = {n: schema.field(n).type for n in names if n not in skip}
        lists = [n for n, t in kinds.items() if pa.types.is_list(t) or pa.types.is_fixed_size_list(t)]
        numeric = [n for n, t in kinds.items() if pa.types.is_integer(t) or pa.types.is_floating(t)]
        if len(lists) == 1 and not numeric:
            return lists
        if lists:
            raise TableDatasetError(f"several candidate feature columns {lists + numeric}; name them in "
                                    "dataset.params.features")
        if not numeric:
            raise TableDatasetError(f"no numeric feature columns besides {sorted(s for s in skip if s)}; "
                                    f"the table has {names}")
        return numeric
    cols = [features] if isinstance(features, str) else list(features)
    missing = [c for c in cols if c not in names]
    if missing:
        raise TableDatasetError(f"dataset.params.features names columns {missing} that the table does not have; "
                                f"it has {names}")
    return cols


def is_image_column(schema, cols: list[str]) -> bool:
    """One binary feature column: encoded images."""
    import pyarrow as pa  # here: see _feature_columns

    kind = schema.field(cols[0]).type
    return len(cols) == 1 and (pa.types.is_binary(kind) or pa.types.is_large_binary(kind))


def decode_images(blobs, column: str, file: str) -> np.ndarray:
    """Encoded images (PNG, JPEG, ... bytes) as float32 rows in [0, 1], channels first."""
    import io  # here: with Pillow, only for image columns

    from PIL import Image, UnidentifiedImageError  # here: only image columns need Pillow (torchvision's)

    rows = []
    for i, blob in enumerate(blobs):
        if blob is None:
            raise TableDatasetError(f"{file}: column {column!r} has missing (null) rows")
        try:
            img = np.asarray(Image.open(io.BytesIO(blob)), dtype=np.float32) / 255.0
        except (UnidentifiedImageError, OSError) as err:
            raise TableDatasetError(f"{file}: column {column!r} row {i} is not an image Pillow can decode "
                                    f"({err})") from None
        rows.append(img[None] if img.ndim == 2 else np.moveaxis(img, -1, 0))  # (C, H, W)
    if len({r.shape for r in rows}) > 1:
        raise TableDatasetError(f"{file}: column {column!r} holds images of different sizes "
                                f"{sorted({r.shape for r in rows})[:3]}; every sample needs the same")
    return np.stack(rows).reshape(len(rows), -1) if rows else np.zeros((0, 0), np.float32)


def _to_matrix(batch, cols: list[str], file: str) -> np.ndarray:
    """A record batch's features as float32 (rows, F); an image column is decoded (channels first)."""
    import pyarrow as pa  # here: see _feature_columns

    if is_image_column(batch.schema, cols):
        return decode_images(batch.column(cols[0]).to_pylist(), cols[0], file)
    if len(cols) == 1 and (pa.types.is_list(batch.schema.field(cols[0]).type)
                           or pa.types.is_fixed_size_list(batch.schema.field(cols[0]).type)):
        arr = batch.column(cols[0])
        if arr.null_count:
            raise TableDatasetError(f"{file}: column {cols[0]!r} has missing (null) rows")
        values = arr.flatten() if hasattr(arr, "flatten") else arr.values
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            raise TableDatasetError(f"{file}: column {cols[0]!r} holds lists of {values.type}; features must be "
                                    "numbers")
        lengths = np.diff(np.asarray(arr.offsets)) if pa.types.is_list(arr.type) else None
        width = arr.type.list_size if lengths is None else (int(lengths[0]) if len(lengths) else 0)
        if lengths is not None and len(lengths) and (lengths != width).any():
            raise TableDatasetError(f"{file}: column {cols[0]!r} holds lists of different lengths "
                                    f"({int(lengths.min())}..{int(lengths.max())}); every sample needs the same")
        return values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(len(arr), width)
    out = np.empty((batch.num_rows, len(cols)), dtype=np.float32)
    for j, name in enumerate(cols):
        column = batch.column(name)
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            raise TableDatasetError(f"{file}: feature column {name!r} has type {column.type}; features must be "
                                    "numbers (or one column of number lists)")
        if column.null_count:
            raise TableDatasetError(f"{file}: feature column {name!r} has missing (null) rows")
        out[:, j] = column.to_numpy(zero_copy_only=False)
    return out


def read_parquet_table(path, *, label_column: str = "label", client_column: str | None = None,
                       split_column: str | None = None, features=None, shape=None,
                       num_classes: int | None = None, storage_options: dict | None = None) -> TableArrays:
    """Read a federated table (see the module docstring) into arrays."""
    files, data, cols = open_table(path, label_column, client_column, split_column, features, storage_options)
    n = data.count_rows()
    if n == 0:
        raise TableDatasetError(f"dataset path {path!r} has no rows")
    x = None
    y = np.empty(n, dtype=np.int64)
    owner = [] if client_column else None
    split = np.zeros(n, dtype=bool) if split_column else None  # True: a test row
    at = 0
    wanted = [*cols, label_column, *(c for c in (client_column, split_column) if c)]
    for batch in data.to_batches(columns=wanted):
        rows = batch.num_rows
        if not rows:
            continue
        feats = _to_matrix(batch, cols, files[0] if len(files) == 1 else str(path))
        if x is None:
            x = np.empty((n, feats.shape[1]), dtype=np.float32)
        x[at:at + rows] = feats
        y[at:at + rows] = batch_labels(batch, label_column)
        if owner is not None:
            owner.append(np.asarray(batch.column(client_column).to_numpy(zero_copy_only=False)).astype(str))
        if split is not None:
            split[at:at + rows] = batch_is_test(batch, split_column)
        at += rows
    if not np.isfinite(x).all():
        raise TableDatasetError("the features have NaN or infinite values")
    k = check_labels(y, label_column, num_classes)
    shape = sample_shape(shape, x.shape[1])
    if shape is not None:
        x = x.reshape((n, *shape))
    return _arrange(x, y, np.concatenate(owner) if owner is not None else None, split, k)


def open_table(path, label_column: str, client_column: str | None, split_column: str | None, features,
               storage_options: dict | None = None):
    """The table's files, its pyarrow dataset (``.filesystem``: where they are) and its feature
    columns, its columns checked."""
    import pyarrow.dataset as pads  # here: see _feature_columns

    files, fs = _files(path, storage_options)
    data = pads.dataset(files, format="parquet", filesystem=fs)
    if len(files) > 1:  # pyarrow would take the first file's columns and types for all of them
        used = None if features is None else {label_column, client_column, split_column,
                                              *([features] if isinstance(features, str) else features)}
        data = pads.dataset(files, format="parquet", filesystem=fs,
                            schema=unified_schema(files, fs, used, exact={label_column}))
    schema = data.schema
    for what, col in (("label_column", label_column), ("client_column", client_column),
                      ("split_column", split_column)):
        if col is not None and col not in schema.names:
            raise TableDatasetError(f"dataset.params.{what} = {col!r} is not a column of {files[0]!r}"
                                    f"{' (and the other files)' if len(files) > 1 else ''}; "
                                    f"{suggestion(col, schema.names)}it has {schema.names}")
    return files, data, _feature_columns(schema, label_column, client_column, split_column, features)


def unified_schema(files: list[str], fs, used: set | None = None, exact: set = frozenset()):
    """The one schema of a table's files, checked column by column: a column that one file has
    and another lacks, or of another kind (text in one, numbers in the other), is refused naming
    both files and the column; integer widths and integers beside floats are unified (to int64,
    float64). ``used``: the columns the read takes (None: every column, the features being every
    other numeric one); the others are left out. ``exact``: columns whose kind must be the same
    in every file (the labels: a float label in one file is refused naming that file, not cast)."""
    import pyarrow as pa  # here: see _feature_columns
    import pyarrow.parquet as pq

    schemas = [pq.read_schema(f, filesystem=fs) for f in files]
    fields: dict[str, list[tuple[str, object]]] = {}
    for f, schema in zip(files, schemas):
        for field in schema:
            fields.setdefault(field.name, []).append((f, field.type))
    out = []
    for name, seen in fields.items():
        if used is not None and name not in used:
            continue
        if len(seen) < len(files):
            lacking = next(f for f, schema in zip(files, schemas) if name not in schema.names)
            raise TableDatasetError(f"{lacking}: has no column {name!r}, which {seen[0][0]} has; every file of the "
                                    "table needs the same columns (or name the features in dataset.params.features)")
        kinds = {t for _, t in seen}
        if len(kinds) == 1:
            out.append(pa.field(name, seen[0][1]))
        elif all(pa.types.is_integer(t) for t in kinds):
            out.append(pa.field(name, pa.int64()))
        elif name not in exact and all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in kinds):
            out.append(pa.field(name, pa.float64()))
        else:
            other = next((f, t) for f, t in seen if t != seen[0][1])
            raise TableDatasetError(f"{other[0]}: column {name!r} has type {other[1]}, but {seen[0][0]} has it as "
                                    f"{seen[0][1]}; every file of the table needs the same types")
    return pa.schema(out)


def batch_labels(batch, label_column: str) -> np.ndarray:
    label = batch.column(label_column)
    if label.null_count:
        raise TableDatasetError(f"label column {label_column!r} has missing (null) rows")
    lab = label.to_numpy(zero_copy_only=False)
    if not np.issubdtype(lab.dtype, np.integer):
        if not np.issubdtype(lab.dtype, np.floating) or not np.all(lab == np.round(lab)):
            raise TableDatasetError(f"label column {label_column!r} has type {label.type}; labels must be "
                                    "integers >= 0 (class indices)")
    return lab


def batch_is_test(batch, split_column: str) -> np.ndarray:
    s = np.asarray(batch.column(split_column).to_numpy(zero_copy_only=False)).astype(str)
    bad = sorted(set(np.unique(s).tolist()) - set(SPLITS))
    if bad:
        raise TableDatasetError(f"split column {split_column!r} has values {bad[:5]}; allowed: {list(SPLITS)}")
    return s == "test"


def check_labels(y: np.ndarray, label_column: str, num_classes: int | None) -> int:
    """The number of classes; labels checked to be class indices."""
    if (y < 0).any():
        raise TableDatasetError(f"label column {label_column!r} has negative values (min {int(y.min())}); labels "
                                "are class indices >= 0")
    k = int(y.max()) + 1 if num_classes is None else int(num_classes)
    if y.max() >= k:
        raise TableDatasetError(f"labels go up to {int(y.max())} but dataset.params.num_classes = {k}")
    return k


def sample_shape(shape, width: int) -> tuple[int, ...] | None:
    if shape is None:
        return None
    shape = tuple(int(d) for d in shape)
    if int(np.prod(shape)) != width:
        raise TableDatasetError(f"dataset.params.shape = {list(shape)} holds {int(np.prod(shape))} values; "
                                f"each sample has {width} features")
    return shape


def _arrange(x, y, owner, is_test, num_classes: int) -> TableArrays:
    """Split rows into the training pool and the test rows, and group them by client."""
    test = is_test if is_test is not None else np.zeros(len(y), dtype=bool)
    train_rows, test_rows = np.flatnonzero(~test), np.flatnonzero(test)
    if not len(train_rows):
        raise TableDatasetError("every row is a test row: the clients have nothing to train on")
    x_tr, y_tr = x[train_rows], y[train_rows]
    x_te, y_te = (x[test_rows], y[test_rows]) if len(test_rows) else (None, None)
    clients = test_clients = names = None
    if owner is not None:
        names, code = np.unique(owner, return_inverse=True)
        code_tr, code_te = code[train_rows], code[test_rows]
        empty = np.setdiff1d(np.arange(len(names)), code_tr)
        if empty.size:
            raise TableDatasetError(f"client {str(names[empty[0]])!r} has no training rows (only test rows); "
                                    f"{empty.size} client(s) like it")
        order = np.argsort(code_tr, kind="stable")
        clients = np.split(order.astype(np.int64), np.cumsum(np.bincount(code_tr, minlength=len(names)))[:-1])
        if len(test_rows):
            order = np.argsort(code_te, kind="stable")
            test_clients = np.split(order.astype(np.int64),
                                    np.cumsum(np.bincount(code_te, minlength=len(names)))[:-1])
        names = [str(v) for v in names]
    return TableArrays(x_tr, y_tr, x_te, y_te, clients, test_clients, names, num_classes)


# --------------------------------------------------------------------------- LEAF


def _leaf_split(folder: str, split: str) -> dict[str, tuple[list, list]]:
    files = sorted(glob.glob(os.path.join(folder, split, "*.json")))
    if not files:
        raise TableDatasetError(f"LEAF folder {folder!r} has no {split}/*.json files (LEAF writes "
                                "data/<dataset>/data/{train,test}/*.json)")
    users: dict[str, tuple[list, list]] = {}
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as err:
            raise TableDatasetError(f"{f}: not a readable LEAF JSON file ({err})") from None
        if not isinstance(doc, dict) or not {"users", "user_data"} <= set(doc):
            raise TableDatasetError(f"{f}: a LEAF file holds 'users', 'num_samples' and 'user_data'")
        for u in doc["users"]:
            data = doc["user_data"].get(u)
            if data is None or "x" not in data or "y" not in data:
                raise TableDatasetError(f"{f}: user {u!r} has no user_data with 'x' and 'y'")
            if len(data["x"]) != len(data["y"]):
                raise TableDatasetError(f"{f}: user {u!r} has {len(data['x'])} x and {len(data['y'])} y")
            xs, ys = users.setdefault(str(u), ([], []))
            xs += data["x"]
            ys += data["y"]
    return users


def _leaf_rows(folder: str):
    train, test = _leaf_split(folder, "train"), _leaf_split(folder, "test")
    names = sorted(train)
    rows_x, rows_y, owner, is_test = [], [], [], []
    for split, users in ((False, train), (True, test)):
        for u in names:
            xs, ys = users.get(u, ([], []))
            rows_x += xs
            rows_y += ys
            owner += [u] * len(ys)
            is_test += [split] * len(ys)
    extra = sorted(set(test) - set(train))
    if extra:
        raise TableDatasetError(f"LEAF folder {folder!r}: users {extra[:3]} have test data but no training data")
    try:
        x = np.asarray(rows_x, dtype=np.float32)
    except ValueError:
        raise TableDatasetError(f"LEAF folder {folder!r}: samples have different sizes or non-numeric x "
                                "(text datasets need their own encoding first)") from None
    y = np.asarray(rows_y)
    if not np.issubdtype(y.dtype, np.integer):
        raise TableDatasetError(f"LEAF folder {folder!r}: y must be class indices (integers)")
    return x.reshape(len(y), -1), y.astype(np.int64), np.asarray(owner), np.asarray(is_test, dtype=bool)


def read_leaf(path: str, *, shape=None, num_classes: int | None = None) -> TableArrays:
    """A LEAF dataset folder (``train/*.json``, ``test/*.json``) as arrays, users as natural clients."""
    x, y, owner, is_test = _leaf_rows(os.path.expanduser(str(path)))
    if shape is not None:
        shape = tuple(int(d) for d in shape)
        if int(np.prod(shape)) != x.shape[1]:
            raise TableDatasetError(f"dataset.params.shape = {list(shape)} holds {int(np.prod(shape))} values; "
                                    f"each LEAF sample has {x.shape[1]}")
        x = x.reshape((len(y), *shape))
    k = int(y.max()) + 1 if num_classes is None else int(num_classes)
    return _arrange(x, y, owner, is_test, k)


def leaf_to_parquet(path: str, out: str) -> str:
    """Convert a LEAF folder to the table format: ``client``, ``label``, ``features`` (a
    fixed-size list of float32) and ``split``; returns ``out``."""
    import pyarrow as pa  # here: see _feature_columns
    import pyarrow.parquet as pq

    x, y, owner, is_test = _leaf_rows(os.path.expanduser(str(path)))
    width = x.shape[1]
    table = pa.table({
        "client": pa.array(owner.astype(str)),
        "label": pa.array(y, type=pa.int64()),
        "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), type=pa.float32()), width),
        "split": pa.array(np.where(is_test, "test", "train")),
    })
    pq.write_table(table, out)
    return out
