"""A sweep's results in Parquet: ``trials.parquet`` (one row per trial) and ``rounds.parquet``.

Layout of a sweep folder (``storage``)::

    <storage>/sweep.yaml            the resolved spec (base experiment inlined): what resume rebuilds from
    <storage>/trials.parquet        one row per trial: hyperparameters, status, final/best metrics
    <storage>/rounds.parquet        every trial's rounds.parquet rows + trial_id + hyperparameters
    <storage>/runs/<trial_id>/      each trial's own run folder (engine.results.load_run reads it)
    <storage>/tune/                 Ray Tune's experiment state and trial checkpoints (--resume)

``storage`` is a local path or a URI (``s3://bucket/prefix``; see :mod:`engine.storage.locations`): every
read here goes through its pyarrow filesystem.

Hyperparameter columns are named by the last component of their dotted key (``train.lr`` ->
``lr``) unless two keys share it (then the full dotted key); ``Sweep.param_columns`` maps keys
to columns. ``configs.parquet`` has one row per configuration (its repeats over seeds pooled:
means and 95 % intervals, :mod:`sweeps.stats`).

Over 400 lines because the per-trial summary, the per-configuration table built from it and the
values a searcher is told (:func:`searcher_values`, computed the same way from the rounds) have to
agree column by column; kept in one module they are read and changed together.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from engine import ConfigError, UserError, load_config
from engine.config.schema import apply_overrides
from engine.config.yamlio import parse_yaml
from engine.results import ROUND_COLUMNS, RunFolderError, Storage, load_run, open_storage, read_table
from engine.results.manifest import method_cell
from engine.results.text import TERMINAL_WIDTH, fold_table, wrap
from sweeps.search import TRIAL_INDEX
from sweeps.spec import expand_params, trial_seed
from sweeps.stats import config_stats, pareto_mask, within_noise

log = logging.getLogger("hetsim")

SWEEP_FILE = "sweep.yaml"
TRIALS_FILE = "trials.parquet"
ROUNDS_FILE = "rounds.parquet"
CONFIGS_FILE = "configs.parquet"
# Each configuration's summary in configs.parquet, besides its rank column and objectives.
CONFIG_TOTALS = ("total_sim_time_s", "total_bytes_up", "total_energy_j")
SEARCHER_PREFIX = "trial_"  # trial_<trials.parquet column>: the values a searcher optimises (Tune results)
RUNS_DIR = "runs"
TUNE_DIR = "tune"

# Summarised per trial as final_<m> (last evaluated value) and best_<m>.
SUMMARY_METRICS = ("global_acc", "global_loss", "pers_acc", "pers_acc_weighted",
                   "pers_acc_worst", "pers_loss", "train_loss")
STATUSES = ("finished", "error", "early_stopped", "diverged", "unfinished")
# Trials whose metrics are not results: they are ranked last and their summaries are NaN.
NOT_RANKED = ("error", "diverged")
# Population Based Training: the trial whose checkpoint a trial continued from, per round
RESTORED_FROM = "restored_from"


@dataclass
class TrialState:
    """What Tune knows about one trial (None where Tune was not asked)."""

    trial_id: str
    params: dict[str, Any]
    tune_status: str | None = None  # TERMINATED, ERROR, PENDING, RUNNING, PAUSED
    error: str | None = None
    tune_rounds: pd.DataFrame | None = None  # reported rows: used when the run folder is unreachable


@dataclass
class Sweep:
    """A sweep folder loaded into pandas."""

    path: Path | str  # a URI for sweeps in object storage
    trials: pd.DataFrame
    rounds: pd.DataFrame
    spec: dict[str, Any]
    param_columns: dict[str, str] = field(default_factory=dict)
    num_trials: int | None = None  # planned: grid points x num_samples x repeats
    storage: Storage | None = field(default=None, repr=False)
    configs: pd.DataFrame = field(default_factory=pd.DataFrame)  # configs.parquet: one row per configuration

    @property
    def repeats(self) -> int:
        return int(self.spec.get("repeats", 1) or 1)

    @property
    def complete(self) -> bool:
        """Every planned trial has ended (finished, early-stopped or errored)."""
        ended = (self.trials["status"] != "unfinished").sum() if len(self.trials) else 0
        return ended >= (self.num_trials or len(self.trials) or 1)

    @property
    def metric(self) -> str:
        return self.spec.get("metric", "global_acc")

    @property
    def mode(self) -> str:
        return self.spec.get("mode", "max")

    @property
    def rank_column(self) -> str:
        """The trials.parquet column the spec ranks by (``rank_by``: best, final, time_to_target)."""
        rank = self.spec.get("rank_by", "best")
        if rank == "time_to_target":
            return time_to_target_column(self.metric, self.spec["target"])
        return f"{rank}_{self.metric}"

    def best(self, n: int = 1, by: str | None = None, mode: str | None = None,
             level: Literal["configs", "trials"] | None = None) -> pd.DataFrame:
        """The ``n`` best trials by the spec's ranking (``rank_by``: ``best_<metric>`` unless the
        spec says ``final`` or ``time_to_target``), or by the trials.parquet column ``by`` (e.g.
        ``total_energy_j``; ``mode`` default: min for totals, times and losses, else max).

        With ``repeats`` > 1 (or ``level="configs"``) the configurations of ``configs`` are ranked by
        their mean of the column (``<by>_mean``); ``level="trials"`` ranks the trials themselves."""
        col = self.rank_column if by is None else by
        if col not in self.trials.columns and col + "_mean" not in self.configs:
            raise KeyError(f"trials.parquet has no column {col!r}; it has: {', '.join(self.trials.columns)}")
        if by is None:
            mode = "min" if col.startswith("time_to_") else self.mode
        elif mode is None:
            mode = "min" if col.startswith("total_") or "loss" in col or col.endswith("_s") else "max"
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r} is not allowed: 'min' or 'max'")
        if level == "configs" or (level is None and self.repeats > 1 and col + "_mean" in self.configs):
            # repeats: configurations ranked by their mean over the seeds (configs.parquet)
            return self.configs.sort_values(col + "_mean", ascending=mode == "min", na_position="last").head(n)
        ok = self.trials[~self.trials["status"].isin(NOT_RANKED)]
        return ok.sort_values(col, ascending=mode == "min", na_position="last").head(n)

    def pareto_front(self) -> pd.DataFrame:
        """The Pareto-optimal trials of the spec's ``objectives`` (empty without objectives); with
        repeats, every trial of a configuration whose means are Pareto-optimal (``configs[configs.pareto]``
        has the configurations)."""
        if "pareto" not in self.trials:
            return self.trials.iloc[0:0]
        return self.trials[self.trials["pareto"].astype(bool)]

    def run(self, trial_id: str):
        """One trial's run folder as :class:`engine.results.tables.Run`."""
        store = self.storage or open_storage(self.path)
        return load_run(store.child(RUNS_DIR, trial_id))


