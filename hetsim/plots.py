"""Shared plotting helpers: figures on the Agg canvas, fixed colours, tier grouping, virtual-time
axes (``Tue 21:00``) and log rate axes.

matplotlib is imported here only, inside the drawing functions: :mod:`hetsim.compare` imports
this module, and its text table (``hetsim compare`` without ``-o``) draws nothing.
"""
from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pandas as pd

# (column, label, colour) of the four phases of a client's round (docs/results.md)
PHASES = (
    ("sim_download_s", "download", "#4C72B0"),
    ("sim_compute_s", "compute", "#DD8452"),
    ("sim_compress_s", "compress", "#55A868"),
    ("sim_upload_s", "upload", "#C44E52"),
)
# a selected client's outcome: "" in drop_reason = aggregated
OUTCOMES = {
    "aggregated": "#55A868",
    "over_selected": "#8172B3",
    "deadline": "#C44E52",
    "dropout": "#DD8452",
    "offline": "#DA8BC3",  # left mid-round (an availability process of clients.profiles.conditions)
    "unavailable": "#9E9E9E",
    "battery": "#CCB974",  # below its battery threshold, or its battery emptied (clients.profiles.battery)
}
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
           "#8C8C8C", "#CCB974", "#64B5CD")
SAMPLED_NET_TIERS = ("loguniform", "uniform", "")
# decade bins for sampled bandwidths (Mbit/s)
BANDWIDTH_EDGES = (0.0, 10.0, 100.0, 1000.0, math.inf)
# virtual time (docs/conditions.md): seconds since Monday 00:00
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# tick steps of a virtual-time axis, seconds
TIME_STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
              10800, 21600, 43200, 86400)
TIME_LABEL = "virtual time (day hh:mm, from Mon 00:00)"


def figure(ncols: int = 1, nrows: int = 1, width: float = 11.0, height: float = 3.6,
           sharey: bool = False, sharex: bool = False, **kw):
    """A matplotlib Figure (Agg, no pyplot) and its axes as a flat list."""
    from matplotlib.figure import Figure  # matplotlib: only drawing needs it, not compare's text table

    fig = Figure(figsize=(width, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=sharey, sharex=sharex, squeeze=False, **kw)
    flat = [ax for row in axes for ax in row]
    for ax in flat:
        tidy(ax)
    return fig, flat


def tidy(ax) -> None:
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(True, alpha=0.25, linewidth=0.6)
    ax.set_axisbelow(True)


def round_ticks(ax, label: str = "round") -> None:
    """Integer ticks on a round axis (``label``: "server step" for an asynchronous run's rows)."""
    from matplotlib.ticker import MaxNLocator  # matplotlib: only drawing needs it (see figure)

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(label)


def step_word(run) -> str:
    """What a row of rounds.parquet is: "round", or "server step" in an asynchronous run."""
    return "server step" if ((getattr(run, "config", None) or {}).get("asynchronous")) else "round"


def fig_legend(fig, ax, ncols: int = 6) -> None:
    """One legend for all panels, below them (the panels share their series), outside the axes."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), ncols), fontsize=8,
                   frameon=False)


def legend_outside(ax, **kw) -> None:
    """The axes' legend to the right of it, outside the plot: never over a curve's end."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
                  borderaxespad=0.0, **kw)


ACC_MIN_SPAN = 0.10  # an accuracy axis spans at least 10 points: 0.7 points must look small


def min_span(ax, span: float = ACC_MIN_SPAN, lo: float | None = 0.0, hi: float | None = 1.0) -> None:
    """Widen the y-axis to at least ``span``, around the data and within [``lo``, ``hi``]
    (accuracies: [0, 1]), so that a small difference does not fill the whole axis."""
    y0, y1 = ax.get_ylim()
    if y1 - y0 >= span:
        return
    mid = (y0 + y1) / 2
    y0, y1 = mid - span / 2, mid + span / 2
    if lo is not None and y0 < lo:
        y0, y1 = lo, lo + span
    if hi is not None and y1 > hi:
        y0, y1 = hi - span, hi
    ax.set_ylim(y0, y1)


