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

The schema is :mod:`sweeps.spec_model`, the checks that give each field its error message
:mod:`sweeps.spec_checks`; this module is :func:`resolve`, which runs them in order, and
:class:`ResolvedSweep`, what it returns. The names of those two modules are importable from here.
Over 400 lines because the spec's format is documented here, above the one function that reads it.
"""
from __future__ import annotations

import copy
import functools
import itertools
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine import ConfigError, ExperimentConfig, load_config
from engine.config.paths import resolve_paths
from engine.config.schema import apply_overrides, expand_path, overrides_given_twice, redact
from engine.ray.cluster import ray_is_up
from engine.storage.locations import is_uri, open_storage
from hardware_profiles.suggest import given_twice
from sweeps.grid import GridError, apply_grid
from sweeps.search import TRIAL_INDEX, SearchProblem, check_budget, check_repeats, check_search
from sweeps.spec_checks import (  # noqa: F401 - the checks' names, importable from sweeps.spec as before
    _algorithm_hint,
    _check_case,
    _check_cases_key,
    _check_distribution,
    _check_experiment,
    _check_probe,
    _check_schedule,
    _config_problem,
    _format_spec_errors,
    _load_base,
    _probe_values,
    _resolved_dimension,
    _resolved_value,
    _resources_check,
    _validate_experiment,
    check_metric,
    count_trials,
    expand_params,
    load_base,
    param_column_names,
    read_mapping_file,
    storage_location,
    trial_seed,
)
from sweeps.spec_model import (  # noqa: F401 - the schema's names, importable from sweeps.spec as before
    DISTRIBUTIONS,
    GRID_KINDS,
    METRIC_PREFIXES,
    NAMED_KINDS,
    RESERVED_KEYS,
    TRIAL_COLUMNS,
    TRIAL_OBJECTIVES,
    Objective,
    RaySpec,
    ResourcesSpec,
    SchedulerSpec,
    SweepSpec,
    SweepSpecError,
)
from sweeps.trackers import check_trackers

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


# ---------------------------------------------------------------- resolve, step by step


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

    Args:
        source: the spec: a YAML file's path, or a mapping.
        storage: the sweep folder (a path or a URI); default: the spec's, else ``sweeps_out/<name>``.
        address: a Ray cluster to join instead of the spec's ``ray.address``.
        command: the command line that started the sweep, kept in ``sweep.yaml``.
        data_checks: if a list, the checks that load the data (the base and each probed value,
            validated as a run validates them: seconds of CPU) are appended to it instead of run
            here, for the caller to run while Ray starts; each raises :class:`SweepSpecError`.
        overrides: ``key=value`` items applied to the base after the spec's own (``hetsim sweep --set``).
        grid: ``KEY=v1,v2`` items replacing dimensions of the space (``hetsim sweep --grid``,
            :mod:`sweeps.grid`).

    Raises:
        SweepSpecError: the first problem found, naming the field, the value and what is allowed.
    """
    spec, spec_dir = _read_spec(source)
    own = _apply_command_line(spec, spec_dir, grid, overrides, address, from_file=isinstance(source, (str, Path)))
    base_raw = _base_with_overrides(spec, spec_dir, own, overrides)
    storage_path = storage_location(
        storage if storage is not None else (spec.storage or Path("sweeps_out") / spec.name))
    try:  # before the data checks: a missing package or a bad URI needs no data loaded
        check_trackers(spec.trackers, storage_path)
    except ValueError as err:
        raise SweepSpecError(f"invalid sweep spec:\n  {err}") from None
    base_cfg, probe = _validate_base(base_raw, storage_path, data_checks)
    dims = _check_space(spec, base_cfg, probe)
    _check_grid_points(base_raw, dims)
    param_columns = _check_columns_and_metrics(spec, dims)
    _check_scheduling(spec, base_cfg, dims)
    spec.storage = storage_path
    try:
        open_storage(storage_path, spec.storage_options)
    except ValueError as err:
        raise SweepSpecError(f"invalid sweep spec:\n  storage = {storage_path!r}: {err}") from None
    return ResolvedSweep(
        spec, base_raw, storage_path, param_columns, base_cfg,
        count_trials(dims, spec.num_samples, spec.search.algorithm, spec.repeats), command,
    )


def _read_spec(source: str | Path | dict[str, Any]) -> tuple[SweepSpec, Path | None]:
    """The spec validated against its schema (named after its file when it has no name), and the
    folder its relative paths are relative to (None for a mapping: the working folder)."""
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
    return spec, spec_dir


