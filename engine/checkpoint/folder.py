"""Checkpoints in a run folder: ``checkpoints/round-000040/`` (the number is the next round to
run), the newest ``checkpoint.keep`` kept, all listed in ``checkpoints/index.json``, and the
round-loop callback that writes them (:class:`CheckpointCallback`).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from engine.atomic import write_json_atomic
from engine.checkpoint.snapshot import (
    FORMAT,
    META,
    config_changes,
    is_result_neutral,
    read_meta,
    results_fingerprint,
    write_checkpoint,
)
from engine.clients.format import CheckpointError
from engine.config.schema import ExperimentConfig
from engine.errors import CorruptRunFolderError, storage_fault
from engine.loop.callbacks import RoundRecord, RunCallback, RunContext
from engine.loop.simulation import Simulation
from engine.results.tables import DAMAGED, HISTORY_TABLES, DamagedFile, RunWriter, damaged_files

CHECKPOINTS = "checkpoints"
INDEX = "index.json"


def checkpoint_name(next_round: int) -> str:
    return f"round-{next_round:06d}"


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


def check_resume_point(run_dir: str | Path, cfg: ExperimentConfig) -> None:
    """Refuse to resume ``run_dir`` with ``cfg`` from a checkpoint it cannot continue: one
    written with other results-relevant fields (``config.yaml`` edited after it), or one past
    the config's last round. Checkpoints that fail to load are skipped by the resume itself."""
    run_dir = Path(run_dir)
    for _, d in reversed(list_checkpoints(run_dir)):
        try:
            meta = read_meta(d, verify=True)
        except CheckpointError:
            continue
        break
    else:
        return
    how = (f"to resume, put those values back in {run_dir / 'config.yaml'}; to rerun with the new "
           f"values, remove {run_dir / CHECKPOINTS} (the run restarts from round 0) or start a new run "
           f"with `hetsim run -c {run_dir / 'config.yaml'}`")
    if meta.get("results_fingerprint") != results_fingerprint(cfg):
        lines = []
        if isinstance(meta.get("config"), dict):  # older checkpoints do not store it
            lines = [f"  {k}: {o!r} in the checkpoint, now {v!r}"
                     for k, o, v in config_changes(meta["config"], cfg.to_dict()) if not is_result_neutral(k)]
        if not lines:  # e.g. only the torch threads per client host differ (float rounding)
            lines = ["  (a field that changes results, or executor.threads_per_actor)"]
        raise CorruptRunFolderError(
            f"cannot resume {run_dir}: its config differs from the one checkpoint {d.name} was "
            "written with:\n" + "\n".join(lines) + "\n" + how)
    if int(meta["next_round"]) > cfg.rounds:
        raise CorruptRunFolderError(
            f"cannot resume {run_dir}: checkpoint {d.name} continues at round {meta['next_round']}, past "
            f"the run's rounds = {cfg.rounds}; the checkpoint or config.yaml was edited; {how}")


def rebuilds(meta: dict, damaged: list[DamagedFile]) -> bool:
    """Whether resuming from the checkpoint ``meta`` recomputes every row the ``damaged`` round
    tables' files held: each was written after it (its first part number is at or past the part
    count the checkpoint recorded; part numbers only grow, so it holds later rounds only)."""
    tables = meta.get("tables") or {}
    return all(d.first >= int(tables.get(d.table, 0)) for d in damaged if d.table not in HISTORY_TABLES)


def check_damaged_tables(run_dir: str | Path) -> list[DamagedFile]:
    """The unreadable table files of a run folder to resume (:func:`damaged_files`), after
    making sure a resume can rebuild them: ``CorruptRunFolderError`` if the run has checkpoints
    but none at or before the rounds a damaged round-table file held. (Without checkpoints the
    resume starts from round 0 and recomputes every round anyway.) Nothing is changed here."""
    run_dir = Path(run_dir)
    damaged = damaged_files(run_dir)
    rounds = [d for d in damaged if d.table not in HISTORY_TABLES]
    found = list_checkpoints(run_dir)
    if not rounds or not found:
        return damaged
    metas = []
    for _, d in found:
        try:
            metas.append((d, read_meta(d)))
        except CheckpointError:
            continue
    if not metas or any(rebuilds(m, rounds) for _, m in metas):
        return damaged  # (no readable checkpoint: the restore says so)
    oldest, meta = metas[0]
    first = rounds[0]
    others = f" (and {len(rounds) - 1} more damaged file(s))" if len(rounds) > 1 else ""
    raise CorruptRunFolderError(
        f"{first.path} is damaged ({first.error}){others}, and no checkpoint can rebuild its rows: it "
        f"holds rounds before the oldest checkpoint, {oldest.name} (which continues at round "
        f"{meta.get('next_round')}). To recompute the run from round 0, remove {run_dir / CHECKPOINTS} "
        f"and resume again (`hetsim run --resume {run_dir}`): the damaged file is then set aside as "
        f"{first.path.name}{DAMAGED}")


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
    write_json_atomic(root / INDEX, {"format": FORMAT, "checkpoints": entries})


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
    between rounds (interrupted, stopped, diverged; not when it failed: a round or a callback
    raised, and the state or the tables may be incomplete). Tells the executor where
    replacement client hosts restore from.
    """

    def __init__(self, cfg: ExperimentConfig, writer: RunWriter | None = None):
        self.cfg = cfg
        self.writer = writer
        self.last: int | None = None  # next_round of the newest checkpoint on disk
        self.sim: Simulation | None = None
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

    def on_round_end(self, run: RunContext, record: RoundRecord) -> None:
        every = self.cfg.checkpoint.every
        done = record.round + 1
        if self.sim is not None and every and done % every == 0 and done < self.cfg.rounds:
            self.save(run, f"every {every} rounds")

    def on_run_end(self, run: RunContext, status: str) -> None:
        sim = self.sim
        # "failed": a callback may have raised after the round (e.g. its rows hit a full
        # disk), so a checkpoint now could claim a round the tables lack
        if (status in ("finished", "failed") or sim is None or sim.in_round or not sim.started
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
        try:
            meta = write_checkpoint(sim, dest, tables=tables, reason=reason)
            self.last = sim.next_round
            sim.executor.recovery_checkpoint = dest
            prune_checkpoints(self.path, self.cfg.checkpoint.keep)
            write_index(self.path)
        except Exception as err:
            fault = storage_fault(err, f"the checkpoint after round {sim.next_round - 1}", dest, self.path)
            if fault is None:
                raise
            raise fault from err
        run.info["checkpoint"] = {"latest": f"{CHECKPOINTS}/{dest.name}", "next_round": sim.next_round}
        return meta