def is_accuracy(metric: str) -> bool:
    """An accuracy column (global_acc, pers_acc_worst, ...): a fraction in [0, 1]."""
    return "acc" in metric


def grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(max(n, 1), max_cols)
    return cols, math.ceil(max(n, 1) / cols)


def colour_map(names) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def hide_unused(axes, used: int) -> None:
    for ax in axes[used:]:
        ax.set_visible(False)


def marker_for(n_points: int) -> str | None:
    return "o" if n_points <= 40 else None


def _profile_column(clients: pd.DataFrame, profiles: pd.DataFrame | None, col: str) -> pd.Series:
    if profiles is None or col not in getattr(profiles, "columns", ()) or "client_id" not in profiles:
        return pd.Series(np.nan, index=clients.index)
    lookup = profiles.set_index("client_id")[col]
    return clients["client_id"].map(lookup).astype(float)


def _bandwidth_bin(mbps: float) -> str:
    if not np.isfinite(mbps):
        return "sampled"
    for lo, hi in pairwise(BANDWIDTH_EDGES):
        if lo <= mbps < hi:
            if lo == 0:
                return f"<{hi:g} Mbps"
            return f"≥{lo:g} Mbps" if math.isinf(hi) else f"{lo:g}–{hi:g} Mbps"
    return "sampled"


def network_groups(clients: pd.DataFrame, profiles: pd.DataFrame | None) -> tuple[pd.Series, list[str]]:
    """Each client row's network tier, and the tiers ordered by download bandwidth.

    Sampled bandwidths (``net_tier`` ``loguniform``/``uniform``) are grouped by decade of the
    client's download bandwidth (``<10 Mbps``, ``10–100 Mbps``, ...).
    """
    tiers = clients["net_tier"].astype(str) if "net_tier" in clients else pd.Series("all", index=clients.index)
    mbps = _profile_column(clients, profiles, "down_mbps")
    sampled = tiers.isin(SAMPLED_NET_TIERS)
    if sampled.any():
        tiers = tiers.where(~sampled, mbps.map(_bandwidth_bin))
    return tiers, _order(tiers, mbps)


def device_groups(clients: pd.DataFrame, profiles: pd.DataFrame | None) -> tuple[pd.Series, list[str]]:
    """Each client row's device tier, and the tiers ordered by speed (GFLOP/s)."""
    tiers = clients["tier"].astype(str) if "tier" in clients else pd.Series("all", index=clients.index)
    return tiers, _order(tiers, _profile_column(clients, profiles, "gflops"))


def arch_groups(clients: pd.DataFrame) -> tuple[pd.Series, list[str]]:
    if "arch" not in clients:
        arch = pd.Series("all", index=clients.index)
    else:
        arch = clients["arch"].fillna("").astype(str).replace("", "all")
    return arch, sorted(arch.unique())


def _order(groups: pd.Series, key: pd.Series) -> list[str]:
    med = key.groupby(groups).median()
    names = list(groups.unique())
    return sorted(names, key=lambda g: (np.nan_to_num(med.get(g, np.nan), nan=np.inf), g))


