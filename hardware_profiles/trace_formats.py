"""Converters from trace formats the FL and networking field uses into hetsim's trace schema.

Each converter reads one file and returns a pandas DataFrame in the schema of
:mod:`hardware_profiles.traces` (link traces ``trace_id, t_s, down_mbps|up_mbps``, compute traces
``trace_id, t_s, factor``, availability ``trace_id, start_s, end_s``); :func:`to_file` writes one
as CSV or Parquet (by suffix) and reads it back through the schema's reader. Frames of several
files combine with ``pandas.concat`` when their trace ids differ.

* FedScale device traces (the ``client_behave_trace`` and ``client_device_capacity`` pickles):
  :func:`fedscale_availability`, :func:`fedscale_links`, :func:`fedscale_compute_speeds`,
  :func:`fedscale_compute`.
* Mahimahi packet-delivery traces (one millisecond timestamp per MTU-sized delivery
  opportunity): :func:`mahimahi_link`.
* Throughput logs in the 6-column format of the HSDPA dataset (Riiser et al., MMSys 2013) and
  the Ghent 4G/LTE logs that follow it: :func:`hsdpa_link`.

hetsim needs rates > 0 (a link that carries nothing never finishes a transfer): where a format
says a link carried nothing (or less than ``floor_mbps``), the converters write ``floor_mbps``.
Pure functions over file paths; no Ray, no torch.
"""
from __future__ import annotations

import math
import pickle
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from .traces import TraceError, read_interval_traces, read_rate_traces

MTU_BYTES = 1500  # Mahimahi: each line of a trace is one delivery opportunity of one 1500-byte packet
RATE_COLUMNS = ("down_mbps", "up_mbps")

__all__ = ["MTU_BYTES", "fedscale_availability", "fedscale_compute", "fedscale_compute_speeds", "fedscale_links",
           "hsdpa_link", "mahimahi_link", "to_file"]


# --------------------------------------------------------------------------- writing


