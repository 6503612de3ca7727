"""Checkpoints of a running :class:`~engine.simulation.Simulation`: write, find, restore.

A checkpoint is a folder, complete or absent (written under a temporary name, then renamed)::

    <dir>/checkpoint.json   next round, simulated time, table part counts, shard list (JSON)
    <dir>/server.pt         global models, the method's server fields, the loop's RNG states
    <dir>/clients-0000.pt   client states, one shard per client host (in-process: one;
    <dir>/clients-0001.pt   Ray: one per actor, written by the actor itself)

``.pt`` files hold ``{"format", "meta" (a JSON string), "tensors"}`` written with
``torch.save`` and read with ``weights_only=True``: values are encoded by the one codec of
:mod:`algorithms.state`, so nothing is ever unpickled. Shards are read memory-mapped, so a host
that needs a few clients of a large shard reads only those.

In a run folder, :class:`CheckpointCallback` writes ``checkpoints/round-000040/`` (the number
is the next round to run) every ``checkpoint.every`` rounds and when a run is interrupted or
stopped, keeps the newest ``checkpoint.keep`` and lists them in ``checkpoints/index.json``.

For other callers (e.g. Ray Tune trials): :func:`write_checkpoint` (a Simulation between
rounds -> a folder) and :func:`restore_checkpoint` (a folder -> a started Simulation built
from the same config).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np
import torch

from algorithms.state import decode, encode
from engine.loop.callbacks import RunCallback, RunContext

if TYPE_CHECKING:
    from engine.config.schema import ExperimentConfig
    from engine.results.tables import RunWriter
    from engine.loop.simulation import RoundRecord, Simulation

FORMAT = "hetsim-checkpoint/1"
BLOB_FORMAT = "hetsim-state/1"
META = "checkpoint.json"
SERVER_FILE = "server.pt"
CHECKPOINTS = "checkpoints"
INDEX = "index.json"

# Config fields that cannot change results: a resumed run may change them (docs/checkpoints.md).
# The torch thread count per client host is checked separately (it changes float rounding).
RESULT_NEUTRAL_FIELDS = (
    "output",
    "checkpoint.every",
    "checkpoint.keep",
    "executor.kind",
    "executor.num_actors",
    "executor.clients_per_actor",
    "executor.cpus_per_actor",
    "executor.threads_per_actor",
    "executor.startup_timeout_s",
    "ray.address",
    "ray.num_cpus",
    "ray.num_gpus",
    "ray.connect_timeout_s",
    "clock.max_sleep_s",  # only caps the sleep of realtime mode
)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, found or restored."""


def shard_name(host: int) -> str:
    return f"clients-{host:04d}.pt"


def checkpoint_name(next_round: int) -> str:
    return f"round-{next_round:06d}"


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
    if isinstance(src, (bytes, bytearray, memoryview)):
        obj = torch.load(io.BytesIO(src), weights_only=True)
    else:
        obj = torch.load(src, weights_only=True, mmap=True)
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


def shards_for(shards: list[dict], num_hosts: int, host: int) -> list[dict]:
    """Shards host ``host`` of ``num_hosts`` must read: its own if the layout is unchanged."""
    same = [s for s in shards if s["num_hosts"] == num_hosts and s["host"] == host]
    return same if same and all(s["num_hosts"] == num_hosts for s in shards) else list(shards)


