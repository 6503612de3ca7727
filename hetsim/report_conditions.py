"""The run report's "Conditions over virtual time" section: links, availability and drops of a
fleet with ``clients.profiles.conditions`` (docs/conditions.md), on the virtual clock.

The section is drawn only for runs whose clients.parquet has the condition columns
(:data:`CONDITION_COLUMNS`, written for fleets with conditions only), so a run without conditions
gets the report it always got. Virtual time counts seconds from Monday 00:00 and is shown as a day
of the week and a time of day (``Tue 21:00``; seconds when the run spans less than an hour).
See docs/reports.md.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hetsim import plots
from hetsim.page import Page

CONDITIONS_FIGURES = ("fig-conditions-links", "fig-conditions-availability", "fig-conditions-drops")
CONDITION_COLUMNS = ("down_mbps", "up_mbps", "down_state", "up_state")  # engine/loop/rows.py
# every outcome of a client in a round, in legend order; "" in drop_reason = aggregated
OUTCOME_ORDER = ("aggregated", "over_selected", "deadline", "offline", "battery", "dropout", "unavailable",
                 "nonfinite", "not selected")
OUTCOME_COLOURS = {**plots.OUTCOMES, "nonfinite": "#222222", "not selected": "#F2F2F2"}
DROP_MARKERS = {"over_selected": "D", "deadline": "X", "offline": "v", "dropout": "s", "unavailable": "o",
                "nonfinite": "P", "battery": "^"}
CLIENT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MAX_LINK_CLIENTS = 8
MAX_HEATMAP_CLIENTS = 120  # more: an even sample of each set's clients
MAX_DROP_ROWS = 60  # more clients that dropped: one strip per condition set instead of one row per client


def has_conditions(run) -> bool:
    """Whether the run's fleet had conditions over virtual time (its clients.parquet says so)."""
    return any(col in run.clients.columns for col in CONDITION_COLUMNS)


# ---------------------------------------------------------------- rounds in virtual time


def round_times(run) -> pd.DataFrame:
    """Per round: its virtual start and end (``round_start_s`` + ``sim_round_s``), seconds."""
    r = run.rounds
    if plots.has_values(r, "round_start_s"):
        start = plots.numeric(r["round_start_s"])
    else:  # clients' start_s (the same for every client that ran the round)
        start = r["round"].map(run.clients.groupby("round")["start_s"].min()) if "start_s" in run.clients else None
        if start is None or start.isna().any():
            raise ValueError("rounds.parquet has no round_start_s")
    out = pd.DataFrame({"round": r["round"].to_numpy(), "start_s": start.to_numpy(dtype=float)})
    out["end_s"] = out["start_s"] + plots.numeric(r["sim_round_s"]).fillna(0).to_numpy()
    return out.set_index("round").sort_index()


def round_marks(ax, rounds: pd.DataFrame, min_gap_frac: float = 0.05) -> None:
    """Thin lines at the rounds' starts, numbered on a top axis; rounds that start too close
    together to be told apart share one label (``0–7``)."""
    lo, hi = ax.get_xlim()
    groups: list[list] = []
    for rnd, t in rounds["start_s"].items():
        ax.axvline(t, color="#BBBBBB", linewidth=0.6, zorder=0)
        if groups and t - groups[-1][1] < min_gap_frac * (hi - lo):
            groups[-1][2] = rnd
        else:
            groups.append([rnd, t, rnd])
    if len(groups) > 16:  # too many to number: every k-th
        groups = groups[::math.ceil(len(groups) / 16)]
    top = ax.secondary_xaxis("top")
    top.set_xticks([t for _, t, _ in groups], [f"{a}" if a == b else f"{a}–{b}" for a, _, b in groups], fontsize=7)
    top.set_xlabel("round (at its start)", fontsize=8)
    top.tick_params(length=2)


# ---------------------------------------------------------------- clients and their sets


def client_sets(run) -> tuple[pd.Series, list[str]]:
    """Each client's condition set (client_id -> name) and the sets' names in order."""
    p = run.profiles
    if p is not None and "conditions" in getattr(p, "columns", ()) and "client_id" in p:
        sets = p.set_index("client_id")["conditions"].fillna("").astype(str).replace("", "(none)")
    else:
        ids = np.sort(run.clients["client_id"].unique())
        sets = pd.Series("all", index=ids)
    named = [s for s in dict.fromkeys(_config_set_order(run)) if (sets == s).any()]
    order = named + sorted(set(sets) - set(named))
    return sets, order


