"""Shared plotting helpers: figures on the Agg canvas, fixed colours, tier grouping.

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
    "unavailable": "#9E9E9E",
}
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
           "#8C8C8C", "#CCB974", "#64B5CD")
SAMPLED_NET_TIERS = ("loguniform", "uniform", "")
# decade bins for sampled bandwidths (Mbit/s)
BANDWIDTH_EDGES = (0.0, 10.0, 100.0, 1000.0, math.inf)


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


def round_ticks(ax) -> None:
    """Integer ticks on a round axis."""
    from matplotlib.ticker import MaxNLocator  # matplotlib: only drawing needs it (see figure)

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")


def fig_legend(fig, ax) -> None:
    """One legend for all panels, below them (the panels share their series)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6), fontsize=8,
                   frameon=False)


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


def numeric(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce")


def has_values(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and numeric(df[col]).notna().any()
