"""Sweep specs: a base experiment plus a search space over dotted config keys.

A spec is one YAML file (or a mapping)::

    name: fedprox-lr-mu
    base: exp.yaml                 # or an inline mapping; omitted: the built-in default experiment
    overrides: [rounds=10]         # optional `key=value` items applied to the base
    space:
      train.lr: {loguniform: [1.0e-3, 1.0e-1]}
      algorithm.mu: {grid: [0.0, 0.01, 0.1]}
      clients.profiles: {named: {fast: {...}, slow: {...}}}   # a grid over named values
      cell: {cases: {a: {train.lr: 0.1, seed: 1}, b: {...}}}  # a grid over named sets of overrides
    columns: {clients.profiles: fleet}   # optional column names (default: the key's last part)
    num_samples: 4                 # samples of the random dimensions (x the grid)
    metric: global_acc             # rank trials by this rounds.parquet column ...
    mode: max                      # ... maximised (or `min`)
    scheduler: {name: asha, grace_period: 2, reduction_factor: 2}   # or fifo, or {name: pbt, ...}
    search: {algorithm: optuna, sampler: nsga2, seed: 0}   # default random (sweeps.search)
    repeats: 3                     # every configuration with seeds seed+0, +1, +2
    max_concurrent_trials: 2
    resources_per_trial: {cpus: 1}
    max_failures: 0                # retries of a failed trial, from its last checkpoint
    checkpoint_every: null         # default: the experiment's checkpoint.every (PBT: its interval)
    storage: sweeps_out/fedprox-lr-mu   # or s3://bucket/prefix (storage_options: {...})
    ray: {address: null}
    trackers: [tensorboard, mlflow]   # optional; off by default (sweeps.trackers)

Everything is checked before anything starts. The spec itself is a pydantic model with
``extra='forbid'``; every value of the space (each grid/choice value, the bounds of a range) is
substituted into the base experiment and validated exactly like ``hetsim run`` validates a
config, so an unknown key or a value the field would reject is a :class:`SweepSpecError` that
names the field, the value and what is allowed.

Over 400 lines because it is one set of rules, read together: the spec's models, the checks
that give each field its error message, and :func:`resolve`, which runs them in order (the
models are under 200 lines; ResolvedSweep, the checks and resolve() are over 400). Splitting it
would put a field's definition and the check that explains its errors in different modules.
"""
from __future__ import annotations

import copy
import functools
import itertools
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine import ConfigError, ExperimentConfig, load_config
from engine.config.hints import yaml_kind
from engine.config.paths import resolve_paths
from engine.config.schema import (
    DEFAULT_CONFIG,
    TYPE_KINDS,
    apply_overrides,
    expand_path,
    input_loc,
    overrides_given_twice,
    value_at,
)
from engine.config.yamlio import read_yaml_file
from engine.ray.cluster import ray_is_up
from engine.results import ROUND_COLUMNS, is_uri, open_storage, redact
from hardware_profiles.suggest import given_twice, unknown_key
from sweeps.grid import GridError, apply_grid
from sweeps.search import TRIAL_INDEX, SearchProblem, SearchSpec, check_budget, check_repeats, check_search
from sweeps.trackers import TrackersSpec, check_trackers

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint", "named", "cases")
# Grid-like kinds: every value is a trial (x num_samples). `named` is a grid over named values
# (mappings, lists, ...): Tune and the tables see the names, the trial applies the value.
# `cases` is a grid over named *sets of overrides* ({dotted key: value, ...}): its key is a
# label, not a config key, so one sweep can hold a study's cells that differ in several keys.
GRID_KINDS = ("grid", "named", "cases")
NAMED_KINDS = ("named", "cases")  # Tune sees names; the trial applies what they stand for
# Columns a sweep's metric may name: every rounds.parquet column, plus the method's
# `server_*` metrics and the per-architecture `global_acc_<arch>` of heterogeneous models.
METRIC_PREFIXES = ("server_", "global_acc_", "global_loss_")
# Keys the sweep itself owns: where trials write, how they reach Ray, what a trial reserves.
RESERVED_KEYS = ("output", "ray", "checkpoint", "executor.kind", "executor.num_actors",
                 "executor.cpus_per_actor", "executor.gpus_per_actor", "executor.clients_per_actor")
# trials.parquet columns besides the hyperparameters (a hyperparameter never takes these names)
TRIAL_COLUMNS = ("trial_id", "status", "error", "rounds_done", "total_sim_time_s",
                 "total_bytes_up", "total_bytes_down", "total_energy_j", "total_energy_wasted_j",
                 "wall_s", "node_id", "run_dir", "attempts",
                 "resumed_from_round", "exploits", "restored_from", "pareto", "config_id", "repeat")

# YAML 1.1 (PyYAML) reads `1e-3` as a string; numbers written that way are meant as floats.
_FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class SweepSpecError(ConfigError):
    """An invalid sweep spec (a ``ValueError``); the message names field, value and what is allowed."""