def _config_set_order(run) -> list[str]:
    cfg = run.config or {}
    sets = (((cfg.get("clients") or {}).get("profiles") or {}).get("conditions") or {}).get("sets") or {}
    return [str(k) for k in sets] if isinstance(sets, dict) else []


def outcomes(clients: pd.DataFrame) -> pd.Series:
    reason = (clients["drop_reason"].fillna("").astype(str) if "drop_reason" in clients
              else pd.Series("", index=clients.index))
    return reason.replace("", "aggregated")


def grouped_rows(ids, sets: pd.Series, order: list[str], limit: int) -> tuple[list[int], int]:
    """Client ids grouped by set (in ``order``), by id within a set; at most ``limit``: an even,
    deterministic sample of each set, in proportion to its size. Returns (ids, how many there were)."""
    ids = np.sort(np.asarray(list(ids)))
    by_set = {s: ids[sets.reindex(ids).fillna("(none)").to_numpy() == s] for s in order}
    total = len(ids)
    out: list[int] = []
    for s in order:
        members = by_set[s]
        if total > limit and len(members):
            k = max(1, round(limit * len(members) / total))
            members = members[np.unique(np.linspace(0, len(members) - 1, k).round().astype(int))]
        out.extend(int(c) for c in members)
    return out, total


def set_labels(ax, rows: list[int], sets: pd.Series, order: list[str], colours: dict[str, str]) -> None:
    """Lines between the sets' rows and each set's name right of the panel, with its clients
    shown (``3 of 8``: the set has 8)."""
    from matplotlib.transforms import blended_transform_factory  # matplotlib: only drawing needs it

    names = sets.reindex(rows).fillna("(none)").to_numpy()
    trans = blended_transform_factory(ax.transAxes, ax.transData)
    for s in order:
        where = np.flatnonzero(names == s)
        if not where.size:
            continue
        lo, hi = where.min(), where.max()
        if lo > 0:
            ax.axhline(lo - 0.5, color="black", linewidth=1.2)
        size = int((sets == s).sum())
        count = f"{where.size}" if where.size == size else f"{where.size} of {size}"
        ax.text(1.01, (lo + hi) / 2, f"{s}\n({count})", transform=trans, ha="left", va="center",
                fontsize=9, color=colours[s], fontweight="bold", clip_on=False)


# ---------------------------------------------------------------- 1. links


def links_figure(page: Page, run) -> None:
    c = run.clients
    rates = [(col, what) for col, what in (("down_mbps", "download"), ("up_mbps", "upload"))
             if plots.has_values(c, col)]
    if not rates:
        page.omit("fig-conditions-links", "fig-conditions-links: clients.parquet has no achieved rates "
                  "(down_mbps / up_mbps)")
        return
    sets, order = client_sets(run)
    colours = plots.colour_map(order)
    ran = c.assign(set=c["client_id"].map(sets).fillna("(none)"))
    # the transfer's midpoint in virtual time
    mid = {"down_mbps": ("start_s", "download_end_s"), "up_mbps": ("compress_end_s", "upload_end_s")}
    sample = link_sample(ran, [col for col, _ in rates], order)
    # the clients of a set: its colour, darker to lighter (told apart by their markers too)
    shade = {}
    for s in order:
        mine = [cid for cid in sample if sets.get(cid, "(none)") == s]
        for j, cid in enumerate(mine):
            shade[cid] = plots.shaded(colours[s], (j / (len(mine) - 1) - 0.5) * 0.7 if len(mine) > 1 else 0.0)
    sample = sorted(sample, key=lambda cid: (order.index(sets.get(cid, "(none)")), cid))
    fig, axes = plots.figure(ncols=len(rates), height=3.9, sharey=True)
    lo, hi, vmin, vmax = np.inf, -np.inf, np.inf, -np.inf
    for ax, (col, what) in zip(axes, rates):
        a, b = mid[col]
        d = ran.assign(t=(plots.numeric(ran[a]) + plots.numeric(ran[b])) / 2, v=plots.numeric(ran[col]))
        d = d[np.isfinite(d["t"]) & (d["v"] > 0)]
        lo, hi = min(lo, d["t"].min()), max(hi, d["t"].max())
        for s in order:
            med = d[d["set"] == s].groupby("round").agg(t=("t", "median"), v=("v", "median"))
            if len(med):
                ax.plot(med["t"], med["v"], "--", color=colours[s], linewidth=2.4, alpha=0.55, zorder=1,
                        label=f"{s}: median per round")
        for i, cid in enumerate(sample):
            mine = d[d["client_id"] == cid].sort_values("t")
            s = sets.get(cid, "(none)")
            ax.plot(mine["t"], mine["v"], "-", color=shade[cid], linewidth=1.0,
                    marker=CLIENT_MARKERS[i % len(CLIENT_MARKERS)], markersize=4, label=f"client {cid} ({s})")
        ax.set_title(f"Achieved {what} rate", loc="left", fontsize=11)
        vmin, vmax = min(vmin, d["v"].min()), max(vmax, d["v"].max())
    for ax in axes:
        plots.time_axis(ax, lo, hi, max_ticks=6 if len(axes) > 1 else 8)
        ax.tick_params(axis="x", labelsize=9)
    plots.log_rate_axis(axes[0], vmin, vmax)
    axes[0].set_ylabel("achieved rate (Mbit/s, log)")
    set_legend(fig, axes[0], order)
    page.figure("fig-conditions-links", fig,
                f"lines: the achieved rate of each transfer (8·bytes / transfer time after the latency) of "
                f"{len(sample)} clients (the ones that ran most, spread over the condition sets), at the "
                "transfer's midpoint in virtual time; colour: condition set; dashed: each set's median "
                "per round over all its clients that ran")


