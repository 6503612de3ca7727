"""How a sweep chooses its trials and how long they run: the search algorithm, repeats of every
configuration over paired seeds, and scheduler budgets in simulated units.

* ``search: {algorithm: random}`` (default) or ``grid``: Tune's ``BasicVariantGenerator`` as before
  (``grid`` refuses sampled dimensions). ``optuna``: ``ray.tune.search.optuna.OptunaSearch`` with a
  seeded sampler (``sampler: tpe | nsga2 | nsga3 | gp | qmc | random | cmaes``, its keyword
  arguments in ``sampler_options``); ``grid``/``named`` dimensions become categorical choices.
* ``repeats: N``: every configuration runs N times; repeat i of every configuration uses the
  experiment's seed + i (:data:`TRIAL_INDEX` in the trial's config says which repeat it is).
* ``scheduler.time_attr``: ASHA and PBT count ``rounds`` (default), simulated seconds
  (``sim_time_s``) or cumulative upload bytes (``bytes_up``); :data:`TIME_ATTRS` names the value
  the trainable reports for each.

Models and checks only, no Ray (importing :mod:`sweeps` does not import Ray): the Tune objects
are built in :mod:`sweeps.searchers`. The checks raise :class:`SearchProblem` with the field,
the value and what is allowed; :func:`sweeps.spec.resolve` reports it as a ``SweepSpecError``.
"""
from __future__ import annotations

import importlib.util
import inspect
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The key Tune's Repeater sets in a trial's config (ray.tune.search.repeater.TRIAL_INDEX); the
# grid/random path adds it as a hidden grid dimension.
TRIAL_INDEX = "__trial_index__"
SEARCH_ALGORITHMS = ("grid", "random", "optuna")
# sampler -> (class in optuna.samplers, handles several objectives, extra package it needs)
OPTUNA_SAMPLERS: dict[str, tuple[str, bool, str | None]] = {
    "tpe": ("TPESampler", True, None),
    "nsga2": ("NSGAIISampler", True, None),
    "nsga3": ("NSGAIIISampler", True, None),
    "gp": ("GPSampler", True, None),
    "qmc": ("QMCSampler", True, None),
    "random": ("RandomSampler", True, None),
    "cmaes": ("CmaEsSampler", False, "cmaes"),
}
# Sampler arguments the sweep sets itself, or that take Python objects rather than values.
_SAMPLER_FIXED = {"seed", "constraints_func", "independent_sampler", "mutation", "crossover",
                  "elite_population_selection_strategy", "child_generation_strategy",
                  "after_trial_strategy", "source_trials", "x0", "reference_points"}
# scheduler.time_attr -> the cumulative value each reported result carries (sweeps.trainable)
TIME_ATTRS = {"rounds": "rounds_done", "sim_time_s": "total_sim_time_s", "bytes_up": "total_bytes_up"}
# An upload budget below this is no budget at all (a round of the smallest model uploads more):
# a value this small was most likely meant as rounds.
MIN_BYTES_BUDGET = 1000


class SearchProblem(ValueError):
    """A search/repeats/budget setting that cannot work; the message names field, value, allowed."""


class SearchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algorithm: Literal["grid", "random", "optuna"] = Field(
        "random", description="random (default) and grid: Tune's variant generator; optuna: a model-based searcher")
    sampler: str | None = Field(None, description="optuna: " + " | ".join(OPTUNA_SAMPLERS) + " (default tpe)")
    seed: int | None = Field(None, ge=0, description="the sampler's seed; default: the spec's search_seed")
    sampler_options: dict[str, Any] = Field(
        default_factory=dict, description="optuna: keyword arguments of the sampler, e.g. {n_startup_trials: 4}")


def installed(package: str) -> bool:
    """Whether ``package`` can be imported (tests replace this to see the missing-package error)."""
    return importlib.util.find_spec(package) is not None


