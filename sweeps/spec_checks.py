"""The checks of a sweep spec, each giving its field's error message (a :class:`SweepSpecError`
that names the field, the value and what is allowed), and the small helpers a trial and the
sweep's tables share (column names, a trial's seed and overrides).

:func:`sweeps.spec.resolve` runs the checks in order; the schema is :mod:`sweeps.spec_model`.
Over 400 lines because it holds every check of a spec, one short function each.
"""
from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from engine import ConfigError, ExperimentConfig, load_config
from engine.config.hints import yaml_kind
from engine.config.paths import resolve_paths
from engine.config.schema import DEFAULT_CONFIG, TYPE_KINDS, apply_overrides, expand_path, input_loc, value_at
from engine.config.yamlio import read_yaml_file
from engine.results import ROUND_COLUMNS
from engine.storage.locations import is_uri
from hardware_profiles.suggest import unknown_key
from sweeps.search import TRIAL_INDEX
from sweeps.spec_model import (
    DISTRIBUTIONS,
    GRID_KINDS,
    METRIC_PREFIXES,
    NAMED_KINDS,
    RESERVED_KEYS,
    TRIAL_COLUMNS,
    SweepSpec,
    SweepSpecError,
    _num,
)


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
