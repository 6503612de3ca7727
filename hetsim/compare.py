"""``hetsim compare PATH PATH ...``: runs side by side (a table and overlaid curves).

A PATH is a run folder, or a sweep folder (every trial that ran becomes one entry, labelled by
its hyperparameter values, e.g. the fleet of a what-if). The table has, per run: final and best
global / personalized accuracy, the simulated time (and rounds) to reach a target accuracy,
bytes up/down and the total simulated time. Text in the terminal; HTML with ``-o``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import sweeps
from engine.results import load_run
from hetsim import plots
from hetsim.common import human_bytes, is_sweep_folder
from hetsim.page import Page
from hetsim.report_energy import energy_to_target

COMPARE_FIGURES = (
    "table-compare",
    "fig-compare-accuracy-round",
    "fig-compare-accuracy-time",
    "fig-compare-round-time",
    "fig-compare-bytes",
)


@dataclass
class Entry:
    label: str
    run: Any  # engine.results.Run


def _series(r: pd.DataFrame, col: str) -> pd.Series:
    if col not in r.columns:
        return pd.Series(dtype=float)
    return pd.to_numeric(r[col], errors="coerce")


def final_value(r: pd.DataFrame, col: str) -> float:
    """The last evaluated (non-NaN) value of a rounds column."""
    s = _series(r, col).dropna()
    return float(s.iloc[-1]) if len(s) else math.nan


def best_value(r: pd.DataFrame, col: str) -> float:
    s = _series(r, col).dropna()
    if not len(s):
        return math.nan
    return float(s.min() if "loss" in col else s.max())


def time_to_target(r: pd.DataFrame, metric: str, target: float) -> tuple[float, float]:
    """(simulated seconds, rounds) until ``metric`` first reaches ``target``; NaN if never."""
    s = _series(r, metric)
    hit = r.loc[s >= target]
    if hit.empty:
        return math.nan, math.nan
    first = hit.index[0]
    return float(r.loc[first, "sim_time_s"]), float(r.loc[first, "round"]) + 1


def run_summary(run) -> dict[str, Any]:
    """Final/best accuracies, totals and status of one run (the report's header, a compare row)."""
    r = run.rounds
    n = len(r)
    wall = run.manifest.get("wall_s")
    return {
        "status": run.manifest.get("status", "?"),
        "rounds": n,
        "final_global_acc": final_value(r, "global_acc"),
        "best_global_acc": best_value(r, "global_acc"),
        "final_pers_acc": final_value(r, "pers_acc"),
        "best_pers_acc": best_value(r, "pers_acc"),
        "sim_time_s": float(r["sim_time_s"].iloc[-1]) if n else math.nan,
        "bytes_up": int(r["bytes_up"].sum()) if n else 0,
        "bytes_down": int(r["bytes_down"].sum()) if n else 0,
        "wall_s": float(wall) if wall is not None else (float(r["wall_s"].sum()) if n and "wall_s" in r else math.nan),
    }


def default_target(entries: list[Entry], metric: str) -> float:
    """The highest level every run reaches: the lowest of the runs' best values, floored to 0.01."""
    bests = [best_value(e.run.rounds, metric) for e in entries]
    bests = [b for b in bests if np.isfinite(b)]
    if not bests:
        return math.nan
    return math.floor(min(bests) * 100 + 1e-9) / 100


def compare_table(entries: list[Entry], metric: str = "global_acc",
                  target: float | None = None) -> tuple[pd.DataFrame, float]:
    """One row per run; returns the table and the target used (``target`` or the default)."""
    if target is None:
        target = default_target(entries, metric)
    rows = []
    for e in entries:
        s = run_summary(e.run)
        t_s, t_rounds = time_to_target(e.run.rounds, metric, target) if np.isfinite(target) else (math.nan, math.nan)
        row = {"run": e.label, "status": s["status"], "rounds": s["rounds"],
               "final_global_acc": s["final_global_acc"], "best_global_acc": s["best_global_acc"],
               "final_pers_acc": s["final_pers_acc"], "best_pers_acc": s["best_pers_acc"]}
        if metric not in ("global_acc", "pers_acc"):
            row[f"final_{metric}"] = final_value(e.run.rounds, metric)
            row[f"best_{metric}"] = best_value(e.run.rounds, metric)
        e_to = energy_to_target(e.run.rounds, metric, target) if np.isfinite(target) else math.nan
        row.update({"time_to_target_s": t_s, "rounds_to_target": t_rounds, "energy_to_target_j": e_to,
                    "sim_time_s": s["sim_time_s"], "bytes_up": s["bytes_up"], "bytes_down": s["bytes_down"],
                    "energy_j": _total(e.run.rounds, "energy_j")})
        rows.append(row)
    return pd.DataFrame(rows), target


# ---------------------------------------------------------------- loading


def _trial_label(row: pd.Series, columns: list[str]) -> str:
    if len(columns) == 1:
        return str(row[columns[0]])
    return ", ".join(f"{c}={row[c]}" for c in columns)


def load_entries(paths: list[str | Path]) -> list[Entry]:
    """Run folders as they are; sweep folders expanded into their trials that ran."""
    entries: list[Entry] = []
    for p in map(Path, paths):
        if is_sweep_folder(p):
            s = sweeps.load_sweep(p)
            cols = [c for c in s.param_columns.values() if c in s.trials.columns]
            ran = s.trials[s.trials["rounds_done"] > 0] if "rounds_done" in s.trials else s.trials
            for _, row in ran.iterrows():
                label = _trial_label(row, cols) if cols else str(row["trial_id"])
                if len(paths) > 1:
                    label = f"{p.name}: {label}"
                entries.append(Entry(label, s.run(row["trial_id"])))
        elif (p / "manifest.json").is_file():
            entries.append(Entry(p.name, load_run(p)))
        else:
            raise FileNotFoundError(
                f"{p} is neither a run folder (no manifest.json) nor a sweep folder (no sweep.yaml)")
    _unique_labels(entries)
    return entries


def _unique_labels(entries: list[Entry]) -> None:
    seen: dict[str, int] = {}
    for e in entries:
        if e.label in seen:
            seen[e.label] += 1
            parent = Path(e.run.path).parent.name
            e.label = f"{parent}/{e.label}" if parent else f"{e.label} ({seen[e.label]})"
        else:
            seen[e.label] = 1


# ---------------------------------------------------------------- output


def _total(r: pd.DataFrame, col: str) -> float:
    """A run's total of ``col`` (NaN: the run has no such column, or an unknown value)."""
    return float(plots.numeric(r[col]).sum(min_count=1)) if col in r else math.nan


def _fmt_j(v) -> str:
    return "–" if v is None or not np.isfinite(v) else (f"{v / 1e3:.3g} kJ" if abs(v) >= 1e3 else f"{v:.3g} J")


def _fmt_pct(v) -> str:
    return "–" if v is None or not np.isfinite(v) else f"{100 * v:.2f}%"


def _fmt_s(v) -> str:
    return "not reached" if v is None or not np.isfinite(v) else f"{v:.2f}"


def _fmt_int(v) -> str:
    return "–" if v is None or not np.isfinite(v) else f"{int(v)}"


def formats(table: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in table.columns:
        if c.startswith(("final_", "best_")) and "loss" not in c:
            out[c] = _fmt_pct
        elif c in ("time_to_target_s",):
            out[c] = _fmt_s
        elif c == "energy_to_target_j":
            out[c] = lambda v: "not reached" if v is None or not np.isfinite(v) else _fmt_j(v)
        elif c == "energy_j":
            out[c] = _fmt_j
        elif c == "sim_time_s":
            out[c] = lambda v: f"{v:.2f}" if np.isfinite(v) else "–"
        elif c == "rounds_to_target":
            out[c] = _fmt_int
        elif c in ("bytes_up", "bytes_down"):
            out[c] = human_bytes
    return out


def text_table(table: pd.DataFrame, metric: str, target: float) -> str:
    shown = table.copy()
    for col, fn in formats(table).items():
        shown[col] = [fn(v) for v in table[col]]
    lines = [shown.to_string(index=False)]
    if np.isfinite(target):
        lines.append(f"\ntime_to_target_s / rounds_to_target / energy_to_target_j: simulated seconds / "
                     f"rounds / the fleet's joules until {metric} >= {target:g}")
    return "\n".join(lines)


def compare_page(entries: list[Entry], metric: str = "global_acc", target: float | None = None,
                 title: str = "hetsim compare"):
    table, target = compare_table(entries, metric, target)
    page = Page(title, f"{len(entries)} runs; target {metric} ≥ {target:g}" if np.isfinite(target)
                else f"{len(entries)} runs")
    page.section("Side by side")
    page.table("table-compare", table, formats(table),
               caption=(f"time_to_target_s, energy_to_target_j: simulated seconds and the fleet's "
                        f"energy until {metric} ≥ {target:g}"
                        if np.isfinite(target) else ""))
    colours = plots.colour_map([e.label for e in entries])
    styles = ["-", "--", "-.", ":"]
    page.section("Curves")
    has_metric = any(plots.has_values(e.run.rounds, metric) for e in entries)
    page.row()
    for fig_id, x, xlabel in (("fig-compare-accuracy-round", "round", "round"),
                              ("fig-compare-accuracy-time", "sim_time_s", "simulated time (s)")):
        if not has_metric:
            page.omit(fig_id, f"{fig_id}: no run has values of {metric}")
            continue
        fig, (ax,) = plots.figure(width=6.6, height=4.0)
        for i, e in enumerate(entries):
            r = e.run.rounds
            if not plots.has_values(r, metric):
                continue
            ev = r[[x]].assign(v=plots.numeric(r[metric])).dropna(subset=["v"])
            # identical curves (a what-if without deadline) stay visible: line styles alternate
            ax.plot(ev[x], ev["v"], styles[i % len(styles)], color=colours[e.label], label=e.label,
                    linewidth=1.6)
        if np.isfinite(target):
            ax.axhline(target, color="#888", linewidth=0.8, linestyle=":", label=f"target {target:g}")
        if x == "round":
            plots.round_ticks(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric)
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(f"{metric} against {xlabel}", loc="left", fontsize=11)
        page.figure(fig_id, fig)
    page.row(False)
    page.row()
    fig, (ax,) = plots.figure(width=6.6, height=3.6)
    for i, e in enumerate(entries):
        r = e.run.rounds
        if len(r):
            ax.plot(r["round"], r["sim_round_s"], styles[i % len(styles)], color=colours[e.label],
                    label=e.label, marker=plots.marker_for(len(r)), markersize=3)
    plots.round_ticks(ax)
    ax.set_ylabel("simulated s")
    ax.legend(fontsize=8)
    ax.set_title("Simulated time per round", loc="left", fontsize=11)
    page.figure("fig-compare-round-time", fig)
    fig, (ax,) = plots.figure(width=6.6, height=3.6)
    for i, e in enumerate(entries):
        r = e.run.rounds
        if len(r):
            ax.plot(r["sim_time_s"], r["bytes_up"].cumsum() / 1e6, styles[i % len(styles)],
                    color=colours[e.label], label=e.label)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("cumulative MB uploaded")
    ax.legend(fontsize=8)
    ax.set_title("Upload against simulated time", loc="left", fontsize=11)
    page.figure("fig-compare-bytes", fig)
    page.row(False)
    return page, table, target
