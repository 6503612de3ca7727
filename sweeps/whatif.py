"""What-if fleets: one experiment run once per fleet, where only ``clients.profiles`` changes.

A what-if is a sweep over one ``named`` dimension, ``clients.profiles``, whose column is
``fleet``: every trial has the same seed, data, partition, client selection and training draws,
and a different hardware fleet. It runs in parallel through :func:`sweeps.run_sweep` and writes
an ordinary sweep folder (``trials.parquet`` / ``rounds.parquet`` with a ``fleet`` column).

A what-if file::

    name: bandwidth                 # default: the file's name
    base: exp.yaml                  # experiment (path relative to this file, or a mapping);
                                    # omitted: the built-in default experiment
    overrides: [rounds=20]          # key=value items for every fleet (not clients.profiles)
    fleets:                         # a list of {name, profiles} / {name, file}, or name -> profiles
      - {name: all_500mbps, profiles: {network: {500mbps: 1.0}}}
      - {name: half_5mbps, file: half_5mbps.yaml}   # a YAML file holding a clients.profiles mapping
    target: 0.8                     # accuracy for time-to-target in the compare report
    timing_only: false              # true: clock.mode: timing_only, nothing trains (docs/timing.md)
    storage: whatif_out/bandwidth   # default: whatif_out/<name>
    max_concurrent_trials: 2
    resources_per_trial: {cpus: 1}
    ray: {address: null, num_cpus: null}

What can and cannot differ between fleets is in docs/reports.md.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import ConfigError, load_config
from engine.config.paths import missing_paths, resolve_paths, resolve_profile_paths
from engine.config.schema import apply_overrides, overrides_given_twice
from engine.config.yamlio import parse_yaml
from hardware_profiles.sampler import assign_profiles
from hardware_profiles.suggest import given_twice
from sweeps.results import RUNS_DIR
from sweeps.spec import (
    RaySpec,
    ResourcesSpec,
    SweepSpecError,
    _config_problem,
    _format_spec_errors,
    load_base,
    read_mapping_file,
)

FLEET_COLUMN = "fleet"
FLEETS_DIR = "fleets"  # <what-if folder>/fleets/<fleet name> -> ../runs/<trial id>
PROFILES_KEY = "clients.profiles"
DEFAULT_STORAGE = "whatif_out"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


class FleetEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    profiles: dict[str, Any] | None = Field(None, description="the clients.profiles mapping")
    file: str | None = Field(None, description="YAML file with the clients.profiles mapping")


class WhatIfSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    base: str | dict[str, Any] | None = None
    overrides: list[str] = Field(default_factory=list)
    fleets: list[FleetEntry] | dict[str, dict[str, Any] | str] = Field(default_factory=list)
    target: float | None = None
    metric: str | None = None  # default: global_acc, or num_arrived for a timing-only what-if
    timing_only: bool = False
    storage: str | None = None
    max_concurrent_trials: int | None = Field(None, ge=1)
    resources_per_trial: ResourcesSpec = Field(default_factory=ResourcesSpec)
    ray: RaySpec = Field(default_factory=RaySpec)


def _error(where: str, msg: str) -> SweepSpecError:
    return SweepSpecError(f"invalid what-if:\n  {where}: {msg}")


def read_fleet_file(path: str | Path, where: str, given: str | None = None) -> dict[str, Any]:
    """A fleet file: the ``clients.profiles`` mapping, bare or as ``clients: {profiles: ...}``;
    its paths are resolved against its folder (``given``: the path as the user wrote it)."""
    path = Path(path).expanduser()
    if not path.is_file():
        as_given = f"{given!r} (resolved to {str(path.resolve())!r})" if given and given != str(path) \
            else repr(str(path))
        raise _error(where, f"fleet file {as_given} does not exist")
    try:
        raw = parse_yaml(path.read_text(), str(path)) or {}
    except (yaml.YAMLError, ValueError) as err:  # ValueError: the strict loader's YamlError
        raise _error(where, f"fleet file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise _error(where, f"fleet file {str(path)!r} must hold a mapping (the clients.profiles section)")
    if set(raw) == {"clients"} and isinstance(raw["clients"], dict):
        extra = set(raw["clients"]) - {"profiles"}
        if extra:
            raise _error(where, f"fleet file {str(path)!r}: only clients.profiles may change between "
                         f"fleets, found clients.{', clients.'.join(sorted(extra))}")
        raw = raw["clients"].get("profiles") or {}
    return _resolved(raw, path.resolve().parent, str(path), where)


def parse_fleet_arg(text: str, base_dir: Path | None = None) -> tuple[str, dict[str, Any]]:
    """``NAME=FLEET.yaml`` (the command line's ``--fleet``) -> (name, profiles)."""
    if "=" not in text:
        raise _error(f"--fleet {text}", "expected NAME=FLEET.yaml")
    name, file = text.split("=", 1)
    path = Path(file)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    return name.strip(), read_fleet_file(path, f"--fleet {text}", file)


def _fleets(spec: WhatIfSpec, spec_dir: Path | None, source: str | None = None) -> dict[str, dict[str, Any]]:
    items: list[tuple[str, Any]] = []
    if isinstance(spec.fleets, dict):
        items = list(spec.fleets.items())
    else:
        for i, f in enumerate(spec.fleets):
            if (f.profiles is None) == (f.file is None):
                raise _error(f"fleets[{i}] ({f.name})", "give either profiles or file (one of them)")
            items.append((f.name, f.profiles if f.profiles is not None else f.file))
        twice = given_twice([name for name, _ in items], "fleets")
        if twice:
            raise SweepSpecError(f"invalid what-if:\n  {twice}")
    out = {}
    for name, value in items:
        if isinstance(value, str):
            path = Path(value).expanduser()
            if spec_dir is not None and not path.is_absolute():
                path = spec_dir / path
            out[name] = read_fleet_file(path, f"fleets.{name}", value)
        else:
            out[name] = _resolved(value, spec_dir, source, f"fleets.{name}")
    return out


def _resolved(profiles: Any, folder: Path | None, source: str | None, where: str) -> Any:
    """A fleet's paths made absolute against the file that names them (trials run in Tune's
    working folders); a missing file is refused here, naming the path first."""
    profiles, origins = resolve_profile_paths(profiles, folder, source)
    problems = missing_paths({"clients": {"profiles": profiles}}, origins)
    if problems:
        raise _error(where, "; ".join(p.strip() for p in problems))
    return profiles


def load_whatif_file(path: str | Path) -> tuple[WhatIfSpec, dict[str, dict[str, Any]], Path]:
    """Read a what-if YAML: (spec, fleets by name, the file's folder)."""
    path = Path(path)
    raw = read_mapping_file(path, "what-if file")
    try:
        spec = WhatIfSpec.model_validate(raw)
    except ValidationError as err:
        raise SweepSpecError(_format_spec_errors(err, WhatIfSpec, "invalid what-if", raw)) from None
    if spec.name is None:
        spec.name = path.stem
    twice = overrides_given_twice(spec.overrides, "key")  # a list in the file (code may compose)
    if twice:
        raise _error("overrides", twice)
    spec_dir = path.resolve().parent
    return spec, _fleets(spec, spec_dir, str(path)), spec_dir


def base_experiment(base: str | Path | dict[str, Any] | None, spec_dir: Path | None = None) -> dict[str, Any]:
    """The experiment every fleet runs: a mapping, a YAML path or None (the built-in default)."""
    return load_base(base, spec_dir, "invalid what-if")


def check_fleets(base_raw: dict[str, Any], fleets: dict[str, dict[str, Any]]) -> None:
    """Every fleet must be a valid ``clients.profiles`` of the base, with known tiers."""
    if len(fleets) < 2:
        raise _error("fleets", f"{len(fleets)} fleet(s) given; a what-if compares at least 2")
    for name, profiles in fleets.items():
        where = f"fleets.{name}"
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise _error(where, "a fleet name is letters, digits, . _ + - (it becomes the fleet column)")
        if not isinstance(profiles, dict):
            raise _error(where, f"must be a clients.profiles mapping, got {profiles!r}")
        try:
            cfg = load_config(apply_overrides(base_raw, {PROFILES_KEY: profiles}))
            assign_profiles(cfg.clients.profiles, cfg.clients.num_clients, seed=cfg.seed)
        except ConfigError as err:
            raise _error(where, _config_problem(err)) from None
        except (ValueError, KeyError, FileNotFoundError) as err:
            raise _error(where, str(err)) from None


def with_overrides(base_raw: dict[str, Any], overrides: list[str], folder: Path | None = None) -> dict[str, Any]:
    """``base_raw`` with ``key=value`` items applied (never clients.profiles: the fleets set it); a
    path they give is relative to ``folder`` (the what-if file's), else to the working folder."""
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key == PROFILES_KEY or key.startswith(PROFILES_KEY + "."):
            raise _error(f"overrides {item}", "clients.profiles is what the fleets set; "
                         "put it in a fleet")
    try:
        return resolve_paths(apply_overrides(base_raw, list(overrides)), folder)[0]
    except ConfigError as err:
        raise _error("overrides", str(err)) from None


def whatif_sweep_spec(
    base_raw: dict[str, Any],
    fleets: dict[str, dict[str, Any]],
    *,
    name: str = "whatif",
    overrides: list[str] = (),
    metric: str = "global_acc",
    storage: str | Path | None = None,
    max_concurrent_trials: int | None = None,
    resources_per_trial: dict[str, Any] | None = None,
    ray: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The sweep spec of a what-if: one ``named`` dimension ``clients.profiles``, column ``fleet``."""
    base_raw = with_overrides(base_raw, overrides)
    check_fleets(base_raw, fleets)
    return {
        "name": name,
        "base": base_raw,
        "space": {PROFILES_KEY: {"named": dict(fleets)}},
        "columns": {PROFILES_KEY: FLEET_COLUMN},
        "num_samples": 1,
        "metric": metric,
        "storage": str(storage if storage is not None else Path(DEFAULT_STORAGE) / name),
        "max_concurrent_trials": max_concurrent_trials,
        "resources_per_trial": resources_per_trial or {},
        "ray": ray or {},
    }


def run_whatif(base_raw: dict[str, Any], fleets: dict[str, dict[str, Any]], *, name: str = "whatif",
               overrides: list[str] = (), storage: str | Path | None = None, address: str | None = None,
               quiet: bool = False, command: list[str] | None = None, **spec_kw):
    """Run the what-if as a sweep; returns the loaded :class:`sweeps.Sweep` (column ``fleet``)."""
    from sweeps.runner import run_sweep  # Ray Tune: ~1 s to import, only when the what-if runs

    spec = whatif_sweep_spec(base_raw, fleets, name=name, overrides=list(overrides), storage=storage, **spec_kw)
    return run_sweep(spec, address=address, quiet=quiet, command=command)


def link_fleet_folders(sweep) -> dict[str, Path]:
    """Name each fleet's run folder: ``<what-if folder>/fleets/<fleet>`` links to ``runs/<trial id>``
    (Tune names trial folders by id). Local folders only; returns fleet -> link."""
    root = Path(sweep.path)
    if "://" in str(sweep.path) or not (root / RUNS_DIR).is_dir() or FLEET_COLUMN not in sweep.trials:
        return {}
    out = {}
    (root / FLEETS_DIR).mkdir(exist_ok=True)
    for fleet, trial_id in zip(sweep.trials[FLEET_COLUMN].astype(str), sweep.trials["trial_id"].astype(str)):
        if not _NAME_RE.fullmatch(fleet) or not (root / RUNS_DIR / trial_id).is_dir():
            continue
        link = root / FLEETS_DIR / fleet
        if link.is_symlink():
            link.unlink()  # a resumed what-if: the trial may be another one now
        if not link.exists():
            link.symlink_to(Path("..") / RUNS_DIR / trial_id, target_is_directory=True)
            out[fleet] = link
    return out


TIMING_ONLY = "clock.mode=timing_only"
TIMING_METRIC = "num_arrived"  # what a timing-only what-if compares by default: it has no accuracy


def timing_overrides(overrides: list[str], timing_only: bool) -> list[str]:
    """``overrides`` with ``clock.mode=timing_only`` when the what-if times its fleets only."""
    return [*overrides, TIMING_ONLY] if timing_only and TIMING_ONLY not in overrides else list(overrides)


def fleet_differences(sweep) -> list[dict[str, Any]]:
    """Per fleet against the first: are the accuracy columns and the arrivals identical?

    ``first_round_acc`` / ``first_round_arrivals``: the first round where they differ (None if never).
    ``same_accuracy`` is None when the runs have no accuracy (timing-only fleets).
    """
    t = sweep.trials[sweep.trials["rounds_done"] > 0]
    runs = {row[FLEET_COLUMN]: sweep.run(row["trial_id"]) for _, row in t.iterrows()}
    names = list(runs)
    out = []
    if not names:
        return out
    ref = runs[names[0]]
    acc_cols = [c for c in ref.rounds.columns if c.startswith(("global_acc", "pers_acc"))]
    for name in names[1:]:
        run = runs[name]
        a, b = ref.rounds.set_index("round"), run.rounds.set_index("round")
        common = a.index.intersection(b.index)
        acc_diff = [r for r in common
                    if not all(_same(a.at[r, c], b.at[r, c]) for c in acc_cols if c in b.columns)]
        arr = {}
        for label, rr in (("ref", ref), ("run", run)):
            c = rr.clients
            if len(c):
                arrived = c[c["made_deadline"].fillna(False).astype(bool)]
                arr[label] = arrived.groupby("round")["client_id"].apply(frozenset)
            else:
                arr[label] = pd.Series(dtype=object)
        arr_diff = [r for r in common if arr["ref"].get(r, frozenset()) != arr["run"].get(r, frozenset())]
        out.append({
            "fleet": name, "reference": names[0],
            "same_accuracy": (not acc_diff) if acc_cols else None, "first_round_acc": acc_diff[0] if acc_diff else None,
            "same_arrivals": not arr_diff, "first_round_arrivals": arr_diff[0] if arr_diff else None,
        })
    return out


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y
