"""The report of a sweep folder (``hetsim report SWEEP``): the best configurations, the metric
against each hyperparameter, and the learning curves of the best trials.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import sweeps
from hetsim import plots
from hetsim.common import human_bytes
from hetsim.page import Page
from sweeps.results import name_columns, objective_column

SWEEP_FIGURES = (
    "table-sweep-best",
    "fig-sweep-curves",
)  # plus one fig-sweep-param-<column> per hyperparameter (sweep_param_figure_id), and
#   fig-sweep-heatmap when exactly two hyperparameters were swept
HEATMAP_FIGURE = "fig-sweep-heatmap"
PARETO_FIGURE = "fig-sweep-pareto"  # with objectives: the front in every pair of them
CONFIGS_FIGURE = "fig-sweep-configs"  # with repeats: each configuration's mean and 95 % interval
CONFIGS_TABLE = "table-sweep-configs"
TOP_TRIALS = 10  # rows of the best-configurations table
TOP_CURVES = 5  # learning curves drawn


def sweep_param_figure_id(column: str) -> str:
    """The id of the figure of the sweep metric against one hyperparameter column."""
    return "fig-sweep-param-" + (re.sub(r"[^A-Za-z0-9]+", "-", column).strip("-").lower() or "x")


def sweep_page(path: Path) -> Page:
    s = sweeps.load_sweep(path)
    t = s.trials
    metric, mode = s.metric, s.mode
    name = s.spec.get("name") or path.name
    base = s.spec.get("base") or {}
    algo = (base.get("algorithm") or {}).get("name", "?")
    dataset = (base.get("dataset") or {}).get("name", "?")
    page = Page(f"hetsim sweep: {name}", f"{algo} on {dataset}; {len(t)} trials, ranked by the "
                f"{'highest' if mode == 'max' else 'lowest'} {metric} of each trial")
    counts = t["status"].value_counts().to_dict() if len(t) else {}
    page.key_values("table-sweep-summary", [
        ("sweep folder", str(path)),
        ("trials", ", ".join(f"{v} {k}" for k, v in counts.items()) or "none"),
        ("planned trials", str(s.num_trials if s.num_trials is not None else "?")),
        ("metric", f"{metric} ({mode})"),
        ("hyperparameters", ", ".join(f"{k} → {v}" for k, v in s.param_columns.items())),
        ("rounds per trial", str(base.get("rounds", "?"))),
    ])
    best_col = f"best_{metric}"
    ok = t[(t["status"] != "error") & pd.to_numeric(t.get(best_col, pd.Series(dtype=float)), errors="coerce").notna()] \
        if len(t) and best_col in t else t.iloc[0:0]
    page.section("Best configurations")
    if ok.empty:
        page.omit("table-sweep-best", f"table-sweep-best: no trial has a value of {metric} yet")
    else:
        cols = ["trial_id", *name_columns(s), "status", "rounds_done",
                f"final_{metric}", best_col, "total_sim_time_s", "total_bytes_up"]
        best = s.best(TOP_TRIALS, level="trials")
        best = best[best[best_col].notna()][[c for c in cols if c in best]]
        fmt = {"total_bytes_up": human_bytes}
        page.table("table-sweep-best", best.reset_index(drop=True), fmt,
                   caption=f"the {len(best)} best trials by {s.rank_column}")
    page.section(f"{metric} against each hyperparameter")
    page.row()
    for key, col in s.param_columns.items():
        fig_id = sweep_param_figure_id(col)
        if ok.empty or col not in ok:
            page.omit(fig_id, f"{fig_id}: no finished trial to plot")
            continue
        kind = next(iter((s.spec.get("space") or {}).get(key, {"grid": []})))
        page.guarded((fig_id,), _param_figure, fig_id, ok, col, key, kind, metric)
    page.row(False)
    kinds = [next(iter((s.spec.get("space") or {}).get(k, {"?": []}))) for k in s.param_columns]
    if len(kinds) == 2 and set(kinds) <= {"grid", "choice", "named"} and not ok.empty:  # two discrete axes
        page.guarded((HEATMAP_FIGURE,), _heatmap_figure, ok, list(s.param_columns.values()), metric, mode)
    if s.repeats > 1 and len(s.configs):
        page.section(f"Configurations over {s.repeats} seeds")
        page.guarded((CONFIGS_FIGURE,), _configs_figure, s)
        _configs_table(page, s)
    objectives = s.spec.get("objectives") or []
    if objectives and "pareto" in t:
        page.section("Trade-offs: the Pareto front")
        page.guarded((PARETO_FIGURE,), _pareto_figure, s, objectives)
        front = s.pareto_front()
        cols = ["trial_id", *[c for c in s.param_columns.values() if c in t],
                *[objective_column(o["name"]) for o in objectives]]
        if s.repeats > 1:  # the front of the configurations' means
            front = s.configs[s.configs["pareto"].astype(bool)] if "pareto" in s.configs else s.configs.iloc[0:0]
            cols = ["config_id", *[c for c in s.param_columns.values() if c in t], "n",
                    *[objective_column(o["name"]) + "_mean" for o in objectives]]
        page.table("table-sweep-pareto", front[[c for c in cols if c in front]].reset_index(drop=True),
                   {c: human_bytes for c in cols if "bytes" in c},
                   caption=f"the {len(front)} Pareto-optimal trials: no other trial is at least as good in every "
                   "objective and better in one")
    page.section("Learning curves of the best trials")
    page.guarded(("fig-sweep-curves",), _sweep_curves, s, ok, metric)
    errors = t[t["status"] == "error"] if len(t) else t
    if len(errors):
        page.section("Errors")
        page.table("table-sweep-errors", errors[["trial_id", "error"]].reset_index(drop=True))
    return page


def _param_figure(page, fig_id, ok, col, key, kind, metric) -> None:
    fig, (ax,) = plots.figure(width=6.6, height=3.4)
    best = plots.numeric(ok[f"best_{metric}"])
    final = plots.numeric(ok[f"final_{metric}"]) if f"final_{metric}" in ok else None
    values = ok[col]
    is_number = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    if is_number and kind not in ("grid", "choice", "named") and values.nunique(dropna=True) > 1:
        x = plots.numeric(values)
        ax.scatter(x, best, color="#4C72B0", label=f"best {metric}", zorder=3)
        if final is not None:
            ax.scatter(x, final, facecolors="none", edgecolors="#DD8452", label=f"final {metric}", zorder=3)
        positive = x.dropna()
        if kind == "loguniform" or (len(positive) and (positive > 0).all() and positive.max() / positive.min() >= 20):
            ax.set_xscale("log")
        ax.set_xlabel(col)
    else:
        labels = values.map(lambda v: "null" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
        cats = list(dict.fromkeys(labels))
        if is_number:
            cats = sorted(cats, key=lambda c: float(c) if c != "null" else math.inf)
        pos = labels.map({c: i for i, c in enumerate(cats)}).to_numpy(dtype=float)
        jitter = np.random.default_rng(0).uniform(-0.12, 0.12, len(pos))
        ax.scatter(pos + jitter, best, color="#4C72B0", label=f"best {metric}", zorder=3)
        if final is not None:
            ax.scatter(pos + jitter, final, facecolors="none", edgecolors="#DD8452", label=f"final {metric}", zorder=3)
        means = best.groupby(labels.values).mean()
        ax.scatter(range(len(cats)), [means.get(c, np.nan) for c in cats], marker="_", s=500,
                   color="#333", label="mean of best", zorder=4)
        ax.set_xticks(range(len(cats)), cats, fontsize=8, rotation=20 if len(cats) > 6 else 0)
        ax.set_xlim(-0.6, len(cats) - 0.4)
        ax.set_xlabel(col)
    ax.set_ylabel(metric)
    if plots.is_accuracy(metric):
        plots.min_span(ax)  # trials 0.7 points apart must not fill the axis
    plots.fig_legend(fig, ax)
    ax.set_title(f"{metric} against {col}", loc="left", fontsize=11)
    page.figure(fig_id, fig, f"one point per trial ({key}); filled: the trial's best value, hollow: "
                "its last evaluated value")


def _heatmap_figure(page, ok, cols, metric, mode) -> None:
    """Two swept hyperparameters: the mean best value of the metric for each pair of values."""
    a, b = cols
    labels = {c: ok[c].map(format_param) for c in cols}
    order = {}
    for c in cols:
        values = list(dict.fromkeys(labels[c]))
        numeric = pd.to_numeric(pd.Series(values), errors="coerce")
        order[c] = [v for _, v in sorted(zip(numeric.fillna(math.inf), values))] if numeric.notna().all() else values
    best = plots.numeric(ok[f"best_{metric}"])
    grid = (pd.DataFrame({"a": labels[a].values, "b": labels[b].values, "v": best.values})
            .groupby(["b", "a"])["v"].mean().unstack("a").reindex(index=order[b], columns=order[a]))
    fig, (ax,) = plots.figure(width=6.6, height=max(2.6, 0.55 * len(order[b]) + 1.4))
    ax.grid(False)
    image = ax.imshow(grid.to_numpy(dtype=float), cmap="viridis" if mode == "max" else "viridis_r", aspect="auto")
    ax.set_xticks(range(len(order[a])), order[a], fontsize=8)
    ax.set_yticks(range(len(order[b])), order[b], fontsize=8)
    ax.set_xlabel(a)
    ax.set_ylabel(b)
    finite = grid.to_numpy(dtype=float)
    middle = np.nanmean(finite) if np.isfinite(finite).any() else 0.0
    for i in range(len(order[b])):
        for j in range(len(order[a])):
            v = finite[i, j]
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=8,
                        color="white" if v < middle else "black")
    fig.colorbar(image, ax=ax, label=f"best {metric} (mean over trials)")
    ax.set_title(f"best {metric} by {a} × {b}", loc="left", fontsize=11)
    page.figure(HEATMAP_FIGURE, fig, f"each cell: the mean over its trials of their best {metric} "
                "(several seeds or samples of the same pair are averaged); blank: no finished trial")


def _interval(configs: pd.DataFrame, col: str) -> np.ndarray:
    """matplotlib's 2 x n error-bar extents of a configs column's 95 % interval (0 without one)."""
    mean = plots.numeric(configs[col + "_mean"]).to_numpy(dtype=float)
    low = mean - plots.numeric(configs[col + "_ci_low"]).to_numpy(dtype=float)
    high = plots.numeric(configs[col + "_ci_high"]).to_numpy(dtype=float) - mean
    return np.nan_to_num(np.vstack([low, high]), nan=0.0)


def _configs_figure(page, s) -> None:
    """Each configuration's mean of the rank column with its 95 % interval, best first."""
    c = s.configs
    rank = s.rank_column
    if rank + "_mean" not in c or c[rank + "_mean"].notna().sum() == 0:
        page.omit(CONFIGS_FIGURE, f"{CONFIGS_FIGURE}: no configuration has a value of {rank}")
        return
    c = c.head(20)
    params = [col for col in s.param_columns.values() if col in c]
    labels = [", ".join(f"{p}={format_param(row[p])}" for p in params) or row["config_id"] for _, row in c.iterrows()]
    fig, (ax,) = plots.figure(width=6.6, height=max(2.6, 0.32 * len(c) + 1.2))
    y = np.arange(len(c))[::-1]
    # missing (one seed: nothing to test) is drawn as within noise: it is not shown to be worse
    noise = (c["within_noise_of_best"].astype("boolean").fillna(True).astype(bool).to_numpy()
             if "within_noise_of_best" in c else np.ones(len(c), bool))
    for mask, colour, label in ((noise, "#4C72B0", "within noise of the best"), (~noise, "#BBBBBB", "worse")):
        if mask.any():
            ax.errorbar(plots.numeric(c[rank + "_mean"])[mask], y[mask], xerr=_interval(c, rank)[:, mask], fmt="o",
                        color=colour, capsize=3, label=label, zorder=3)
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel(f"{rank}: mean over seeds, 95 % interval")
    plots.fig_legend(fig, ax)
    ax.set_title(f"{rank} by configuration ({s.repeats} seeds each)", loc="left", fontsize=11)
    page.figure(CONFIGS_FIGURE, fig, "one row per configuration, best first: the mean over its seeds and the 95 % "
                "t-interval of that mean; blue: its interval overlaps the best configuration's (within noise)")


