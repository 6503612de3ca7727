"""Run folders: the resolved config, a manifest and Parquet tables, written as the run goes.

Layout of one run (schema in ``docs/results.md``)::

    <run>/config.yaml        resolved experiment config
    <run>/manifest.json      versions, seed, start time, command, status
    <run>/profiles.parquet   one row per client (hardware profile)
    <run>/rounds.parquet     one row per round
    <run>/clients.parquet    one row per round x selected client
    <run>/<extra>.parquet    optional method traces (e.g. FedCSPACK's shared packs)
    <run>/faults.parquet     client hosts that died and were replaced (Ray executor)
    <run>/checkpoints/       checkpoints for resuming (engine.checkpoint.folder)

Each round is first written as its own small Parquet part under ``_parts/<table>/``
(atomically: temp file + rename), so a crash loses at most the round in flight. Every
``COMPACT_PARTS`` parts of a table are merged into a chunk (``<first>-<last>.parquet``, grown
until it holds ``CHUNK_BYTES``), so a run of any length keeps a bounded number of files and
compacts quickly when it ends; then the parts and chunks become one file per table.
:func:`load_run` reads either form.

A file that cannot be read (a full disk, a power loss) is named with what to do
(:class:`RunFolderError`); a resume finds such files (:func:`damaged_files`) and sets them
aside (:func:`set_aside`) when a checkpoint rebuilds their rounds (``docs/checkpoints.md``).
Over 400 lines because the writer, the readers and the damaged-file checks share one part layout
(numbers, chunks, what a reader reads), which is kept in this one module.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from engine.atomic import write_atomic
from engine.config.yamlio import parse_yaml
from engine.errors import CorruptRunFolderError, UserError
from engine.results.manifest import parse_manifest
from engine.storage.locations import Storage, open_storage

PARTS = "_parts"
DAMAGED = ".damaged"  # suffix of a file set aside as unreadable (readers' globs skip it)
COMPACT_PARTS = 64  # loose parts of one table that are merged into its open chunk
CHUNK_BYTES = 32 * 2**20  # a chunk this large is closed: the next merge starts a new one

# Columns every run has (methods add their own trace columns; see docs/results.md).
ROUND_COLUMNS = (
    "round", "num_selected", "num_run", "num_arrived", "num_unavailable", "num_dropout", "num_nonfinite",
    "sim_round_s", "sim_time_s", "sim_deadline_s", "bytes_up", "bytes_down", "train_loss",
    "pers_acc", "pers_acc_weighted", "pers_acc_worst", "pers_acc_std", "pers_loss",
    "global_acc", "global_loss", "round_start_s",
    "energy_download_j", "energy_train_j", "energy_compress_j", "energy_upload_j", "energy_j", "energy_wasted_j",
    "wall_s",
)
CLIENT_COLUMNS = (
    "round", "client_id", "tier", "net_tier", "arch", "num_samples", "bytes_up", "bytes_down",
    "train_flops", "compress_ops", "sim_download_s", "sim_compute_s", "sim_compress_s",
    "sim_upload_s", "sim_total_s", "made_deadline", "drop_reason", "train_loss",
    "pers_acc", "pers_loss", "test_samples", "wall_fit_s",
    "start_s", "download_end_s", "train_end_s", "compress_end_s", "upload_end_s",
    "energy_download_j", "energy_train_j", "energy_compress_j", "energy_upload_j", "energy_j",
)
# clients.parquet columns of fleets with conditions over time (clients.profiles.conditions)
CONDITION_COLUMNS = ("down_mbps", "up_mbps", "down_state", "up_state", "left_s")
# columns of fleets with batteries (clients.profiles.battery): rounds.parquet, clients.parquet
BATTERY_ROUND_COLUMNS = ("num_battery", "battery_mean", "battery_min")
BATTERY_CLIENT_COLUMNS = ("battery_level", "battery_level_end", "on_charger", "left_s")
PROFILE_COLUMNS = (
    "client_id", "gflops", "down_mbps", "up_mbps", "latency_s", "memory_gb", "availability",
    "dropout", "train_w", "idle_w", "rx_w", "tx_w", "tail_j", "battery_wh",
    "cache_bytes", "topk_ns_in_cache", "topk_ns_out_of_cache", "randomk_ns_per_kept", "periodick_ns_per_kept",
    "quant_ns_per_elem", "tier", "net_tier",
)
# Tables that log what happened rather than one row per round: kept whole when a resumed run
# rewinds its round tables to a checkpoint.
HISTORY_TABLES = ("profiles", "faults")
FAULT_COLUMNS = (
    "round", "actor", "pid", "clients", "clients_restored", "cause", "recovery", "checkpoint",
    "state_rounds_lost", "seconds_lost",
)
# Host wall-clock columns: the only ones that differ between two runs with the same seed.
WALL_COLUMNS = ("wall_s", "wall_fit_s")


def _write_parquet_atomic(df: pd.DataFrame, path: Path) -> None:
    write_atomic(path, lambda f: df.to_parquet(f, index=False))


def _rows_as_arrow(rows: list[dict[str, Any]]):
    """Row dicts as an Arrow table with the columns and types ``pd.DataFrame(rows)`` would give
    (every key of every row, in order of appearance; a missing value is null), or None where
    Arrow cannot type a column on its own (pandas then decides, as before). 3x faster than
    going through pandas for a round's rows: the driver writes two such parts per round."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    if not keys:  # rows without columns: pandas' empty frame, which is not written
        return None
    try:
        return pa.table({k: [row.get(k) for row in rows] for k in keys})
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


