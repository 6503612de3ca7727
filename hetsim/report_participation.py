"""Who took part: the run report's "Participation and fairness" section and the warnings of its banner.

:func:`participation_summary` computes everything from a run's tables (clients.parquet's
``made_deadline`` / ``drop_reason``, profiles.parquet, rounds.parquet), so it works on any run
folder, old ones too, and from a notebook: it returns DataFrames and a ``fairness`` dict::

    from hetsim.report_participation import participation_summary
    p = participation_summary("runs/my-run")      # a folder, an engine Run, or {"clients": df, ...}
    p.outcomes          # client_id x round: aggregated / deadline / ... / "not selected"
    p.clients           # one row per client: selections, aggregations, last accuracy, its profile
    p.fairness          # share aggregated at least once, Gini / Jain of the counts, worst decile

:func:`run_warnings` are the banner's warnings (no arrival, clients never aggregated, accuracy at
chance). See docs/reports.md.

Over 400 lines: the numbers, the warnings drawn from them and the section's panels are one concern
(who took part) and share their helpers; the numbers stay free of matplotlib.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.results import load_run
from hetsim import plots
from hetsim.page import Page
from hetsim.report_conditions import OUTCOME_COLOURS, OUTCOME_ORDER, outcomes

PARTICIPATION_FIGURES = (
    "table-fairness",
    "fig-participation-clients",
    "fig-participation-tiers",
    "table-participation-left-out",
    "fig-accuracy-tier",
)
NOT_SELECTED = "not selected"
RARE_SHARE = 0.25  # "rarely aggregated": in under a quarter of the rounds it was selected in
CHANCE_FACTOR = 1.5  # accuracy at most 1.5 x 1/num_classes counts as "near chance"
# classes per dataset: neither the manifest nor config.yaml records them (engine/data/datasets.py)
DATASET_CLASSES = {"digits": 10, "mnist5k": 10, "mnist": 10, "fashion_mnist": 10, "fashion_mnist_tv": 10,
                   "cifar10": 10, "cifar100": 100, "synthetic": 10}
EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}
PROFILE_SHOWN = ("gflops", "down_mbps", "up_mbps", "latency_s", "availability", "dropout")
MAX_IDS_IN_WARNING = 20
MAX_LEFT_OUT_ROWS = 50  # a large fleet's table stays readable; the DataFrame has them all
MAX_HEATMAP_ROWS = 2000  # clients drawn in the outcome heatmap (a sample of larger fleets: a few pixels each)


@dataclass
class Participation:
    """A run's participation, as DataFrames (see the module docstring)."""

    outcomes: pd.DataFrame  # index client_id, columns round: outcome labels
    clients: pd.DataFrame  # one row per client of the fleet
    shares: dict[str, pd.DataFrame]  # grouping ("device tier", ...) -> tier x outcome, shares of selections
    tier_accuracy: pd.DataFrame  # grouping, tier, round, sim_time_s, pers_acc (mean), clients
    fairness: dict[str, float] = field(default_factory=dict)

    def fairness_frame(self) -> pd.DataFrame:
        """The fairness numbers as one row (a notebook can concat runs)."""
        return pd.DataFrame([self.fairness])


# ---------------------------------------------------------------- numbers


def gini(x) -> float:
    """Gini coefficient of non-negative counts: 0 = equal, → 1 = one holds everything; NaN if all zero."""
    x = np.sort(np.asarray(x, dtype=float))
    n, total = len(x), x.sum()
    if n == 0 or total <= 0:
        return math.nan
    return float(2 * np.sum(np.arange(1, n + 1) * x) / (n * total) - (n + 1) / n)


def jain(x) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 = equal, 1/n = one holds everything; NaN if all zero."""
    x = np.asarray(x, dtype=float)
    sq = np.sum(x ** 2)
    return float(x.sum() ** 2 / (len(x) * sq)) if len(x) and sq > 0 else math.nan


def worst_decile(values) -> float:
    """Mean of the lowest tenth (at least one value) of ``values``, NaN ignored."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    return float(v[: math.ceil(len(v) / 10)].mean()) if len(v) else math.nan


