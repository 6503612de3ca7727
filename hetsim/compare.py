"""``hetsim compare PATH PATH ...``: runs side by side (a table and overlaid curves).

A PATH is a run folder, or a sweep folder (every trial that ran becomes one entry, labelled by
its hyperparameter values, e.g. the fleet of a what-if). The table has, per run: final and best
global / personalized accuracy, the simulated time (and rounds) to reach a target accuracy,
bytes up/down and the total simulated time. Text in the terminal; HTML with ``-o``, which also shows
what differs: the config keys that differ and each run's fleet side by side.

Over 400 lines: the table, the rules of its default target, the config diff and the page are one
command's output, read together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

import sweeps
from engine import UserError
from engine.results import load_run
from engine.results.manifest import method_cell
from engine.results.text import TERMINAL_WIDTH, fold_table, wrap
from hetsim import plots
from hetsim.common import human_bytes, is_sweep_folder
from hetsim.page import Page
from hetsim.report_energy import energy_to_target
from hetsim.report_participation import participation_summary, run_warnings
from hetsim.summary import NA, why_no_accuracy, why_no_energy

COMPARE_FIGURES = (
    "table-compare",
    "table-config-diff",
    "table-fleets",
    "fig-compare-accuracy-round",
    "fig-compare-accuracy-time",
    "fig-compare-round-time",
    "fig-compare-bytes",
    "fig-compare-participation",
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


def starting_value(r: pd.DataFrame, col: str) -> float:
    """The first evaluated (non-NaN) value of a rounds column: where the run started from."""
    s = _series(r, col).dropna()
    return float(s.iloc[0]) if len(s) else math.nan


def default_target(entries: list[Entry], metric: str) -> float:
    """The highest level every run reaches, among the runs that rose above every run's starting value:
    the lowest of their best values, floored to 0.01 (but kept above the starts). NaN when no run rose
    above the starts: a target there would be "reached" in the first round and compare nothing."""
    starts = [v for v in (starting_value(e.run.rounds, metric) for e in entries) if np.isfinite(v)]
    bests = [v for v in (best_value(e.run.rounds, metric) for e in entries) if np.isfinite(v)]
    floor = max(starts, default=-math.inf)
    above = [b for b in bests if b > floor]
    if not above:
        return math.nan
    target = math.floor(min(above) * 100 + 1e-9) / 100
    return target if target > floor else min(above)


def target_notes(entries: list[Entry], table: pd.DataFrame, metric: str, target: float,
                 given: bool) -> list[str]:
    """Plain sentences under the table: which runs did not reach the target, and a target that
    compares nothing (none could be chosen, or a given one at or below a run's starting value)."""
    starts = {e.label: starting_value(e.run.rounds, metric) for e in entries}
    if not np.isfinite(target):
        known = [v for v in starts.values() if np.isfinite(v)]
        if not known:
            return [f"no run has values of {metric}: time to target is not computed"]
        return [f"no target: no run's {metric} rose above the highest starting value "
                f"({_fmt_value(max(known), metric)}), so time to target is not computed; give --target"]
    notes = []
    if given:
        low = [lab for lab, v in starts.items() if np.isfinite(v) and v >= target]
        if low:
            notes.append(f"target {target:g} is at or below the starting {metric} of {', '.join(low)}: "
                         "reaching it in the first round says nothing")
    best_col = f"best_{metric}"
    for _, row in table[table["time_to_target_s"].isna()].iterrows():
        best = row.get(best_col, math.nan)
        why = (f"{metric} best {_fmt_value(best, metric)} < target {_fmt_value(target, metric)}"
               if np.isfinite(best) else f"no {metric} values")
        notes.append(f"{row['run']}: not reached ({why})")
    return notes


def _fmt_value(v: float, metric: str) -> str:
    return _fmt_pct(v) if "acc" in metric else f"{v:.4g}"


def compare_table(entries: list[Entry], metric: str = "global_acc",
                  target: float | None = None) -> tuple[pd.DataFrame, float]:
    """One row per run; returns the table and the target used (``target`` or the default)."""
    check_metric(entries, metric)
    given = target is not None
    if target is None:
        target = default_target(entries, metric)
    rows = []
    trained = not all(_timing_only(e.run) for e in entries)  # timing-only runs have no accuracy to show
    for e in entries:
        s = run_summary(e.run)
        t_s, t_rounds = time_to_target(e.run.rounds, metric, target) if np.isfinite(target) else (math.nan, math.nan)
        row = {"run": e.label, "status": s["status"], "rounds": s["rounds"]}
        if trained:
            row.update({"final_global_acc": s["final_global_acc"], "best_global_acc": s["best_global_acc"],
                        "final_pers_acc": s["final_pers_acc"], "best_pers_acc": s["best_pers_acc"]})
        if metric not in ("global_acc", "pers_acc"):
            row[f"final_{metric}"] = final_value(e.run.rounds, metric)
            row[f"best_{metric}"] = best_value(e.run.rounds, metric)
        energy_known = why_no_energy(e.run.rounds) is None  # the run summary's rule: no partial sums
        e_to = energy_to_target(e.run.rounds, metric, target) if np.isfinite(target) and energy_known else math.nan
        row.update({"time_to_target_s": t_s, "rounds_to_target": t_rounds, "energy_to_target_j": e_to,
                    "sim_time_s": s["sim_time_s"], "bytes_up": s["bytes_up"], "bytes_down": s["bytes_down"],
                    "energy_j": _total(e.run.rounds, "energy_j") if energy_known else math.nan})
        f = participation_summary(e.run).fairness
        row.update({"aggregated_once": f["share_aggregated_once"], "gini_aggregations": f["gini_aggregations"]})
        rows.append(row)
    table = pd.DataFrame(rows)
    # kept with the table (copies keep attrs): the text table and the page print them
    table.attrs["notes"] = target_notes(entries, table, metric, target, given)
    table.attrs["missing"] = missing_reasons(entries, table)
    return table, target


def _timing_only(run) -> bool:
    return ((run.config or {}).get("clock") or {}).get("mode") == "timing_only"


NOT_REACHED = ("time_to_target_s", "rounds_to_target")  # "not reached": target_notes say why


def missing_reasons(entries: list[Entry], table: pd.DataFrame) -> dict[tuple[int, str], str]:
    """Why each empty cell of the table is empty, as the run summaries say it: (row, column) ->
    reason. A target not reached is not here (its cells say so and :func:`target_notes` why)."""
    out: dict[tuple[int, str], str] = {}
    for i, e in enumerate(entries):
        r, cfg = e.run.rounds, e.run.config or {}
        for col in table.columns:
            v = table.at[i, col]
            if col in NOT_REACHED or not isinstance(v, (float, np.floating)) or np.isfinite(v):
                continue
            if col == "energy_to_target_j" and not np.isfinite(table.at[i, "time_to_target_s"]):
                continue  # not reached
            out[(i, col)] = _why_missing(col, r, cfg)
    return out


def _why_missing(col: str, r: pd.DataFrame, cfg: dict) -> str:
    if col in ("energy_j", "energy_to_target_j"):
        return why_no_energy(r) or "no energy recorded"
    if col in ("aggregated_once", "gini_aggregations"):
        return "no client rows: no client was selected"
    if col == "sim_time_s":
        return "no round finished"
    values = col.removeprefix("final_").removeprefix("best_")
    if values == "global_acc" or values.startswith("pers_"):
        return why_no_accuracy(r, cfg, values)
    return f"rounds.parquet has no {values} column" if values not in r else f"no round recorded {values}"


def check_metric(entries: list[Entry], metric: str) -> None:
    """Refuse a metric that no run has (the table would be all dashes)."""
    if not any(metric in e.run.rounds.columns for e in entries):
        columns = sorted({c for e in entries for c in e.run.rounds.columns
                          if c != "round" and pd.api.types.is_numeric_dtype(e.run.rounds[c])})
        raise UserError(f"compare: --metric {metric!r} is not a column of rounds.parquet in any of the "
                        f"runs; give one of: {', '.join(columns)}")


def check_target(metric: str, target: float | None) -> None:
    """Refuse a ``--target`` the metric cannot take (the command line's check: from Python, a
    target above 1 is a way to ask for "never reached")."""
    if target is None:
        return
    accuracy = "acc" in metric  # global_acc, pers_acc, pers_acc_worst, ...: fractions
    if not math.isfinite(target) or (accuracy and not 0 <= target <= 1):
        allowed = (f"an accuracy in [0, 1] (0.8 = 80%), as {metric} is" if accuracy
                   else f"a finite number in the units of {metric}")
        raise UserError(f"compare: --target {target:g} is outside the allowed range: give {allowed}")


# ---------------------------------------------------------------- loading


def _trial_label(row: pd.Series, columns: list[str]) -> str:
    if len(columns) == 1:
        return str(row[columns[0]])
    return ", ".join(f"{c}={row[c]}" for c in columns)


def with_mode(label: str, run) -> str:
    """``label`` of an asynchronous run with its mode: ``fast (fedbuff, async)``; ``(async)`` alone
    where the label starts with the mode already (a run folder's default name, ``fedbuff-mnist5k-...``)."""
    method = method_cell(run.config or {})
    if not method.endswith(", async"):
        return label
    named = label.rsplit(": ", 1)[-1].startswith(method.removesuffix(", async"))
    return f"{label} (async)" if named else f"{label} ({method})"


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
                run = s.run(row["trial_id"])
                entries.append(Entry(with_mode(label, run), run))
        elif (p / "manifest.json").is_file():
            run = load_run(p)
            entries.append(Entry(with_mode(p.name, run), run))
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


# ---------------------------------------------------------------- what differs


def flatten(cfg: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys -> YAML flow text (lists and scalars are leaves)."""
    if isinstance(cfg, dict) and cfg:
        out: dict[str, str] = {}
        for k, v in cfg.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: yaml.safe_dump(cfg, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()}


def config_diff(entries: list[Entry]) -> pd.DataFrame:
    """Only the config keys whose values differ between the runs: one row per key, a column per run
    ("" where a run lacks the key)."""
    flat = pd.DataFrame({e.label: pd.Series(flatten(e.run.config or {}), dtype=object) for e in entries})
    flat = flat.fillna("")
    differs = flat.nunique(axis=1) > 1
    out = flat[differs].sort_index()
    return out.rename_axis("key").reset_index()


def fleet_text(run) -> str:
    """A run's fleet: its clients.profiles (YAML) and what was drawn: clients per device and network
    tier, median GFLOP/s and Mbit/s."""
    profiles = ((run.config or {}).get("clients") or {}).get("profiles") or {}
    profiles = {k: v for k, v in profiles.items() if v is not None and v != {}}  # the resolved defaults: noise
    text = yaml.safe_dump(profiles, sort_keys=False, default_flow_style=None, width=60).strip()
    p = run.profiles
    if p is None or p.empty:
        return text
    drawn = ["", f"# drawn: {len(p)} clients"]
    for col, what in (("tier", "device"), ("net_tier", "network")):
        if col in p:
            counts = p[col].astype(str).value_counts().sort_index()
            drawn.append(f"#   {what}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    med = [f"{what} {p[col].median():g}" for col, what in (("gflops", "GFLOP/s"), ("down_mbps", "down Mbit/s"),
                                                            ("up_mbps", "up Mbit/s")) if col in p]
    if med:
        drawn.append("#   median: " + ", ".join(med))
    return text + "\n".join(drawn)


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
        if c.startswith(("final_", "best_")) and "acc" in c:
            out[c] = _fmt_pct
        elif c.startswith(("final_", "best_")):  # another metric (compare --metric): in its own units
            out[c] = lambda v: "–" if v is None or not np.isfinite(v) else f"{v:.4g}"
        elif c in ("time_to_target_s",):
            out[c] = _fmt_s
        elif c == "energy_to_target_j":
            out[c] = lambda v: "not reached" if v is None or not np.isfinite(v) else _fmt_j(v)
        elif c == "energy_j":
            out[c] = _fmt_j
        elif c == "sim_time_s":
            out[c] = lambda v: f"{v:.2f}" if np.isfinite(v) else "–"
        elif c == "rounds_to_target":
            out[c] = lambda v: "not reached" if v is None or not np.isfinite(v) else _fmt_int(v)
        elif c == "aggregated_once":
            out[c] = _fmt_pct
        elif c == "gini_aggregations":
            out[c] = lambda v: "–" if v is None or not np.isfinite(v) else f"{v:.3f}"
        elif c in ("bytes_up", "bytes_down"):
            out[c] = human_bytes
    return out


def shown_table(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The table as its cells read (every value formatted) and its footnotes: an empty cell reads
    ``n/a [k]``, footnote k saying why (one footnote per reason)."""
    shown = table.copy().astype(object)
    for col, fn in formats(table).items():
        shown[col] = [fn(v) for v in table[col]]
    reasons = table.attrs.get("missing", {})
    numbers = {why: k for k, why in enumerate(dict.fromkeys(reasons.values()), start=1)}
    for (i, col), why in reasons.items():
        shown.at[i, col] = f"{NA} [{numbers[why]}]"
    return shown, [f"[{k}] {NA}: {why}" for why, k in numbers.items()]


def text_table(table: pd.DataFrame, metric: str, target: float, width: int | None = TERMINAL_WIDTH) -> str:
    """The compare table as text: columns folded into blocks at most ``width`` characters wide,
    each repeating the run's name (None: one block, ``--wide``), and the notes wrapped."""
    shown, footnotes = shown_table(table)
    lines = [*footnotes]
    if np.isfinite(target):
        lines.append(f"time_to_target_s / rounds_to_target / energy_to_target_j: simulated seconds / "
                     f"rounds / the fleet's joules until {metric} >= {target:g}")
    lines.append("aggregated_once / gini_aggregations: share of the fleet aggregated at least once / Gini of "
                 "the clients' aggregation counts (0 = equal)")
    lines.extend(table.attrs.get("notes", []))
    return "\n".join([fold_table(shown, width), "", *(wrap(line, width) for line in lines)])


def compare_page(entries: list[Entry], metric: str = "global_acc", target: float | None = None,
                 title: str = "hetsim compare"):
    table, target = compare_table(entries, metric, target)
    page = Page(title, f"{len(entries)} runs; target {metric} ≥ {target:g}" if np.isfinite(target)
                else f"{len(entries)} runs")
    summaries = {e.label: participation_summary(e.run) for e in entries}
    page.warnings([f"{e.label}: {w}" for e in entries for w in run_warnings(e.run, summaries[e.label])])
    page.section("Side by side")
    shown, footnotes = shown_table(table)
    page.table("table-compare", shown, text_columns={"run", "status"},
               caption=(f"time_to_target_s, energy_to_target_j: simulated seconds and the fleet's "
                        f"energy until {metric} ≥ {target:g}"
                        if np.isfinite(target) else ""))
    for note in [*footnotes, *table.attrs.get("notes", [])]:
        page.text(note)
    page.section("What differs")
    diff = config_diff(entries)
    if diff.empty:
        page.omit("table-config-diff", "table-config-diff: every run has the same config")
    else:
        page.table("table-config-diff", diff, caption="config.yaml keys whose values differ between the runs")
    page.side_by_side("table-fleets", {e.label: fleet_text(e.run) for e in entries},
                      caption="each run's fleet: clients.profiles as configured, then as drawn (profiles.parquet)")
    colours = plots.colour_map([e.label for e in entries])
    styles = ["-", "--", "-.", ":"]
    page.section("Curves")
    has_metric = any(plots.has_values(e.run.rounds, metric) for e in entries)
    # an asynchronous run's rows are server steps: the round axis says so when one is there
    steps = any((e.run.config or {}).get("asynchronous") for e in entries)
    round_label = "round (asynchronous: server step)" if steps else "round"
    page.row()
    for fig_id, x, xlabel in (("fig-compare-accuracy-round", "round", round_label),
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
        if plots.is_accuracy(metric):
            plots.min_span(ax)
        plots.fig_legend(fig, ax, ncols=2)  # below: two such figures stand side by side
        ax.set_title(f"{metric} against {xlabel.split(' (')[0]}", loc="left", fontsize=11)
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
    ax.set_xlabel(round_label)
    ax.set_ylabel("simulated s")
    plots.fig_legend(fig, ax, ncols=2)
    ax.set_title("Simulated time per round" + (" or server step" if steps else ""), loc="left", fontsize=11)
    page.figure("fig-compare-round-time", fig)
    fig, (ax,) = plots.figure(width=6.6, height=3.6)
    for i, e in enumerate(entries):
        r = e.run.rounds
        if len(r):
            ax.plot(r["sim_time_s"], r["bytes_up"].cumsum() / 1e6, styles[i % len(styles)],
                    color=colours[e.label], label=e.label)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("cumulative MB uploaded")
    plots.fig_legend(fig, ax, ncols=2)
    ax.set_title("Upload against simulated time", loc="left", fontsize=11)
    page.figure("fig-compare-bytes", fig)
    page.row(False)
    page.guarded(("fig-compare-participation",), participation_by_tier, entries, summaries)
    return page, table, target


def participation_by_tier(page: Page, entries: list[Entry], summaries: dict) -> None:
    """Per device and network tier, the share of its selections aggregated, a bar per run: who a
    fleet leaves out."""
    groupings = [g for g in ("device tier", "network tier") if any(g in p.shares for p in summaries.values())]
    if not groupings:
        page.omit("fig-compare-participation", "fig-compare-participation: no run has client rows")
        return
    colours = plots.colour_map([e.label for e in entries])
    fig, axes = plots.figure(ncols=len(groupings), height=3.6)
    width = 0.8 / len(entries)
    for ax, what in zip(axes, groupings):
        tiers = list(dict.fromkeys(t for p in summaries.values() if what in p.shares for t in p.shares[what].index))
        y = np.arange(len(tiers))[::-1]  # the slowest on top
        for i, e in enumerate(entries):
            share = summaries[e.label].shares.get(what)
            if share is None:
                continue
            # a tier none of whose selections was aggregated has no column: 0, marked (a bar of 0 is invisible)
            v = (share["aggregated"] if "aggregated" in share else share["clients"] * 0.0).reindex(tiers)
            at = y + 0.4 - (i + 0.5) * width
            ax.barh(at, v.fillna(0).to_numpy(dtype=float), width, color=colours[e.label], label=e.label)
            for where in at[(v == 0).to_numpy()]:  # a few tiers per run
                ax.text(0.01, where, "0 (none aggregated)", va="center", fontsize=7, color=colours[e.label],
                        fontweight="bold")
        ax.set_yticks(y, tiers)
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of the tier's selections aggregated")
        ax.set_title(f"Aggregated by {what}", loc="left", fontsize=11)
    plots.fig_legend(fig, axes[0])
    page.figure("fig-compare-participation", fig, "0: none of the tier's selections was aggregated; "
                "no bar: the run has no client of that tier")