class RunWriter:
    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._seq: dict[str, int] = {}
        self._loose: dict[str, int] = {}  # parts of each table not merged into a chunk yet

    def write_table(self, name: str, df: pd.DataFrame | pa.Table) -> None:
        if isinstance(df, pa.Table):
            write_atomic(self.dir / f"{name}.parquet", lambda f: pq.write_table(df, f))
        else:
            _write_parquet_atomic(df, self.dir / f"{name}.parquet")

    def append(self, table: str, rows: list[dict[str, Any]] | dict[str, Any] | pd.DataFrame | pa.Table) -> None:
        """Append rows (row dicts, columns, a frame or an Arrow table) to ``table`` durably (one
        part per call)."""
        if isinstance(rows, pa.Table):
            arrow = rows
        else:
            arrow = _rows_as_arrow(rows) if isinstance(rows, list) and rows else None
        if arrow is not None and arrow.num_rows == 0:
            return
        df = None
        if arrow is None:
            df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
            if df.empty:
                return
        seq = self._seq.get(table, 0)
        self._seq[table] = seq + 1
        part_dir = self.dir / PARTS / table
        part_dir.mkdir(parents=True, exist_ok=True)
        path = part_dir / f"{seq:07d}.parquet"
        if table not in self._loose:  # a writer continuing a folder (resume): count what is there
            self._loose[table] = sum(1 for n in live_parts(_names(part_dir)) if "-" not in n)
        if df is not None:
            _write_parquet_atomic(df, path)
        else:
            write_atomic(path, lambda f: pq.write_table(arrow, f))
        self._loose[table] += 1
        if self._loose[table] >= COMPACT_PARTS:
            self._merge_parts(part_dir)
            self._loose[table] = 0

    def _merge_parts(self, part_dir: Path) -> None:
        """Merge the loose parts of a table, and its open chunk if it is not full, into one chunk
        named after the first and last part it holds. Crash-safe: the chunk appears whole
        (temp + rename) before the files it replaces go, and readers skip files a chunk covers."""
        names = live_parts(_names(part_dir))
        merge = [n for n in names if "-" not in n]
        chunks = [n for n in names if "-" in n]
        if chunks and (part_dir / chunks[-1]).stat().st_size < CHUNK_BYTES:
            merge.insert(0, chunks[-1])
        first, last = _span(merge[0])[0], _span(merge[-1])[1]
        target = part_dir / f"{first:07d}-{last:07d}.parquet"
        same = _same_schema([part_dir / n for n in merge])
        if same is not None:  # the usual case: Arrow alone, 3x faster than through pandas
            write_atomic(target, lambda f: pq.write_table(same, f))
        else:  # columns whose types differ between parts: pandas decides, as at the end
            df = _read_files([part_dir / n for n in merge])
            if df is None:
                return
            try:
                _write_parquet_atomic(df, target)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                return  # a column mixing kinds (1 and "x"): left to the final compaction to report
        _remove_covered(part_dir)

    def sequence(self) -> dict[str, int]:
        """Parts written so far per table (checkpoints record it)."""
        return dict(self._seq)

    def rewind(self, next_round: int, sequence: dict[str, int] | None = None,
               damaged: Iterable[Path] = ()) -> dict[str, int]:
        """Drop every row of round >= ``next_round`` from every round table (parts and compacted
        tables) and continue numbering parts after the ones that remain, so a resumed run
        appends each round exactly once. ``sequence``: the part counts a checkpoint recorded
        (parts are never numbered below them). Tables in ``HISTORY_TABLES`` are kept whole.
        ``damaged``: unreadable files (:func:`damaged_files`) that hold only rounds >= ``next_round``
        (the caller resumes from a checkpoint at or before them): set aside, not read, and listed
        in ``self.set_aside`` (old path: new). Crash-safe: every step can be redone. Returns the
        rows dropped per table (a set-aside file's rows are not counted: they cannot be read)."""
        dropped: dict[str, int] = {}
        self.set_aside: dict[Path, Path] = {}  # old path -> new
        bad = {Path(p) for p in damaged}
        names = {p.name for p in (self.dir / PARTS).glob("*") if p.is_dir()}
        names |= {p.stem for p in self.dir.glob("*.parquet")}
        for name in sorted(names - set(HISTORY_TABLES)):
            dropped[name] = self._rewind_table(name, next_round, bad)
            part_dir = self.dir / PARTS / name
            numbers = [_span(n)[1] for n in live_parts(_names(part_dir))]
            self._seq[name] = max([(sequence or {}).get(name, 0), *(n + 1 for n in numbers)])
        for name in sorted(names & set(HISTORY_TABLES)):  # kept whole; the resumed run adds to them
            part_dir = self.dir / PARTS / name
            compacted = self.dir / f"{name}.parquet"
            if name != "profiles" and compacted.exists() and not live_parts(_names(part_dir)):
                part_dir.mkdir(parents=True, exist_ok=True)  # else the next compaction replaces it
                os.replace(compacted, part_dir / "0000000.parquet")
            numbers = [_span(n)[1] for n in live_parts(_names(part_dir))]
            self._seq[name] = max([self._seq.get(name, 0), *(n + 1 for n in numbers)])
        self._loose.clear()  # counted again on the next append
        return dropped

    def _rewind_table(self, name: str, next_round: int, bad: set[Path]) -> int:
        part_dir = self.dir / PARTS / name
        compacted = self.dir / f"{name}.parquet"
        if compacted in bad:  # all its rounds are recomputed; parts beside it are older copies
            self.set_aside[compacted] = set_aside(compacted)
            for p in part_dir.glob("*.parquet"):
                p.unlink()
            return 0
        if compacted.exists():  # a finalized run: the compacted table is the truth; it becomes part 0
            df = _read_parquet(compacted)
            _require_round(df, name)
            keep = df[df["round"] < next_round]
            part_dir.mkdir(parents=True, exist_ok=True)
            tmp = part_dir / "0000000.parquet.tmp"
            if len(keep):
                keep.to_parquet(tmp, index=False)
            for p in part_dir.glob("*.parquet"):
                p.unlink()
            if len(keep):
                os.replace(tmp, part_dir / "0000000.parquet")
            compacted.unlink()
            return len(df) - len(keep)
        dropped = 0
        if part_dir.exists():
            _remove_covered(part_dir)  # a merge that was killed before it removed its inputs
        for p in [part_dir / n for n in live_parts(_names(part_dir))]:
            if p in bad:  # written after the checkpoint resumed from: its rounds are recomputed
                self.set_aside[p] = set_aside(p)
                continue
            rounds = _read_parquet(p)
            _require_round(rounds, name)
            late = rounds["round"] >= next_round
            if late.all():
                p.unlink()
            elif late.any():
                _write_parquet_atomic(rounds[~late].reset_index(drop=True), p)
            dropped += int(late.sum())
        return dropped

    def finalize(self) -> None:
        """Compact every table's parts into ``<table>.parquet`` and remove the parts."""
        parts_root = self.dir / PARTS
        if not parts_root.exists():
            return
        for table_dir in sorted(p for p in parts_root.iterdir() if p.is_dir()):
            df = _read_parts(table_dir)
            if df is not None:
                self.write_table(table_dir.name, df)
        kept = [p for p in parts_root.rglob(f"*{DAMAGED}*") if p.is_file()]
        if not kept:
            shutil.rmtree(parts_root)
            return
        # files set aside as damaged stay for the user to inspect; the rest goes
        for p in sorted(parts_root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if p.is_file() and DAMAGED not in p.name:
                p.unlink()
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()


def _require_round(df: pd.DataFrame, name: str) -> None:
    if "round" not in df.columns:
        raise ValueError(f"table {name!r} has no 'round' column: cannot rewind it to a checkpoint")


class RunFolderError(UserError, FileNotFoundError):
    """A run folder (or one of its files) is missing or unreadable."""


def _unreadable(path: Path | str, err: BaseException) -> RunFolderError:
    """The error for a run folder's Parquet file that cannot be read: which, why, what to do."""
    return RunFolderError(
        f"{path} is unreadable ({type(err).__name__}: {str(err).strip()[:200]}); the file is "
        f"truncated or not Parquet (cut by a full disk or a power loss?); {_remedy(str(path))}")


def _remedy(path: str) -> str:
    """What to do about a damaged Parquet file of a run folder, by where it lies."""
    parent, name = path.rstrip("/").rsplit("/", 1) if "/" in path else ("", path)
    run = parent.rpartition("/")[0]
    if run.endswith(f"/{PARTS}") or run == PARTS:  # a part: a resume rebuilds its rounds
        run = run[: -len(PARTS)].rstrip("/") or "."
        return (f"`hetsim run --resume {run}` sets it aside (as {name}{DAMAGED}) and recomputes its rounds "
                f"from a checkpoint at or before them")
    run = parent or "."
    again = f"restore it from a copy, or run the experiment again (`hetsim run -c {run}/config.yaml`)"
    if name == "profiles.parquet":  # built from the config: a resume writes it again
        return f"if the run is unfinished, `hetsim run --resume {run}` writes it again; else {again}"
    return again


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a truncated or foreign file
        raise _unreadable(path, err) from None


def set_aside(path: Path) -> Path:
    """Rename a damaged file to ``<name>.damaged`` (``.damaged-2``, ... if taken), out of every
    reader's way but kept for the user to inspect; returns the new path."""
    for i in range(1, 1000):
        target = path.with_name(f"{path.name}{DAMAGED}" + (f"-{i}" if i > 1 else ""))
        if not target.exists():
            os.replace(path, target)
            return target
    raise FileExistsError(f"{path}: too many damaged copies beside it; remove them")


@dataclass
class DamagedFile:
    """A Parquet file of a run folder that cannot be read."""

    table: str
    path: Path
    first: int  # the first part number it holds (a chunk's first); 0 for a compacted table
    error: str


def parquet_problem(path: Path) -> str | None:
    """Why the Parquet file ``path`` cannot be read, or None. Reads its footer and its ``round``
    column (what a resume needs), not every column: a file cut short or not Parquet fails here."""
    try:
        with pq.ParquetFile(path) as f:
            f.read(columns=["round"] if "round" in f.schema_arrow.names else [])
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        return f"{type(err).__name__}: {str(err).strip()[:200]}"
    return None


def damaged_files(run_dir: str | Path) -> list[DamagedFile]:
    """Every table file of a local run folder that cannot be read: compacted tables, and the
    parts readers would read (files already set aside are not listed)."""
    run_dir = Path(run_dir)
    names = {p.name for p in (run_dir / PARTS).glob("*") if p.is_dir()}
    names |= {p.stem for p in run_dir.glob("*.parquet")}
    out = []
    for name in sorted(names):
        compacted = run_dir / f"{name}.parquet"
        if compacted.exists():  # parts beside it are copies a compaction left: never read
            problem = parquet_problem(compacted)
            if problem is not None:
                out.append(DamagedFile(name, compacted, 0, problem))
            continue
        part_dir = run_dir / PARTS / name
        for part in live_parts(_names(part_dir)):
            problem = parquet_problem(part_dir / part)
            if problem is not None:
                out.append(DamagedFile(name, part_dir / part, _span(part)[0], problem))
    return out


def _span(name: str) -> tuple[int, int] | None:
    """The part numbers a part file holds: ``0000007.parquet`` (7, 7), a chunk
    ``0000000-0000063.parquet`` (0, 63); None for any other name."""
    if not name.endswith(".parquet"):
        return None
    first, dash, last = name[: -len(".parquet")].partition("-")
    if not first.isdigit() or (dash and not last.isdigit()):
        return None
    return int(first), int(last) if dash else int(first)


def live_parts(names: list[str]) -> list[str]:
    """The part files of a table to read, in order: those no chunk covers (a writer killed
    while merging leaves the chunk and the files it merged)."""
    spans = sorted(((_span(n), n) for n in names if _span(n) is not None), key=lambda t: (t[0][0], -t[0][1]))
    out, end = [], -1
    for (_, last), name in spans:
        if last > end:
            out.append(name)
            end = last
    return out


def _names(part_dir: Path) -> list[str]:
    return [p.name for p in part_dir.glob("*.parquet")] if part_dir.exists() else []


def _remove_covered(part_dir: Path) -> None:
    names = _names(part_dir)
    live = set(live_parts(names))
    for name in names:
        if name not in live and _span(name) is not None:
            (part_dir / name).unlink(missing_ok=True)


def _same_schema(files: list[Path], metadata: bool = False) -> pa.Table | None:
    """The files as one Arrow table if they all have the same columns and types (then pandas
    reads it as it reads them one by one) and, with ``metadata``, the same pandas metadata (kept:
    it converts the whole as it converts each part); None otherwise, or if one is unreadable
    (the pandas path names it)."""
    try:
        tables = [_read_arrow(f) if metadata else _read_arrow(f).replace_schema_metadata(None) for f in files]
    except Exception:  # noqa: BLE001 - pyarrow raises several types for a truncated file
        return None
    if not tables or any(not t.schema.equals(tables[0].schema, check_metadata=metadata) for t in tables):
        return None
    return pa.concat_tables(tables)


def _read_arrow(path: Path) -> pa.Table:
    return pq.ParquetFile(path).read()  # no dataset layer: ~3x faster than pq.read_table for a small part


def _read_files(files: list[Path]) -> pd.DataFrame | None:
    frames = [_read_parquet(f) for f in files]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else None


def _read_parts(table_dir: Path) -> pd.DataFrame | None:
    names = live_parts(_names(table_dir))
    if not names:
        return None
    files = [table_dir / n for n in names]
    same = _same_schema(files, metadata=True)
    if same is not None:  # the usual case: one conversion to pandas, not one per part (~3x faster)
        return same.to_pandas() if same.num_rows else None
    return _read_files(files)


def _as_storage(run_dir) -> Storage:
    return run_dir if isinstance(run_dir, Storage) else open_storage(run_dir)


def read_table(run_dir, table: str) -> pd.DataFrame | None:
    """One table of a run, finished (compacted) or still in progress / crashed (parts).

    ``run_dir``: a local path, a URI (``s3://...``) or an :class:`engine.storage.locations.Storage`.
    A run that compacts its parts while they are read (it finished meanwhile) is read again.
    """
    for _ in range(2):
        try:
            return _read_table_once(run_dir, table)
        except FileNotFoundError:  # a listed part is gone: the parts were compacted meanwhile
            pass
    return _read_table_once(run_dir, table)


def _read_table_once(run_dir, table: str) -> pd.DataFrame | None:
    if not isinstance(run_dir, (str, Path)) or "://" in str(run_dir):
        store = _as_storage(run_dir)
        if store.exists(f"{table}.parquet"):
            return _read_stored(store, f"{table}.parquet")
        parts = live_parts(store.list(f"{PARTS}/{table}", dirs=False))
        frames = [_read_stored(store, f"{PARTS}/{table}/{p}") for p in parts]
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else None
    run_dir = Path(run_dir)
    final = run_dir / f"{table}.parquet"
    if final.exists():
        return _read_parquet(final)
    table_dir = run_dir / PARTS / table
    return _read_parts(table_dir) if table_dir.exists() else None


def _read_stored(store: Storage, rel: str) -> pd.DataFrame:
    try:
        return store.read_parquet(rel)
    except UserError:  # unreachable storage: its message says so
        raise
    except FileNotFoundError:  # a part compacted meanwhile: read_table reads again
        raise
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise _unreadable(store.child(rel).uri, err) from None


@dataclass
class Run:
    """A run folder loaded into pandas."""

    path: Path | str  # a URI for runs in object storage
    config: dict[str, Any]
    manifest: dict[str, Any]
    rounds: pd.DataFrame
    clients: pd.DataFrame
    profiles: pd.DataFrame | None

    def table(self, name: str) -> pd.DataFrame | None:
        return read_table(self.path, name)


def load_run(run_dir) -> Run:
    """Load a run folder (finished, running or crashed) into DataFrames.

    ``run_dir``: a local path, a URI (``s3://bucket/runs/x``; see :mod:`engine.storage.locations`) or an
    :class:`engine.storage.locations.Storage`; ``Run.path`` is a ``Path`` for local folders, else the URI.
    A missing folder or manifest, or an unreadable file, is a :class:`RunFolderError` naming it.
    """
    if isinstance(run_dir, (str, Path)) and "://" not in str(run_dir):
        source = path = Path(run_dir)
        if not path.is_dir():
            what = "is a file" if path.exists() else "does not exist"
            raise RunFolderError(f"{path} {what}; give a run folder (it holds manifest.json)")
        exists = lambda name: (path / name).exists()  # noqa: E731
        read_text = lambda name: (path / name).read_text(errors="replace")  # noqa: E731 - garbage: said by the parser
    else:
        source = store = _as_storage(run_dir)
        path = Path(store.path) if not store.is_remote else store.uri
        exists = store.exists
        read_text = lambda name: store.read_bytes(name).decode(errors="replace")  # noqa: E731
    if not exists("manifest.json"):
        raise RunFolderError(f"{path} is not a run folder (no manifest.json)")
    try:
        manifest = parse_manifest(read_text("manifest.json"), f"{path}/manifest.json", path)
    except (OSError, CorruptRunFolderError) as err:
        raise RunFolderError(str(err) if isinstance(err, CorruptRunFolderError) else
                             f"{path}/manifest.json is unreadable ({type(err).__name__}: {err})") from None
    try:
        config = parse_yaml(read_text("config.yaml"), f"{path}/config.yaml") if exists("config.yaml") else {}
    except (OSError, ValueError, UserError, yaml.YAMLError) as err:
        raise RunFolderError(
            f"{path}/config.yaml is damaged ({type(err).__name__}: {' '.join(str(err).split())[:300]}); restore it "
            "from a copy (every checkpoint's checkpoint.json holds the config too, under 'config')") from None
    if config is not None and not isinstance(config, dict):
        raise RunFolderError(
            f"{path}/config.yaml is damaged (it holds a {type(config).__name__}, not a config); restore it "
            "from a copy (every checkpoint's checkpoint.json holds the config too, under 'config')")
    rounds = read_table(source, "rounds")
    clients = read_table(source, "clients")
    return Run(
        path=path,
        config=config or {},
        manifest=manifest,
        rounds=rounds if rounds is not None else pd.DataFrame(),
        clients=clients if clients is not None else pd.DataFrame(),
        profiles=read_table(source, "profiles"),
    )