def stacked_bars(ax, index, parts: list[tuple[str, np.ndarray, str]], width: float = 0.8) -> None:
    """Stacked bars at ``index``: parts = (label, heights, colour)."""
    bottom = np.zeros(len(index))
    for label, heights, colour in parts:
        heights = np.nan_to_num(np.asarray(heights, dtype=float))
        ax.bar(index, heights, width, bottom=bottom, label=label, color=colour, linewidth=0)
        bottom += heights


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit) that shows ``max_bytes`` as 1 to 999 of B, KB, MB or GB (decimal, as human_bytes)."""
    for div, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if np.isfinite(max_bytes) and max_bytes >= div:
            return div, unit
    return 1.0, "B"


def numeric(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce")


def has_values(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and numeric(df[col]).notna().any()


# ---------------------------------------------------------------- virtual time and rates


def virtual_time(t: float, digits: int = 0, day: bool = True) -> str:
    """Seconds since Monday 00:00 -> ``Tue 21:00`` (``digits`` 1: with seconds, 2, 3: and tenths, hundredths;
    ``day`` False: the time of day only); past the first week the week is named (``w2 Mon 08:00``)."""
    if not np.isfinite(t):
        return "–"
    t = round(float(t), max(digits - 1, 0)) if digits else round(float(t) / 60) * 60.0
    days, rest = divmod(t, 86400.0)
    hours, rest = divmod(rest, 3600.0)
    minutes, seconds = divmod(rest, 60.0)
    text = f"{int(hours):02d}:{int(minutes):02d}"
    if digits == 1:
        text += f":{int(round(seconds)):02d}"
    elif digits >= 2:
        text += f":{seconds:0{digits + 2}.{digits - 1}f}"
    return f"{day_name(t)} {text}" if day else text


def day_name(t: float) -> str:
    week, day = divmod(int(t // 86400.0), 7)
    return f"w{week + 1} {DAYS[day]}" if week else DAYS[day]


def time_labels(times, digits: int) -> list[str]:
    """Labels of increasing times: the day on the first and wherever the day changes, else the time only."""
    out, last = [], None
    for t in times:
        name = day_name(t) if np.isfinite(t) else None
        out.append(virtual_time(t, digits, day=name != last))
        last = name
    return out


def label_digits(gap_s: float) -> int:
    """The precision that tells times ``gap_s`` apart: minutes, seconds, tenths or hundredths."""
    return 0 if gap_s >= 60 else 1 if gap_s >= 1 else 2 if gap_s >= 0.1 else 3


def time_axis(ax, lo: float, hi: float, max_ticks: int = 6) -> None:
    """A virtual-time x axis over [lo, hi]: round ticks (0.01 s ... days apart) labelled ``Tue 21:00``,
    ``21:30``, ... (the day where it changes)."""
    span = max(hi - lo, 1e-3)
    pad = 0.03 * span
    lo, hi = lo - pad, hi + pad
    step = next((s for s in TIME_STEPS if (hi - lo) / s <= max_ticks), None)
    if step is None:
        step = 86400.0 * math.ceil((hi - lo) / 86400.0 / max_ticks)
    ticks = np.arange(math.ceil(lo / step) * step, hi, step)
    digits = label_digits(step)
    ax.set_xlim(lo, hi)
    ax.set_xticks(ticks, time_labels(ticks, digits))
    ax.set_xlabel(TIME_LABEL if digits == 0 else TIME_LABEL.replace("hh:mm", "hh:mm:ss"))


def log_rate_axis(ax, vmin: float, vmax: float) -> None:
    """A log y axis over at least a decade around [vmin, vmax], labelled 0.5, 1, 10, 200 (not 2×10²);
    within two decades the 2s and 5s are labelled too."""
    from matplotlib.ticker import FuncFormatter, LogLocator  # matplotlib: only drawing needs it

    lo, hi = vmin / 1.4, vmax * 1.4
    if hi / lo < 10:
        centre = math.sqrt(lo * hi)
        lo, hi = centre / math.sqrt(10), centre * math.sqrt(10)
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(plain)
    if hi / lo <= 100:
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2, 5)))
        ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="both", labelsize=9)


def shaded(colour: str, amount: float) -> tuple[float, float, float]:
    """``colour`` mixed with black (``amount`` < 0) or white (> 0)."""
    from matplotlib.colors import to_rgb  # matplotlib: only drawing needs it

    rgb = np.array(to_rgb(colour))
    mixed = rgb * (1 + amount) if amount < 0 else rgb + (1 - rgb) * amount
    return tuple(float(v) for v in mixed)
