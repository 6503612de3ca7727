"""The Tune search algorithm of a resolved sweep (the spec side: :mod:`sweeps.search`).

* grid/random: ``BasicVariantGenerator`` as before; ``repeats: N`` adds the hidden grid dimension
  :data:`~sweeps.search.TRIAL_INDEX` over ``range(N)`` with ``constant_grid_search=True``, so the
  sampled values of a configuration are drawn once and shared by its N repeats.
* optuna: ``OptunaSearch`` (seeded sampler, one metric or a list of them) inside
  :class:`MeanRepeater` (``ray.tune.search.Repeater``: each suggestion runs N times with
  ``TRIAL_INDEX`` set, and the searcher is told the mean) inside a ``ConcurrencyLimiter``.

Tune only hands a searcher the last result of a trial, so the trainable reports the trial-level
values the searcher optimises in its final result, as ``trial_<column>`` (``sweeps.results.searcher_values``).
Tune's experiment checkpoint saves the searcher's state (the Optuna study), so ``--resume``
continues the search.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from ray import tune
from ray.tune.search import ConcurrencyLimiter, Repeater
from ray.tune.search.basic_variant import BasicVariantGenerator

from sweeps.results import SEARCHER_PREFIX, searcher_columns
from sweeps.search import OPTUNA_SAMPLERS, TRIAL_INDEX
from sweeps.space import tune_param_space
from sweeps.spec import ResolvedSweep


class MeanRepeater(Repeater):
    """Tune's Repeater, also for several metrics: the searcher gets each metric's mean over the
    repeats (Tune's own looks the metric list up as one key and fails)."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, **kwargs) -> None:
        metrics = self.searcher.metric
        if not isinstance(metrics, list):
            super().on_trial_complete(trial_id, result, **kwargs)
            return
        group = self._trial_id_to_group[trial_id]
        values = [float((result or {}).get(m, np.nan)) for m in metrics]
        group.report(trial_id, values)
        if group.finished_reporting():
            scores = np.array(group.scores(), dtype=float).reshape(-1, len(metrics))
            with np.errstate(all="ignore"):  # an all-NaN metric (every repeat failed) stays NaN
                means = np.nanmean(scores, axis=0) if np.isfinite(scores).any() else scores[0]
            self.searcher.on_trial_complete(
                group.primary_trial_id, result=dict(zip(metrics, means.tolist())), **kwargs)


def param_space(resolved: ResolvedSweep) -> dict[str, Any]:
    """The Tuner's param_space: the spec's space (for Optuna, grid keys as categorical choices)
    plus, for grid/random with repeats, the hidden repeat dimension."""
    spec = resolved.spec
    space = spec.space
    if spec.search.algorithm == "optuna":
        space = {k: ({"choice": list(next(iter(d.values())))} if next(iter(d)) in ("grid", "named", "cases") else d)
                 for k, d in space.items()}
    out = tune_param_space(space)
    if spec.repeats > 1 and spec.search.algorithm != "optuna":
        out[TRIAL_INDEX] = tune.grid_search(list(range(spec.repeats)))
    return out


def search_alg(resolved: ResolvedSweep):
    spec = resolved.spec
    if spec.search.algorithm != "optuna":
        # max_concurrent goes to the generator: Tune ignores TuneConfig.max_concurrent_trials
        # when a BasicVariantGenerator is passed (measured with ray 2.60)
        return BasicVariantGenerator(random_state=spec.search_seed, max_concurrent=spec.max_concurrent_trials or 0,
                                     constant_grid_search=spec.repeats > 1)
    import optuna  # reason: only Optuna sweeps need it (an optional extra, checked by the spec)
    from ray.tune.search.optuna import OptunaSearch  # reason: imports optuna

    name = spec.search.sampler or "tpe"
    seed = spec.search.seed if spec.search.seed is not None else spec.search_seed
    sampler = getattr(optuna.samplers, OPTUNA_SAMPLERS[name][0])(seed=seed, **spec.search.sampler_options)
    columns = searcher_columns(spec.model_dump(mode="json"))
    metric = [SEARCHER_PREFIX + c for c, _ in columns]
    mode = [m for _, m in columns]
    if len(columns) == 1:
        metric, mode = metric[0], mode[0]
    searcher = OptunaSearch(metric=metric, mode=mode, sampler=sampler)
    if spec.repeats > 1:
        searcher = MeanRepeater(searcher, repeat=spec.repeats, set_index=True)
    if spec.max_concurrent_trials:
        searcher = ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent_trials)
    return searcher


def tune_num_samples(resolved: ResolvedSweep) -> int:
    """TuneConfig.num_samples: the variant generator repeats the grid (with the repeat
    dimension) num_samples times; a searcher makes num_samples x repeats trials in all."""
    spec = resolved.spec
    return spec.num_samples * spec.repeats if spec.search.algorithm == "optuna" else spec.num_samples