def set_legend(fig, ax, order: list[str], max_cols: int = 5) -> None:
    """The legend below the figure, one column per condition set (its median, then its clients)."""
    from matplotlib.lines import Line2D  # matplotlib: only drawing needs it

    columns: dict[str, list] = {s: [] for s in order}
    for handle, label in zip(*ax.get_legend_handles_labels()):
        s = next((s for s in order if label.startswith(f"{s}:") or label.endswith(f"({s})")), None)
        columns.setdefault(s, []).append((handle, label))
    columns = {s: entries for s, entries in columns.items() if entries}
    if not columns:
        return
    if len(columns) > max_cols:  # too many sets for a column each: in rows, set by set
        entries = [e for col in columns.values() for e in col]
        fig.legend(*zip(*entries), loc="outside lower center", ncols=max_cols, fontsize=8, frameon=False)
        return
    depth = max(len(col) for col in columns.values())
    blank = (Line2D([], [], linestyle="none"), "")
    entries = [e for col in columns.values() for e in col + [blank] * (depth - len(col))]
    fig.legend(*zip(*entries), loc="outside lower center", ncols=len(columns), fontsize=8, frameon=False)


def link_sample(clients: pd.DataFrame, cols: list[str], order: list[str], k: int = MAX_LINK_CLIENTS) -> list[int]:
    """At most ``k`` clients, taken in turn from each set: those with the most transfers first, then by id."""
    has = clients[cols].apply(plots.numeric).gt(0).any(axis=1)
    counts = clients[has].groupby(["set", "client_id"]).size().reset_index(name="n")
    queues = {s: counts[counts["set"] == s].sort_values(["n", "client_id"], ascending=[False, True])["client_id"]
              .astype(int).tolist() for s in order}
    out: list[int] = []
    while len(out) < k and any(queues.values()):
        for s in order:
            if queues[s] and len(out) < k:
                out.append(queues[s].pop(0))
    return out


# ---------------------------------------------------------------- 2. availability heat map


