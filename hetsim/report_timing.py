"""The what-if page of a ``clock.mode: timing_only`` run: the fleet's questions, no accuracy.

:func:`whatif_section` adds what only such a page needs: the what-if's key figures, the
distribution of round times (with each round's deadline, which a policy of ``clock.deadline`` may
change from round to round), the clients' finish times by tier against the deadline, and when
the fleet was first heard from (the share of each tier aggregated at least once, round by
round: what is left at the end is never heard). The run report (:mod:`hetsim.report`) puts it
before its own sections that apply (time per tier, traffic, participation and fairness,
conditions, asynchronous steps, energy and batteries) and leaves out accuracy. Figure ids:
:data:`TIMING_FIGURES`; docs/reports.md.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from hetsim import plots
from hetsim.page import Page

TIMING_FIGURES = (
    "table-whatif-summary",
    "fig-whatif-round-times",
    "fig-whatif-client-times",
    "fig-whatif-heard",
)
MAX_BOX_TIERS = 12  # tiers drawn as boxes; the rest are named in the caption


def is_timing_only(run) -> bool:
    return ((run.config or {}).get("clock") or {}).get("mode") == "timing_only"


def whatif_section(page: Page, run) -> None:
    page.section("Fleet what-if: round times and arrivals")
    page.guarded(("table-whatif-summary",), summary_table, run)
    page.guarded(("fig-whatif-round-times",), round_times_figure, run)
    page.guarded(("fig-whatif-client-times",), client_times_figure, run)
    page.guarded(("fig-whatif-heard",), heard_figure, run)


def _quantile(s: pd.Series, q: float) -> float:
    s = plots.numeric(s).dropna()
    return float(s.quantile(q)) if len(s) else float("nan")


def _seconds(v: float) -> str:
    return "–" if not np.isfinite(v) else f"{v:.3g} s"


def summary_table(page: Page, run) -> None:
    r, c = run.rounds, run.clients
    step = plots.step_word(run)
    selected = plots.numeric(r["num_selected"]).sum()
    arrived = plots.numeric(r["num_arrived"]).sum()
    heard = c.loc[c["made_deadline"].astype(bool), "client_id"].nunique() if len(c) else 0
    picked = c["client_id"].nunique() if len(c) else 0
    fleet = int(run.manifest.get("num_clients") or (len(run.profiles) if run.profiles is not None else picked))
    deadline = plots.numeric(r["sim_deadline_s"]) if "sim_deadline_s" in r else pd.Series(dtype=float)
    items = [
        (f"{step}s", f"{len(r)} in {_seconds(float(plots.numeric(r['sim_time_s']).iloc[-1]))} of virtual time"),
        (f"{step} time: median / p90 / max", " / ".join(_seconds(_quantile(r["sim_round_s"], q))
                                                        for q in (0.5, 0.9, 1.0))),
        ("deadline: median (min - max)", "none" if deadline.dropna().empty else
         f"{_seconds(_quantile(deadline, 0.5))} ({_seconds(deadline.min())} - {_seconds(deadline.max())})"),
        (f"uploads aggregated per {step}: mean", f"{arrived / max(len(r), 1):.1f} of {selected / max(len(r), 1):.1f} "
         f"selected ({100 * arrived / selected:.1f} %)" if selected else "–"),
        ("clients heard from (aggregated at least once)", f"{heard} of {picked} ever selected, of {fleet} "
         f"registered; never heard: {picked - heard} selected, {fleet - picked} never selected"),
    ]
    page.key_values("table-whatif-summary", items)


def round_times_figure(page: Page, run) -> None:
    r = run.rounds
    step = plots.step_word(run)
    x = r["round"].to_numpy()
    t = plots.numeric(r["sim_round_s"]).to_numpy()
    fig, (ax, ax2) = plots.figure(ncols=2, height=3.4, gridspec_kw={"width_ratios": [2.2, 1]})
    ax.bar(x, t, 0.8, color="#4C72B0", linewidth=0, label=f"{step} time")
    if "sim_deadline_s" in r and plots.has_values(r, "sim_deadline_s"):
        ax.step(x, plots.numeric(r["sim_deadline_s"]), where="mid", color="#C44E52", linewidth=1.5,
                label="deadline")
    plots.round_ticks(ax, step)
    ax.set_ylabel("simulated s")
    ax.set_title(f"Time of each {step} and its deadline", loc="left", fontsize=11)
    plots.legend_outside(ax)
    finite = t[np.isfinite(t)]
    lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    if hi - lo <= 1e-3 * max(abs(hi), 1e-12):  # (nearly) one value: a bar around it, not a 1e-9 axis
        lo, hi = lo * 0.9, hi * 1.1 if hi > 0 else 1.0
    ax2.hist(finite, bins=min(30, max(5, len(finite) // 3)), range=(lo, hi), color="#4C72B0", alpha=0.85)
    for q, style in ((0.5, "-"), (0.9, "--")):
        if len(finite):
            v = float(np.quantile(finite, q))
            ax2.axvline(v, color="black", linestyle=style, linewidth=1, label=f"p{int(q * 100)} {v:.3g} s")
    ax2.set_xlabel(f"{step} time (simulated s)")
    ax2.set_ylabel(f"{step}s")
    ax2.legend(fontsize=8, loc="best")
    ax2.set_title("Distribution", loc="left", fontsize=11)
    page.figure("fig-whatif-round-times", fig, f"bars: each {step}'s simulated time (the slowest upload it kept, "
                "or its deadline when a client lost on the way was needed); red: the deadline the clock set "
                "(clock.deadline_s, or the policy of clock.deadline); right: their distribution, median and p90")


def client_times_figure(page: Page, run) -> None:
    c = run.clients
    if "sim_total_s" not in c or not plots.has_values(c, "sim_total_s"):
        page.omit("fig-whatif-client-times", "fig-whatif-client-times: no client ran")
        return
    from matplotlib.ticker import FuncFormatter, NullFormatter  # matplotlib: only drawing needs it

    ran = c[plots.numeric(c["sim_total_s"]).notna()]
    deadline = _quantile(run.rounds.get("sim_deadline_s", pd.Series(dtype=float)), 0.5)
    fig, axes = plots.figure(ncols=2, height=3.6)
    total = plots.numeric(ran["sim_total_s"])
    spread = total[total > 0]
    log = len(spread) > 0 and float(spread.max()) > 30 * float(spread.min())  # several decades: a log axis
    left_out = []
    for ax, grouping, what in ((axes[0], plots.device_groups, "device tier"),
                               (axes[1], plots.network_groups, "network tier")):
        groups, order = grouping(ran, run.profiles)
        left_out += order[MAX_BOX_TIERS:]
        order = order[:MAX_BOX_TIERS]
        data = [plots.numeric(ran.loc[groups == g, "sim_total_s"]).to_numpy() for g in order]
        ax.boxplot(data, vert=False, tick_labels=order, showfliers=False, whis=(5, 95),
                   medianprops={"color": "black"})
        if np.isfinite(deadline):
            ax.axvline(deadline, color="#C44E52", linewidth=1.5, label=f"median deadline {deadline:.3g} s")
            ax.legend(fontsize=8, loc="lower right")
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("simulated s (log)" if log else "simulated s")
        ax.set_title(f"Finish times by {what}", loc="left", fontsize=11)
    more = f"; not drawn: {', '.join(left_out)}" if left_out else ""
    page.figure("fig-whatif-client-times", fig, "when each client that ran finished its round (download, "
                "compute, compress and upload, seconds after the round's start), each time it ran: boxes from "
                "the 25th to the 75th percentile, whiskers 5th-95th, black the median; red: the median "
                "deadline; a log axis where the times span more than 30x" + more)


def heard_figure(page: Page, run) -> None:
    """Share of each device tier's registered clients aggregated at least once, by round."""
    c, profiles = run.clients, run.profiles
    if c.empty or profiles is None or "tier" not in profiles:
        page.omit("fig-whatif-heard", "fig-whatif-heard: needs clients.parquet and profiles.parquet")
        return
    rounds = np.sort(run.rounds["round"].unique())
    tiers = profiles["tier"].astype(str)
    size = tiers.value_counts()
    order = sorted(size.index, key=lambda t: -size[t])
    tier_of = pd.Series(tiers.to_numpy(), index=profiles["client_id"].to_numpy())
    made = c[c["made_deadline"].astype(bool)]
    first = made.groupby("client_id")["round"].min()
    first_tier = tier_of.reindex(first.index).to_numpy()
    seen = c.groupby("client_id")["round"].min()
    seen_tier = tier_of.reindex(seen.index).to_numpy()
    fig, axes = plots.figure(ncols=2, height=3.4, sharey=True)
    colours = plots.colour_map(order)
    for ax, when, where, what in ((axes[0], first, first_tier, "aggregated at least once (heard from)"),
                                  (axes[1], seen, seen_tier, "selected at least once")):
        for tier in order:
            counts = pd.Series(when.to_numpy()[where == tier]).value_counts().reindex(rounds, fill_value=0)
            share = counts.cumsum().to_numpy() / size[tier]
            ax.plot(rounds, share, "-", color=colours[tier], label=f"{tier} ({size[tier]:,})",
                    marker=plots.marker_for(len(rounds)), markersize=3)
        plots.round_ticks(ax, plots.step_word(run))
        ax.set_ylim(0, 1.02)
        ax.set_title(f"Share of each tier {what}", loc="left", fontsize=11)
    axes[0].set_ylabel("share of the tier's registered clients")
    axes[1].legend(fontsize=8, loc="best", title="device tier (registered)", title_fontsize=8)
    page.figure("fig-whatif-heard", fig, "left: the share of each device tier's registered clients whose "
                "upload was aggregated at least once by the end of each round; the rest are never heard "
                "from; right: the share selected at least once (with the fleet's size, the selection "
                "alone leaves most clients out)")
