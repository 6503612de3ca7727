"""``hetsim report PATH``: one self-contained HTML page for a run folder or a sweep folder.

The page embeds every figure (base64 PNG, no external URL) and the PNGs are also written beside
it, in ``<page stem>_figures/<figure id>.png``. Figure ids are stable (:data:`RUN_FIGURES`,
:data:`ASCEND_FIGURES`, :data:`FEDCSPACK_FIGURES`, :data:`CONDITIONS_FIGURES`, :data:`SWEEP_FIGURES`); a
panel whose data is missing is replaced by a note. See docs/reports.md.

This module holds the run report and the figures every run has; the participation and fairness
section and the banner's warnings are in :mod:`hetsim.report_participation`, the method-specific
figures (ASCEND, FedCSPACK) in :mod:`hetsim.report_methods`, the conditions over virtual time in
:mod:`hetsim.report_conditions`, the energy section in :mod:`hetsim.report_energy`, the sweep report
in :mod:`hetsim.report_sweep`, the what-if section of a ``clock.mode: timing_only`` run (which has no
accuracy) in :mod:`hetsim.report_timing`. All figure ids are importable from here.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from engine.results import load_run
from hetsim import plots
from hetsim.common import human_bytes, is_sweep_folder
from hetsim.page import Page
from hetsim.report_async import ASYNC_FIGURES as ASYNC_FIGURES
from hetsim.report_async import async_section, has_async
from hetsim.report_conditions import CONDITIONS_FIGURES as CONDITIONS_FIGURES
from hetsim.report_conditions import availability_figure, drops_figure, has_conditions, links_figure
from hetsim.report_energy import ENERGY_FIGURES as ENERGY_FIGURES
from hetsim.report_energy import energy_section, has_energy
from hetsim.report_methods import ASCEND_FIGURES, FEDCSPACK_FIGURES, ascend_figures, fedcspack_figures
from hetsim.report_participation import PARTICIPATION_FIGURES as PARTICIPATION_FIGURES
from hetsim.report_participation import participation_section, participation_summary, run_warnings
from hetsim.report_sweep import SWEEP_FIGURES as SWEEP_FIGURES
from hetsim.report_sweep import sweep_page
from hetsim.report_sweep import sweep_param_figure_id as sweep_param_figure_id
from hetsim.report_timing import TIMING_FIGURES as TIMING_FIGURES
from hetsim.report_timing import is_timing_only, whatif_section
from hetsim.summary import method_text, summary_rows

RUN_FIGURES = (
    "fig-accuracy-round",
    "fig-accuracy-time",
    "fig-time-device-tier",
    "fig-time-network-tier",
    "fig-bytes",
    "fig-bytes-time",
    "fig-participation",
    *(fig_id for fig_id in PARTICIPATION_FIGURES if fig_id.startswith("fig-")),  # every run has them too
)
REPORT_FILE = "report.html"


def build_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of a run or sweep folder; returns the HTML file's path.

    ``out`` defaults to ``<path>/report.html``; the figures go to ``<out stem>_figures/``.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a folder (give a run folder or a sweep folder)")
    out = Path(out) if out is not None else path / REPORT_FILE
    if is_sweep_folder(path):
        page = sweep_page(path)
    elif (path / "manifest.json").is_file():
        page = run_page(path)
    else:
        raise FileNotFoundError(
            f"{path} is neither a run folder (no manifest.json) nor a sweep folder (no sweep.yaml)")
    return page.write(out)


# ====================================================================== run report


def run_page(path: Path) -> Page:
    run = load_run(path)
    cfg = run.config or {}
    algo = (cfg.get("algorithm") or {}).get("name") or run.manifest.get("algorithm", "?")
    dataset = (cfg.get("dataset") or {}).get("name") or run.manifest.get("dataset", "?")
    timing_only = is_timing_only(run)
    page = Page(f"hetsim {'what-if (timing only)' if timing_only else 'run'}: {path.name}{_trial_params(path)}",
                f"{method_text(cfg, run.manifest)} on {dataset}, {run.manifest.get('num_clients', '?')} clients, "
                f"status {run.manifest.get('status', '?')}")
    participation = participation_summary(run)
    page.warnings(run_warnings(run, participation))
    page.key_values("table-run-summary", summary_items(path, run))
    if run.rounds.empty:
        page.text("This run has no finished rounds yet: nothing to plot.")
        for fig_id in RUN_FIGURES:
            page.omit(fig_id, f"{fig_id}: no rounds in rounds.parquet")
        return page

    if timing_only:  # nothing trained: the fleet's questions first, no accuracy
        whatif_section(page, run)
    else:
        page.section("Accuracy")
        page.guarded(("fig-accuracy-round", "fig-accuracy-time"), accuracy_figures, run)
    page.section("Where the simulated time goes")
    page.guarded(("fig-time-device-tier", "fig-time-network-tier"), time_figures, run)
    page.section("Traffic and participation")
    page.guarded(("fig-bytes", "fig-bytes-time"), bytes_figure, run)
    page.guarded(("fig-participation",), participation_figure, run)
    participation_section(page, run, participation, accuracy=not timing_only)
    if "arm" in run.clients.columns or algo == "ascend":
        page.section("ASCEND: compressor choice")
        page.guarded(ASCEND_FIGURES, ascend_figures, run)
    if "packs_shared" in run.clients.columns or algo == "fedcspack":
        page.section("FedCSPACK: shared packs")
        page.guarded(FEDCSPACK_FIGURES, fedcspack_figures, run)
    if has_conditions(run):
        page.section("Conditions over virtual time")
        page.guarded(("fig-conditions-links",), links_figure, run)
        page.guarded(("fig-conditions-availability",), availability_figure, run)
        page.guarded(("fig-conditions-drops",), drops_figure, run)
    if has_async(run):
        page.section("Asynchronous rounds")
        async_section(page, run)
    if has_energy(run):
        page.section("Energy")
        energy_section(page, run, accuracy=not timing_only)
    page.preformatted("resolved config (config.yaml)", yaml.safe_dump(cfg, sort_keys=False))
    return page


def summary_items(path: Path, run) -> list[tuple[str, str]]:
    """The report's first table: the folder, status and seed, then the lines `hetsim show` prints."""
    cfg = run.config or {}
    return [
        ("run folder", str(path)),
        ("status", str(run.manifest.get("status", "?"))),
        ("seed", str(cfg.get("seed", run.manifest.get("seed", "?")))),
        *(summary_rows(run) if len(run.rounds) else []),
    ]


