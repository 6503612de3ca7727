"""The run report's "Energy" section (docs/energy.md): accuracy against the fleet's cumulative
energy, energy per device and network tier by phase, and battery levels over virtual time; and
:func:`energy_to_target`, which ``hetsim compare`` uses.

Drawn for runs whose tables have the energy columns (runs written before the ledger have none).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from hetsim import plots
from hetsim.page import Page
from hetsim.report_conditions import round_times

ENERGY_FIGURES = ("fig-energy-accuracy", "fig-energy-tiers", "fig-energy-battery")
# (column, label, colour) of a ledger's four phases, as the time figures colour them
ENERGY_PHASES = (
    ("energy_download_j", "download", "#4C72B0"),
    ("energy_train_j", "train", "#DD8452"),
    ("energy_compress_j", "compress", "#55A868"),
    ("energy_upload_j", "upload", "#C44E52"),
)
MAX_BATTERY_CLIENTS = 12


def has_energy(run) -> bool:
    return plots.has_values(run.rounds, "energy_j")


def cumulative_energy(rounds: pd.DataFrame) -> pd.Series:
    """The fleet's energy up to the end of each round, J (NaN from the first unknown round on)."""
    return plots.numeric(rounds["energy_j"]).cumsum(skipna=False)


def energy_to_target(rounds: pd.DataFrame, metric: str, target: float) -> float:
    """Cumulative fleet energy (J) at the first round whose ``metric`` reaches ``target``; NaN
    when it never does or the run has no energy columns."""
    if "energy_j" not in rounds or metric not in rounds:
        return float("nan")
    reached = plots.numeric(rounds[metric]) >= target
    if not reached.any():
        return float("nan")
    return float(cumulative_energy(rounds)[reached.to_numpy()].iloc[0])


def energy_summary(run) -> list[tuple[str, str]]:
    """Key figures of the run's ledger for the report's table."""
    r, c = run.rounds, run.clients
    total = float(plots.numeric(r["energy_j"]).sum(min_count=1))
    wasted = float(plots.numeric(r["energy_wasted_j"]).sum(min_count=1)) if "energy_wasted_j" in r else np.nan
    out = [("fleet energy, whole run", _joules(total)),
           ("spent on updates that were not aggregated", f"{_joules(wasted)} ({_share(wasted, total)})")]
    ran = c[plots.numeric(c["energy_j"]).notna()] if "energy_j" in c else c.iloc[:0]
    if len(ran):
        per_client = ran.groupby("client_id")["energy_j"].sum()
        out.append(("per client that ran: median / max", f"{_joules(per_client.median())} / "
                    f"{_joules(per_client.max())} (client {int(per_client.idxmax())})"))
    if "num_battery" in r:
        out.append(("selected but out of battery (client-rounds)", str(int(r["num_battery"].sum()))))
    return out


def _joules(j: float) -> str:
    if j is None or not np.isfinite(j):
        return "–"
    for unit, scale in (("MJ", 1e6), ("kJ", 1e3), ("J", 1.0)):
        if abs(j) >= scale:
            return f"{j / scale:.3g} {unit}"
    return f"{j:.3g} J"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if np.isfinite(part) and np.isfinite(whole) and whole > 0 else "–"


def energy_section(page: Page, run, accuracy: bool = True) -> None:
    """``accuracy``: with the accuracy against energy (a timing-only run has none)."""
    page.key_values("table-energy-summary", energy_summary(run))
    if accuracy:
        page.guarded(("fig-energy-accuracy",), accuracy_figure, run)
    page.guarded(("fig-energy-tiers",), tiers_figure, run)
    if "battery_level" in run.clients.columns:
        page.guarded(("fig-energy-battery",), battery_figure, run)


def accuracy_figure(page: Page, run) -> None:
    r = run.rounds
    metrics = [(m, label, colour) for m, label, colour in (("global_acc", "global model", "#4C72B0"),
                                                            ("pers_acc", "personalized (mean)", "#DD8452"))
               if plots.has_values(r, m)]
    if not metrics:
        page.omit("fig-energy-accuracy", "fig-energy-accuracy: no evaluated round")
        return
    cum = cumulative_energy(r)
    scale, unit = (1e3, "kJ") if cum.max() >= 1e3 else (1.0, "J")
    fig, (ax,) = plots.figure(width=7.5, height=3.8)
    for col, label, colour in metrics:
        ev = pd.DataFrame({"x": cum / scale, "v": plots.numeric(r[col])}).dropna()
        ax.plot(ev["x"], ev["v"], "-", color=colour, label=label, marker=plots.marker_for(len(ev)), markersize=3.5)
    ax.set_xlabel(f"cumulative fleet energy ({unit})")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.02)
    plots.legend_outside(ax)
    ax.set_title("Accuracy against the energy the fleet spent", loc="left", fontsize=11)
    page.figure("fig-energy-accuracy", fig, "x: the sum of every client's ledger (download, train, compress, "
                "upload, radio tails) up to the end of each round, wasted work included")