def _num(v: Any) -> Any:
    if isinstance(v, str) and _FLOAT_RE.match(v.strip()):
        f = float(v)
        return int(f) if f.is_integer() and not re.search(r"[.eE]", v) else f
    return v


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SchedulerSpec(_Model):
    name: Literal["fifo", "asha", "pbt"] = "fifo"
    time_attr: Literal["rounds", "sim_time_s", "bytes_up"] = Field(
        "rounds", description="the unit of grace_period/max_t/perturbation_interval: rounds, simulated "
        "seconds or cumulative upload bytes")
    metric: str | None = Field(None, description="the scheduler's metric; default: the sweep's metric")
    mode: Literal["max", "min"] | None = Field(None, description="default: the sweep's mode")
    # ASHA
    # int | float: whole rounds, or simulated seconds / bytes with another time_attr (sweeps.search)
    grace_period: int | float = Field(1, gt=0, description="ASHA: time_attr units before a trial may be stopped")
    reduction_factor: float = Field(2.0, gt=1)
    max_t: int | float | None = Field(None, gt=0, description="default: the experiment's rounds (time_attr rounds)")
    # Population Based Training
    perturbation_interval: int | float = Field(
        2, gt=0, description="PBT: time_attr units between exploit/explore steps (each one a checkpoint)")
    hyperparam_mutations: list[str] | None = Field(
        None, description="PBT: space keys it may change; default: every key of the space")
    quantile_fraction: float = Field(0.25, ge=0, le=0.5,
                                     description="PBT: bottom fraction that copies the top fraction")
    resample_probability: float = Field(0.25, ge=0, le=1)
    synch: bool = Field(False, description="PBT: pause trials at each interval until all reach it "
                        "(checkpoints every round)")


class ResourcesSpec(_Model):
    cpus: float | None = Field(
        None, gt=0, description="CPUs of one trial; default 1 (in-process), 0.01 (Ray executor)")
    gpus: float = Field(
        0.0, ge=0, description="GPUs of one trial's own process (the Ray executor's client actors "
        "add executor.gpus_per_actor each)")


class RaySpec(_Model):
    address: str | None = Field(None, description="existing cluster; None starts a local Ray")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray")
    num_gpus: int | None = Field(None, ge=0, description="GPUs of a local Ray (default: detected)")
    connect_timeout_s: float = Field(30.0, gt=0, description="give up joining the address after this")


class Objective(_Model):
    """One objective of a trade-off: a rounds.parquet column (its best value over the rounds,
    by ``mode``) or a trials.parquet total (``total_bytes_up``, ``total_sim_time_s``, ...)."""

    name: str
    mode: Literal["max", "min"]


TRIAL_OBJECTIVES = ("total_sim_time_s", "total_bytes_up", "total_bytes_down", "total_energy_j",
                    "total_energy_wasted_j", "wall_s")


