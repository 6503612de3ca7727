"""The run report's "Asynchronous rounds" section (docs/async.md): how stale the updates were
when they arrived, and how many clients were in flight over virtual time.

Drawn for runs whose clients.parquet has the asynchronous columns (``staleness``, written only
by an ``asynchronous:`` run); accuracy against simulated time is the run's own accuracy figure,
and ``hetsim compare`` puts it beside a synchronous run.
"""
from __future__ import annotations

import numpy as np

from hetsim import plots
from hetsim.page import Page

ASYNC_FIGURES = ("fig-async-staleness", "fig-async-in-flight")
OUTCOME_COLOURS = {"applied": "#55A868", "stale": "#C44E52", "offline": "#DA8BC3"}


def has_async(run) -> bool:
    return "staleness" in run.clients.columns and plots.has_values(run.clients, "staleness")


def async_section(page: Page, run) -> None:
    page.guarded(("fig-async-staleness",), staleness_figure, run)
    page.guarded(("fig-async-in-flight",), in_flight_figure, run)


def _outcome(clients):
    reason = clients["drop_reason"].fillna("").astype(str)
    return reason.where(reason != "", "applied")


def staleness_figure(page: Page, run) -> None:
    c = run.clients[plots.numeric(run.clients["staleness"]).notna()]
    outcome = _outcome(c)
    stale = plots.numeric(c["staleness"]).astype(int)
    edges = np.arange(stale.min(), stale.max() + 2) - 0.5
    fig, (ax,) = plots.figure(width=7.5, height=3.6)
    bottom = np.zeros(len(edges) - 1)
    for kind in [k for k in OUTCOME_COLOURS if (outcome == k).any()] + sorted(set(outcome) - set(OUTCOME_COLOURS)):
        counts, _ = np.histogram(stale[outcome == kind], bins=edges)
        ax.bar(edges[:-1] + 0.5, counts, bottom=bottom, width=0.9, label=f"{kind} ({int(counts.sum())})",
               color=OUTCOME_COLOURS.get(kind, "#8C8C8C"))
        bottom += counts
    limit = ((run.config or {}).get("asynchronous") or {}).get("max_staleness")
    if limit is not None:
        ax.axvline(float(limit) + 0.5, color="#C44E52", linestyle=":", linewidth=1.2, label="max_staleness")
    ax.set_xlabel("staleness (server versions between dispatch and arrival)")
    ax.set_ylabel("updates")
    ax.legend(fontsize=8)
    ax.set_title(f"Staleness of the updates (mean of the applied: "
                 f"{stale[outcome == 'applied'].mean():.2f})", loc="left", fontsize=11)
    page.figure("fig-async-staleness", fig, "one count per update that reached the server or was lost: "
                "applied, dropped as older than max_staleness, or lost when its client went offline")


def in_flight_figure(page: Page, run) -> None:
    r = run.rounds
    if not plots.has_values(r, "in_flight"):
        page.omit("fig-async-in-flight", "fig-async-in-flight: rounds.parquet has no in_flight")
        return
    t = plots.numeric(r["sim_time_s"]).to_numpy()
    fig, (ax,) = plots.figure(width=11.0, height=3.2)
    ax.step(t, plots.numeric(r["in_flight"]), where="post", color="#4C72B0", label="in flight")
    if plots.has_values(r, "buffered"):
        ax.step(t, plots.numeric(r["buffered"]), where="post", color="#DD8452", label="buffered")
    conc = ((run.config or {}).get("asynchronous") or {}).get("concurrency")
    if conc is not None:
        ax.axhline(float(conc), color="grey", linestyle=":", linewidth=1, label="concurrency")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("clients")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Clients in flight after each server step", loc="left", fontsize=11)
    page.figure("fig-async-in-flight", fig, "right after each server step (and the dispatch at its instant); "
                "fewer than the concurrency when idle clients were offline or waiting in the buffer")