def _configs_table(page, s) -> None:
    c = s.configs
    rank = s.rank_column
    shown = c.head(TOP_TRIALS)
    out = shown[["config_id", *[p for p in s.param_columns.values() if p in c], "n"]].copy()
    for col in dict.fromkeys([rank, *[objective_column(o["name"]) for o in s.spec.get("objectives") or []],
                              "total_sim_time_s", "total_bytes_up"]):
        if col + "_mean" not in shown:
            continue
        fmt = human_bytes if "bytes" in col else (lambda v: f"{v:.4g}")
        out[col] = [f"{fmt(m)} [{fmt(lo)}, {fmt(hi)}]" if np.isfinite(lo) else f"{fmt(m)}"
                    for m, lo, hi in zip(shown[col + "_mean"], shown[col + "_ci_low"], shown[col + "_ci_high"])]
    for col in ("within_noise_of_best", "pareto"):
        if col in shown:  # missing stays missing (within_noise_of_best of a configuration run once)
            out[col] = shown[col].astype("boolean").to_numpy(dtype=object, na_value=None)
    page.table(CONFIGS_TABLE, out.reset_index(drop=True),
               caption=f"the {len(out)} best configurations by their mean {rank} over {s.repeats} seeds: "
               "mean [95 % t-interval]; within_noise_of_best: the interval overlaps the best's")