class SweepSpec(_Model):
    name: str | None = Field(None, description="default: the spec file's name")
    base: str | dict[str, Any] | None = Field(
        None, description="experiment YAML path (relative to the spec) or inline mapping")
    overrides: list[str] = Field(default_factory=list, description="key=value items on the base")
    space: dict[str, dict[str, Any]] = Field(..., description="dotted config key -> distribution")
    num_samples: int = Field(1, ge=1)
    metric: str = "global_acc"
    mode: Literal["max", "min"] = "max"
    target: float | None = Field(
        None, description="a value of metric: trials.parquet gets time_to_<metric>_<target> (simulated s)")
    rank_by: Literal["best", "final", "time_to_target"] = Field(
        "best", description="how the summary and Sweep.best rank trials (time_to_target needs target)")
    objectives: list[Objective] = Field(
        default_factory=list, description="trade-off objectives: trials.parquet marks the Pareto-optimal trials")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    max_concurrent_trials: int | None = Field(None, ge=1)
    resources_per_trial: ResourcesSpec = Field(default_factory=ResourcesSpec)
    storage: str | None = Field(
        None, description="sweep folder: a path or a URI (s3://bucket/prefix); default sweeps_out/<name>")
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="options of the URI's pyarrow filesystem (endpoint_override, ...)")
    max_failures: int = Field(0, ge=0, description="retries of a failed trial, from its last checkpoint")
    checkpoint_every: int | None = Field(
        None, ge=1, description="rounds between trial checkpoints; default: the experiment's checkpoint.every")
    search_seed: int | None = Field(0, ge=0, description="seed of the random sampling (None: fresh)")
    search: SearchSpec = Field(default_factory=SearchSpec, description="search algorithm (sweeps.search)")
    repeats: int = Field(1, ge=1, description="runs of every configuration, repeat i with seed + i")
    ray: RaySpec = Field(default_factory=RaySpec)
    columns: dict[str, str] = Field(
        default_factory=dict, description="dotted key -> its column name in the tables (default: "
        "the key's last component)")
    trackers: TrackersSpec = Field(
        default_factory=TrackersSpec, description="experiment trackers: [tensorboard, mlflow] or "
        "{mlflow: {tracking_uri: ...}} (sweeps.trackers); default none")

    @model_validator(mode="after")
    def _ranking(self) -> "SweepSpec":
        if self.target is not None and not math.isfinite(self.target):
            raise ValueError(f"target = {self.target!r}: give a finite value of the metric")
        if self.rank_by == "time_to_target" and self.target is None:
            raise ValueError("rank_by = 'time_to_target' needs a target (a value of metric, e.g. target: 0.8)")
        return self

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scheduler_shorthand(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", v):
            raise ValueError(f"name {v!r} must be a folder name (letters, digits, . _ + -)")
        return v


# ---------------------------------------------------------------- resolved spec


class ResolvedSweep:
    """A validated spec with everything a trial needs, independent of files and cwd.

    ``to_dict()`` is what ``<storage>/sweep.yaml`` holds and what resume rebuilds from.
    """

    def __init__(self, spec: SweepSpec, base_raw: dict[str, Any], storage: str,
                 param_columns: dict[str, str], base_cfg: ExperimentConfig,
                 num_trials: int | None, command: list[str] | None = None):
        self.spec = spec
        self.base_raw = base_raw  # the base mapping with the spec's overrides applied
        self.storage = storage  # an absolute local path or a URI
        self.param_columns = param_columns
        self.base_cfg = base_cfg
        self.num_trials = num_trials
        self.command = command or []

    @property
    def name(self) -> str:
        return self.spec.name or "sweep"

    @property
    def rounds(self) -> int:
        return self.base_cfg.rounds

    def open_storage(self):
        """The sweep folder as :class:`engine.storage.locations.Storage`."""
        return open_storage(self.storage, self.spec.storage_options)

    @property
    def checkpoint_every(self) -> int | None:
        """Rounds between trial checkpoints: the spec's, PBT's interval, else the experiment's."""
        s = self.spec
        if s.checkpoint_every is not None:
            return s.checkpoint_every
        if s.scheduler.name != "pbt":
            return None
        if s.scheduler.time_attr != "rounds":  # the interval is not in rounds: any round may be a step
            return 1
        # synch PBT pauses a trial at whatever round it waits in, and a paused function trial
        # restarts from its last checkpoint: with fewer, it would redo rounds and pause again
        return 1 if s.scheduler.synch else s.scheduler.perturbation_interval

    def trial_raw(self, params: dict[str, Any]) -> dict[str, Any]:
        raw = apply_overrides(self.base_raw, expand_params(self.spec.space, params))
        if params.get(TRIAL_INDEX):  # repeat i: the configuration's seed (a case may set it) + i
            raw = apply_overrides(raw, {"seed": trial_seed(raw.get("seed", self.base_cfg.seed), params)})
        every = self.checkpoint_every
        return apply_overrides(raw, {"checkpoint.every": every}) if every is not None else raw

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec.model_dump(mode="json")
        spec["base"] = self.base_raw
        spec["overrides"] = []  # already applied to `base`
        spec["storage"] = str(self.storage)
        # credentials stay out of sweep.yaml: resume takes them from the environment again
        spec["storage_options"] = redact(self.spec.storage_options)
        return {
            "spec": spec,
            "param_columns": self.param_columns,
            "num_trials": self.num_trials,
            "command": self.command,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], storage: str | Path | None = None,
                  storage_options: dict[str, Any] | None = None) -> "ResolvedSweep":
        spec = SweepSpec.model_validate(d["spec"])
        if storage_options:
            spec.storage_options = {**spec.storage_options, **storage_options}
        storage = storage_location(storage if storage is not None else spec.storage)
        spec.storage = storage
        base_raw = spec.base if isinstance(spec.base, dict) else {}
        base_cfg = _validate_experiment(base_raw, "base")
        return cls(spec, base_raw, storage, dict(d["param_columns"]), base_cfg,
                   d.get("num_trials"), d.get("command"))


# ---------------------------------------------------------------- loading and validation


def _format_spec_errors(err: ValidationError, root: type[BaseModel] | None = None,
                        title: str = "invalid sweep spec", raw: Any = None) -> str:
    """One line per error, naming the field as the user wrote it (``raw``: the spec's mapping;
    pydantic's union members left out), each field once."""
    lines = []
    errors = [(e, *(input_loc(e["loc"], raw) if isinstance(raw, dict) else ([str(p) for p in e["loc"]], False)))
              for e in err.errors()]
    by_field: dict[str, list] = {}
    for e, loc, key_error in errors:
        by_field.setdefault(".".join(loc), []).append((e, key_error))
    for e, loc, key_error in errors:
        field = ".".join(loc) or "<root>"
        msg = e["msg"]
        if key_error:
            msg = f"key {e.get('input')!r}: {msg}"
        tried = by_field.get(".".join(loc), [])
        if len(tried) > 1:  # a union tried member by member: the member that took the value's type says why
            inner = [x for x, k in tried if k or x["type"] not in TYPE_KINDS]
            if inner and e is not inner[0]:
                continue
            if not inner:
                if e is not tried[0][0]:
                    continue
                kinds = " or ".join(dict.fromkeys(TYPE_KINDS.get(x["type"], x["type"]) for x, _ in tried))
                lines.append(f"  {field} = {e.get('input')!r}: {yaml_kind(e.get('input'))} is not allowed here; "
                             f"give {kinds}")
                continue
        if e["type"] == "extra_forbidden":
            parent: Any = root or SweepSpec
            for part in loc[:-1]:
                info = getattr(parent, "model_fields", {}).get(part)
                parent = info.annotation if info is not None else None
                # `Model | None` (e.g. trackers.mlflow): the model's keys
                parent = next((a for a in getattr(parent, "__args__", ()) if hasattr(a, "model_fields")), parent)
            allowed = list(getattr(parent, "model_fields", {}) or {})
            msg = unknown_key(loc[-1], allowed)
        if e["type"] == "missing":  # pydantic's input is the whole mapping it is missing from
            lines.append(f"  {field}: required; give {loc[-1]}")
            continue
        shown = value_at(raw, loc) if key_error else e.get("input")  # a bad key: its mapping is the field
        lines.append(f"  {field} = {shown!r}: {msg}")
    return f"{title}:\n" + "\n".join(lines)