def check_search(search: SearchSpec, dims: dict[str, tuple[str, Any]], n_objectives: int, scheduler: str) -> None:
    """Refuse what the chosen searcher cannot do, before anything starts."""
    algo = search.algorithm
    if algo == "grid":
        for key, (kind, _) in dims.items():
            if kind not in ("grid", "named", "cases"):
                raise SearchProblem(
                    f"space.{key} = {{{kind}: ...}}: search.algorithm 'grid' takes grid, named and cases dimensions "
                    "only; use algorithm: random (grid x samples) or optuna for sampled dimensions")
    if algo != "optuna":
        if search.sampler is not None or search.sampler_options:
            field = "sampler" if search.sampler is not None else "sampler_options"
            raise SearchProblem(
                f"search.{field} = {getattr(search, field)!r}: only search.algorithm 'optuna' has a sampler "
                f"(algorithm is {algo!r})")
        return
    if not installed("optuna"):
        raise SearchProblem(
            "search.algorithm = 'optuna': the package optuna is not installed; "
            "pip install 'hetsim[search]' (or pip install optuna)")
    name = search.sampler or "tpe"
    if name not in OPTUNA_SAMPLERS:
        raise SearchProblem(
            f"search.sampler = {name!r}: not an Optuna sampler the sweep knows; allowed: {', '.join(OPTUNA_SAMPLERS)}")
    cls_name, multi, package = OPTUNA_SAMPLERS[name]
    if package is not None and not installed(package):
        raise SearchProblem(
            f"search.sampler = {name!r}: Optuna's {cls_name} needs the package {package}, which is not "
            f"installed; pip install {package}")
    if n_objectives > 1 and not multi:
        allowed = ", ".join(k for k, v in OPTUNA_SAMPLERS.items() if v[1])
        raise SearchProblem(
            f"search.sampler = {name!r}: {cls_name} optimises one objective but the spec has {n_objectives} "
            f"(objectives); multi-objective samplers: {allowed}")
    import optuna.samplers  # reason: only a spec that chose Optuna (and has it) pays for importing it

    params = inspect.signature(getattr(optuna.samplers, cls_name)).parameters
    allowed_opts = [p for p in params if p not in _SAMPLER_FIXED]
    for opt in search.sampler_options:
        if opt not in allowed_opts:
            raise SearchProblem(
                f"search.sampler_options.{opt}: not an option of {cls_name} the spec may set; allowed: "
                f"{', '.join(allowed_opts)}" + (" (the seed is search.seed)" if opt == "seed" else ""))
    if scheduler == "pbt":
        raise SearchProblem(
            "scheduler.name = 'pbt' with search.algorithm = 'optuna': Tune's Population Based Training "
            "works with its own variant generator only; use algorithm: random or grid with PBT, or "
            "fifo/asha with Optuna")
    for key, (kind, args) in dims.items():
        if kind == "grid":
            bad = [v for v in args if not (v is None or isinstance(v, (bool, int, float, str)))]
            if bad:
                raise SearchProblem(
                    f"space.{key}.grid: value {bad[0]!r}: Optuna's categorical choices take None, booleans, "
                    "numbers and strings only; give such values names with {named: {name: value}}")


def check_repeats(repeats: int, dims: dict[str, tuple[str, Any]], scheduler: str) -> None:
    if repeats == 1:
        return
    if "seed" in dims:
        raise SearchProblem(
            f"repeats = {repeats}: the space sweeps seed itself; repeats set the seed (seed + repeat index), "
            "so use either repeats or a seed dimension")
    if scheduler == "pbt":
        raise SearchProblem(
            f"repeats = {repeats} with scheduler 'pbt': PBT's exploit steps copy hyperparameters between "
            "trials, so the repeats of a configuration would not stay one configuration; allowed: repeats: 1")


def check_budget(s) -> None:
    """Scheduler values in the unit of ``s.time_attr`` (``s``: the spec's SchedulerSpec)."""
    if s.name == "fifo":
        if s.time_attr != "rounds":
            raise SearchProblem(
                f"scheduler.time_attr = {s.time_attr!r}: only the asha and pbt schedulers count a budget "
                "(scheduler.name is 'fifo')")
        return
    unit = {"rounds": "rounds", "sim_time_s": "simulated seconds", "bytes_up": "upload bytes"}[s.time_attr]
    fields = ("grace_period", "max_t") if s.name == "asha" else ("perturbation_interval",)
    for field in fields:
        value = getattr(s, field)
        if value is None:
            continue
        if s.time_attr == "rounds" and float(value) != int(value):
            raise SearchProblem(
                f"scheduler.{field} = {value!r}: with time_attr 'rounds' it counts rounds; give a whole number")
        if s.time_attr == "bytes_up" and value < MIN_BYTES_BUDGET:
            raise SearchProblem(
                f"scheduler.{field} = {value!r}: with time_attr 'bytes_up' it counts cumulative upload bytes; "
                f"give at least {MIN_BYTES_BUDGET} (e.g. 5.0e6 for 5 MB), or time_attr: rounds for rounds")
    if s.time_attr == "rounds":
        return
    if s.name == "asha" and s.max_t is None:
        raise SearchProblem(
            f"scheduler.max_t = None: with time_attr {s.time_attr!r} ASHA needs its budget in {unit} "
            "(the experiment's rounds are only the default for time_attr: rounds); allowed: a number > "
            "grace_period")
    if s.name == "asha" and s.grace_period >= s.max_t:
        raise SearchProblem(
            f"scheduler.grace_period = {s.grace_period!r}: must be < max_t ({s.max_t!r} {unit})")


def shown_values(kind: str, args: Any) -> Any:
    """A dimension's values as ``--dry-run`` lists them: a ``cases`` or ``named`` dimension (a
    study's runs, a what-if's fleets) by its first names; what each sets is in the spec."""
    if kind not in ("cases", "named"):
        return args
    return ", ".join(map(str, list(args)[:8])) + (f", ... ({len(args)} {kind})" if len(args) > 8 else "")


def describe_search(spec, base_seed: int) -> list[str]:
    """``hetsim sweep --dry-run`` lines on the searcher and the repeats (``spec``: a SweepSpec)."""
    lines = []
    if spec.search.algorithm == "optuna":
        lines.append(f"search: optuna ({spec.search.sampler or 'tpe'}), {spec.num_samples} suggestion(s); "
                     "grid/named keys are drawn as choices")
    if spec.repeats > 1:
        lines.append(f"repeats: {spec.repeats} (seeds {base_seed}..{base_seed + spec.repeats - 1} for every "
                     "configuration)")
    return lines