def to_file(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a converter's frame to ``path`` (``.csv``, or ``.parquet`` / ``.pq``) and check it
    by reading it back with :func:`~hardware_profiles.traces.read_rate_traces` (each rate or
    factor column it has) or :func:`~hardware_profiles.traces.read_interval_traces`; a frame the
    schema rejects raises that reader's :class:`TraceError` (and is not left behind). Returns the path."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        raise ValueError(f"{str(p)!r}: write a trace as .csv, .parquet or .pq (got suffix {p.suffix!r})")
    columns = set(df.columns)
    intervals = {"start_s", "end_s"} <= columns
    rates = [c for c in (*RATE_COLUMNS, "factor") if c in columns]
    if "trace_id" not in columns or not (intervals or (rates and "t_s" in columns)):
        raise ValueError(f"{str(p)!r}: a trace frame has trace_id with t_s and down_mbps/up_mbps/factor, or "
                         f"with start_s and end_s; this one has {list(df.columns)}")
    p.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".csv":
        df.to_csv(p, index=False)
    else:
        df.to_parquet(p, index=False)
    try:
        if intervals:
            read_interval_traces(p)
        for column in rates:
            read_rate_traces(p, column)
    except TraceError:
        p.unlink()  # no file the schema rejects is left behind
        raise
    return p


# --------------------------------------------------------------------------- FedScale


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: containers, numbers, strings and numpy scalars/arrays. Any other
    global a pickle names (a function, a class) is refused before it is looked up."""

    _BUILTINS = frozenset({"dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str",
                           "bytes", "bytearray", "bool"})
    _NUMPY = frozenset({"scalar", "_reconstruct", "ndarray", "dtype", "_frombuffer"})
    _NUMPY_MODULES = frozenset({"numpy", "numpy.core.multiarray", "numpy._core.multiarray",
                                "numpy.core.numeric", "numpy._core.numeric"})

    def find_class(self, module: str, name: str):
        allowed = ((module == "builtins" and name in self._BUILTINS)
                   or (module == "collections" and name in ("OrderedDict", "defaultdict"))
                   or (module in self._NUMPY_MODULES and name in self._NUMPY))
        if not allowed:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a FedScale trace holds plain data only")
        return super().find_class(module, name)


def _load_pickle(path: str | Path, what: str) -> Mapping:
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{what} file {str(p)!r} does not exist")
    try:
        with p.open("rb") as f:
            data = _PlainUnpickler(f).load()
    except Exception as err:  # noqa: BLE001 - a foreign file fails to unpickle in many ways
        raise TraceError(f"{str(p)!r} is not a readable {what} pickle: {type(err).__name__}: {err}") from None
    if not isinstance(data, Mapping) or not data:
        raise TraceError(f"{str(p)!r}: a {what} pickle holds a non-empty dict {{client_id: {{...}}}}; "
                         f"got {type(data).__name__}" + (" (empty)" if isinstance(data, Mapping) else ""))
    return data


def _number(value, path, client, key: str, positive: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or (positive and x <= 0):
        need = "a finite number > 0" if positive else "a finite number"
        raise TraceError(f"{path}: client {client!r}: {key!r} = {value!r} is not {need}")
    return x


def _times(record: Mapping, key: str, path, client) -> np.ndarray:
    value = record[key]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TraceError(f"{path}: client {client!r}: {key!r} must be a list of times in seconds, got {value!r}")
    return np.array([_number(v, path, client, key) for v in value], dtype=np.float64)


def _record(data: Mapping, client, path, keys: tuple[str, ...], what: str) -> Mapping:
    record = data[client]
    if not isinstance(record, Mapping):
        raise TraceError(f"{path}: client {client!r}: a {what} entry is a dict with {list(keys)}, "
                         f"got {type(record).__name__}")
    missing = [k for k in keys if k not in record]
    if missing:
        raise TraceError(f"{path}: client {client!r}: {what} entry lacks {missing} (has {sorted(map(str, record))})")
    return record


def fedscale_availability(path: str | Path) -> pd.DataFrame:
    """Online intervals ``trace_id, start_s, end_s`` from FedScale's ``client_behave_trace``.

    The file is a pickled dict ``{client_id: {"active": [t, ...], "inactive": [t, ...],
    "finish_time": T, ...}}`` with times in seconds; a client is online from ``active[i]`` until
    ``inactive[i]``, the pairing FedScale's simulator replays (for a well-formed trace,
    ``active[i] <= inactive[i] < active[i+1]``, that is the next inactive time); an active time
    without a partner (more active times than inactive ones) stays online until ``finish_time``.
    Intervals are clipped to ``[0, finish_time]``, empty ones dropped (an inactive time before
    its active time, too), the rest sorted and merged where they overlap or touch. ``trace_id``
    is the client id as a string, clients in the file's order; a client with no interval left
    has no rows (it is never online, which the schema cannot say).

    Looping differs: FedScale loops a client's trace with period ``finish_time``, hetsim's
    :class:`~hardware_profiles.processes.Intervals` with the last interval's end. They agree for
    a client online at ``finish_time``; for others a looped replay comes back earlier.

    Security: this unpickles ``path``. Never pass a file you do not trust: unpickling can run
    arbitrary code. As a second line of defence the loader refuses every global but plain
    containers and numpy scalars/arrays, but that is no licence to load untrusted files.
    """
    data = _load_pickle(path, "FedScale client_behave_trace")
    ids, starts, ends = [], [], []
    for client in data:
        record = _record(data, client, path, ("active", "inactive", "finish_time"), "client_behave_trace")
        finish = _number(record["finish_time"], path, client, "finish_time", positive=True)
        active = _times(record, "active", path, client)
        inactive = _times(record, "inactive", path, client)
        n = min(len(active), len(inactive))
        off = np.concatenate([inactive[:n], np.full(len(active) - n, finish)])
        s, e = np.clip(active, 0.0, finish), np.clip(off, 0.0, finish)
        keep = e > s
        s, e = s[keep], e[keep]
        order = np.argsort(s, kind="stable")
        merged: list[list[float]] = []
        for a, b in zip(s[order], e[order]):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], float(b))
            else:
                merged.append([float(a), float(b)])
        for a, b in merged:
            ids.append(str(client))
            starts.append(a)
            ends.append(b)
    if not ids:
        raise TraceError(f"{path}: no client of the FedScale behaviour trace has an online interval")
    return pd.DataFrame({"trace_id": ids, "start_s": np.array(starts), "end_s": np.array(ends)})


def _capacity(path: str | Path) -> list[tuple[str, float, float]]:
    """(client id, ms per sample, kbps) per client of a ``client_device_capacity`` pickle."""
    data = _load_pickle(path, "FedScale client_device_capacity")
    out = []
    for client in data:
        record = _record(data, client, path, ("computation", "communication"), "client_device_capacity")
        out.append((str(client), _number(record["computation"], path, client, "computation", positive=True),
                    _number(record["communication"], path, client, "communication", positive=True)))
    return out


def _constant(ids: list[str], values: dict[str, np.ndarray], duration_s: float) -> pd.DataFrame:
    duration_s = float(duration_s)
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s = {duration_s!r} must be a finite number > 0")
    frame = {"trace_id": np.repeat(np.asarray(ids, dtype=object), 2),
             "t_s": np.tile([0.0, duration_s], len(ids))}
    frame.update({c: np.repeat(v, 2) for c, v in values.items()})
    return pd.DataFrame(frame)


def fedscale_links(path: str | Path, duration_s: float = 86400.0) -> pd.DataFrame:
    """A constant link trace per client, ``trace_id, t_s, down_mbps, up_mbps``, from FedScale's
    ``client_device_capacity``: a pickled dict ``{client_id: {"computation": ms per sample,
    "communication": kbps}}``. Each client gets two rows, ``t_s = 0`` and ``t_s = duration_s``,
    with ``down_mbps = up_mbps = communication / 1000`` (FedScale has one rate for both ways).

    Security: this unpickles ``path``; never pass a file you do not trust (see
    :func:`fedscale_availability`)."""
    rows = _capacity(path)
    kbps = np.array([r[2] for r in rows], dtype=np.float64)
    return _constant([r[0] for r in rows], {"down_mbps": kbps / 1000.0, "up_mbps": kbps / 1000.0}, duration_s)


def fedscale_compute_speeds(path: str | Path) -> pd.DataFrame:
    """``client_id, ms_per_sample`` from FedScale's ``client_device_capacity`` (its
    ``"computation"``: the milliseconds a client's device takes per training sample, lower is
    faster). Not a trace: hetsim's compute factor multiplies a device tier's GFLOP/s, so a
    per-sample latency becomes a factor only against a reference of your choosing
    (:func:`fedscale_compute`).

    Security: this unpickles ``path``; never pass a file you do not trust (see
    :func:`fedscale_availability`)."""
    rows = _capacity(path)
    return pd.DataFrame({"client_id": [r[0] for r in rows], "ms_per_sample": np.array([r[1] for r in rows])})


def fedscale_compute(path: str | Path, reference_ms: float, duration_s: float = 86400.0) -> pd.DataFrame:
    """A constant compute trace per client, ``trace_id, t_s, factor``, with
    ``factor = reference_ms / ms_per_sample``: hetsim's compute factor is relative to the
    GFLOP/s of the device tier a client is given, so ``reference_ms`` is the per-sample latency
    of a device that runs at exactly its tier's speed (e.g. the median of
    :func:`fedscale_compute_speeds`, with a tier that matches that device). A client twice as
    slow as the reference gets 0.5. Two rows per client, ``t_s = 0`` and ``duration_s``.

    Security: this unpickles ``path``; never pass a file you do not trust (see
    :func:`fedscale_availability`)."""
    reference_ms = float(reference_ms)
    if not (math.isfinite(reference_ms) and reference_ms > 0):
        raise ValueError(f"reference_ms = {reference_ms!r} must be a finite number > 0")
    rows = _capacity(path)
    ms = np.array([r[1] for r in rows], dtype=np.float64)
    return _constant([r[0] for r in rows], {"factor": reference_ms / ms}, duration_s)


# --------------------------------------------------------------------------- link logs


def _rate_args(path, trace_id, column: str, floor_mbps: float) -> tuple[str, float]:
    if column not in RATE_COLUMNS:
        raise ValueError(f"column = {column!r}: a link trace's rate column is one of {list(RATE_COLUMNS)}")
    floor_mbps = float(floor_mbps)
    if not (math.isfinite(floor_mbps) and floor_mbps > 0):
        raise ValueError(f"floor_mbps = {floor_mbps!r} must be a finite number > 0 (hetsim needs rates > 0)")
    return (Path(path).stem if trace_id is None else str(trace_id)), floor_mbps


def _lines(path: str | Path, what: str):
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{what} file {str(p)!r} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(f"{str(p)!r} is not a readable {what} text file: {type(err).__name__}: {err}") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():  # blank lines (a trailing newline, say) carry nothing
            yield number, line.strip()


def _link_frame(trace_id: str, column: str, edges_s: np.ndarray, rates: np.ndarray) -> pd.DataFrame:
    """Pieces ``[edges_s[i], edges_s[i+1])`` at ``rates[i]``; the end row repeats the last rate
    (what a replay that holds past the end, ``loop: false``, keeps)."""
    return pd.DataFrame({"trace_id": [trace_id] * len(edges_s), "t_s": edges_s,
                         column: np.append(rates, rates[-1])})


_DIGITS = re.compile(r"[0-9]+")


def mahimahi_link(path: str | Path, trace_id: str | None = None, column: str = "down_mbps",
                  bin_ms: float = 1000.0, floor_mbps: float = 0.01) -> pd.DataFrame:
    """A link trace ``trace_id, t_s, <column>`` from a Mahimahi packet-delivery trace.

    Mahimahi's format: one non-negative integer per line, non-decreasing, the millisecond at
    which one MTU-sized packet (:data:`MTU_BYTES` = 1500 bytes) can be delivered (a repeated
    timestamp is several packets); the trace loops with period = its last timestamp. It becomes
    one piece per ``bin_ms`` window, ``t_s`` = the window's start in seconds, at
    ``rate_mbps = packets_in_window * 1500 * 8 / (bin_ms / 1000) / 1e6``; the last row, at
    ``ceil(last timestamp / bin_ms)`` windows, marks the end (a packet exactly there counts in
    the last window), so a looped replay's period is a whole number of windows.

    A window without packets carries nothing in Mahimahi; hetsim needs rates > 0, so rates
    below ``floor_mbps`` (default 0.01 Mbps; an empty window's 0 among them) are raised to it:
    an outage becomes a near-stall.

    ``column``: ``down_mbps`` or ``up_mbps`` (Mahimahi keeps each direction in its own file);
    ``trace_id``: defaults to the file's stem. Malformed lines raise :class:`TraceError`
    (a ``ValueError``) naming the file and the line.
    """
    trace_id, floor_mbps = _rate_args(path, trace_id, column, floor_mbps)
    bin_ms = float(bin_ms)
    if not (math.isfinite(bin_ms) and bin_ms > 0):
        raise ValueError(f"bin_ms = {bin_ms!r} must be a finite number > 0")
    stamps, previous = [], 0
    for number, line in _lines(path, "Mahimahi trace"):
        if not _DIGITS.fullmatch(line):
            raise TraceError(f"{path}: line {number}: {line!r} is not a timestamp (one non-negative integer "
                             "of milliseconds per line)")
        ms = int(line)
        if ms < previous:
            raise TraceError(f"{path}: line {number}: timestamp {ms} is before the previous one ({previous}); "
                             "a Mahimahi trace never goes back in time")
        stamps.append(ms)
        previous = ms
    if not stamps:
        raise TraceError(f"{path}: the Mahimahi trace holds no timestamps")
    if stamps[-1] == 0:
        raise TraceError(f"{path}: the Mahimahi trace lasts no time (its last timestamp is 0)")
    ms = np.asarray(stamps, dtype=np.float64)
    bins = math.ceil(ms[-1] / bin_ms)
    index = np.minimum(np.floor(ms / bin_ms).astype(np.int64), bins - 1)
    packets = np.bincount(index, minlength=bins).astype(np.float64)
    rates = np.maximum(packets * MTU_BYTES * 8 / (bin_ms / 1000) / 1e6, floor_mbps)
    return _link_frame(trace_id, column, np.arange(bins + 1) * bin_ms / 1000, rates)


def _field(fields: list[str], i: int, name: str, path, number: int) -> float:
    try:
        x = float(fields[i])
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x < 0:
        raise TraceError(f"{path}: line {number}: column {i + 1} ({name}) = {fields[i]!r} is not a finite "
                         "number >= 0")
    return x


def hsdpa_link(path: str | Path, trace_id: str | None = None, column: str = "down_mbps",
               floor_mbps: float = 0.01, rebase: bool = True) -> pd.DataFrame:
    """A link trace ``trace_id, t_s, <column>`` from a throughput log in the HSDPA dataset's
    format (Riiser et al., MMSys 2013; the Ghent 4G/LTE logs use it too).

    One line per measurement, 6 whitespace-separated columns: unix time (s), a monotonic time in
    ms (from an unspecified start), latitude, longitude, bytes received since the previous line,
    ms elapsed since the previous line. Only columns 2, 5 and 6 are used (the others must be
    there). Each line's rate ``bytes * 8 / (ms / 1000) / 1e6`` Mbps applies from the previous
    line's time to its own (column 2); the first line's from its time minus its elapsed ms, or,
    where its elapsed ms is 0, the first line only marks the start. A final row at the last
    line's time marks the end. ``t_s`` is column 2 / 1000, shifted so that the trace starts at 0
    (``rebase=False``: as logged; the schema allows any start).

    A line with 0 bytes carried nothing; hetsim needs rates > 0, so rates below ``floor_mbps``
    (default 0.01 Mbps; a 0-byte line's 0 among them) are raised to it.
    Malformed lines raise :class:`TraceError` (a ``ValueError``) naming the file and the line:
    not 6 columns, a used column that is not a finite number >= 0, a time (column 2) that does
    not increase, 0 elapsed ms after the first line, or bytes over 0 ms.
    """
    trace_id, floor_mbps = _rate_args(path, trace_id, column, floor_mbps)
    edges, rates = [], []
    last = None
    for number, line in _lines(path, "HSDPA-format throughput log"):
        fields = line.split()
        if len(fields) != 6:
            raise TraceError(f"{path}: line {number}: {len(fields)} columns; an HSDPA-format log has 6 (unix s, "
                             "ms since start, latitude, longitude, bytes since the previous line, ms since it)")
        t_ms = _field(fields, 1, "ms since start", path, number)
        nbytes = _field(fields, 4, "bytes since the previous line", path, number)
        elapsed = _field(fields, 5, "ms since the previous line", path, number)
        if last is not None and t_ms <= last:
            raise TraceError(f"{path}: line {number}: time {fields[1]} ms does not increase (the previous line's "
                             f"is {last:g} ms)")
        if elapsed == 0:
            if last is not None or nbytes > 0:
                raise TraceError(f"{path}: line {number}: {fields[4]} bytes over 0 ms since the previous line; "
                                 "a rate needs elapsed time > 0")
        else:
            edges.append(last if last is not None else t_ms - elapsed)
            rates.append(max(nbytes * 8 / (elapsed / 1000) / 1e6, floor_mbps))
        last = t_ms
    if not rates:
        raise TraceError(f"{path}: the log holds no measurement with elapsed time > 0")
    edges_ms = np.asarray([*edges, last], dtype=np.float64)
    if rebase:
        edges_ms = edges_ms - edges_ms[0]
    return _link_frame(trace_id, column, edges_ms / 1000, np.asarray(rates, dtype=np.float64))
