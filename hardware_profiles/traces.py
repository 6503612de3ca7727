"""Traces are data: one documented schema for link, compute and availability traces.

A trace file is CSV or Parquet with one row per piece (docs/conditions.md):

* link traces:   ``trace_id, t_s, down_mbps, up_mbps`` (either rate column may be absent);
* compute traces: ``trace_id, t_s, factor``;
* availability:  ``trace_id, start_s, end_s`` (online intervals).

Per trace, ``t_s`` starts anywhere and increases strictly; piece i spans ``[t_i, t_{i+1})`` and
the last row's time is where the trace ends. Rates and factors are finite and > 0; intervals
are finite, non-overlapping and in order. Every problem is one :class:`TraceError` naming the
file, the trace and the row. Converters from formats the field uses write this schema
(:mod:`hardware_profiles.trace_formats`).

The example traces shipped in ``hardware_profiles/traces/`` are named ``builtin:NAME`` in a
config (``builtin:fluctuating_links``, the file name with or without its extension), so a config
reaches them from any folder: :func:`builtin_trace`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hardware_profiles.suggest import unknown


class TraceError(ValueError):
    """A trace file that does not follow the schema (the message names file, trace and row)."""


BUILTIN_PREFIX = "builtin:"
BUILTIN_DIR = Path(__file__).parent / "traces"
_TRACE_SUFFIXES = (".csv", ".parquet")


def builtin_names() -> list[str]:
    """The shipped traces, as ``builtin:NAME`` (sorted)."""
    return sorted(BUILTIN_PREFIX + p.stem for p in BUILTIN_DIR.iterdir() if p.suffix in _TRACE_SUFFIXES)


def builtin_trace(name: str) -> Path:
    """The file of the shipped trace ``builtin:NAME`` (``NAME`` with or without its extension);
    an unknown name is a :class:`TraceError` with the closest one and the list."""
    stem = name.removeprefix(BUILTIN_PREFIX).strip()
    for candidate in (BUILTIN_DIR / stem, *(BUILTIN_DIR / (stem + s) for s in _TRACE_SUFFIXES)):
        if candidate.suffix in _TRACE_SUFFIXES and candidate.is_file() and "/" not in stem:
            return candidate
    raise TraceError(unknown("shipped trace", name, builtin_names(), "shipped traces"))


def _read(path: str | Path):
    import pandas as pd  # pandas: only a fleet with trace files reads one

    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file {str(p)!r} does not exist")
    try:
        df = pd.read_parquet(p) if p.suffix.lower() in (".parquet", ".pq") else pd.read_csv(p)
    except Exception as err:  # noqa: BLE001 - pandas/pyarrow raise many types for a foreign file
        raise TraceError(f"trace file {str(p)!r} is unreadable as {'Parquet' if p.suffix == '.parquet' else 'CSV'}: "
                         f"{type(err).__name__}: {err}") from None
    if "trace_id" not in df.columns and "client_id" in df.columns:  # one trace per client, by its id
        df = df.rename(columns={"client_id": "trace_id"})
    if "trace_id" not in df.columns:
        raise TraceError(f"trace file {str(p)!r} has no 'trace_id' (or 'client_id') column; "
                         f"columns: {list(df.columns)}")
    if df.empty:
        raise TraceError(f"trace file {str(p)!r} holds no rows")
    df["trace_id"] = df["trace_id"].astype(str)
    return df


def _numeric(df, path, cols: tuple[str, ...]) -> None:
    import pandas as pd  # pandas: see _read

    for c in cols:
        values = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=np.float64)  # text: NaN, named below
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            row = int(bad[0])
            raise TraceError(f"{path}: row {row + 2}: {c} = {df[c].iloc[row]!r} is not a finite number "
                             f"(trace {df['trace_id'].iloc[row]!r})")
        df[c] = values


def read_rate_traces(path: str | Path, column: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{trace_id: (t_s, values)}`` of the rate ``column`` (``down_mbps``, ``up_mbps`` or
    ``factor``), each trace sorted as written and checked."""
    df = _read(path)
    missing = [c for c in ("t_s", column) if c not in df.columns]
    if missing:
        raise TraceError(f"{path}: columns {missing} missing; a trace with {column} needs trace_id, t_s, {column}")
    _numeric(df, path, ("t_s", column))
    out = {}
    for tid, rows in df.groupby("trace_id", sort=False):
        t = rows["t_s"].to_numpy(dtype=np.float64)
        v = rows[column].to_numpy(dtype=np.float64)
        if len(t) < 2:
            raise TraceError(f"{path}: trace {tid!r} has {len(t)} row; give at least 2 (the last row marks its end)")
        step = np.flatnonzero(np.diff(t) <= 0)
        if step.size:
            row = int(rows.index[step[0] + 1]) + 2
            raise TraceError(f"{path}: trace {tid!r}: t_s must increase strictly; row {row} "
                             f"has t_s = {t[step[0] + 1]!r} after {t[step[0]]!r}")
        low = np.flatnonzero(v <= 0)
        if low.size:
            raise TraceError(f"{path}: trace {tid!r}: row {int(rows.index[low[0]]) + 2}: {column} = {v[low[0]]!r}; "
                             "rates and factors must be > 0 (a link that carries nothing never finishes)")
        out[str(tid)] = (t, v)
    return out


def read_interval_traces(path: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{trace_id: (start_s, end_s)}`` of online intervals, checked: in order, not overlapping."""
    df = _read(path)
    missing = [c for c in ("start_s", "end_s") if c not in df.columns]
    if missing:
        raise TraceError(f"{path}: columns {missing} missing; availability intervals need trace_id, start_s, end_s")
    _numeric(df, path, ("start_s", "end_s"))
    out = {}
    for tid, rows in df.groupby("trace_id", sort=False):
        s = rows["start_s"].to_numpy(dtype=np.float64)
        e = rows["end_s"].to_numpy(dtype=np.float64)
        bad = np.flatnonzero((e <= s) | (s < 0))
        if bad.size:
            raise TraceError(f"{path}: trace {tid!r}: row {int(rows.index[bad[0]]) + 2}: interval [{s[bad[0]]!r}, "
                             f"{e[bad[0]]!r}) must have 0 <= start_s < end_s")
        overlap = np.flatnonzero(s[1:] < e[:-1])
        if overlap.size:
            raise TraceError(f"{path}: trace {tid!r}: row {int(rows.index[overlap[0] + 1]) + 2} starts at "
                             f"{s[overlap[0] + 1]!r}, before the previous interval ends ({e[overlap[0]]!r}); "
                             "intervals must be in order and not overlap")
        out[str(tid)] = (s, e)
    return out


def pick(available: dict, wanted, path, what: str) -> dict[str, float]:
    """The traces a condition set uses, as ``{trace_id: share}`` (``wanted``: a list, shares,
    or None for every trace in the file, in equal shares)."""
    if wanted is None:
        wanted = list(available)
    if isinstance(wanted, list):
        wanted = {t: 1.0 / len(wanted) for t in wanted}
    unknown = [t for t in wanted if str(t) not in available]
    if unknown:
        raise TraceError(f"{what}.traces names {unknown}, not in {path}; its traces: {sorted(available)[:20]}")
    total = sum(wanted.values())
    if not wanted or abs(total - 1) > 1e-6 or any(v < 0 for v in wanted.values()):
        raise TraceError(f"{what}.traces shares {wanted!r} must be >= 0 and sum to 1")
    return {str(k): float(v) for k, v in wanted.items()}