def _trial_params(path: Path) -> str:
    """`` (fleet slow)`` / `` (lr=0.01)`` for a sweep's or what-if's trial folder (its trial.json), else ""."""
    try:
        params = json.loads((path / "trial.json").read_text()).get("params") or {}
    except (OSError, ValueError, AttributeError):
        return ""
    # a what-if's one dimension is clients.profiles, named by its fleet
    text = ", ".join(f"fleet {v}" if k == "clients.profiles" else f"{k}={v}" for k, v in params.items())
    return f" ({text})" if text else ""


# ---------------------------------------------------------------- accuracy

ACCURACY_LINES = (
    ("global_acc", "global model", "#4C72B0", "-"),
    ("pers_acc", "personalized (mean)", "#DD8452", "-"),
    ("pers_acc_worst", "personalized (worst client)", "#C44E52", "--"),
)


def accuracy_figures(page: Page, run) -> None:
    r = run.rounds
    metrics = [m for m, *_ in ACCURACY_LINES if plots.has_values(r, m)]
    arch_cols = sorted(c for c in r.columns if c.startswith("global_acc_") and plots.has_values(r, c))
    if not metrics and not arch_cols:
        for fig_id in ("fig-accuracy-round", "fig-accuracy-time"):
            page.omit(fig_id, f"{fig_id}: no evaluated round (global_acc and pers_acc are empty)")
        return
    evaluated = r[metrics + arch_cols].apply(plots.numeric).notna().any(axis=1)
    step = plots.step_word(run)
    page.row()
    for fig_id, x, xlabel in (("fig-accuracy-round", "round", step),
                              ("fig-accuracy-time", "sim_time_s", "simulated time (s)")):
        fig, (ax,) = plots.figure(width=6.6, height=4.0)
        for col, label, colour, style in ACCURACY_LINES:
            if col not in metrics:
                continue
            # evaluated rounds only; a metric missing in one of them is a gap, not a line across it
            ev = r.loc[evaluated, [x]].assign(v=plots.numeric(r.loc[evaluated, col]))
            ax.plot(ev[x], ev["v"], style, color=colour, label=label,
                    marker=plots.marker_for(len(ev)), markersize=3.5)
            if col == "pers_acc" and plots.has_values(r, "pers_acc_std"):
                std = plots.numeric(r.loc[ev.index, "pers_acc_std"])
                ax.fill_between(ev[x], (ev["v"] - std).clip(0, 1), (ev["v"] + std).clip(0, 1), color=colour, alpha=0.15,
                                linewidth=0, label="personalized ± 1 std")
        for i, col in enumerate(arch_cols):
            ev = r.loc[evaluated, [x]].assign(v=plots.numeric(r.loc[evaluated, col]))
            ax.plot(ev[x], ev["v"], ":", color=plots.PALETTE[(i + 4) % len(plots.PALETTE)],
                    label=f"global: {col[len('global_acc_'):]}")
        if x == "round":
            plots.round_ticks(ax, step)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1.02)
        plots.fig_legend(fig, ax, ncols=2)  # below: two such figures stand side by side
        title = f"Accuracy per {step}" if x == "round" else "Accuracy against simulated time"
        ax.set_title(title, loc="left", fontsize=11)
        page.figure(fig_id, fig, "global: held-out global test set; personalized: each client's own "
                    "model on its local test split, mean and worst over the clients that ran"
                    if x == "round" else "x: cumulative simulated seconds at the end of each round")
    page.row(False)