def num_classes(config: dict[str, Any], manifest: dict[str, Any] | None = None) -> int | None:
    """The dataset's number of classes (``manifest.num_classes`` if a run wrote it), None if unknown."""
    if manifest and manifest.get("num_classes"):
        return int(manifest["num_classes"])
    ds = (config or {}).get("dataset") or {}
    params = ds.get("params") or {}
    if params.get("num_classes"):
        return int(params["num_classes"])
    if ds.get("name") == "emnist":
        return EMNIST_CLASSES.get(params.get("split", "balanced"))
    return DATASET_CLASSES.get(ds.get("name"))


# ---------------------------------------------------------------- the summary


def _tables(source) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    if isinstance(source, (str, Path)):
        source = load_run(source)
    if isinstance(source, dict):
        return (source.get("clients", pd.DataFrame()), source.get("rounds", pd.DataFrame()),
                source.get("profiles"))
    return source.clients, source.rounds, source.profiles


def fleet_ids(clients: pd.DataFrame, profiles: pd.DataFrame | None) -> np.ndarray:
    """Every client of the fleet: profiles.parquet's, else those clients.parquet names."""
    ids = clients["client_id"] if "client_id" in clients else pd.Series(dtype=int)
    if profiles is not None and "client_id" in getattr(profiles, "columns", ()):
        ids = pd.concat([profiles["client_id"], ids])
    return np.sort(ids.astype(int).unique())


def participation_summary(source) -> Participation:
    """Participation and fairness of a run: ``source`` is a run folder, an engine ``Run`` or a
    mapping with ``clients``, ``rounds`` and (optionally) ``profiles`` DataFrames."""
    clients, rounds, profiles = _tables(source)
    ids = fleet_ids(clients, profiles)
    round_ids = np.sort(pd.concat([rounds.get("round", pd.Series(dtype=int)),
                                   clients.get("round", pd.Series(dtype=int))]).astype(int).unique())
    c = clients.assign(outcome=outcomes(clients)) if len(clients) else \
        pd.DataFrame(columns=["round", "client_id", "outcome"])
    grid = (c.drop_duplicates(["client_id", "round"], keep="last")
            .pivot(index="client_id", columns="round", values="outcome")
            .reindex(index=ids, columns=round_ids).fillna(NOT_SELECTED))
    grid.index.name, grid.columns.name = "client_id", "round"
    per = _per_client(c, ids, profiles)
    shares = {what: _shares(c, profiles, groups) for what, groups in _groupings(c, profiles).items()}
    return Participation(grid, per, shares, _tier_accuracy(c, rounds, profiles), _fairness(per, rounds, c))


def _per_client(c: pd.DataFrame, ids: np.ndarray, profiles: pd.DataFrame | None) -> pd.DataFrame:
    out = pd.DataFrame({
        "selected": c.groupby("client_id").size(),
        "aggregated": (c["outcome"] == "aggregated").groupby(c["client_id"]).sum(),
    }).reindex(ids, fill_value=0).astype(int)
    out.index.name = "client_id"
    out["aggregated_share"] = out["aggregated"] / out["selected"].where(out["selected"] > 0)
    if "pers_acc" in c:  # each client's latest evaluation
        acc = c.assign(v=plots.numeric(c["pers_acc"])).dropna(subset=["v"]).sort_values("round")
        out["last_pers_acc"] = acc.groupby("client_id")["v"].last().reindex(ids)
    status = np.select([out["selected"] == 0, out["aggregated"] == 0, out["aggregated_share"] < RARE_SHARE],
                       ["never selected", "never aggregated", "rarely aggregated"], "")
    out["participation"] = status
    prof = profiles.set_index("client_id") if profiles is not None and "client_id" in profiles else pd.DataFrame()
    first = c.drop_duplicates("client_id").set_index("client_id")
    for col in ("tier", "net_tier"):
        src = prof[col] if col in prof else first[col] if col in first else pd.Series(dtype=object)
        out[col] = src.reindex(ids).astype(object).fillna("").astype(str).to_numpy()
    for col in PROFILE_SHOWN:
        if col in prof:
            out[col] = prof[col].reindex(ids).to_numpy()
    return out.reset_index()