def availability_figure(page: Page, run) -> None:
    from matplotlib.colors import BoundaryNorm, ListedColormap  # matplotlib: only drawing needs it
    from matplotlib.patches import Patch  # matplotlib: only drawing needs it

    c = run.clients
    if c.empty:
        page.omit("fig-conditions-availability", "fig-conditions-availability: clients.parquet is empty")
        return
    sets, order = client_sets(run)
    colours = plots.colour_map(order)
    times = round_times(run)
    rounds = times.index.to_numpy()
    ids = sets.index if len(sets) else c["client_id"].unique()
    rows, total = grouped_rows(ids, sets, order, MAX_HEATMAP_CLIENTS)
    outcome = outcomes(c)
    kinds = [k for k in OUTCOME_ORDER if k == "not selected" or (outcome == k).any()]
    kinds += sorted(set(outcome) - set(kinds))
    code = {k: i for i, k in enumerate(kinds)}
    grid = np.full((len(rows), len(rounds)), code["not selected"], dtype=float)
    row_of = {cid: i for i, cid in enumerate(rows)}
    col_of = {rnd: j for j, rnd in enumerate(rounds)}
    for cid, rnd, o in zip(c["client_id"], c["round"], outcome):
        i, j = row_of.get(int(cid)), col_of.get(rnd)
        if i is not None and j is not None:
            grid[i, j] = code[o]
    cmap = ListedColormap([OUTCOME_COLOURS.get(k, plots.PALETTE[i % len(plots.PALETTE)]) for i, k in enumerate(kinds)])
    norm = BoundaryNorm(np.arange(len(kinds) + 1) - 0.5, len(kinds))
    height = min(9.0, max(3.4, 1.6 + 0.17 * len(rows)))
    fig, (ax,) = plots.figure(height=height)
    ax.grid(False)
    ax.imshow(grid, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    # x: every k-th round, numbered and at its virtual start
    step = max(1, math.ceil(len(rounds) / 14))
    cols = np.arange(0, len(rounds), step)
    starts = times["start_s"].to_numpy()
    gaps = np.diff(starts[cols]) if len(cols) > 1 else np.array([3600.0])
    digits = plots.label_digits(float(np.min(gaps)) if len(gaps) else 3600.0)
    ax.set_xticks(cols, [f"{rounds[j]}\n{label}" for j, label in zip(cols, plots.time_labels(starts[cols], digits))],
                  fontsize=8)
    ax.set_xlabel("round and its virtual start (day hh:mm" + (":ss" if digits else "") + ")")
    if len(rows) <= 60:
        ax.set_yticks(np.arange(len(rows)), [str(cid) for cid in rows], fontsize=7 if len(rows) > 30 else 8)
        ax.set_ylabel("client id")
    else:
        ax.set_yticks([])
        ax.set_ylabel(f"clients ({len(rows)}), by id within each set")
    set_labels(ax, rows, sets, order, colours)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title("Each client's outcome per round, clients grouped by condition set", loc="left", fontsize=11)
    handles = [Patch(facecolor=cmap(code[k]), edgecolor="#999999", linewidth=0.5, label=k) for k in kinds]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 8), fontsize=8, frameon=False)
    shown = f"{len(rows)} of {total} clients (an even sample of each set)" if len(rows) < total else "every client"
    page.figure("fig-conditions-availability", fig,
                f"{shown}; aggregated: arrived and used; offline: its availability process took it offline "
                "before its upload was done; unavailable: offline when selected; dropout: failed mid-round; "
                "deadline: too slow; over_selected: finished after the round's target was met; "
                "nonfinite: its upload had NaN/inf; not selected: not chosen that round")


# ---------------------------------------------------------------- 3. drops


def drop_events(run) -> pd.DataFrame:
    """One row per lost client and round: ``t`` = when the server lost it in virtual time
    (unavailable, dropout: the round's start; offline: when it left; in flight: its upload's end,
    capped at the round's end)."""
    c = run.clients
    times = round_times(run)
    reason = outcomes(c)
    lost = c[reason != "aggregated"].assign(reason=reason[reason != "aggregated"])
    start = lost["round"].map(times["start_s"])
    end = lost["round"].map(times["end_s"])
    upload_end = plots.numeric(lost["upload_end_s"]) if "upload_end_s" in lost else pd.Series(np.nan, lost.index)
    t = np.where(upload_end.notna(), np.minimum(upload_end, end), start)
    if "left_s" in lost:  # an offline client: when it left
        left = plots.numeric(lost["left_s"])
        t = np.where(left.notna(), left, t)
    return lost.assign(t=t, round_start_s=start)[["round", "client_id", "reason", "t", "round_start_s"]]