# ---------------------------------------------------------------- time per round


def time_figures(page: Page, run) -> None:
    c, r = run.clients, run.rounds
    if c.empty or "sim_total_s" not in c or not plots.has_values(c, "sim_total_s"):
        for fig_id in ("fig-time-device-tier", "fig-time-network-tier"):
            page.omit(fig_id, f"{fig_id}: clients.parquet has no client times")
        return
    ran = c[plots.numeric(c["sim_total_s"]).notna()]
    for fig_id, grouping, what in (
        ("fig-time-device-tier", plots.device_groups, "device tier"),
        ("fig-time-network-tier", plots.network_groups, "network tier"),
    ):
        groups, order = grouping(ran, run.profiles)
        all_groups, _ = grouping(c, run.profiles)  # the participation panels count the selected clients
        selected = c.groupby(all_groups.values)["client_id"].nunique()
        _phase_panels(page, fig_id, ran, r, groups, order, what, selected, plots.step_word(run))


def _phase_panels(page, fig_id, ran, rounds, groups, order, what, selected, step="round") -> None:
    phases = [p for p in plots.PHASES if p[0] in ran.columns]
    ncols, nrows = plots.grid_shape(len(order))
    fig, axes = plots.figure(ncols=ncols, nrows=nrows, height=3.2, sharey=True)
    all_rounds = np.sort(rounds["round"].unique())
    mean = ran.assign(_g=groups.values).groupby(["_g", "round"])[[p[0] for p in phases]].mean()
    round_s = rounds.set_index("round")["sim_round_s"]
    for ax, g in zip(axes, order):
        m = mean.loc[g].reindex(all_rounds) if g in mean.index.get_level_values(0) else None
        if m is None:
            continue
        plots.stacked_bars(ax, all_rounds, [(lab, m[col].to_numpy(), colour) for col, lab, colour in phases])
        ax.step(all_rounds, round_s.reindex(all_rounds).to_numpy(), where="mid", color="black", linewidth=1,
                label="round time (slowest arrived)" if step == "round" else "time since the previous step")
        n_ran = ran.loc[groups == g, "client_id"].nunique()
        n_selected = selected.get(g, n_ran)
        ax.set_title(f"{g}  ({n_ran} of {n_selected} selected clients ran)" if n_selected != n_ran
                     else f"{g}  ({n_ran} clients ran)", loc="left", fontsize=10)
        plots.round_ticks(ax, step)
    axes[0].set_ylabel("simulated s (mean per client)")
    for row_start in range(0, len(axes), ncols):
        axes[row_start].set_ylabel("simulated s (mean per client)")
    plots.hide_unused(axes, len(order))
    plots.fig_legend(fig, axes[0])
    fig.suptitle(f"Simulated time per {step} by {what}: download / compute / compress / upload",
                 x=0.01, ha="left", fontsize=11)
    page.figure(fig_id, fig, f"bars: mean phase seconds of the {what}'s clients that ran in the "
                "round; line: the round's simulated time (slowest client that arrived, or the deadline); "
                "a title counts the tier's clients that ran (not unavailable) of those ever selected, "
                "which the participation panels count")


# ---------------------------------------------------------------- bytes and participation