def _groupings(c: pd.DataFrame, profiles: pd.DataFrame | None) -> dict[str, tuple[pd.Series, list[str]]]:
    """Tier labels of clients.parquet's rows: device, network (sampled bandwidths by decade) and,
    where there is more than one, architecture and condition set."""
    if c.empty:
        return {}
    out = {"device tier": plots.device_groups(c, profiles), "network tier": plots.network_groups(c, profiles)}
    arch, order = plots.arch_groups(c)
    if len(order) > 1:
        out["architecture"] = (arch, order)
    if profiles is not None and "conditions" in profiles:
        sets = c["client_id"].map(profiles.set_index("client_id")["conditions"]).fillna("").astype(str)
        if sets.nunique() > 1:
            out["condition set"] = (sets, sorted(sets.unique()))
    return out


def _shares(c: pd.DataFrame, profiles, groups: tuple[pd.Series, list[str]]) -> pd.DataFrame:
    labels, order = groups
    share = pd.crosstab(labels, c["outcome"], normalize="index").reindex(index=order, fill_value=0.0)
    kinds = [k for k in OUTCOME_ORDER if k in share.columns] + sorted(set(share.columns) - set(OUTCOME_ORDER))
    share = share[kinds]
    share.insert(0, "clients", c.groupby(labels)["client_id"].nunique().reindex(order).to_numpy())
    share.insert(1, "selections", labels.value_counts().reindex(order).to_numpy())
    share.index.name, share.columns.name = "tier", None
    return share


def _tier_accuracy(c: pd.DataFrame, rounds: pd.DataFrame, profiles) -> pd.DataFrame:
    """Mean personalized accuracy per tier and evaluated round (rounds where any client was evaluated)."""
    cols = ["grouping", "tier", "round", "sim_time_s", "pers_acc", "clients"]
    if "pers_acc" not in c or not plots.has_values(c, "pers_acc"):
        return pd.DataFrame(columns=cols)
    acc = plots.numeric(c["pers_acc"])
    evaluated = np.sort(c.loc[acc.notna(), "round"].unique())
    time = rounds.set_index("round")["sim_time_s"] if "sim_time_s" in rounds else pd.Series(dtype=float)
    frames = []
    for what, (labels, order) in _groupings(c, profiles).items():
        if what not in ("device tier", "network tier"):
            continue
        m = (c.assign(tier=labels, v=acc).dropna(subset=["v"]).groupby(["tier", "round"])["v"]
             .agg(["mean", "count"]))
        # every evaluated round per tier: a round without its clients is NaN (a gap, not a line across it)
        full = pd.MultiIndex.from_product([order, evaluated], names=["tier", "round"])
        m = m.reindex(full).reset_index().rename(columns={"mean": "pers_acc", "count": "clients"})
        m["clients"] = m["clients"].fillna(0).astype(int)
        m.insert(0, "grouping", what)
        m["sim_time_s"] = m["round"].map(time)
        frames.append(m[cols])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def _fairness(per: pd.DataFrame, rounds: pd.DataFrame, c: pd.DataFrame) -> dict[str, float]:
    counts = per["aggregated"].to_numpy()
    n = len(per)
    arrived = _arrivals(rounds, c)
    return {
        "clients": n,
        "share_aggregated_once": float((counts > 0).mean()) if n else math.nan,
        "never_aggregated": int(((per["selected"] > 0) & (counts == 0)).sum()),
        "never_selected": int((per["selected"] == 0).sum()),
        "rarely_aggregated": int((per["participation"] == "rarely aggregated").sum()),
        "gini_aggregations": gini(counts),
        "jain_aggregations": jain(counts),
        "worst_decile_pers_acc": worst_decile(per["last_pers_acc"]) if "last_pers_acc" in per else math.nan,
        "rounds_without_arrival": int((arrived == 0).sum()),
    }


def _arrivals(rounds: pd.DataFrame, c: pd.DataFrame) -> pd.Series:
    """Clients aggregated per round (rounds.parquet's ``num_arrived``, else counted in clients.parquet)."""
    if "num_arrived" in rounds and "round" in rounds:
        return rounds.set_index("round")["num_arrived"].fillna(0)
    if "round" not in rounds:
        return pd.Series(dtype=int)
    got = c[c["outcome"] == "aggregated"].groupby("round").size() if len(c) else pd.Series(dtype=int)
    return got.reindex(rounds["round"], fill_value=0)


# ---------------------------------------------------------------- warnings