def _pareto_figure(page, s, objectives) -> None:
    t = s.trials[~s.trials["status"].isin(("error", "diverged"))]
    pairs = [(a, b) for i, a in enumerate(objectives) for b in objectives[i + 1:]][:3]
    if not pairs:
        page.omit(PARETO_FIGURE, f"{PARETO_FIGURE}: one objective has no trade-off to draw")
        return
    repeated = s.repeats > 1 and "pareto" in s.configs
    if repeated:  # one point per configuration: the means, with 95 % intervals as error bars
        t = s.configs.rename(columns={objective_column(o["name"]) + "_mean": objective_column(o["name"])
                                      for o in objectives})
    fig, axes = plots.figure(ncols=len(pairs), width=5.2 * len(pairs), height=3.8)
    front = t["pareto"].astype(bool)
    params = [c for c in s.param_columns.values() if c in t]
    for ax, (a, b) in zip(axes, pairs):
        x = plots.numeric(t[objective_column(a["name"])])
        y = plots.numeric(t[objective_column(b["name"])])
        if repeated:
            ax.errorbar(x, y, xerr=_interval(s.configs, objective_column(a["name"])),
                        yerr=_interval(s.configs, objective_column(b["name"])), fmt="none", ecolor="#999999",
                        elinewidth=0.8, capsize=2, zorder=1)
        ax.scatter(x[~front], y[~front], color="#BBBBBB", label="dominated", zorder=2)
        ax.scatter(x[front], y[front], color="#C44E52", label="Pareto-optimal", zorder=3)
        if len(objectives) == 2:  # a 2-D front is a staircase; with more objectives a projection is not
            order = np.argsort(x[front].to_numpy())
            ax.plot(x[front].to_numpy()[order], y[front].to_numpy()[order], color="#C44E52", linewidth=0.8,
                    zorder=2)
        _label_front(ax, t[front], x[front], y[front], params)
        ax.set_xlabel(f"{a['name']} ({a['mode']})")
        ax.set_ylabel(f"{b['name']} ({b['mode']})")
    plots.fig_legend(fig, axes[0])
    fig.suptitle(f"Trade-offs: every {'configuration (means over seeds)' if repeated else 'trial'};\n"
                 "the Pareto-optimal ones labelled with their hyperparameters",
                 x=0.01, ha="left", fontsize=11)
    page.figure(PARETO_FIGURE, fig, "each panel: two of the spec's objectives; red: trials no other trial "
                "dominates in all objectives together (a trial may be optimal only through a third one)"
                + ("; with repeats one point per configuration, the means over its seeds with their 95 % "
                   "intervals as error bars" if repeated else ""))


