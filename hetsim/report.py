"""``hetsim report PATH``: one self-contained HTML page for a run folder or a sweep folder.

The page embeds every figure (base64 PNG, no external URL) and the PNGs are also written beside
it, in ``<page stem>_figures/<figure id>.png``. Figure ids are stable (:data:`RUN_FIGURES`,
:data:`ASCEND_FIGURES`, :data:`FEDCSPACK_FIGURES`, :data:`SWEEP_FIGURES`); a panel whose data
is missing is replaced by a note. See docs/reports.md.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetsim import plots
from hetsim.common import human_bytes, is_sweep_folder
from hetsim.page import Page

RUN_FIGURES = (
    "fig-accuracy-round",
    "fig-accuracy-time",
    "fig-time-device-tier",
    "fig-time-network-tier",
    "fig-bytes",
    "fig-participation",
)
ASCEND_FIGURES = (
    "fig-ascend-arms-network",
    "fig-ascend-arms-arch",
    "fig-ascend-q",
    "fig-ascend-rewards",
    "fig-ascend-rollbacks",
)
FEDCSPACK_FIGURES = (
    "fig-fedcspack-share",
    "fig-fedcspack-saving",
    "fig-fedcspack-packs",
)
SWEEP_FIGURES = (
    "table-sweep-best",
    "fig-sweep-curves",
)  # plus one fig-sweep-param-<column> per hyperparameter (sweep_param_figure_id)
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
    from engine.results import load_run
    from hetsim.compare import run_summary

    run = load_run(path)
    cfg = run.config or {}
    algo = (cfg.get("algorithm") or {}).get("name") or run.manifest.get("algorithm", "?")
    dataset = (cfg.get("dataset") or {}).get("name") or run.manifest.get("dataset", "?")
    page = Page(f"hetsim run: {path.name}",
                f"{algo} on {dataset}, {run.manifest.get('num_clients', '?')} clients, "
                f"status {run.manifest.get('status', '?')}")
    s = run_summary(run)
    page.key_values("table-run-summary", [
        ("run folder", str(path)),
        ("status", str(run.manifest.get("status", "?"))),
        ("algorithm / dataset / model", f"{algo} / {dataset} / {(cfg.get('model') or {}).get('name', '?')}"),
        ("seed", str(cfg.get("seed", run.manifest.get("seed", "?")))),
        ("rounds", f"{s['rounds']} of {cfg.get('rounds', '?')}"),
        ("global accuracy: final / best", f"{_pct(s['final_global_acc'])} / {_pct(s['best_global_acc'])}"),
        ("personalized accuracy: final / best", f"{_pct(s['final_pers_acc'])} / {_pct(s['best_pers_acc'])}"),
        ("simulated time", f"{s['sim_time_s']:.2f} s"),
        ("upload / download", f"{human_bytes(s['bytes_up'])} / {human_bytes(s['bytes_down'])}"),
        ("wall time", f"{s['wall_s']:.1f} s" if np.isfinite(s["wall_s"]) else "–"),
    ])
    if run.rounds.empty:
        page.text("This run has no finished rounds yet: nothing to plot.")
        for fig_id in RUN_FIGURES:
            page.omit(fig_id, f"{fig_id}: no rounds in rounds.parquet")
        return page

    page.section("Accuracy")
    page.guarded(("fig-accuracy-round", "fig-accuracy-time"), accuracy_figures, run)
    page.section("Where the simulated time goes")
    page.guarded(("fig-time-device-tier", "fig-time-network-tier"), time_figures, run)
    page.section("Traffic and participation")
    page.guarded(("fig-bytes",), bytes_figure, run)
    page.guarded(("fig-participation",), participation_figure, run)
    if "arm" in run.clients.columns or algo == "ascend":
        page.section("ASCEND: compressor choice")
        page.guarded(ASCEND_FIGURES, ascend_figures, run)
    if "packs_shared" in run.clients.columns or algo == "fedcspack":
        page.section("FedCSPACK: shared packs")
        page.guarded(FEDCSPACK_FIGURES, fedcspack_figures, run)
    import yaml

    page.preformatted("resolved config (config.yaml)", yaml.safe_dump(cfg, sort_keys=False))
    return page


def _pct(v: float) -> str:
    return "–" if v is None or not np.isfinite(v) else f"{100 * v:.2f}%"


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
    page.row()
    for fig_id, x, xlabel in (("fig-accuracy-round", "round", "round"),
                              ("fig-accuracy-time", "sim_time_s", "simulated time (s)")):
        fig, (ax,) = plots.figure(width=6.6, height=4.0)
        for col, label, colour, style in ACCURACY_LINES:
            if col not in metrics:
                continue
            ev = r[[x, col]].assign(v=plots.numeric(r[col])).dropna(subset=["v"])
            ax.plot(ev[x], ev["v"], style, color=colour, label=label,
                    marker=plots.marker_for(len(ev)), markersize=3.5)
            if col == "pers_acc" and plots.has_values(r, "pers_acc_std"):
                std = plots.numeric(r.loc[ev.index, "pers_acc_std"])
                ax.fill_between(ev[x], (ev["v"] - std).clip(0, 1), (ev["v"] + std).clip(0, 1), color=colour, alpha=0.15,
                                linewidth=0, label="personalized ± 1 std")
        for i, col in enumerate(arch_cols):
            ev = r[[x]].assign(v=plots.numeric(r[col])).dropna(subset=["v"])
            ax.plot(ev[x], ev["v"], ":", color=plots.PALETTE[(i + 4) % len(plots.PALETTE)],
                    label=f"global: {col[len('global_acc_'):]}")
        if x == "round":
            plots.round_ticks(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1.02)
        ax.legend(loc="best", fontsize=8)
        title = "Accuracy per round" if x == "round" else "Accuracy against simulated time"
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
    for fig_id, (groups, order), what in (
        ("fig-time-device-tier", plots.device_groups(ran, run.profiles), "device tier"),
        ("fig-time-network-tier", plots.network_groups(ran, run.profiles), "network tier"),
    ):
        _phase_panels(page, fig_id, ran, r, groups, order, what)


def _phase_panels(page, fig_id, ran, rounds, groups, order, what) -> None:
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
        ax.step(all_rounds, round_s.reindex(all_rounds).to_numpy(), where="mid", color="black",
                linewidth=1, label="round time (slowest arrived)")
        n_clients = ran.loc[groups == g, "client_id"].nunique()
        ax.set_title(f"{g}  ({n_clients} clients)", loc="left", fontsize=10)
        plots.round_ticks(ax)
    axes[0].set_ylabel("simulated s (mean per client)")
    for row_start in range(0, len(axes), ncols):
        axes[row_start].set_ylabel("simulated s (mean per client)")
    plots.hide_unused(axes, len(order))
    plots.fig_legend(fig, axes[0])
    fig.suptitle(f"Simulated time per round by {what}: download / compute / compress / upload",
                 x=0.01, ha="left", fontsize=11)
    page.figure(fig_id, fig, f"bars: mean phase seconds of the {what}'s clients that ran in the "
                "round; line: the round's simulated time (slowest client that arrived, or the deadline)")


# ---------------------------------------------------------------- bytes and participation


def bytes_figure(page: Page, run) -> None:
    r = run.rounds
    if not {"bytes_up", "bytes_down"} <= set(r.columns):
        page.omit("fig-bytes", "fig-bytes: rounds.parquet has no bytes_up / bytes_down")
        return
    fig, (ax,) = plots.figure(height=3.2)
    x = r["round"].to_numpy()
    ax.bar(x - 0.2, r["bytes_down"] / 1e6, 0.4, label="download", color="#4C72B0")
    ax.bar(x + 0.2, r["bytes_up"] / 1e6, 0.4, label="upload", color="#C44E52")
    plots.round_ticks(ax)
    ax.set_ylabel("MB per round")
    ax.legend(fontsize=8)
    ax.set_title(f"Bytes per round (total: {human_bytes(r['bytes_down'].sum())} down, "
                 f"{human_bytes(r['bytes_up'].sum())} up)", loc="left", fontsize=11)
    page.figure("fig-bytes", fig, "download: broadcast to the clients that ran; upload: payloads "
                "of the clients that arrived (exact payload bytes)")


def _outcome(clients: pd.DataFrame) -> pd.Series:
    reason = clients["drop_reason"].fillna("").astype(str) if "drop_reason" in clients else pd.Series("", index=clients.index)
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
    plots.stacked_bars(ax, rounds, [(k, counts.get(k, pd.Series(0, index=rounds)).to_numpy(), colours[k]) for k in kinds])
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
                "dropout: failed mid-round; unavailable: offline when selected")


# ---------------------------------------------------------------- ASCEND


def _arms(run) -> list[str]:
    c = run.clients
    known = list((run.config.get("algorithm") or {}).get("arms") or [])
    seen = [a for a in c["arm"].dropna().astype(str).unique() if a] if "arm" in c else []
    qs = [col[2:] for col in c.columns if col.startswith("q_")]
    out = []
    for a in [*known, *sorted(seen), *qs]:
        if a not in out:
            out.append(a)
    return out


def ascend_figures(page: Page, run) -> None:
    c = run.clients
    if "arm" not in c.columns or not c["arm"].notna().any():
        for fig_id in ASCEND_FIGURES:
            page.omit(fig_id, f"{fig_id}: clients.parquet has no ASCEND trace (column 'arm')")
        return
    arms = _arms(run)
    colours = plots.colour_map(arms)
    chose = c[c["arm"].notna() & (c["arm"].astype(str) != "")]
    net, net_order = plots.network_groups(chose, run.profiles)
    arch, arch_order = plots.arch_groups(chose)
    for fig_id, groups, order, what in (("fig-ascend-arms-network", net, net_order, "network tier"),
                                        ("fig-ascend-arms-arch", arch, arch_order, "architecture")):
        page.guarded((fig_id,), _arm_share_panels, fig_id, chose, run.rounds, groups, order, arms,
                     colours, what)
    page.guarded(("fig-ascend-q",), _q_panels, run, net_order, arms, colours)
    page.guarded(("fig-ascend-rewards",), _reward_panels, run, arms, colours)
    page.guarded(("fig-ascend-rollbacks",), _rollback_panel, run)


def _arm_share_panels(page, fig_id, chose, rounds, groups, order, arms, colours, what) -> None:
    ncols, nrows = plots.grid_shape(len(order))
    fig, axes = plots.figure(ncols=ncols, nrows=nrows, height=3.0, sharey=True)
    all_rounds = np.sort(rounds["round"].unique())
    for ax, g in zip(axes, order):
        sub = chose[groups.values == g]
        share = pd.crosstab(sub["round"], sub["arm"].astype(str), normalize="index").reindex(all_rounds)
        plots.stacked_bars(ax, all_rounds, [(a, share.get(a, pd.Series(0.0, index=all_rounds)).to_numpy(),
                                             colours[a]) for a in arms])
        ax.set_ylim(0, 1)
        ax.set_title(f"{g}  ({sub['client_id'].nunique()} clients)", loc="left", fontsize=10)
        plots.round_ticks(ax)
    for row_start in range(0, len(axes), ncols):
        axes[row_start].set_ylabel("share of uploads")
    plots.hide_unused(axes, len(order))
    plots.fig_legend(fig, axes[0])
    fig.suptitle(f"Compressor chosen per round, by {what}", x=0.01, ha="left", fontsize=11)
    page.figure(fig_id, fig, "share of the clients that trained in the round choosing each arm "
                "(warm-up, exploration, exploitation and forced Top-K after a rollback alike)")


def _q_panels(page, run, net_order, arms, colours) -> None:
    c = run.clients
    q_cols = {col[2:]: col for col in c.columns if col.startswith("q_") and plots.has_values(c, col)}
    policy = (run.config.get("algorithm") or {}).get("policy", "egreedy")
    if not q_cols:
        page.omit("fig-ascend-q", f"fig-ascend-q: no Q values or probabilities recorded "
                  f"(policy {policy!r}: a fixed arm has none)")
        return
    ylabel = "arm probability" if policy == "exp3" else "Q (EMA of rewards)"
    groups, _ = plots.network_groups(c, run.profiles)
    order = [g for g in net_order if (groups == g).any()] or sorted(groups.unique())
    ncols, nrows = plots.grid_shape(len(order))
    fig, axes = plots.figure(ncols=ncols, nrows=nrows, height=3.0, sharey=True)
    rounds = np.sort(run.rounds["round"].unique())
    for ax, g in zip(axes, order):
        sub = c[groups.values == g]
        for arm in arms:
            if arm not in q_cols:
                continue
            # a client's policy state holds between its participations: carry it forward, then
            # average over the tier's clients that have one
            state = (sub.assign(q=plots.numeric(sub[q_cols[arm]]))
                     .pivot_table(index="round", columns="client_id", values="q", aggfunc="last")
                     .reindex(rounds).ffill())
            m = state.mean(axis=1)
            ax.plot(m.index, m.values, color=colours[arm], label=arm, marker=plots.marker_for(len(m)),
                    markersize=3)
        ax.set_title(f"{g}", loc="left", fontsize=10)
        plots.round_ticks(ax)
    for row_start in range(0, len(axes), ncols):
        axes[row_start].set_ylabel(ylabel)
    plots.hide_unused(axes, len(order))
    plots.fig_legend(fig, axes[0])
    fig.suptitle(f"{ylabel} per arm, mean over the network tier's clients ({policy})",
                 x=0.01, ha="left", fontsize=11)
    page.figure("fig-ascend-q", fig, "each client's policy state after its latest choice (q_<arm> "
                "columns of docs/ascend.md, carried forward between its participations), averaged "
                "over the tier's clients")


def _reward_panels(page, run, arms, colours) -> None:
    c = run.clients
    if not plots.has_values(c, "reward"):
        page.omit("fig-ascend-rewards", "fig-ascend-rewards: no reward was closed (column 'reward' "
                  "is empty: a client is rewarded one participation late)")
        return
    arm_col = "reward_arm" if "reward_arm" in c else "arm"
    rw = c[plots.numeric(c["reward"]).notna()].copy()
    rw["reward"] = plots.numeric(rw["reward"])
    rw["_arm"] = rw[arm_col].fillna("").astype(str)
    fig, (ax, ax2) = plots.figure(ncols=2, height=3.4, gridspec_kw={"width_ratios": [2.2, 1]})
    # the round a reward belongs to (closed one participation later)
    xcol = "reward_round" if "reward_round" in rw and (plots.numeric(rw["reward_round"]) >= 0).any() else "round"
    rng = np.random.default_rng(0)
    for arm in arms:
        sub = rw[rw["_arm"] == arm]
        if sub.empty:
            continue
        x = plots.numeric(sub[xcol]).to_numpy(dtype=float)
        ax.scatter(x + rng.uniform(-0.18, 0.18, len(x)), sub["reward"], s=9, alpha=0.45,
                   color=colours[arm], linewidths=0)
        m = sub.groupby(plots.numeric(sub[xcol]))["reward"].mean()
        ax.plot(m.index, m.values, "-o", color=colours[arm], label=f"{arm} (mean)", linewidth=1.2,
                markersize=3.5, alpha=0.9)
    ax.axhline(0, color="#888", linewidth=0.8)
    plots.round_ticks(ax)
    ax.set_xlabel("round of the rewarded upload" if xcol == "reward_round" else "round")
    ax.set_ylabel("reward")
    ax.legend(fontsize=8)
    ax.set_title("Rewards by arm", loc="left", fontsize=11)
    groups, order = plots.network_groups(rw, run.profiles)
    table = rw.groupby([groups.values, "_arm"])["reward"].mean().unstack()
    table = table.reindex(index=[g for g in order if g in table.index])
    width = 0.8 / max(len(arms), 1)
    pos = np.arange(len(table))
    for i, arm in enumerate(arms):
        if arm in table:
            ax2.bar(pos + (i - (len(arms) - 1) / 2) * width, table[arm].to_numpy(), width,
                    color=colours[arm], label=arm)
    ax2.set_xticks(pos, table.index, fontsize=8)
    ax2.axhline(0, color="#888", linewidth=0.8)
    ax2.set_title("Mean reward by network tier", loc="left", fontsize=11)
    page.figure("fig-ascend-rewards", fig, "r = clip((ρ·ΔD + (1−ρ)·Δf) / (T/T̄)); points: one "
                "closed reward each (jittered), lines: mean per round")


def _rollback_panel(page, run) -> None:
    r = run.rounds
    rollbacks = run.table("rollbacks")
    gamma = (run.config.get("algorithm") or {}).get("gamma", None)
    if not plots.has_values(r, "server_probe_loss"):
        page.omit("fig-ascend-rollbacks", "fig-ascend-rollbacks: rounds.parquet has no "
                  "server_probe_loss (rollback guard trace)")
        return
    fig, (ax,) = plots.figure(height=3.4)
    x = r["round"].to_numpy()
    ax.plot(x, plots.numeric(r["server_probe_loss"]), "-o", markersize=3, color="#4C72B0",
            label="probe loss of the candidate models")
    if plots.has_values(r, "server_probe_loss_ref"):
        ref = plots.numeric(r["server_probe_loss_ref"])
        ax.plot(x, ref, "--", color="#555", label="reference (last accepted)")
        if gamma is not None:
            ax.plot(x, (1 + float(gamma)) * ref, ":", color="#C44E52", label=f"threshold (1+γ)·ref, γ={gamma}")
    rolled = r[plots.numeric(r.get("server_rollback", pd.Series(0, index=r.index))).fillna(0) > 0]
    if len(rolled):
        ax.scatter(rolled["round"], plots.numeric(rolled["server_probe_loss"]), marker="x", s=60,
                   color="#C44E52", zorder=5, label="rolled back")
    forced = _forced_rounds(run)
    for i, rnd in enumerate(forced):
        ax.axvspan(rnd - 0.5, rnd + 0.5, color="#E0C36B", alpha=0.25, linewidth=0,
                   label="Top-K forced" if i == 0 else None)
    plots.round_ticks(ax)
    ax.set_ylabel("global probe loss")
    n = len(rolled)
    guard = "guard off (gamma: null)" if gamma is None and "gamma" in (run.config.get("algorithm") or {}) else f"{n} rollback(s)"
    ax.set_title(f"Rollback guard: {guard}", loc="left", fontsize=11)
    ax.legend(fontsize=8)
    page.figure("fig-ascend-rollbacks", fig, "a round whose probe loss exceeds the threshold is "
                "rolled back: models and residuals restored, Top-K forced for the next rounds")
    if rollbacks is not None and len(rollbacks):
        page.table("table-ascend-rollbacks", rollbacks.reset_index(drop=True))
    else:
        page.text("No rollbacks in this run (rollbacks.parquet is absent).")


def _forced_rounds(run) -> list[int]:
    c = run.clients
    if "arm_reason" not in c:
        return []
    return sorted(int(v) for v in c.loc[c["arm_reason"].astype(str) == "forced", "round"].unique())


# ---------------------------------------------------------------- FedCSPACK


def fedcspack_figures(page: Page, run) -> None:
    c = run.clients
    if not plots.has_values(c, "packs_shared") or not plots.has_values(c, "packs_total"):
        for fig_id in FEDCSPACK_FIGURES:
            page.omit(fig_id, f"{fig_id}: clients.parquet has no FedCSPACK trace (packs_shared)")
        return
    sent = c[plots.numeric(c["packs_total"]) > 0].copy()
    if "made_deadline" in sent:
        sent = sent[sent["made_deadline"].fillna(False).astype(bool)]
    sent["share"] = plots.numeric(sent["packs_shared"]) / plots.numeric(sent["packs_total"])
    rounds = np.sort(run.rounds["round"].unique())
    fig, (ax,) = plots.figure(height=3.4)
    g = sent.groupby("round")["share"]
    mean, lo, hi = (g.mean().reindex(rounds), g.min().reindex(rounds), g.max().reindex(rounds))
    ax.plot(rounds, mean, "-o", markersize=3, color="#4C72B0", label="packs shared (mean)")
    ax.fill_between(rounds, lo, hi, color="#4C72B0", alpha=0.15, linewidth=0, label="min – max over clients")
    if plots.has_values(sent, "packs_below_threshold"):
        below = (plots.numeric(sent["packs_below_threshold"]) / plots.numeric(sent["packs_total"]))
        ax.plot(rounds, below.groupby(sent["round"]).mean().reindex(rounds), "--", color="#DD8452",
                label="candidates (θ_ij < θ_a, before the Top-K cap)")
    ax.set_ylim(0, 1.02)
    plots.round_ticks(ax)
    ax.set_ylabel("share of the J packs")
    ax.legend(fontsize=8)
    ax.set_title("Share of packs sent per round (arrived clients)", loc="left", fontsize=11)
    page.figure("fig-fedcspack-share", fig, "packs_shared / packs_total per client; the candidates "
                "are the packs that drifted from the previous global model")
    page.guarded(("fig-fedcspack-saving",), _fedcspack_saving, run, sent, rounds)
    page.guarded(("fig-fedcspack-packs",), _fedcspack_heatmap, run)


def _fedcspack_saving(page, run, sent, rounds) -> None:
    pack_size = (run.config.get("algorithm") or {}).get("pack_size")
    if not pack_size or not plots.has_values(sent, "bytes_up"):
        page.omit("fig-fedcspack-saving", "fig-fedcspack-saving: needs algorithm.pack_size in "
                  "config.yaml and the clients' bytes_up")
        return
    dense = 4.0 * float(pack_size) * plots.numeric(sent["packs_total"])  # every pack, float32
    up = plots.numeric(sent["bytes_up"])
    per_round = pd.DataFrame({"round": sent["round"], "up": up, "dense": dense}).groupby("round").sum()
    per_round = per_round.reindex(rounds, fill_value=0.0)
    saving = 1 - per_round["up"] / per_round["dense"].where(per_round["dense"] > 0)
    fig, (ax, ax2) = plots.figure(ncols=2, height=3.4)
    ax.bar(rounds, 100 * saving.to_numpy(), color="#55A868")
    total = 1 - up.sum() / dense.sum() if dense.sum() > 0 else math.nan
    ax.axhline(100 * total, color="#333", linewidth=0.8, linestyle="--", label=f"whole run: {100 * total:.1f}%")
    ax.set_ylim(min(0, 100 * np.nanmin(saving.to_numpy(dtype=float), initial=0)), 100)
    plots.round_ticks(ax)
    ax.set_ylabel("upload saving (%)")
    ax.legend(fontsize=8)
    ax.set_title("Upload saving vs. sending every pack", loc="left", fontsize=11)
    ax2.plot(rounds, per_round["dense"].cumsum() / 1e6, color="#888", label="every pack (dense)")
    ax2.plot(rounds, per_round["up"].cumsum() / 1e6, color="#C44E52", label="FedCSPACK upload")
    plots.round_ticks(ax2)
    ax2.set_ylabel("cumulative MB uploaded")
    ax2.legend(fontsize=8)
    ax2.set_title("Cumulative upload", loc="left", fontsize=11)
    page.figure("fig-fedcspack-saving", fig, "saving = 1 − bytes_up / (4·P·J) summed over the "
                "arrived clients (J·P float32 values: the whole model, padded to packs)")


def _fedcspack_heatmap(page, run) -> None:
    packs = run.table("packs")
    if packs is None or packs.empty:
        page.omit("fig-fedcspack-packs", "fig-fedcspack-packs: no packs.parquet — run with "
                  "algorithm.record_packs: true for the pack-sharing heat map")
        return
    c = run.clients
    packs = packs.assign(arch=packs["arch"].fillna("").astype(str).replace("", "all")) if "arch" in packs \
        else packs.assign(arch="all")
    archs = sorted(packs["arch"].unique())
    arrived = c[c["made_deadline"].fillna(False).astype(bool)] if "made_deadline" in c else c
    arr_arch, _ = plots.arch_groups(arrived)
    n_arrived = arrived.groupby([arr_arch.values, "round"]).size()
    rounds = np.sort(run.rounds["round"].unique())
    fig, axes = plots.figure(ncols=len(archs), height=3.8)
    im = None
    for ax, arch in zip(axes, archs):
        sub = packs[packs["arch"] == arch]
        totals = plots.numeric(arrived.loc[arr_arch.values == arch, "packs_total"]) if "packs_total" in arrived \
            else pd.Series(dtype=float)
        n_packs = max(int(np.nan_to_num(totals.max(), nan=0)), int(sub["pack"].max()) + 1)
        counts = sub.groupby(["pack", "round"]).size().unstack(fill_value=0)
        counts = counts.reindex(index=range(n_packs), columns=rounds, fill_value=0)
        denom = np.array([n_arrived.get((arch, r), 0) for r in rounds], dtype=float)
        share = counts.to_numpy(dtype=float) / np.where(denom > 0, denom, np.nan)
        im = ax.imshow(share, aspect="auto", origin="lower", interpolation="nearest", cmap="viridis",
                       vmin=0, vmax=1, extent=(rounds[0] - 0.5, rounds[-1] + 0.5, -0.5, n_packs - 0.5))
        ax.grid(False)
        plots.round_ticks(ax)
        ax.set_ylabel("pack index")
        ax.set_title(f"Pack sharing ({arch}, J = {n_packs})" if len(archs) > 1 else f"Pack sharing (J = {n_packs})",
                     loc="left", fontsize=11)
    if im is not None:
        fig.colorbar(im, ax=axes, label="share of arrived clients sending the pack", shrink=0.9)
    page.figure("fig-fedcspack-packs", fig, "from packs.parquet (record_packs: true): which packs "
                "the clients that arrived shared in each round")


# ====================================================================== sweep report

TOP_TRIALS = 10  # rows of the best-configurations table
TOP_CURVES = 5  # learning curves drawn


def sweep_param_figure_id(column: str) -> str:
    """The id of the figure of the sweep metric against one hyperparameter column."""
    import re

    return "fig-sweep-param-" + (re.sub(r"[^A-Za-z0-9]+", "-", column).strip("-").lower() or "x")


def sweep_page(path: Path) -> Page:
    import sweeps

    s = sweeps.load_sweep(path)
    t = s.trials
    metric, mode = s.metric, s.mode
    name = s.spec.get("name") or path.name
    base = s.spec.get("base") or {}
    algo = (base.get("algorithm") or {}).get("name", "?")
    dataset = (base.get("dataset") or {}).get("name", "?")
    page = Page(f"hetsim sweep: {name}", f"{algo} on {dataset}; {len(t)} trials, ranked by the "
                f"{'highest' if mode == 'max' else 'lowest'} {metric} of each trial")
    counts = t["status"].value_counts().to_dict() if len(t) else {}
    page.key_values("table-sweep-summary", [
        ("sweep folder", str(path)),
        ("trials", ", ".join(f"{v} {k}" for k, v in counts.items()) or "none"),
        ("planned trials", str(s.num_trials if s.num_trials is not None else "?")),
        ("metric", f"{metric} ({mode})"),
        ("hyperparameters", ", ".join(f"{k} → {v}" for k, v in s.param_columns.items())),
        ("rounds per trial", str(base.get("rounds", "?"))),
    ])
    best_col = f"best_{metric}"
    ok = t[(t["status"] != "error") & pd.to_numeric(t.get(best_col, pd.Series(dtype=float)), errors="coerce").notna()] \
        if len(t) and best_col in t else t.iloc[0:0]
    page.section("Best configurations")
    if ok.empty:
        page.omit("table-sweep-best", f"table-sweep-best: no trial has a value of {metric} yet")
    else:
        cols = ["trial_id", *[c for c in s.param_columns.values() if c in t], "status", "rounds_done",
                f"final_{metric}", best_col, "total_sim_time_s", "total_bytes_up"]
        best = s.best(TOP_TRIALS)
        best = best[best[best_col].notna()][[c for c in cols if c in best]]
        fmt = {"total_bytes_up": human_bytes}
        page.table("table-sweep-best", best.reset_index(drop=True), fmt,
                   caption=f"the {len(best)} best trials by {best_col}")
    page.section(f"{metric} against each hyperparameter")
    page.row()
    for key, col in s.param_columns.items():
        fig_id = sweep_param_figure_id(col)
        if ok.empty or col not in ok:
            page.omit(fig_id, f"{fig_id}: no finished trial to plot")
            continue
        kind = next(iter((s.spec.get("space") or {}).get(key, {"grid": []})))
        page.guarded((fig_id,), _param_figure, fig_id, ok, col, key, kind, metric)
    page.row(False)
    page.section("Learning curves of the best trials")
    page.guarded(("fig-sweep-curves",), _sweep_curves, s, ok, metric)
    errors = t[t["status"] == "error"] if len(t) else t
    if len(errors):
        page.section("Errors")
        page.table("table-sweep-errors", errors[["trial_id", "error"]].reset_index(drop=True))
    return page


def _param_figure(page, fig_id, ok, col, key, kind, metric) -> None:
    fig, (ax,) = plots.figure(width=6.6, height=3.4)
    best = plots.numeric(ok[f"best_{metric}"])
    final = plots.numeric(ok[f"final_{metric}"]) if f"final_{metric}" in ok else None
    values = ok[col]
    is_number = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    if is_number and kind not in ("grid", "choice", "named") and values.nunique(dropna=True) > 1:
        x = plots.numeric(values)
        ax.scatter(x, best, color="#4C72B0", label=f"best {metric}", zorder=3)
        if final is not None:
            ax.scatter(x, final, facecolors="none", edgecolors="#DD8452", label=f"final {metric}", zorder=3)
        positive = x.dropna()
        if kind == "loguniform" or (len(positive) and (positive > 0).all() and positive.max() / positive.min() >= 20):
            ax.set_xscale("log")
        ax.set_xlabel(col)
    else:
        labels = values.map(lambda v: "null" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
        cats = list(dict.fromkeys(labels))
        if is_number:
            cats = sorted(cats, key=lambda c: float(c) if c != "null" else math.inf)
        pos = labels.map({c: i for i, c in enumerate(cats)}).to_numpy(dtype=float)
        jitter = np.random.default_rng(0).uniform(-0.12, 0.12, len(pos))
        ax.scatter(pos + jitter, best, color="#4C72B0", label=f"best {metric}", zorder=3)
        if final is not None:
            ax.scatter(pos + jitter, final, facecolors="none", edgecolors="#DD8452", label=f"final {metric}", zorder=3)
        means = best.groupby(labels.values).mean()
        ax.scatter(range(len(cats)), [means.get(c, np.nan) for c in cats], marker="_", s=500,
                   color="#333", label="mean of best", zorder=4)
        ax.set_xticks(range(len(cats)), cats, fontsize=8, rotation=20 if len(cats) > 6 else 0)
        ax.set_xlim(-0.6, len(cats) - 0.4)
        ax.set_xlabel(col)
    ax.set_ylabel(metric)
    plots.fig_legend(fig, ax)
    ax.set_title(f"{metric} against {col}", loc="left", fontsize=11)
    page.figure(fig_id, fig, f"one point per trial ({key}); filled: the trial's best value, hollow: "
                "its last evaluated value")


def _sweep_curves(page, s, ok, metric) -> None:
    r = s.rounds
    if ok.empty or r.empty or metric not in r:
        page.omit("fig-sweep-curves", f"fig-sweep-curves: no trial rounds with {metric}")
        return
    top = s.best(TOP_CURVES)
    top = top[top["trial_id"].isin(ok["trial_id"])]
    cols = [c for c in s.param_columns.values() if c in top]
    fig, (ax, ax2) = plots.figure(ncols=2, height=3.8)
    colours = plots.colour_map(list(top["trial_id"]))
    for _, row in top.iterrows():
        tr = r[r["trial_id"] == row["trial_id"]]
        ev = tr.assign(v=plots.numeric(tr[metric])).dropna(subset=["v"])
        label = ", ".join(f"{c}={format_param(row[c])}" for c in cols) or row["trial_id"]
        for a, x in ((ax, "round"), (ax2, "sim_time_s")):
            a.plot(ev[x], ev["v"], color=colours[row["trial_id"]], label=label,
                   marker=plots.marker_for(len(ev)), markersize=3)
    plots.round_ticks(ax)
    ax2.set_xlabel("simulated time (s)")
    for a in (ax, ax2):
        a.set_ylabel(metric)
    ax.set_title(f"{metric} per round", loc="left", fontsize=11)
    ax2.set_title(f"{metric} against simulated time", loc="left", fontsize=11)
    plots.fig_legend(fig, ax)
    page.figure("fig-sweep-curves", fig, f"the {len(top)} best trials by best_{metric}")


def format_param(v: Any) -> str:
    if isinstance(v, float):
        return "null" if math.isnan(v) else f"{v:.4g}"
    return str(v)