def run_warnings(run, summary: Participation | None = None) -> list[str]:
    """What makes a run mean little, from its tables: rounds (or the whole run) without an arrival,
    clients never aggregated, accuracy near chance at the end; and the manifest's other warnings
    (validation, resume) but not its end-of-run ones, which the tables give again here."""
    p = summary or participation_summary(run)
    out: list[str] = []
    r = run.rounds
    arrived = _arrivals(r, _with_outcome(run.clients))
    if len(arrived) and (arrived == 0).all():
        up = int(plots.numeric(r["bytes_up"]).sum()) if "bytes_up" in r else 0
        skipped = int(plots.numeric(r["num_nonfinite"]).sum()) if "num_nonfinite" in r else 0
        cause = (f"Every upload was non-finite and skipped ({skipped} in all, train.on_nonfinite: skip_client); "
                 "lower train.lr, or set train.on_nonfinite: stop to end such a run as diverged."
                 if skipped else "Every selected client was lost (see the outcomes below); a deadline the fleet "
                 "cannot meet is the usual cause.")
        trained = "" if _timing_only(run) else ": the global model was never trained"
        out.append(f"No client arrived in any of the {len(arrived)} rounds ({up} bytes uploaded){trained}. {cause}")
    elif (arrived == 0).any():
        empty = arrived.index[arrived.to_numpy() == 0]
        out.append(f"No client arrived in {len(empty)} of {len(arrived)} rounds ({_id_list(empty, 'round')})"
                   + ("." if _timing_only(run) else ": those rounds left the model unchanged."))
    per = p.clients
    never = per[(per["selected"] > 0) & (per["aggregated"] == 0)]
    if len(never):
        by_net = never["net_tier"].replace("", "?").value_counts()
        out.append(f"{len(never)} of {len(per)} clients ({100 * len(never) / len(per):.0f}% of the fleet) were "
                   f"selected but never aggregated: {_id_list(never['client_id'], 'client')}; by network tier: "
                   + ", ".join(f"{t} {n}" for t, n in by_net.items()) + ".")
    chance = _chance_warning(run)
    if chance:
        out.append(chance)
    derived = set(run.manifest.get("result_warnings") or [])  # said above, from the tables
    out.extend(f"the run said: {w}" for w in run.manifest.get("warnings") or [] if w not in derived)
    return out


def _timing_only(run) -> bool:
    return ((getattr(run, "config", None) or {}).get("clock") or {}).get("mode") == "timing_only"


def _with_outcome(clients: pd.DataFrame) -> pd.DataFrame:
    return clients.assign(outcome=outcomes(clients)) if len(clients) else pd.DataFrame(columns=["round", "outcome"])


def _chance_warning(run) -> str | None:
    k = num_classes(run.config, run.manifest)
    col = next((m for m in ("global_acc", "pers_acc") if plots.has_values(run.rounds, m)), None)
    if not k or col is None:
        return None
    final = float(plots.numeric(run.rounds[col]).dropna().iloc[-1])
    if final > CHANCE_FACTOR / k:
        return None
    return (f"Accuracy is still near chance at the end: final {col} {100 * final:.1f}% with {k} classes "
            f"(chance {100 / k:.1f}%; warned at or below {100 * CHANCE_FACTOR / k:.1f}%).")


def _id_list(ids, what: str) -> str:
    ids = [int(i) for i in ids]
    shown = ", ".join(map(str, ids[:MAX_IDS_IN_WARNING]))
    more = f" and {len(ids) - MAX_IDS_IN_WARNING} more" if len(ids) > MAX_IDS_IN_WARNING else ""
    return f"{what}{'s' if len(ids) > 1 else ''} {shown}{more}"


# ---------------------------------------------------------------- the report section


def participation_section(page: Page, run, summary: Participation | None = None, accuracy: bool = True) -> None:
    """The run report's "Participation and fairness" section (each panel guarded on its own);
    ``accuracy``: with the accuracy by tier (a timing-only run has none)."""
    p = summary or participation_summary(run)
    page.section("Participation and fairness")
    page.guarded(("table-fairness",), fairness_table, p, accuracy)
    page.guarded(("fig-participation-clients",), outcome_heatmap, p, run)
    page.guarded(("fig-participation-tiers",), tier_shares_figure, p)
    page.guarded(("table-participation-left-out",), left_out_table, p)
    if accuracy:
        page.guarded(("fig-accuracy-tier",), tier_accuracy_figure, p)


def _pct(v) -> str:
    return "–" if v is None or not np.isfinite(v) else f"{100 * v:.1f}%"


