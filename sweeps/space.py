"""The search space of a spec as a Ray Tune ``param_space``.

Keys stay dotted (``"train.lr"``); a trial's config is ``{dotted key: value}`` and is applied to
the base experiment with :func:`engine.config.schema.apply_overrides`.
"""
from __future__ import annotations

from typing import Any

from ray import tune


def tune_param_space(space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{"train.lr": {"loguniform": [1e-3, 0.1]}}`` -> ``{"train.lr": tune.loguniform(1e-3, 0.1)}``."""
    out: dict[str, Any] = {}
    for key, dist in space.items():
        (kind, args), = dist.items()
        if kind == "grid":
            out[key] = tune.grid_search(list(args))
        elif kind in ("named", "cases"):  # Tune sees the names; the trial applies them (spec.expand_params)
            out[key] = tune.grid_search(list(args))
        elif kind == "choice":
            out[key] = tune.choice(list(args))
        elif kind == "uniform":
            out[key] = tune.uniform(*args)
        elif kind == "loguniform":
            out[key] = tune.loguniform(*args)
        elif kind == "randint":
            out[key] = tune.randint(*args)  # high exclusive
        else:  # the spec validator only lets the kinds above through
            raise ValueError(f"unknown distribution {kind!r} for {key}")
    return out


def tune_mutations(space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Population Based Training's ``hyperparam_mutations``: lists (grid/choice values, which
    PBT shifts to a neighbour) or Tune domains (ranges, which it scales by 0.8/1.2 or resamples)."""
    domains = tune_param_space({k: v for k, v in space.items() if next(iter(v)) not in ("grid", "choice")})
    lists = {k: list(next(iter(v.values()))) for k, v in space.items() if next(iter(v)) in ("grid", "choice")}
    return {k: lists.get(k, domains.get(k)) for k in space}


class ClipToSpace:
    """PBT's ``custom_explore_fn``: a perturbed value (x0.8 / x1.2) stays inside its range
    (``uniform``/``loguniform``/``randint`` bounds of the spec; randint's high is exclusive)."""

    def __init__(self, space: dict[str, dict[str, Any]]):
        self.bounds = {}
        for key, dist in space.items():
            (kind, args), = dist.items()
            if kind in ("uniform", "loguniform"):
                self.bounds[key] = (float(args[0]), float(args[1]))
            elif kind == "randint":
                self.bounds[key] = (int(args[0]), int(args[1]) - 1)

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for key, (low, high) in self.bounds.items():
            if key in config and config[key] is not None:
                config[key] = type(low)(min(max(config[key], low), high))
        return config


def plain(value: Any) -> Any:
    """A sampled value as a plain Python scalar (Tune may hand out numpy scalars)."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (list, dict, str)):
        try:
            return item()
        except (TypeError, ValueError):
            return value
    return value