# ------------------------------------------------------------------------------ config checks
def host_threads(cfg: "ExperimentConfig") -> int:
    """Torch threads per client host, as the executors set them."""
    ex = cfg.executor
    if ex.threads_per_actor:
        return ex.threads_per_actor
    return max(1, int(ex.cpus_per_actor)) if ex.kind == "ray" else 1


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _neutral(path: str) -> bool:
    return any(path == f or path.startswith(f + ".") for f in RESULT_NEUTRAL_FIELDS)


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(field, old, new) for every field that differs between two config dicts."""
    a, b = _flatten(old), _flatten(new)
    missing = object()
    return [(k, a.get(k, missing), b.get(k, missing)) for k in sorted(set(a) | set(b))
            if a.get(k, missing) != b.get(k, missing)]


def check_resumable(saved: "ExperimentConfig", new: "ExperimentConfig") -> None:
    """Refuse a config change that could change results (ConfigError naming the fields)."""
    from engine.config.schema import ConfigError

    bad = [(k, o, n) for k, o, n in config_changes(saved.to_dict(), new.to_dict()) if not _neutral(k)]
    lines = [f"  {k}: {o!r} -> {n!r}" for k, o, n in bad]
    if host_threads(saved) != host_threads(new):
        lines.append(
            f"  torch threads per client host: {host_threads(saved)} -> {host_threads(new)} "
            "(changes floating-point rounding; set executor.threads_per_actor="
            f"{host_threads(saved)} to keep it)"
        )
    if lines:
        raise ConfigError(
            "cannot resume with a config that changes results:\n" + "\n".join(lines)
            + "\nonly these may change on resume: " + ", ".join(RESULT_NEUTRAL_FIELDS)
        )


def results_fingerprint(cfg: "ExperimentConfig") -> str:
    """A hash of every config field that can change results."""
    flat = {k: v for k, v in _flatten(cfg.to_dict()).items() if not _neutral(k)}
    flat["<host_threads>"] = host_threads(cfg)
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ write / restore
def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2))


def write_checkpoint(
    sim: "Simulation",
    directory: str | Path,
    *,
    tables: dict[str, int] | None = None,
    reason: str = "",
) -> dict:
    """Write everything the next round of ``sim`` depends on into ``directory``.

    ``sim`` must be started and between rounds. The folder appears complete or not at all
    (written as ``<directory>.tmp-<pid>`` and renamed; an existing checkpoint there is
    replaced). ``tables``: the run writer's part counts, for resuming its Parquet tables.
    Returns the checkpoint's metadata (also in ``checkpoint.json``).
    """
    if sim.in_round:
        raise CheckpointError("cannot checkpoint in the middle of a round")
    directory = Path(directory)
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        server_bytes = save_blob(
            {"server": sim.server.checkpoint_state(), "rng": _rng_state(), "sim_time_s": sim.sim_time_s},
            tmp / SERVER_FILE, path=f"{type(sim.server).__name__}",
        )
        shards = sim.executor.save_client_states(tmp)
        meta = {
            "format": FORMAT,
            "next_round": sim.next_round,
            "rounds": sim.cfg.rounds,
            "sim_time_s": sim.sim_time_s,
            "algorithm": sim.cfg.algorithm.name,
            "seed": sim.cfg.seed,
            "results_fingerprint": results_fingerprint(sim.cfg),
            "written": dt.datetime.now(dt.timezone.utc).isoformat(),
            "reason": reason,
            "tables": dict(tables or {}),
            "server": {"file": SERVER_FILE, "bytes": server_bytes},
            "client_states": shards,
            "bytes": server_bytes + sum(s["bytes"] for s in shards),
            "write_s": None,
        }
        meta["write_s"] = time.perf_counter() - t0
        _write_json(tmp / META, meta)
        _replace_dir(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _replace_dir(src: Path, dest: Path) -> None:
    if dest.exists():
        if any(dest.iterdir()) and not (dest / META).exists():
            raise CheckpointError(f"{dest} exists and is not a checkpoint; not replacing it")
        old = dest.with_name(f"{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
        os.replace(src, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dest)


def read_meta(directory: str | Path, verify: bool = False) -> dict:
    """A checkpoint's ``checkpoint.json``; ``verify``: also check that every file it lists is
    there with the size it had when written (an incomplete checkpoint raises)."""
    directory = Path(directory)
    try:
        meta = json.loads((directory / META).read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{directory} is not a readable checkpoint: {err}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{directory}: unknown checkpoint format {meta.get('format')!r}")
    if verify:
        for entry in [meta["server"], *meta["client_states"]]:
            f = directory / entry["file"]
            size = f.stat().st_size if f.is_file() else None
            if size != entry["bytes"]:
                raise CheckpointError(f"{f} is incomplete ({size} bytes, {entry['bytes']} written)")
    return meta


def restore_checkpoint(sim: "Simulation", directory: str | Path, *, allow_config_change: bool = False) -> dict:
    """Put ``sim`` (built from the same config; started here if it is not) in the state the
    checkpoint in ``directory`` holds: its next round is the checkpoint's. Returns the metadata.

    ``allow_config_change``: ``sim``'s config may differ from the one that wrote the checkpoint
    (Population Based Training continues a trial's state with new hyperparameters; methods take
    hyperparameters from the config, not from the restored state)."""
    directory = Path(directory)
    meta = read_meta(directory, verify=True)
    want = results_fingerprint(sim.cfg)
    if meta["results_fingerprint"] != want and not allow_config_change:
        raise CheckpointError(
            f"{directory} was written by a run with another config (fingerprint "
            f"{meta['results_fingerprint']}, this one {want}); results would not continue it"
        )
    sim.start()
    state = load_blob(directory / SERVER_FILE)
    sim.server.restore_checkpoint_state(state["server"])
    _set_rng_state(state["rng"])
    sim.sim_time_s = state["sim_time_s"]
    sim.next_round = int(meta["next_round"])
    sim.executor.load_client_states(directory, meta["client_states"])
    return meta


# ------------------------------------------------------------------------------ run folders
def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(next round, folder) of every complete checkpoint of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    out = []
    for d in root.glob("round-*"):
        if d.is_dir() and d.name[len("round-"):].isdigit() and (d / META).is_file():
            out.append((int(d.name[len("round-"):]), d))
    return sorted(out)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    for _, d in reversed(list_checkpoints(run_dir)):
        try:
            read_meta(d, verify=True)
        except CheckpointError:
            continue
        return d
    return None


def write_index(run_dir: str | Path) -> None:
    root = Path(run_dir) / CHECKPOINTS
    entries = []
    for n, d in list_checkpoints(run_dir):
        try:
            m = read_meta(d)
        except CheckpointError:
            continue
        entries.append({"next_round": n, "path": d.name, "written": m["written"], "reason": m["reason"],
                        "bytes": m["bytes"], "write_s": m["write_s"]})
    tmp = root / f"{INDEX}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "checkpoints": entries}, indent=2))
    os.replace(tmp, root / INDEX)


def prune_checkpoints(run_dir: str | Path, keep: int, newer_than: int | None = None) -> None:
    """Keep the newest ``keep`` checkpoints; with ``newer_than``, first drop those past that
    round (a resumed run's discarded future); remove leftovers of interrupted writes."""
    root = Path(run_dir) / CHECKPOINTS
    for d in root.glob("round-*.tmp-*"):
        shutil.rmtree(d, ignore_errors=True)
    for d in root.glob("round-*.old-*"):
        shutil.rmtree(d, ignore_errors=True)
    found = list_checkpoints(run_dir)
    if newer_than is not None:
        for n, d in found:
            if n > newer_than:
                shutil.rmtree(d, ignore_errors=True)
        found = [(n, d) for n, d in found if n <= newer_than]
    for _, d in found[: max(0, len(found) - keep)]:
        shutil.rmtree(d, ignore_errors=True)


class CheckpointCallback(RunCallback):
    """Writes the run's checkpoints (placed after the Parquet recorder: what it saves is on disk).

    Every ``checkpoint.every`` rounds (not after the last round), and when the run ends early
    between rounds (interrupted, stopped, diverged; not after a round that raised, whose state
    is incomplete). Tells the executor where replacement client hosts restore from.
    """

    def __init__(self, cfg: "ExperimentConfig", writer: "RunWriter | None" = None):
        self.cfg = cfg
        self.writer = writer
        self.last: int | None = None  # next_round of the newest checkpoint on disk
        self.sim: "Simulation | None" = None
        self.path: Path | None = None

    def on_run_begin(self, run: RunContext) -> None:
        self.sim, self.path = run.simulation, run.path
        if self.sim is None or self.path is None:
            return
        latest = latest_checkpoint(self.path)
        if latest is not None and read_meta(latest)["next_round"] == self.sim.next_round:
            self.last = self.sim.next_round
            self.sim.executor.recovery_checkpoint = latest
        self.sim.executor.run_dir = self.path

    def on_round_end(self, run: RunContext, record: "RoundRecord") -> None:
        every = self.cfg.checkpoint.every
        done = record.round + 1
        if self.sim is not None and every and done % every == 0 and done < self.cfg.rounds:
            self.save(run, f"every {every} rounds")

    def on_run_end(self, run: RunContext, status: str) -> None:
        sim = self.sim
        if (status == "finished" or sim is None or sim.in_round or not sim.started
                or sim.next_round >= self.cfg.rounds or sim.next_round == self.last):
            return
        try:
            self.save(run, f"run {status}")
        except Exception as err:  # noqa: BLE001 - never hide why the run ended
            run.info["checkpoint_error"] = f"{type(err).__name__}: {err}"

    def save(self, run: RunContext, reason: str) -> dict:
        sim = self.sim
        assert sim is not None and self.path is not None
        dest = self.path / CHECKPOINTS / checkpoint_name(sim.next_round)
        tables = self.writer.sequence() if self.writer is not None else {}
        meta = write_checkpoint(sim, dest, tables=tables, reason=reason)
        self.last = sim.next_round
        sim.executor.recovery_checkpoint = dest
        prune_checkpoints(self.path, self.cfg.checkpoint.keep)
        write_index(self.path)
        run.info["checkpoint"] = {"latest": f"{CHECKPOINTS}/{dest.name}", "next_round": sim.next_round}
        return meta