def _apply_command_line(spec: SweepSpec, spec_dir: Path | None, grid: list[str] | None,
                        overrides: list[str] | None, address: str | None, from_file: bool = False) -> list[str]:
    """``--grid``, ``--set`` and the Ray address of the command line, written into ``spec``; returns
    the spec's own overrides (their paths are relative to the spec's file, not the working folder)."""
    if grid:
        try:
            spec.space = apply_grid(spec.space, grid)
        except GridError as err:
            raise SweepSpecError(f"invalid sweep spec:\n  {err}") from None
    own = list(spec.overrides)
    twice = overrides_given_twice(own, "overrides:") if from_file else None
    if twice:  # a list in the spec file; a resumed sweep's spec holds the --set items after them
        raise SweepSpecError(f"invalid sweep spec:\n  {twice}")
    if overrides:
        spec.overrides = [*own, *overrides]
    if address is not None:
        spec.ray.address = address
    return own


def _base_with_overrides(spec: SweepSpec, spec_dir: Path | None, own: list[str],
                         overrides: list[str] | None) -> dict[str, Any]:
    """The base experiment's mapping with the spec's overrides, then the command line's, applied."""
    base_raw = _load_base(spec, spec_dir)
    try:  # a path in the spec's own overrides is relative to the spec's file, in --set to the working folder
        for items, folder in ((own, spec_dir), (list(overrides or []), None)):
            if items:
                base_raw = resolve_paths(apply_overrides(base_raw, items), folder)[0]
    except ConfigError as err:
        raise SweepSpecError(f"invalid sweep spec:\n  overrides: {err}") from None
    return base_raw


def _validate_base(base_raw: dict[str, Any], storage_path: str,
                   data_checks: list[Callable[[], Any]] | None) -> tuple[ExperimentConfig, Callable[..., None]]:
    """The base experiment validated, and ``probe(key, kind, args, value)``, which validates one
    probed value of the space. With ``data_checks`` the checks that load data are appended to it
    (run by the caller while Ray starts) instead of run here; nor are they for a URI storage."""
    local_storage = None if is_uri(storage_path) else Path(storage_path)  # run folders' checks
    checks_now = local_storage if data_checks is None else None
    ray_running = ray_is_up()  # pinned: the deferred checks may run while Ray starts
    base_cfg = _validate_experiment(base_raw, "base", checks_now)
    defer = data_checks is not None and local_storage is not None
    if defer:
        data_checks.append(functools.partial(_validate_experiment, base_raw, "base", local_storage, ray_running))

    def probe(key: str, kind: str, args: Any, value: Any) -> None:
        _check_probe(base_raw, key, kind, args, value, base_cfg, checks_now)
        if defer:
            data_checks.append(functools.partial(
                _check_probe, base_raw, key, kind, args, value, base_cfg, local_storage, ray_running))

    return base_cfg, probe


def _check_space(spec: SweepSpec, base_cfg: ExperimentConfig,
                 probe: Callable[..., None]) -> dict[str, tuple[str, Any]]:
    """Every dimension of the space: its key, its distribution, and each probed value in the base
    (``probe``). Returns ``{key: (kind, args)}`` and writes the normalised space back into ``spec``."""
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
            probe(key, kind, args, value)
        dims[key] = (kind, args)
    spec.space = {k: {kind: args} for k, (kind, args) in dims.items()}
    return dims


def _check_grid_points(base_raw: dict[str, Any], dims: dict[str, tuple[str, Any]]) -> None:
    """Grid values are validated together too (fields can constrain each other) when few."""
    grid_keys = [k for k, (kind, _) in dims.items() if kind in GRID_KINDS]
    combos = math.prod(len(dims[k][1]) for k in grid_keys)
    if len(grid_keys) < 2 or combos > 256:
        return
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


def _check_columns_and_metrics(spec: SweepSpec, dims: dict[str, tuple[str, Any]]) -> dict[str, str]:
    """The spec's column names, its metric and its objectives; returns the hyperparameters' columns."""
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
    return param_columns


def _check_scheduling(spec: SweepSpec, base_cfg: ExperimentConfig, dims: dict[str, tuple[str, Any]]) -> None:
    """The searcher, the repeats and the scheduler against the space and the base experiment, and
    the resources each trial asks for."""
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
