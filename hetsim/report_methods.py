"""The method-specific figures of a run report (``hetsim report``): ASCEND's compressor choice
and rollback guard, FedCSPACK's shared packs. Each draws from the method's columns of
``clients.parquet`` / ``rounds.parquet`` (and its own tables), or leaves notes when they are absent.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hetsim import plots
from hetsim.page import Page

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


# ---------------------------------------------------------------- ASCEND


def _arms(run) -> list[str]:
    c = run.clients
    known = list((run.config.get("algorithm") or {}).get("arms") or [])
    seen = [a for a in c["arm"].dropna().astype(str).unique() if a] if "arm" in c else []
    qs = [col[2:] for col in c.columns if col.startswith("q_") and c[col].notna().any()]  # an empty q_: not an arm
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
    guard_off = gamma is None and "gamma" in (run.config.get("algorithm") or {})
    guard = "guard off (gamma: null)" if guard_off else f"{n} rollback(s)"
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