def fairness_table(page: Page, p: Participation, accuracy: bool = True) -> None:
    f = p.fairness
    page.key_values("table-fairness", [
        ("clients aggregated at least once", f"{_pct(f['share_aggregated_once'])} of {f['clients']}"),
        ("selected but never aggregated / never selected", f"{f['never_aggregated']} / {f['never_selected']}"),
        (f"rarely aggregated (in < {RARE_SHARE:.0%} of their selections)", str(f["rarely_aggregated"])),
        ("Gini of aggregation counts (0 = equal)", _fmt3(f["gini_aggregations"])),
        ("Jain index of aggregation counts (1 = equal)", _fmt3(f["jain_aggregations"])),
        *([("worst-decile personalized accuracy (each client's last)", _pct(f["worst_decile_pers_acc"]))]
          if accuracy else []),
        ("rounds in which no client arrived", str(f["rounds_without_arrival"])),
    ])


def _fmt3(v: float) -> str:
    return "–" if not np.isfinite(v) else f"{v:.3f}"


def outcome_heatmap(page: Page, p: Participation, run) -> None:
    from matplotlib.colors import BoundaryNorm, ListedColormap  # matplotlib: only drawing needs it
    from matplotlib.patches import Patch  # matplotlib: only drawing needs it

    grid = p.outcomes
    if grid.empty or not grid.shape[1]:
        page.omit("fig-participation-clients", "fig-participation-clients: no client rounds in clients.parquet")
        return
    per = p.clients.set_index("client_id")
    # rows: network tier (slowest first), then device tier, then id: who is left out shows as blocks
    net_labels, net_order = plots.network_groups(per.reset_index(), _profiles(run))
    dev_labels, dev_order = plots.device_groups(per.reset_index(), _profiles(run))
    key = pd.DataFrame({"n": pd.Categorical(net_labels, net_order).codes,
                        "d": pd.Categorical(dev_labels, dev_order).codes, "id": per.index}, index=per.index)
    rows = key.sort_values(["n", "d", "id"]).index
    total = len(rows)
    if total > MAX_HEATMAP_ROWS:  # a large fleet: an even sample in the same order (each tier in proportion)
        rows = rows[np.linspace(0, total - 1, MAX_HEATMAP_ROWS).round().astype(int)]
    shown = grid.loc[rows]
    present = set(pd.unique(shown.to_numpy().ravel()))
    kinds = [k for k in OUTCOME_ORDER if k in present] + sorted(present - set(OUTCOME_ORDER))
    code = {k: i for i, k in enumerate(kinds)}
    values = pd.Categorical(shown.to_numpy().ravel(), categories=kinds).codes.reshape(shown.shape).astype(float)
    cmap = ListedColormap([OUTCOME_COLOURS.get(k, plots.PALETTE[i % len(plots.PALETTE)]) for i, k in enumerate(kinds)])
    norm = BoundaryNorm(np.arange(len(kinds) + 1) - 0.5, len(kinds))
    fig, (ax,) = plots.figure(height=min(10.0, max(3.4, 1.6 + 0.17 * len(rows))))
    ax.grid(False)
    ax.imshow(values, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    rounds = grid.columns.to_numpy()
    step = max(1, math.ceil(len(rounds) / 20))
    ax.set_xticks(np.arange(0, len(rounds), step), [str(r) for r in rounds[::step]], fontsize=8)
    ax.set_xlabel("round")
    if len(rows) <= 60:
        labels = pd.Series(per.index.astype(str) + "  " + per["tier"].to_numpy() + " · " + net_labels.to_numpy(),
                           index=per.index).reindex(rows)
        ax.set_yticks(np.arange(len(rows)), labels.tolist(), fontsize=7 if len(rows) > 30 else 8)
    else:
        ax.set_yticks([])
    ax.set_ylabel("client (device tier · network tier)")
    net_sorted = pd.Series(net_labels.to_numpy(), index=per.index).reindex(rows).to_numpy()
    for i in np.flatnonzero(net_sorted[1:] != net_sorted[:-1]) + 1:  # a line between network tiers
        ax.axhline(i - 0.5, color="black", linewidth=1.2)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title("Each client's outcome per round, clients by network tier (slowest first) and device tier",
                 loc="left", fontsize=11)
    handles = [Patch(facecolor=cmap(code[k]), edgecolor="#999999", linewidth=0.5, label=k) for k in kinds]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 9), fontsize=8, frameon=False)
    sample = (f"{len(rows):,} of the {total:,} clients, evenly spread in this order; "
              if len(rows) < total else "")
    page.figure("fig-participation-clients", fig,
                f"{sample}aggregated: arrived and used; deadline: too slow; over_selected: finished after the round's "
                "target was met; dropout: failed mid-round; unavailable: offline when selected; offline: left "
                "before its upload was done; nonfinite: its upload had NaN/inf; not selected: not chosen that round")