def _label_front(ax, front, x, y, params) -> None:
    """One label per point of the front: points at the same place share one (a line each), and
    neighbours along x alternate above and below so their labels do not print over each other."""
    labels: dict[tuple[float, float], list[str]] = {}
    for (_, row), xi, yi in zip(front.iterrows(), x, y):
        text = ", ".join(f"{c}={format_param(row[c])}" for c in params)
        labels.setdefault((float(xi), float(yi)), []).append(text)
    for k, ((xi, yi), texts) in enumerate(sorted(labels.items())):
        above = k % 2 == 0
        ax.annotate("\n".join(texts), (xi, yi), fontsize=7, xytext=(4, 4 if above else -6),
                    textcoords="offset points", va="bottom" if above else "top")


def _sweep_curves(page, s, ok, metric) -> None:
    r = s.rounds
    if ok.empty or r.empty or metric not in r:
        page.omit("fig-sweep-curves", f"fig-sweep-curves: no trial rounds with {metric}")
        return
    top = s.best(TOP_CURVES, level="trials")
    top = top[top["trial_id"].isin(ok["trial_id"])]
    cols = [c for c in s.param_columns.values() if c in top]
    fig, (ax, ax2) = plots.figure(ncols=2, height=3.8)
    colours = plots.colour_map(list(top["trial_id"]))
    for _, row in top.iterrows():
        tr = r[r["trial_id"] == row["trial_id"]]
        ev = tr.assign(v=plots.numeric(tr[metric])).dropna(subset=["v"])
        label = ", ".join(f"{c}={format_param(row[c])}" for c in cols) or row["trial_id"]
        for a, x in ((ax, "round"), (ax2, "sim_time_s")):
            a.plot(ev[x], ev["v"], color=colours[row["trial_id"]], label=label,
                   marker=plots.marker_for(len(ev)), markersize=3)
    plots.round_ticks(ax)
    ax2.set_xlabel("simulated time (s)")
    for a in (ax, ax2):
        a.set_ylabel(metric)
        if plots.is_accuracy(metric):
            plots.min_span(a)
    ax.set_title(f"{metric} per round", loc="left", fontsize=11)
    ax2.set_title(f"{metric} against simulated time", loc="left", fontsize=11)
    plots.fig_legend(fig, ax)
    page.figure("fig-sweep-curves", fig, f"the {len(top)} best trials by best_{metric}")


def format_param(v: Any) -> str:
    if isinstance(v, float):
        return "null" if math.isnan(v) else f"{v:.4g}"
    return str(v)