def bytes_figure(page: Page, run) -> None:
    r = run.rounds
    if not {"bytes_up", "bytes_down"} <= set(r.columns):
        for fig_id in ("fig-bytes", "fig-bytes-time"):
            page.omit(fig_id, f"{fig_id}: rounds.parquet has no bytes_up / bytes_down")
        return
    x = r["round"].to_numpy()
    down, up = plots.numeric(r["bytes_down"]).fillna(0), plots.numeric(r["bytes_up"]).fillna(0)
    # up and down on their own scales: compression cuts the upload, invisible beside the broadcast
    same = bool(np.array_equal(down.to_numpy(), up.to_numpy()))  # FedAvg: the upload is the broadcast
    note = " (= download)" if same else ""
    fig, axes = plots.figure(ncols=2, height=3.2)
    for ax, values, what, colour in ((axes[0], down, "download", "#4C72B0"), (axes[1], up, "upload", "#C44E52")):
        div, unit = plots.byte_unit(values.max())
        ax.bar(x, values / div, 0.8, color=colour, linewidth=0)
        plots.round_ticks(ax)
        ax.set_ylabel(f"{unit} per round")
        ax.set_title(f"{what.capitalize()} per round (total {human_bytes(values.sum())})"
                     + (note if what == "upload" else ""), loc="left", fontsize=11)
    page.figure("fig-bytes", fig, "download: broadcast to the clients that ran; upload: payloads "
                "of the clients that arrived (exact payload bytes); each panel on its own scale"
                + ("; here every round's upload equals its download" if same else ""))
    fig, (ax,) = plots.figure(width=7.5, height=3.4)
    t = plots.numeric(r["sim_time_s"]).to_numpy()
    # equal series: download wide and dashed under a thin upload, so that both stay visible
    lines = ((down, "download (= upload)" if same else "download", "#4C72B0", "--" if same else "-",
              3.2 if same else 1.5),
             (up, "upload", "#C44E52", "-", 1.2 if same else 1.5))
    for values, what, colour, style, width in lines:
        cum = values.cumsum().to_numpy(dtype=float)
        ax.plot(t, np.where(cum > 0, cum, np.nan), style, color=colour, label=what, linewidth=width,
                marker=plots.marker_for(len(t)) if not (same and style == "--") else None, markersize=3)
    if (down.sum() > 0) or (up.sum() > 0):
        from matplotlib.ticker import FuncFormatter  # matplotlib: only drawing needs it (see plots.figure)

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("cumulative bytes (log)")
    plots.legend_outside(ax)
    ax.set_title("Cumulative bytes against simulated time", loc="left", fontsize=11)
    page.figure("fig-bytes-time", fig, "cumulative download and upload at the end of each round, against "
                "cumulative simulated seconds; log axis: both stay visible when one is much smaller"
                + ("; the two are equal here: the dashed download lies under the upload" if same else ""))


def _outcome(clients: pd.DataFrame) -> pd.Series:
    reason = (clients["drop_reason"].fillna("").astype(str) if "drop_reason" in clients
              else pd.Series("", index=clients.index))
    return reason.replace("", "aggregated")


def participation_figure(page: Page, run) -> None:
    c, r = run.clients, run.rounds
    if c.empty:
        page.omit("fig-participation", "fig-participation: clients.parquet is empty")
        return
    outcome = _outcome(c)
    kinds = [k for k in plots.OUTCOMES if (outcome == k).any()] + sorted(set(outcome) - set(plots.OUTCOMES))
    colours = {k: plots.OUTCOMES.get(k, plots.PALETTE[i % len(plots.PALETTE)]) for i, k in enumerate(kinds)}
    fig, (ax, ax2) = plots.figure(ncols=2, height=3.4, gridspec_kw={"width_ratios": [3, 1.3]})
    rounds = np.sort(r["round"].unique())
    counts = pd.crosstab(c["round"], outcome).reindex(index=rounds, fill_value=0)
    plots.stacked_bars(ax, rounds, [(k, counts.get(k, pd.Series(0, index=rounds)).to_numpy(), colours[k])
                                    for k in kinds])
    plots.round_ticks(ax)
    ax.set_ylabel("selected clients")
    ax.set_title("Selected clients per round by outcome", loc="left", fontsize=11)
    plots.fig_legend(fig, ax)
    groups, order = plots.device_groups(c, run.profiles)
    share = pd.crosstab(groups, outcome, normalize="index").reindex(index=order[::-1], fill_value=0)
    left = np.zeros(len(share))
    for k in kinds:
        v = share.get(k, pd.Series(0.0, index=share.index)).to_numpy()
        ax2.barh(share.index, v, left=left, color=colours[k], label=k)
        left += v
    ax2.set_xlim(0, 1)
    ax2.set_xlabel("share of selections")
    ax2.set_title("Outcome by device tier", loc="left", fontsize=11)
    page.figure("fig-participation", fig, "aggregated: the upload arrived and was used; "
                "over_selected: finished after the round's target was met; deadline: too slow; "
                "dropout: failed mid-round; unavailable: offline when selected; battery: below its battery "
                "threshold, or its battery emptied")