def tiers_figure(page: Page, run) -> None:
    c = run.clients
    ran = c[plots.numeric(c["energy_j"]).notna()] if "energy_j" in c else c.iloc[:0]
    if ran.empty:
        page.omit("fig-energy-tiers", "fig-energy-tiers: no client's energy is known")
        return
    fig, axes = plots.figure(ncols=2, width=11.0, height=3.4)
    for ax, (groups, order), what in ((axes[0], plots.device_groups(ran, run.profiles), "device tier"),
                                      (axes[1], plots.network_groups(ran, run.profiles), "network tier")):
        sums = ran.assign(_g=groups.values).groupby("_g")[[p[0] for p in ENERGY_PHASES]].sum().reindex(order)
        left = np.zeros(len(order))
        y = np.arange(len(order))
        for col, label, colour in ENERGY_PHASES:
            v = sums[col].fillna(0).to_numpy()
            ax.barh(y, v, left=left, color=colour, label=label, height=0.6)
            left += v
        ax.set_yticks(y, [str(g) for g in order])
        ax.invert_yaxis()
        ax.set_xlabel("energy over the run (J)")
        n = ran.assign(_g=groups.values).groupby("_g")["client_id"].nunique().reindex(order)
        for yi, (total, k) in enumerate(zip(left, n.fillna(0).astype(int))):
            ax.text(total, yi, f"  {_joules(total)}, {k} clients", va="center", fontsize=8)
        ax.set_title(f"by {what}", loc="left", fontsize=10)
    plots.fig_legend(fig, axes[0])
    fig.suptitle("Who pays: energy over the run by tier and phase", x=0.01, ha="left", fontsize=11)
    page.figure("fig-energy-tiers", fig, "bars: the sum of the ledgers of the tier's clients over every "
                "round they ran, split into download (with its radio tail), train, compress and upload")


def battery_figure(page: Page, run) -> None:
    c = run.clients
    times = round_times(run)
    fig, (ax,) = plots.figure(width=11.0, height=3.6)
    lv = c[plots.numeric(c["battery_level"]).notna()] if "battery_level" in c else c.iloc[:0]
    if lv.empty:
        page.omit("fig-energy-battery", "fig-energy-battery: no battery-powered client was selected")
        return
    # a few clients, the ones that ran lowest first: their level at each round they were selected
    lowest = lv.groupby("client_id")["battery_level_end"].min().sort_values().index[:MAX_BATTERY_CLIENTS]
    for i, cid in enumerate(lowest):
        rows = lv[lv["client_id"] == cid].sort_values("round")
        x = np.concatenate([times.loc[rows["round"], "start_s"], times.loc[rows["round"], "end_s"]])
        y = np.concatenate([rows["battery_level"], rows["battery_level_end"]])
        order = np.argsort(x, kind="stable")
        ax.plot(x[order], y[order], "-", color=plots.PALETTE[i % len(plots.PALETTE)], linewidth=0.9, alpha=0.8,
                label=f"client {int(cid)}" if i < 6 else None)
    r = run.rounds.set_index("round")
    if "battery_mean" in r:
        ends = times["end_s"].reindex(r.index)
        ax.plot(ends, r["battery_mean"], "-", color="black", linewidth=2, label="fleet mean (end of round)")
        ax.plot(ends, r["battery_min"], "--", color="black", linewidth=1, label="fleet minimum")
    threshold = ((run.config or {}).get("clients", {}).get("profiles", {}).get("battery") or {}).get("threshold")
    if threshold is not None:
        ax.axhline(float(threshold), color="#C44E52", linestyle=":", linewidth=1.2, label="participation threshold")
    lo, hi = float(times["start_s"].min()), float(times["end_s"].max())
    plots.time_axis(ax, lo, hi if hi > lo else lo + 1.0)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("battery level (of capacity)")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    ax.set_title("Battery levels over virtual time", loc="left", fontsize=11)
    page.figure("fig-energy-battery", fig, f"thin lines: the {len(lowest)} battery-powered clients that ran "
                "lowest, at the start and end of each round they were selected; thick: the fleet's mean "
                "and minimum at each round's end")