def _profiles(run):
    return getattr(run, "profiles", None)


def tier_shares_figure(page: Page, p: Participation) -> None:
    if not p.shares:
        page.omit("fig-participation-tiers", "fig-participation-tiers: clients.parquet is empty")
        return
    kinds = list(dict.fromkeys(k for s in p.shares.values() for k in s.columns[2:]))
    kinds = [k for k in OUTCOME_ORDER if k in kinds] + sorted(set(kinds) - set(OUTCOME_ORDER))
    heights = [max(len(s), 1) for s in p.shares.values()]
    fig, axes = plots.figure(ncols=len(p.shares), height=max(2.6, 1.2 + 0.35 * max(heights)))
    for ax, (what, share) in zip(axes, p.shares.items()):
        share = share.iloc[::-1]  # slowest on top
        left = np.zeros(len(share))
        names = [f"{t} ({n} selected)" for t, n in zip(share.index, share["clients"])]
        for k in kinds:
            v = share[k].to_numpy() if k in share else np.zeros(len(share))
            ax.barh(names, v, left=left, color=OUTCOME_COLOURS.get(k, "#777777"), label=k)
            left += v
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of selections")
        ax.set_title(f"Outcome by {what}", loc="left", fontsize=11)
    plots.fig_legend(fig, axes[0])
    page.figure("fig-participation-tiers", fig, "each tier's selections by outcome; (n selected): its clients that "
                "were ever selected (the time panels count those of them that ran); sampled bandwidths are "
                "grouped by decade of the download bandwidth")


def left_out_table(page: Page, p: Participation) -> None:
    per = p.clients
    left = per[per["participation"].isin(["never aggregated", "rarely aggregated"])]
    if left.empty:
        # not missing data but the good case: a sentence, not an "omitted" note
        page.text("No client was left out: every client that was selected was aggregated in at least "
                  f"{RARE_SHARE:.0%} of its selections.")
        return
    cols = [c for c in ("client_id", "participation", "selected", "aggregated", "tier", "net_tier",
                        *PROFILE_SHOWN, "last_pers_acc") if c in left]
    left = left.sort_values(["aggregated", "client_id"])[cols]
    more = f"; the first {MAX_LEFT_OUT_ROWS} of {len(left)} (all: participation_summary)" \
        if len(left) > MAX_LEFT_OUT_ROWS else ""
    page.table("table-participation-left-out", left.head(MAX_LEFT_OUT_ROWS), {"last_pers_acc": _pct},
               caption=f"clients never aggregated, or in fewer than {RARE_SHARE:.0%} of the rounds they were "
                       f"selected in, with their profile (profiles.parquet){more}")


def tier_accuracy_figure(page: Page, p: Participation) -> None:
    t = p.tier_accuracy
    if t.empty:
        page.omit("fig-accuracy-tier", "fig-accuracy-tier: clients.parquet has no per-client pers_acc")
        return
    groupings = list(dict.fromkeys(t["grouping"]))
    fig, axes = plots.figure(ncols=len(groupings), height=3.8, sharey=True)
    for ax, what in zip(axes, groupings):
        mine = t[t["grouping"] == what]
        order = list(dict.fromkeys(mine["tier"]))
        colours = plots.colour_map(order)
        for tier in order:
            line = mine[mine["tier"] == tier].sort_values("round")
            ax.plot(line["sim_time_s"], line["pers_acc"], "-", color=colours[tier], label=tier,
                    marker=plots.marker_for(len(line)), markersize=3)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8, loc="best")
        ax.set_title(f"Personalized accuracy by {what}", loc="left", fontsize=11)
    axes[0].set_ylabel("mean personalized accuracy")
    page.figure("fig-accuracy-tier", fig, "mean over the tier's clients evaluated in the round (each on its "
                "local test split); a gap: none of the tier's clients was evaluated in that round")
