"""Statistics of a sweep's trials, vectorised: per-configuration means with 95 % t-intervals,
Pareto fronts and the 2-D hypervolume of a front.

Pure numpy/pandas (and scipy's t quantiles; scipy comes with scikit-learn): no sweep files here.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

LEVEL = 0.95  # the intervals of configs.parquet
STAT_SUFFIXES = ("_mean", "_std", "_ci_low", "_ci_high")


def t_half_width(std: np.ndarray | pd.Series, n: np.ndarray | pd.Series, level: float = LEVEL) -> np.ndarray:
    """Half width of the two-sided ``level`` t-interval of a mean: t(1-(1-level)/2, n-1) * std / sqrt(n).
    NaN for n < 2 (one value has no spread)."""
    from scipy import stats  # reason: ~1 s of import that every trial process would pay; only tables need it

    n = np.asarray(n, dtype=float)
    std = np.asarray(std, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = stats.t.ppf(0.5 + level / 2, np.where(n >= 2, n - 1, np.nan))
        return t * std / np.sqrt(n)


def pareto_mask(values: np.ndarray, modes: list[str]) -> np.ndarray:
    """True for the rows no other row dominates (at least as good in every column, better in one);
    a row with a NaN is never on the front (and dominates nothing)."""
    m = np.asarray(values, dtype=float) * np.array([-1.0 if mode == "max" else 1.0 for mode in modes])
    front = np.zeros(len(m), dtype=bool)
    idx = np.flatnonzero(np.isfinite(m).all(axis=1)) if m.size else np.array([], dtype=int)
    if idx.size:
        sub = m[idx]
        no_worse = (sub[:, None, :] <= sub[None, :, :]).all(axis=2)  # [j, i]: j no worse than i everywhere
        better = (sub[:, None, :] < sub[None, :, :]).any(axis=2)
        front[idx] = ~(no_worse & better).any(axis=0)
    return front


def config_stats(trials: pd.DataFrame, key: str, columns: list[str], first: list[str] | None = None) -> pd.DataFrame:
    """One row per value of ``key`` (the configuration id): ``first`` columns (the hyperparameters)
    from its first row, ``n`` (rows with a value of the first column) and for every column
    ``<c>_mean``, ``<c>_std`` (ddof 1), ``<c>_ci_low``, ``<c>_ci_high`` (the 95 % t-interval of the mean,
    NaN with one value)."""
    first = first or []
    numeric = trials[columns].apply(pd.to_numeric, errors="coerce").astype(float)
    grouped = numeric.groupby(trials[key], sort=False)
    mean, std, count = grouped.mean(), grouped.std(ddof=1), grouped.count()
    half = pd.DataFrame(t_half_width(std.to_numpy(), count.to_numpy()), index=mean.index, columns=columns)
    out = trials.groupby(key, sort=False)[first].first() if first else pd.DataFrame(index=mean.index)
    out["n"] = count[columns[0]].astype(int) if columns else 0
    for c in columns:
        out[c + "_mean"] = mean[c]
        out[c + "_std"] = std[c]
        out[c + "_ci_low"] = mean[c] - half[c]
        out[c + "_ci_high"] = mean[c] + half[c]
    return out.reset_index()


def within_noise(configs: pd.DataFrame, column: str, mode: str) -> pd.Series:
    """True where a configuration's interval of ``column`` overlaps the best configuration's
    (the best by mean, ``mode``), False where it does not; missing (``pd.NA``) where there is
    nothing to test: the configuration or the best has no interval (one value, no repeats). The
    best is within noise of itself. A nullable boolean column."""
    mean = configs[column + "_mean"]
    out = pd.Series(pd.NA, index=configs.index, dtype="boolean")
    if mean.notna().sum() == 0:
        return out
    best = mean.idxmax() if mode == "max" else mean.idxmin()
    low, high = configs[column + "_ci_low"], configs[column + "_ci_high"]
    tested = low.notna() & high.notna() & pd.notna(low[best]) & pd.notna(high[best])
    out[tested] = ((low <= high[best]) & (high >= low[best]))[tested]
    out[best] = True
    return out


def hypervolume_2d(points: np.ndarray, reference: tuple[float, float], modes: tuple[str, str]) -> float:
    """The area dominated by ``points`` (n x 2) and bounded by ``reference``, both objectives
    turned into minimisation (``mode`` max: negated); points not better than the reference in both
    objectives add nothing. The front's staircase, vectorised: sort by the first objective, keep
    the running minimum of the second."""
    sign = np.array([-1.0 if m == "max" else 1.0 for m in modes])
    p = np.asarray(points, dtype=float).reshape(-1, 2) * sign
    ref = np.asarray(reference, dtype=float) * sign
    p = p[np.isfinite(p).all(axis=1) & (p < ref).all(axis=1)]
    if not len(p):
        return 0.0
    p = p[np.lexsort((p[:, 1], p[:, 0]))]
    y = np.minimum.accumulate(p[:, 1])
    x_next = np.append(p[1:, 0], ref[0])
    return float(np.sum((x_next - p[:, 0]) * (ref[1] - y)))