def _config_problem(err: ConfigError) -> str:
    text = str(err)
    prefix = "invalid experiment config:\n"
    if text.startswith(prefix):
        text = text[len(prefix):]
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _check_experiment(raw: dict[str, Any], storage: Path | None = None,
                      ray_running: bool | None = None) -> ExperimentConfig:
    """Schema check; with ``storage`` also the whole validation pass a run makes (data too)."""
    from engine import validate_experiment  # torch: resolve() needs it, load_sweep() does not

    cfg = load_config(raw)
    if storage is not None:
        validate_experiment(cfg, run_dir=storage / "runs", ray_running=ray_running)
    return cfg


def _validate_experiment(raw: dict[str, Any], where: str, storage: Path | None = None,
                         ray_running: bool | None = None) -> ExperimentConfig:
    try:
        return _check_experiment(raw, storage, ray_running)
    except ConfigError as err:
        raise SweepSpecError(f"invalid sweep spec:\n  {where}: {_config_problem(err)}") from None


def _check_probe(base_raw: dict[str, Any], key: str, kind: str, args: Any, value: Any, base_cfg,
                 storage: Path | None = None, ray_running: bool | None = None) -> None:
    """The base with ``key`` set to one probed ``value`` of its distribution must validate (a
    case of a ``cases`` dimension: the base with the case's overrides)."""
    try:
        _check_experiment(apply_overrides(base_raw, value if kind == "cases" else {key: value}), storage, ray_running)
    except ConfigError as err:
        if kind in ("cases", "named"):  # the failing entry alone: the others (fleets, cases) would bury it
            name = next(n for n, case in args.items() if case is value)
            shown = f" = {value!r}" if kind == "cases" else ""  # a case is a few keys; a named value may be a fleet
            raise SweepSpecError(f"invalid sweep spec:\n  space.{key}.{kind}.{name}{shown}: rejected by the "
                                 f"experiment config: {_config_problem(err)}") from None
        raise SweepSpecError(
            f"invalid sweep spec:\n  space.{key}.{kind} = {args!r}: value {value!r} is "
            f"rejected by the experiment config: {_config_problem(err)}"
            + _algorithm_hint(key, base_cfg)) from None


def _resolved_value(key: str, value: Any, folder: Path | None) -> Any:
    """``value`` of the dotted ``key`` with its input paths made absolute against ``folder``
    (None: the working folder)."""
    try:
        raw, origins = resolve_paths(apply_overrides({}, {key: value}), folder)
    except ConfigError:  # not a settable key: the space's own check names it
        return value
    if not origins:
        return value
    for part in key.split("."):
        raw = raw[part]
    return raw


def _resolved_dimension(key: str, dist: Any, folder: Path | None) -> Any:
    """A space dimension whose values (grid, choice, named, cases) may hold paths, resolved."""
    if not isinstance(dist, dict) or len(dist) != 1:
        return dist
    (kind, args), = dist.items()
    if kind in ("grid", "choice") and isinstance(args, list):
        return {kind: [_resolved_value(key, v, folder) for v in args]}
    if kind == "named" and isinstance(args, dict):
        return {kind: {n: _resolved_value(key, v, folder) for n, v in args.items()}}
    if kind == "cases" and isinstance(args, dict):
        return {kind: {n: {k: _resolved_value(k, v, folder) for k, v in case.items()} if isinstance(case, dict)
                       else case for n, case in args.items()}}
    return dist