def time_to_target_column(metric: str, target: float) -> str:
    return f"time_to_{metric}_{target:g}"


def time_to_target_s(rounds: pd.DataFrame, metric: str, mode: str, target: float) -> float:
    """Simulated seconds at the end of the first round whose ``metric`` reaches ``target``
    (>= for mode max, <= for min); NaN if it never does."""
    if rounds is None or metric not in rounds or "sim_time_s" not in rounds:
        return math.nan
    v = pd.to_numeric(rounds[metric], errors="coerce")
    hit = (v >= target) if mode == "max" else (v <= target)
    return float(rounds.loc[hit, "sim_time_s"].iloc[0]) if hit.any() else math.nan


def _best_fn(metric: str, spec_metric: str, spec_mode: str):
    mode = spec_mode if metric == spec_metric else ("min" if "loss" in metric else "max")
    return (lambda s: s.min()) if mode == "min" else (lambda s: s.max())


def _normalize_params(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """One dtype per hyperparameter column: numbers, booleans, or strings when mixed."""
    for col in columns:
        values = list(df[col])
        present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
        if all(isinstance(v, bool) for v in present):
            continue
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
            df[col] = pd.to_numeric(pd.Series(values, index=df.index, dtype=object))
            continue
        if all(isinstance(v, str) for v in present):
            continue
        df[col] = [v if isinstance(v, str) or v is None else json.dumps(v) for v in values]
    return df


def _trial_status(tune_status: str | None, info_status: str | None, rounds_done: int, rounds: int,
                  scheduler: str) -> str:
    if info_status == "diverged":  # the run ended itself (train.on_nonfinite: stop)
        return "diverged"
    if tune_status is not None:
        if tune_status == "ERROR":
            return "error"
        if tune_status == "TERMINATED":
            return "finished" if rounds_done >= rounds else "early_stopped"
        return "unfinished"
    # No Tune state (a folder read while the sweep runs or after a crash): the trial's own record.
    if info_status == "finished":
        return "finished"
    if info_status == "error":
        return "error"
    if info_status == "stopped" and scheduler == "asha":
        return "early_stopped"
    return "unfinished"


def _planned_rounds(spec: dict[str, Any], params: dict[str, Any]) -> int:
    try:
        return load_config(apply_overrides(spec.get("base") or {},
                                           expand_params(spec.get("space") or {}, params))).rounds
    except Exception:  # noqa: BLE001 - a trial config that no longer loads: the raw rounds, or 20
        return int(params.get("rounds", (spec.get("base") or {}).get("rounds", 20)))


def _param_segments(info: dict[str, Any], params: dict[str, Any]) -> list[tuple[int, dict[str, Any], str]]:
    """(first round, swept values, restored-from trial) of each stretch of a trial's rounds.

    One stretch unless Population Based Training made the trial continue from another trial's
    checkpoint with new values (``trial.json`` ``history``)."""
    segments = []
    for h in info.get("history", []):
        if h.get("restored_from") and h.get("restored_from") != info.get("trial_id"):
            segments.append((int(h["first_round"]), h.get("params", params), h["restored_from"]))
    first = info.get("history", [{}])[0].get("params", params) if info.get("history") else params
    return [(0, first, "")] + segments


def summarize_trial(
    storage: Storage,
    state: TrialState,
    sweep: dict[str, Any],
) -> tuple[dict[str, Any], pd.DataFrame]:
    """One trials.parquet row (without hyperparameters) and the trial's rounds."""
    spec = sweep["spec"]
    rounds_total = _planned_rounds(spec, state.params)
    run = storage.child(RUNS_DIR, state.trial_id)
    info = _read_json(run, "trial.json")
    manifest = _read_json(run, "manifest.json")
    config: dict[str, Any] = {}
    if run.exists("config.yaml"):
        config = parse_yaml(run.read_text("config.yaml"), f"{run}/config.yaml") or {}
        rounds_total = int(config.get("rounds", rounds_total))
    rounds = read_table(run, "rounds") if run.exists() else None
    if rounds is None:
        rounds = state.tune_rounds if state.tune_rounds is not None else pd.DataFrame()
    rounds = rounds.reset_index(drop=True)
    n = len(rounds)
    status = _trial_status(state.tune_status, info.get("status"), n, rounds_total,
                           spec.get("scheduler", {}).get("name", "fifo"))
    error = None
    if status == "error":
        error = info.get("error") or manifest.get("error") or state.error or "unknown error"
    elif status == "diverged":
        error = info.get("error") or manifest.get("error") or "diverged"
    metric, mode = spec.get("metric", "global_acc"), spec.get("mode", "max")
    row: dict[str, Any] = {"trial_id": state.trial_id, "status": status, "rounds_done": n,
                           "method": method_cell(config) if config else ""}
    metrics = list(SUMMARY_METRICS)
    extra = [metric] + sorted(c for c in rounds.columns if c.startswith("global_acc_"))
    metrics += [m for m in extra if m not in metrics]
    for m in metrics:
        s = pd.to_numeric(rounds[m], errors="coerce").dropna() if m in rounds.columns else pd.Series(dtype=float)
        if status == "diverged":  # the metric of a diverged run is missing, not a number
            s = s.iloc[0:0]
        row[f"final_{m}"] = float(s.iloc[-1]) if len(s) else math.nan
        row[f"best_{m}"] = float(_best_fn(m, metric, mode)(s)) if len(s) else math.nan
    row["total_sim_time_s"] = float(rounds["sim_time_s"].iloc[-1]) if n and "sim_time_s" in rounds else math.nan
    target = spec.get("target")
    if target is not None:
        row[time_to_target_column(metric, target)] = time_to_target_s(rounds, metric, mode, target)
    row["total_bytes_up"] = int(rounds["bytes_up"].sum()) if n and "bytes_up" in rounds else 0
    row["total_bytes_down"] = int(rounds["bytes_down"].sum()) if n and "bytes_down" in rounds else 0
    for col in ("energy_j", "energy_wasted_j"):  # NaN: the run predates the ledger or a power number is unknown
        row[f"total_{col}"] = float(rounds[col].sum(min_count=1)) if n and col in rounds else math.nan
    wall = manifest.get("wall_s")
    if wall is not None:
        row["wall_s"] = float(wall)
    else:
        row["wall_s"] = float(rounds["wall_s"].sum()) if n and "wall_s" in rounds else math.nan
    row["node_id"] = info.get("node_id", "")
    row["attempts"] = int(info.get("attempts", 1 if info else 0))
    resumed = info.get("resumed_from_round")
    row["resumed_from_round"] = int(resumed) if resumed is not None else -1
    segments = _param_segments(info, state.params)
    row["exploits"] = len(segments) - 1
    row["error"] = error or ""
    row["run_dir"] = f"{RUNS_DIR}/{state.trial_id}"
    rounds.attrs["segments"] = segments
    return row, rounds


def _round_params(rounds: pd.DataFrame, segments, param_columns: dict[str, str]) -> pd.DataFrame:
    """The hyperparameter values in force at each round (+ ``restored_from`` under PBT)."""
    first_rounds = [first for first, _, _ in segments]
    which = np.searchsorted(first_rounds, rounds["round"].to_numpy(), side="right") - 1
    out = pd.DataFrame({col: [segments[i][1].get(key) for i in which] for key, col in param_columns.items()},
                       index=rounds.index)
    if len(segments) > 1:
        out[RESTORED_FROM] = [segments[i][2] for i in which]
    return out


def collect(storage: Storage, sweep: dict[str, Any], states: list[TrialState]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Build trials.parquet and rounds.parquet frames from the trials' run folders."""
    param_columns: dict[str, str] = sweep["param_columns"]
    cols = list(param_columns.values())
    pbt = sweep["spec"].get("scheduler", {}).get("name") == "pbt"
    base_seed = int((sweep["spec"].get("base") or {}).get("seed", 0) or 0)
    trial_rows, round_frames, config_keys = [], [], []
    for state in sorted(states, key=lambda s: s.trial_id):
        row, rounds = summarize_trial(storage, state, sweep)
        params = {param_columns[k]: state.params.get(k) for k in param_columns}
        repeat = int(state.params.get(TRIAL_INDEX) or 0)
        config_keys.append(json.dumps({k: state.params.get(k) for k in param_columns}, sort_keys=True, default=str))
        seed = state.params["seed"] if "seed" in state.params else trial_seed(base_seed, state.params)
        trial_rows.append({"trial_id": row.pop("trial_id"), **params, **row, "repeat": repeat, "seed": seed})
        if len(rounds):
            per_round = _round_params(rounds, rounds.attrs.pop("segments"), param_columns)
            if pbt and RESTORED_FROM not in per_round:
                per_round[RESTORED_FROM] = ""
            lead = pd.DataFrame({"trial_id": state.trial_id}, index=rounds.index)
            round_frames.append(pd.concat([lead, per_round, rounds.drop(columns=list(per_round.columns),
                                                                        errors="ignore")], axis=1))
    trials = pd.DataFrame(trial_rows)
    if trials.empty:
        trials = pd.DataFrame(columns=["trial_id", *cols, "status", "rounds_done", "error", "run_dir"])
    trials = _normalize_params(trials, cols)
    if len(trials):  # one id per configuration (its values without the repeat), by first trial
        codes = pd.factorize(pd.Series(config_keys))[0]
        trials.insert(1 + len(cols), "config_id", [f"c{c:03d}" for c in codes])
    if round_frames:
        rounds = pd.concat(round_frames, ignore_index=True)
        rounds = _normalize_params(rounds, cols)
    else:
        rounds = pd.DataFrame({c: pd.Series(dtype=trials[c].dtype) for c in ["trial_id", *cols]})
    objectives = sweep["spec"].get("objectives") or []
    if objectives and len(trials):
        trials = mark_pareto(trials, rounds, objectives)
        if int(sweep["spec"].get("repeats", 1) or 1) > 1:  # the configurations' means decide
            configs = config_table(trials, sweep)
            trials["pareto"] = trials["config_id"].map(configs.set_index("config_id")["pareto"]).fillna(False)
    return trials, rounds


def rank_column(spec: dict[str, Any]) -> tuple[str, str]:
    """The trials.parquet column the spec ranks by (``rank_by``) and its mode."""
    metric, rank = spec.get("metric", "global_acc"), spec.get("rank_by", "best")
    if rank == "time_to_target":
        return time_to_target_column(metric, spec["target"]), "min"
    return f"{rank}_{metric}", spec.get("mode", "max")


def config_table(trials: pd.DataFrame, sweep: dict[str, Any]) -> pd.DataFrame:
    """configs.parquet: one row per configuration (``config_id``) with its hyperparameters,
    ``n`` (its ranked trials: not errored or diverged), ``trial_ids``, and for the rank column,
    each objective and the totals of :data:`CONFIG_TOTALS`: mean, std, 95 % t-interval over its
    trials; ``within_noise_of_best`` (its interval of the rank column overlaps the best
    configuration's) and, with objectives, ``pareto`` (of the means). Best first."""
    spec = sweep["spec"]
    params = [c for c in sweep["param_columns"].values() if c in trials]
    rank, mode = rank_column(spec)
    objectives = spec.get("objectives") or []
    columns = [rank, *(objective_column(o["name"]) for o in objectives), *CONFIG_TOTALS]
    columns = [c for c in dict.fromkeys(columns) if c in trials]
    if trials.empty or "config_id" not in trials:
        return pd.DataFrame(columns=["config_id", *params, "n"])
    ranked = trials.copy()
    bad = ranked["status"].isin(NOT_RANKED)
    ranked.loc[bad, columns] = math.nan  # an errored/diverged trial's numbers are not results
    out = config_stats(ranked, "config_id", columns, first=params)
    out["n"] = (~bad).groupby(ranked["config_id"], sort=False).sum().to_numpy()
    out["trial_ids"] = ranked.groupby("config_id", sort=False)["trial_id"].agg(",".join).to_numpy()
    if rank in columns:
        out["within_noise_of_best"] = within_noise(out, rank, mode)
    if objectives:
        means = out[[objective_column(o["name"]) + "_mean" for o in objectives]].to_numpy(dtype=float)
        out["pareto"] = pareto_mask(means, [o["mode"] for o in objectives])
    if rank in columns:
        out = out.sort_values(rank + "_mean", ascending=mode == "min", na_position="last", kind="stable")
    return out.reset_index(drop=True)


def objective_column(name: str) -> str:
    """The trials.parquet column an objective is read from (a total stands for itself)."""
    return name if name.startswith(("total_", "time_to_")) or name == "wall_s" else f"objective_{name}"


def mark_pareto(trials: pd.DataFrame, rounds: pd.DataFrame, objectives: list[dict[str, Any]]) -> pd.DataFrame:
    """``objective_<name>`` (a rounds column's best value per trial, by its mode) and ``pareto``:
    True for the ranked trials that no other ranked trial dominates (at least as good in every
    objective, better in one). Trials with a missing objective value are never on the front."""
    trials = trials.copy()
    for o in objectives:
        col = objective_column(o["name"])
        if col != o["name"]:
            values = pd.to_numeric(rounds[o["name"]], errors="coerce") if o["name"] in rounds else None
            if values is None:
                trials[col] = math.nan
            else:
                per = values.groupby(rounds["trial_id"]).agg("max" if o["mode"] == "max" else "min")
                trials[col] = trials["trial_id"].map(per)
            trials.loc[trials["status"] == "diverged", col] = math.nan
    cols = [objective_column(o["name"]) for o in objectives]
    m = np.array(trials[cols].apply(pd.to_numeric, errors="coerce"), dtype=float)  # a copy: NaN goes in
    m[trials["status"].isin(NOT_RANKED).to_numpy()] = np.nan  # never ranked: never on the front
    trials["pareto"] = pareto_mask(m, [o["mode"] for o in objectives])
    return trials


def searcher_columns(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(trials.parquet column, mode) a searcher optimises: the objectives, else the rank column."""
    objectives = spec.get("objectives") or []
    if objectives:
        return [(objective_column(o["name"]), o["mode"]) for o in objectives]
    return [rank_column(spec)]


def searcher_values(rounds: pd.DataFrame, spec: dict[str, Any]) -> dict[str, float]:
    """The :func:`searcher_columns` of a trial from its rounds so far, computed as
    :func:`summarize_trial` and :func:`mark_pareto` compute them (NaN where there is no value)."""
    metric, mode = spec.get("metric", "global_acc"), spec.get("mode", "max")
    objectives = {objective_column(o["name"]): o for o in spec.get("objectives") or []}
    out: dict[str, float] = {}
    for col, _ in searcher_columns(spec):
        if col.startswith("time_to_"):
            v = time_to_target_s(rounds, metric, mode, spec["target"])
        elif col.startswith("total_") or col == "wall_s":
            name = col[len("total_"):] if col.startswith("total_") else col
            if name == "sim_time_s":
                v = float(rounds["sim_time_s"].iloc[-1]) if len(rounds) and name in rounds else math.nan
            else:
                v = float(pd.to_numeric(rounds[name]).sum(min_count=1)) if name in rounds else math.nan
        else:
            if col in objectives:
                name, how = objectives[col]["name"], objectives[col]["mode"]
            else:  # best_<m> / final_<m>
                how, name = col.split("_", 1)
            s = pd.to_numeric(rounds[name], errors="coerce").dropna() if name in rounds else pd.Series(dtype=float)
            if not len(s):
                v = math.nan
            elif how == "final":
                v = float(s.iloc[-1])
            elif how == "best":
                v = float(_best_fn(name, metric, mode)(s))
            else:
                v = float(s.max() if how == "max" else s.min())
        out[col] = v
    return out


def write(storage: Storage, trials: pd.DataFrame, rounds: pd.DataFrame) -> None:
    storage.write_parquet(TRIALS_FILE, trials)
    storage.write_parquet(ROUNDS_FILE, rounds)
    storage.write_parquet(CONFIGS_FILE, config_table(trials, read_sweep_file(storage)))


def read_sweep_file(path: str | Path | Storage, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    store = open_storage(path, storage_options)
    if not store.exists(SWEEP_FILE):
        raise FileNotFoundError(f"{store.uri} is not a sweep folder (no {SWEEP_FILE})")
    where = f"{store.uri}/{SWEEP_FILE}"
    data = parse_yaml(store.read_text(SWEEP_FILE), where)
    if not isinstance(data, dict) or not {"spec", "param_columns"} <= set(data):
        raise ConfigError(f"{where} is not a sweep file written by hetsim (no spec / "
                          "param_columns); was it edited?")
    return data


def states_from_folders(storage: Storage) -> list[TrialState]:
    """Trials known from their run folders alone (no Tune state)."""
    states = []
    for name in storage.list(RUNS_DIR, dirs=True):
        run = storage.child(RUNS_DIR, name)
        info = _read_json(run, "trial.json")
        states.append(TrialState(name, info.get("params", {})))
    return states


def load_sweep(path: str | Path | Storage, refresh: bool = False,
               storage_options: dict[str, Any] | None = None) -> Sweep:
    """Load a sweep folder (a local path or a URI such as ``s3://bucket/sweeps/lr``).

    ``trials.parquet``/``rounds.parquet`` are written when a sweep (or a resume) ends. For a
    folder without them (a sweep still running, or killed) or with ``refresh=True`` the frames
    are rebuilt from the trials' run folders, with the status each trial recorded itself.
    ``storage_options``: options of the URI's filesystem (see :mod:`engine.storage.locations`).
    """
    if isinstance(path, (str, Path)) and not isinstance(path, Storage) and "://" not in str(path):
        p = Path(path)
        if p.is_file() and p.name in (TRIALS_FILE, ROUNDS_FILE, SWEEP_FILE):
            path = p.parent
    store = open_storage(path, storage_options)
    sweep = read_sweep_file(store)
    tables = None if refresh or not store.exists(TRIALS_FILE) else _read_tables(store)
    if tables is None:
        trials, rounds = collect(store, sweep, states_from_folders(store))
        configs = config_table(trials, sweep)
    else:
        trials, rounds, configs = tables
        configs = configs if configs is not None else config_table(trials, sweep)
    return Sweep(path=store.uri if store.is_remote else Path(store.path), trials=trials, rounds=rounds,
                 spec=sweep["spec"], param_columns=dict(sweep["param_columns"]),
                 num_trials=sweep.get("num_trials"), storage=store, configs=configs)


def name_columns(sweep: Sweep) -> list[str]:
    """What names a trial in a table besides its id: its hyperparameter columns, and ``method``
    (``fedbuff, async``) when a trial runs asynchronously, which no hyperparameter need say."""
    t = sweep.trials
    params = [c for c in sweep.param_columns.values() if c in t]
    asynchronous = "method" in t and t["method"].astype(str).str.endswith(", async").any()
    return [*params, "method"] if asynchronous else params


def summary_table(sweep: Sweep, top: int = 10, width: int | None = TERMINAL_WIDTH) -> str:
    """Trials by status, then the best ``top`` trials by ``best_<metric>``; the table folded into
    blocks of columns at most ``width`` characters wide (None: one block, ``--wide``)."""
    t = sweep.trials
    if t.empty:
        return f"{sweep.path}: no trials"
    counts = t["status"].value_counts()
    head = "trials: " + ", ".join(f"{counts[s]} {s}" for s in
                                  ("finished", "early_stopped", "diverged", "error", "unfinished")
                                  if s in counts)
    metric = sweep.metric
    rank = sweep.rank_column
    cols = ["trial_id", *name_columns(sweep), "status", "rounds_done",
            f"final_{metric}", f"best_{metric}", rank, "total_sim_time_s", "total_bytes_up", "total_energy_j"]
    if sweep.repeats > 1:  # configurations: means over the seeds and their 95 % intervals
        cols = ["config_id", *sweep.param_columns.values(), "n", f"{rank}_mean", f"{rank}_ci_low",
                f"{rank}_ci_high", "within_noise_of_best", "total_sim_time_s_mean", "total_bytes_up_mean"]
    cols = [c for c in dict.fromkeys(cols) if c in t.columns or c in sweep.configs.columns]
    best = sweep.best(top)[cols].rename(columns={"total_bytes_up_mean": "total_bytes_up"})
    if "total_bytes_up" in best:
        best = best.assign(total_bytes_up=[f"{v / 1e6:.3g} MB" for v in best["total_bytes_up"]])
    order = "min" if rank.startswith("time_to_") else sweep.mode
    what = f"configurations ({sweep.repeats} seeds each) by mean {rank}" if sweep.repeats > 1 else f"by {rank}"
    lines = [head, f"best {min(top, len(best))} {what} ({order}):",
             fold_table(best, width, float_format=lambda v: f"{v:.4g}")]
    retried = t[t["attempts"] > 1] if "attempts" in t.columns else t.iloc[0:0]
    if len(retried):
        lines.append(f"{len(retried)} trial(s) needed more than one attempt (attempts column)")
    errors = t[t["status"].isin(("error", "diverged"))]
    for _, row in errors.head(5).iterrows():
        lines.append(wrap(f"{row['status']} {row['trial_id']}: {row['error']}", width))
    if len(errors) > 5:
        lines.append(f"... {len(errors) - 5} more errored or diverged trials in trials.parquet")
    return "\n".join(lines)


def _read_tables(store: Storage) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None] | None:
    """trials, rounds and configs.parquet; None (with a warning) if one cannot be read: they are
    summaries of the trials' run folders, which the caller reads instead."""
    out = []
    for name in (TRIALS_FILE, ROUNDS_FILE, CONFIGS_FILE):
        try:
            out.append(store.read_parquet(name) if store.exists(name) else None)
        except UserError:  # unreachable storage: its message says so
            raise
        except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a damaged file
            log.warning("hetsim: warning: %s/%s is unreadable (%s: %s); the trials are read from their run "
                        "folders instead (`hetsim sweep --resume` writes it again)", store.uri, name,
                        type(err).__name__, str(err).strip()[:200])
            return None
    trials, rounds, configs = out
    return trials, rounds if rounds is not None else pd.DataFrame(), configs


def _read_json(run: Storage, name: str) -> dict[str, Any]:
    """A trial folder's trial.json or manifest.json ({} if absent); a damaged one is named."""
    if not run.exists(name):
        return {}
    text = run.read_bytes(name).decode(errors="replace")
    try:
        data = json.loads(text)
    except ValueError as err:
        data, why = None, f"not valid JSON: {err}" if text.strip() else "empty"
    else:
        why = f"a JSON {type(data).__name__}, not an object"
    if not isinstance(data, dict):
        raise RunFolderError(f"{run.uri}/{name} is damaged ({why}); restore it from a copy (the sweep's "
                             "other trials are intact)")
    return data


def tune_rounds_frame(metrics_df: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rounds.parquet columns of a trial's Tune results (fallback for unreachable run folders)."""
    if metrics_df is None or metrics_df.empty or "round" not in metrics_df:
        return None
    keep = [c for c in metrics_df.columns
            if c in ROUND_COLUMNS or c.startswith(("server_", "global_acc_", "global_loss_"))]
    return metrics_df[keep].reset_index(drop=True)