def drops_figure(page: Page, run) -> None:
    ev = drop_events(run)
    if ev.empty:
        page.omit("fig-conditions-drops", "fig-conditions-drops: no client was lost (every selected client "
                  "was aggregated)")
        return
    sets, order = client_sets(run)
    colours = plots.colour_map(order)
    ev = ev.assign(set=ev["client_id"].map(sets).fillna("(none)"))
    reasons = [k for k in OUTCOME_ORDER if (ev["reason"] == k).any()] + sorted(set(ev["reason"]) - set(OUTCOME_ORDER))
    rcolour = {k: OUTCOME_COLOURS.get(k, plots.PALETTE[i % len(plots.PALETTE)]) for i, k in enumerate(reasons)}
    rows, _ = grouped_rows(ev["client_id"].unique(), sets, order, limit=10**9)
    per_client = len(rows) <= MAX_DROP_ROWS
    if per_client:
        y = ev["client_id"].map({cid: i for i, cid in enumerate(rows)}).to_numpy(dtype=float)
    else:  # one strip per set, clients spread deterministically within it
        present = [s for s in order if (ev["set"] == s).any()]
        jitter = ((ev["client_id"].to_numpy() * 0.6180339887) % 1.0 - 0.5) * 0.7
        y = ev["set"].map({s: i for i, s in enumerate(present)}).to_numpy(dtype=float) + jitter
    n_rows = len(rows) if per_client else len(present)
    height = min(11.0, max(3.6, 1.8 + (0.17 if per_client else 0.8) * n_rows))
    fig, (ax, ax2) = plots.figure(ncols=2, height=height, gridspec_kw={"width_ratios": [3.4, 1]})
    handles = {}
    for k in sorted(reasons, key=lambda k: -(ev["reason"] == k).sum()):  # the rarest on top
        m = (ev["reason"] == k).to_numpy()
        handles[k] = ax.scatter(ev["t"].to_numpy()[m], y[m], s=34, marker=DROP_MARKERS.get(k, "o"), color=rcolour[k],
                                edgecolors="white", linewidths=0.4, alpha=0.85, label=k, zorder=3)
    times = round_times(run)
    plots.time_axis(ax, float(min(times["start_s"].min(), ev["t"].min())),
                    float(max(times["end_s"].max(), ev["t"].max())), max_ticks=7)
    round_marks(ax, times)
    if per_client:
        ax.set_yticks(np.arange(len(rows)), [str(cid) for cid in rows], fontsize=7 if len(rows) > 30 else 8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_ylabel("client id")
        set_labels(ax, rows, sets, order, colours)
    else:
        ax.set_yticks(np.arange(len(present)), present)
        for tick, s in zip(ax.get_yticklabels(), present):
            tick.set_color(colours[s])
        ax.set_ylim(len(present) - 0.5, -0.5)
        ax.set_ylabel("condition set (clients spread within)")
    ax.set_title("Lost clients: when (virtual time) and why", loc="left", fontsize=11)
    # right: per set, the share of its selections lost for each reason
    c = run.clients
    sel = c.assign(set=c["client_id"].map(sets).fillna("(none)"), reason=outcomes(c))
    share = pd.crosstab(sel["set"], sel["reason"], normalize="index").reindex(
        index=[s for s in order if (sel["set"] == s).any()][::-1], fill_value=0)
    left = np.zeros(len(share))
    for k in reasons:
        v = share.get(k, pd.Series(0.0, index=share.index)).to_numpy()
        ax2.barh(share.index, v, left=left, color=rcolour[k])
        left += v
    ax2.yaxis.tick_right()  # the left panel's set names are on its right: keep them apart
    ax2.tick_params(axis="y", length=0)
    for tick, s in zip(ax2.yaxis.get_major_ticks(), share.index):
        tick.label2.set_color(colours.get(s, "black"))
    ax2.set_xlim(0, 1)
    ax2.set_xlabel("share of the set's selections lost")
    ax2.set_title("Lost, by condition set", loc="left", fontsize=11)
    fig.legend([handles[k] for k in reasons], reasons, loc="outside lower center", ncols=min(len(reasons), 7),
               fontsize=8, frameon=False)
    page.figure("fig-conditions-drops", fig,
                "x: when the server lost the client: unavailable and dropout at the round's start (they never "
                "ran); offline when it left; deadline, over_selected and nonfinite at the end of its upload, "
                "capped at the round's end; grey lines and top axis: round starts; "
                "right: the share of each condition set's selections lost, by reason")
