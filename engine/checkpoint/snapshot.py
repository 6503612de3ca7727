"""A checkpoint of a running :class:`~engine.loop.simulation.Simulation`: write it, read it, restore it.

A checkpoint is a folder, complete or absent (written under a temporary name, then renamed)::

    <dir>/checkpoint.json   next round, simulated time, table part counts, shard list (JSON)
    <dir>/server.pt         global models, the method's server fields, the loop's RNG states
    <dir>/clients-0000.pt   client states, one shard per client host (in-process: one;
    <dir>/clients-0001.pt   Ray: one per actor, written by the actor itself)

The files are in the format of :mod:`engine.clients.format`. Also here: which config
changes a resumed run may make (:func:`check_resumable`). For other callers than a run folder
(e.g. Ray Tune trials): :func:`write_checkpoint` (a Simulation between rounds -> a folder) and
:func:`restore_checkpoint` (a folder -> a started Simulation built from the same config). Run
folders keep theirs with :mod:`engine.checkpoint.folder`.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.atomic import write_json_atomic
from engine.clients.format import CheckpointError, load_blob, save_blob
from engine.config.schema import ExperimentConfig
from engine.errors import ConfigError
from engine.loop.simulation import Simulation

FORMAT = "hetsim-checkpoint/1"
META = "checkpoint.json"
SERVER_FILE = "server.pt"


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
    "executor.keep_warm",  # which processes host the clients, not what they compute
    "executor.state_memory_mb",  # where client states are kept, not what they are
    "executor.state_spill_dir",
    "ray.address",
    "ray.num_cpus",
    "ray.num_gpus",
    "ray.connect_timeout_s",
    "ray.allow_missing_gpus",  # only lifts a start-up check
    "clock.max_sleep_s",  # only caps the sleep of realtime mode
)


# ------------------------------------------------------------------------------ config checks
def host_threads(cfg: ExperimentConfig) -> int:
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


def is_result_neutral(path: str) -> bool:
    """Whether the dotted config field ``path`` cannot change results."""
    return any(path == f or path.startswith(f + ".") for f in RESULT_NEUTRAL_FIELDS)


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(field, old, new) for every field that differs between two config dicts."""
    a, b = _flatten(old), _flatten(new)
    missing = object()
    return [(k, a.get(k, missing), b.get(k, missing)) for k in sorted(set(a) | set(b))
            if a.get(k, missing) != b.get(k, missing)]


def check_resumable(saved: ExperimentConfig, new: ExperimentConfig) -> None:
    """Refuse a config change that could change results (ConfigError naming the fields)."""
    bad = [(k, o, n) for k, o, n in config_changes(saved.to_dict(), new.to_dict()) if not is_result_neutral(k)]
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


def results_fingerprint(cfg: ExperimentConfig) -> str:
    """A hash of every config field that can change results."""
    flat = {k: v for k, v in _flatten(cfg.to_dict()).items() if not is_result_neutral(k)}
    flat["<host_threads>"] = host_threads(cfg)
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ write / restore
def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def write_checkpoint(
    sim: Simulation,
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
            {"server": sim.server.checkpoint_state(), "rng": _rng_state(), "sim_time_s": sim.sim_time_s,
             "batteries": sim.batteries.state() if sim.batteries is not None else None,
             "clock": sim.clock.state(),  # what the clock learned (the adaptive deadline's arrivals)
             "last_times": sim.last_times,  # the clients' last phase times (methods that read them), or None
             "selection": sim.selector.state(),  # the selection policy's own state and the clients' history
             # asynchronous runs: the event loop (updates in flight, buffer, base versions)
             "asynchronous": sim.asynchronous.state() if sim.asynchronous is not None else None},
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
            "config": sim.cfg.to_dict(),  # to name the fields of a config edited after it
            "written": dt.datetime.now(dt.timezone.utc).isoformat(),
            "reason": reason,
            "tables": dict(tables or {}),
            "server": {"file": SERVER_FILE, "bytes": server_bytes},
            "client_states": shards,
            "bytes": server_bytes + sum(s["bytes"] for s in shards),
            # what this checkpoint wrote: client shards linked from the previous one cost nothing
            "written_bytes": server_bytes + sum(s["bytes"] for s in shards if not s.get("linked")),
            "write_s": None,
        }
        meta["write_s"] = time.perf_counter() - t0
        write_json_atomic(tmp / META, meta)
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


def restore_checkpoint(sim: Simulation, directory: str | Path, *, allow_config_change: bool = False) -> dict:
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
    if sim.last_times is not None:
        sim.last_times = {int(c): dict(v) for c, v in (state.get("last_times") or {}).items()}
    if sim.batteries is not None:
        sim.batteries.restore(state["batteries"])
    sim.selector.load_state(state.get("selection"))  # absent: a checkpoint from before selection policies
    sim.clock.restore(state.get("clock"))  # absent: a checkpoint from before deadline policies
    if sim.asynchronous is not None:
        sim.asynchronous.restore(state["asynchronous"])
    sim.next_round = int(meta["next_round"])
    sim.executor.load_client_states(directory, meta["client_states"])
    return meta