def read_mapping_file(path: Path, what: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping (a spec); errors name the file."""
    raw = read_yaml_file(path, what)  # strict: duplicate keys, file:line:col, empty or binary files
    if not isinstance(raw, dict):
        raise SweepSpecError(f"{what} {str(path)!r} must hold a mapping, got {type(raw).__name__}")
    return raw


def load_base(base: str | Path | dict[str, Any] | None, spec_dir: Path | None,
              title: str = "invalid sweep spec") -> dict[str, Any]:
    """The base experiment: a mapping, a YAML path (relative to ``spec_dir``) or None (the default)."""
    if base is None:
        base = DEFAULT_CONFIG
    if isinstance(base, (str, Path)):
        path = Path(expand_path(str(base)))
        if not path.is_absolute() and spec_dir is not None:
            path = spec_dir / path
        if not path.is_file():
            raise SweepSpecError(
                f"{title}:\n  base = {str(base)!r}: experiment file {str(path)!r} does not exist")
        raw = read_yaml_file(path, "experiment file (sweep base)")
        if not isinstance(raw, dict):
            raise SweepSpecError(f"{title}:\n  base = {str(path)!r}: must hold a mapping")
        return resolve_paths(raw, path.resolve().parent, str(path))[0]  # relative to the base's file
    return resolve_paths(base, spec_dir)[0]  # an inline base: relative to the spec's file


def _load_base(spec: SweepSpec, spec_dir: Path | None) -> dict[str, Any]:
    return load_base(spec.base, spec_dir)


def _check_distribution(key: str, dist: dict[str, Any]) -> tuple[str, Any]:
    """Return (kind, normalised arguments) of one space entry, or raise."""
    where = f"space.{key}"
    if len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
        raise SweepSpecError(
            f"invalid sweep spec:\n  {where} = {dist!r}: must be one of "
            + ", ".join(f"{{{d}: ...}}" for d in DISTRIBUTIONS)
            + " (grid/choice: a list of values; uniform/loguniform/randint: [low, high]; "
            "named: a mapping name -> value; cases: a mapping name -> {dotted key: value})")
    kind, args = next(iter(dist.items()))
    if kind in NAMED_KINDS:
        what = "value" if kind == "named" else "{dotted key: value, ...}"
        if not isinstance(args, dict) or not args:
            raise SweepSpecError(
                f"invalid sweep spec:\n  {where}.{kind} = {args!r}: must be a non-empty mapping name -> {what}")
        for name, value in args.items():
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name):
                raise SweepSpecError(
                    f"invalid sweep spec:\n  {where}.{kind}: name {name!r} must be a string of letters, "
                    "digits, . _ + - (it becomes a value in the tables)")
            if kind == "cases":
                _check_case(f"{where}.cases.{name}", value)
        return kind, dict(args)
    if kind in ("grid", "choice"):
        if not isinstance(args, list) or not args:
            raise SweepSpecError(
                f"invalid sweep spec:\n  {where}.{kind} = {args!r}: must be a non-empty list of values")
        return kind, [_num(a) for a in args]
    if not isinstance(args, (list, tuple)) or len(args) != 2:
        raise SweepSpecError(f"invalid sweep spec:\n  {where}.{kind} = {args!r}: must be [low, high]")
    low, high = (_num(a) for a in args)
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (low, high))
    if kind == "randint":
        if not numbers or not all(isinstance(x, int) for x in (low, high)) or low >= high:
            raise SweepSpecError(
                f"invalid sweep spec:\n  {where}.randint = {args!r}: must be integers [low, high) "
                "with low < high (high is exclusive, as in numpy and Tune)")
        return kind, [low, high]
    if not numbers or not all(math.isfinite(x) for x in (low, high)) or low >= high:
        raise SweepSpecError(
            f"invalid sweep spec:\n  {where}.{kind} = {args!r}: must be finite numbers [low, high] with low < high")
    if kind == "loguniform" and low <= 0:
        raise SweepSpecError(
            f"invalid sweep spec:\n  {where}.loguniform = {args!r}: bounds must be > 0")
    return kind, [float(low), float(high)]


def _check_case(where: str, case: Any) -> None:
    """One case of a ``cases`` dimension: a mapping of dotted config keys the sweep may set."""
    if not isinstance(case, dict):
        raise SweepSpecError(f"invalid sweep spec:\n  {where} = {case!r}: must be a mapping "
                             "{dotted key: value, ...} (the overrides this case applies to the base)")
    for key in case:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][\w]*(\.[\w]+)*", key):
            raise SweepSpecError(f"invalid sweep spec:\n  {where}.{key}: not a dotted config key like train.lr")
        for reserved in RESERVED_KEYS:
            if key == reserved or key.startswith(reserved + "."):
                raise SweepSpecError(f"invalid sweep spec:\n  {where}.{key}: {reserved} is fixed for the whole "
                                     "sweep (set it in base or overrides)")


def _probe_values(kind: str, args: list[Any]) -> list[Any]:
    """The values substituted into the base to validate a dimension."""
    if kind in ("grid", "choice"):
        return args
    if kind in NAMED_KINDS:
        return list(args.values())
    if kind == "randint":
        return [args[0], args[1] - 1]
    return args


def _algorithm_hint(key: str, cfg: ExperimentConfig) -> str:
    """Algorithm keys depend on the base's method: say which ones it has."""
    parts = key.split(".")
    if parts[0] != "algorithm" or len(parts) != 2 or parts[1] in type(cfg.algorithm).model_fields:
        return ""
    keys = [k for k in type(cfg.algorithm).model_fields if k != "name"]
    return (f" (the base's algorithm {cfg.algorithm.name!r} has "
            + (f"keys: {', '.join(keys)})" if keys else "no parameters)"))


def param_column_names(keys: list[str], chosen: dict[str, str] | None = None) -> dict[str, str]:
    """Dotted key -> column: ``chosen[key]``, else its last component when unique and not a
    reserved column, else the dotted key."""
    chosen = chosen or {}
    reserved = set(TRIAL_COLUMNS) | set(ROUND_COLUMNS)
    last = [chosen.get(k, k.split(".")[-1]) for k in keys]
    out = {}
    for key, short in zip(keys, last):
        clash = last.count(short) > 1 or short in reserved or short.startswith(("final_", "best_"))
        if key in chosen and clash:
            raise SweepSpecError(
                f"invalid sweep spec:\n  columns.{key} = {short!r}: clashes with another column "
                f"(a trials.parquet / rounds.parquet column or another hyperparameter)")
        out[key] = key if clash else short
    return out


def trial_seed(base_seed: int, params: dict[str, Any]) -> int:
    """The seed of a trial: the base experiment's plus its repeat index."""
    return int(base_seed) + int(params.get(TRIAL_INDEX) or 0)


def expand_params(space: dict[str, dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    """A trial's ``{dotted key: value}`` with the names of ``named`` dimensions replaced by their values
    and those of ``cases`` dimensions by their overrides (without the repeat index, which is not a
    config key)."""
    out = {k: v for k, v in params.items() if k != TRIAL_INDEX}
    for key, dist in space.items():
        (kind, args), = dist.items()
        if kind == "named" and key in out:
            out[key] = copy.deepcopy(args[out[key]])
        elif kind == "cases" and key in out:
            out.update(copy.deepcopy(args[out.pop(key)]))
    return out


def check_metric(metric: str, where: str) -> None:
    if metric in ROUND_COLUMNS or any(
            metric.startswith(p) and len(metric) > len(p) for p in METRIC_PREFIXES):
        return
    raise SweepSpecError(
        f"invalid sweep spec:\n  {where} = {metric!r}: not a rounds.parquet column; allowed: "
        f"{', '.join(ROUND_COLUMNS)}, or a method metric named server_<name> / global_acc_<arch>")


def _resources_check(spec: SweepSpec, cfg: ExperimentConfig) -> None:
    if cfg.executor.kind == "inprocess" and cfg.executor.device == "cuda" and not spec.resources_per_trial.gpus:
        raise SweepSpecError(
            "invalid sweep spec:\n  resources_per_trial.gpus = 0: the base experiment trains on "
            "executor.device = 'cuda' in the trial's own process (in-process executor), which then "
            "holds no GPU; give each trial a share (e.g. gpus: 0.5) or use device: auto")
    if cfg.executor.kind == "ray" and cfg.executor.num_actors is None:
        raise SweepSpecError(
            "invalid sweep spec:\n  base executor.num_actors = None: a sweep with executor.kind=ray "
            "needs executor.num_actors so that each trial's placement group (1 bundle for the trial "
            "+ num_actors bundles of executor.cpus_per_actor CPUs) can be sized before it starts")


def storage_location(location: str | Path) -> str:
    """An absolute local path, or the URI unchanged."""
    text = str(location)
    return text.rstrip("/") if is_uri(text) else str(Path(expand_path(text)).resolve())


def _check_schedule(spec: SweepSpec, cfg: ExperimentConfig, dims: dict[str, tuple[str, Any]]) -> None:
    """Schedulers compare the last evaluated value of their metric: each decision point must
    come after the first evaluated round, and PBT may only change keys of the space."""
    s = spec.scheduler
    every = cfg.evaluation.eval_every
    # budgets in simulated seconds or bytes are checked by sweeps.search.check_budget
    in_rounds = s.time_attr == "rounds"
    if in_rounds and s.name == "asha" and every > 1 and s.grace_period < min(every, cfg.rounds):
        raise SweepSpecError(
            f"invalid sweep spec:\n  scheduler.grace_period = {s.grace_period}: ASHA's first decision "
            f"comes after {s.grace_period} round(s) but the experiment evaluates every "
            f"{every} rounds (evaluation.eval_every), so no trial has a value then; set "
            f"grace_period >= {min(every, cfg.rounds)} (the scheduler compares the last evaluated value)")
    if s.name == "pbt":
        if in_rounds and s.perturbation_interval >= cfg.rounds:
            raise SweepSpecError(
                f"invalid sweep spec:\n  scheduler.perturbation_interval = {s.perturbation_interval}: "
                f"must be < the experiment's rounds ({cfg.rounds}) for PBT to act")
        if in_rounds and every > 1 and s.perturbation_interval < every:
            raise SweepSpecError(
                f"invalid sweep spec:\n  scheduler.perturbation_interval = {s.perturbation_interval}: the "
                f"experiment evaluates every {every} rounds (evaluation.eval_every); set "
                f"perturbation_interval >= {every}")
        every = spec.checkpoint_every
        if every is not None and s.synch and every != 1:
            raise SweepSpecError(
                f"invalid sweep spec:\n  checkpoint_every = {every}: synchronous PBT (scheduler.synch) "
                "pauses trials at any round and they restart from their last checkpoint; it needs "
                "checkpoint_every: 1 (the default with synch)")
        if in_rounds and every is not None and s.perturbation_interval % every:
            raise SweepSpecError(
                f"invalid sweep spec:\n  checkpoint_every = {every}: PBT copies checkpoints every "
                f"{s.perturbation_interval} rounds (scheduler.perturbation_interval); checkpoint_every "
                "must divide it")
        for key in s.hyperparam_mutations or list(dims):
            if dims.get(key, ("",))[0] == "cases":
                raise SweepSpecError(
                    f"invalid sweep spec:\n  space.{key}: a cases dimension cannot be mutated by PBT (its "
                    "cases set different keys); list the keys PBT may change in scheduler.hyperparam_mutations")
            if key not in dims:
                raise SweepSpecError(
                    f"invalid sweep spec:\n  scheduler.hyperparam_mutations: {key!r} is not a key of "
                    f"the space; allowed: {', '.join(dims)}")


def _check_cases_key(key: str, cases: Any, space: dict[str, Any], base_cfg: ExperimentConfig) -> None:
    """A ``cases`` dimension's key is a label (its column): a plain name, neither a config field
    nor set by a case together with another dimension of the space."""
    if not re.fullmatch(r"[A-Za-z_]\w*", key) or key in type(base_cfg).model_fields:
        raise SweepSpecError(
            f"invalid sweep spec:\n  space.{key}: a cases dimension is named by a plain label (its column "
            f"in the tables, e.g. cell), not a config key; {key!r} is "
            + ("a config section" if key in type(base_cfg).model_fields else "not a plain name"))
    for name, case in (cases.items() if isinstance(cases, dict) else []):
        for other in (case if isinstance(case, dict) else []):
            if any(other == k or other.startswith(k + ".") or k.startswith(other + ".") for k in space if k != key):
                raise SweepSpecError(
                    f"invalid sweep spec:\n  space.{key}.cases.{name}.{other}: also set by another dimension "
                    "of the space; a key is set by one dimension only")


def count_trials(space: dict[str, tuple[str, Any]], num_samples: int, algorithm: str = "random",
                 repeats: int = 1) -> int:
    """Trials of a sweep: grid points x samples x repeats (a searcher: samples x repeats)."""
    grid = 1
    for kind, args in space.values():
        if kind in GRID_KINDS and algorithm != "optuna":  # Optuna draws grid keys as choices
            grid *= len(args)
    return grid * num_samples * repeats


def resolve(
    source: str | Path | dict[str, Any],
    storage: str | Path | None = None,
    address: str | None = None,
    command: list[str] | None = None,
    data_checks: list[Callable[[], Any]] | None = None,
    overrides: list[str] | None = None,
    grid: list[str] | None = None,
) -> ResolvedSweep:
    """Load and fully validate a sweep spec; nothing is started or written.

    ``overrides``: ``key=value`` items applied to the base after the spec's own (``hetsim sweep --set``).
    ``grid``: ``KEY=v1,v2`` items replacing dimensions of the space (``hetsim sweep --grid``, sweeps.grid).

    ``data_checks``: if a list, the checks that load the data (the base and each probed value,
    validated as a run validates them: seconds of CPU) are appended to it instead of run here,
    for the caller to run while Ray starts; each raises :class:`SweepSpecError`.
    """
    spec_dir = None
    default_name = None
    if isinstance(source, (str, Path)):
        path = Path(expand_path(str(source)))
        raw = read_mapping_file(path, "sweep spec")
        spec_dir, default_name = path.resolve().parent, path.stem
    else:
        raw = copy.deepcopy(dict(source))
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as err:
        raise SweepSpecError(_format_spec_errors(err, raw=raw)) from None
    if spec.name is None:
        spec.name = default_name or "sweep"
    # a path among the space's values: relative to the spec's file (a mapping: the working folder),
    # made absolute here, since trials run in Tune's own working folders
    spec.space = {key: _resolved_dimension(key, dist, spec_dir) for key, dist in spec.space.items()}
    if grid:
        try:
            spec.space = apply_grid(spec.space, grid)
        except GridError as err:
            raise SweepSpecError(f"invalid sweep spec:\n  {err}") from None
    own = list(spec.overrides)
    twice = overrides_given_twice(own, "overrides:") if isinstance(source, (str, Path)) else None
    if twice:  # a list in the spec file; a resumed sweep's spec holds the --set items after them
        raise SweepSpecError(f"invalid sweep spec:\n  {twice}")
    if overrides:
        spec.overrides = [*own, *overrides]
    if address is not None:
        spec.ray.address = address

    base_raw = _load_base(spec, spec_dir)
    try:  # a path in the spec's own overrides is relative to the spec's file, in --set to the working folder
        for items, folder in ((own, spec_dir), (list(overrides or []), None)):
            if items:
                base_raw = resolve_paths(apply_overrides(base_raw, items), folder)[0]
    except ConfigError as err:
        raise SweepSpecError(f"invalid sweep spec:\n  overrides: {err}") from None
    storage_path = storage_location(
        storage if storage is not None else (spec.storage or Path("sweeps_out") / spec.name))
    try:  # before the data checks: a missing package or a bad URI needs no data loaded
        check_trackers(spec.trackers, storage_path)
    except ValueError as err:
        raise SweepSpecError(f"invalid sweep spec:\n  {err}") from None
    local_storage = None if is_uri(storage_path) else Path(storage_path)  # run folders' checks
    checks_now = local_storage if data_checks is None else None
    ray_running = ray_is_up()  # pinned: the deferred checks may run while Ray starts
    base_cfg = _validate_experiment(base_raw, "base", checks_now)
    if data_checks is not None and local_storage is not None:
        data_checks.append(functools.partial(_validate_experiment, base_raw, "base", local_storage, ray_running))

    if not spec.space:
        raise SweepSpecError("invalid sweep spec:\n  space = {}: give at least one dotted key to sweep")
    dims: dict[str, tuple[str, Any]] = {}
    for key, dist in spec.space.items():
        if isinstance(dist, dict) and next(iter(dist), None) == "cases":
            _check_cases_key(key, dist["cases"], spec.space, base_cfg)
        elif not re.fullmatch(r"[A-Za-z_][\w]*(\.[\w]+)*", key):
            raise SweepSpecError(f"invalid sweep spec:\n  space.{key}: not a dotted config key like train.lr")
        for reserved in RESERVED_KEYS:
            if key == reserved or key.startswith(reserved + "."):
                raise SweepSpecError(
                    f"invalid sweep spec:\n  space.{key}: {reserved} is fixed for the whole sweep "
                    "(set it in base or overrides)")
        kind, args = _check_distribution(key, dist)
        for value in _probe_values(kind, args):
            _check_probe(base_raw, key, kind, args, value, base_cfg, checks_now)
            if data_checks is not None and local_storage is not None:
                data_checks.append(functools.partial(
                    _check_probe, base_raw, key, kind, args, value, base_cfg, local_storage, ray_running))
        dims[key] = (kind, args)
    spec.space = {k: {kind: args} for k, (kind, args) in dims.items()}
    # Grid values are validated together too (fields can constrain each other) when few.
    grid_keys = [k for k, (kind, _) in dims.items() if kind in GRID_KINDS]
    combos = math.prod(len(dims[k][1]) for k in grid_keys)
    if len(grid_keys) > 1 and combos <= 256:
        for values in itertools.product(*(_probe_values(*dims[k]) for k in grid_keys)):
            combo = dict(zip(grid_keys, values))
            overrides = {k: v for k, v in combo.items() if dims[k][0] != "cases"}
            for k in grid_keys:
                if dims[k][0] == "cases":
                    overrides.update(combo[k])
            try:
                load_config(apply_overrides(base_raw, overrides))
            except ConfigError as err:
                raise SweepSpecError(
                    f"invalid sweep spec:\n  space: the grid point {combo!r} is rejected by the "
                    f"experiment config: {_config_problem(err)}") from None

    for key in spec.columns:
        if key not in dims:
            raise SweepSpecError(
                f"invalid sweep spec:\n  columns.{key}: not a key of space; allowed: {', '.join(dims)}")
    param_columns = param_column_names(list(dims), spec.columns)
    check_metric(spec.metric, "metric")
    for i, objective in enumerate(spec.objectives):
        if objective.name not in TRIAL_OBJECTIVES and not objective.name.startswith("time_to_"):
            try:
                check_metric(objective.name, f"objectives[{i}].name")
            except SweepSpecError as err:
                raise SweepSpecError(f"{err}; or a trials.parquet total: {', '.join(TRIAL_OBJECTIVES)}") from None
        elif objective.name.startswith("time_to_") and (
                spec.target is None or objective.name != f"time_to_{spec.metric}_{spec.target:g}"):
            raise SweepSpecError(f"invalid sweep spec:\n  objectives[{i}].name = {objective.name!r}: a time to a "
                                 "target is the column time_to_<metric>_<target> of the spec's metric and target")
    twice = given_twice([o.name for o in spec.objectives], "objectives", "named")
    if twice:
        raise SweepSpecError(f"invalid sweep spec:\n  {twice}")
    if spec.scheduler.metric is not None:
        check_metric(spec.scheduler.metric, "scheduler.metric")
    max_t = spec.scheduler.max_t
    try:
        check_search(spec.search, dims, len(spec.objectives), spec.scheduler.name)
        check_repeats(spec.repeats, dims, spec.scheduler.name)
        check_budget(spec.scheduler)
    except SearchProblem as err:
        raise SweepSpecError(f"invalid sweep spec:\n  {err}") from None
    in_rounds = spec.scheduler.time_attr == "rounds"
    if in_rounds and max_t is not None and max_t > base_cfg.rounds:
        raise SweepSpecError(
            f"invalid sweep spec:\n  scheduler.max_t = {max_t}: must be <= the experiment's rounds "
            f"({base_cfg.rounds})")
    if in_rounds and spec.scheduler.name == "asha" and spec.scheduler.grace_period > (max_t or base_cfg.rounds):
        raise SweepSpecError(
            f"invalid sweep spec:\n  scheduler.grace_period = {spec.scheduler.grace_period}: must be "
            f"<= max_t ({max_t or base_cfg.rounds} rounds)")
    _resources_check(spec, base_cfg)

    _check_schedule(spec, base_cfg, dims)
    spec.storage = storage_path
    try:
        open_storage(storage_path, spec.storage_options)
    except ValueError as err:
        raise SweepSpecError(f"invalid sweep spec:\n  storage = {storage_path!r}: {err}") from None
    return ResolvedSweep(
        spec, base_raw, storage_path, param_columns, base_cfg,
        count_trials(dims, spec.num_samples, spec.search.algorithm, spec.repeats), command,
    )
