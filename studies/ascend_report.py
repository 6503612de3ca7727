"""The ASCEND study's analysis and report (``studies/ascend_study.py`` runs the study): a run's
figures against simulated time, arm shares, paired bootstrap differences, the ground truth per
cell and ``results.md``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ADAPTIVE = ("ascend", "ascend_v1", "ascend_v2", "ascend_rho0", "exp3", "ascend4", "ascend_joint", "ascend_mean",
            "ascend_v4", "ascend_v4m")
UNIFORM = ("topk", "randomk", "periodick", "qsgd8")
ARMS4 = ("topk", "randomk", "periodick", "qsgd8")
POLICY_REASONS = ("explore", "exploit", "sample")  # the policy's own choices (not warm-up / forced)
BOOTSTRAP = 2000  # resamples of the paired seeds
TARGETS = (0.7, 0.8, 0.85)  # accuracies whose simulated time-to-reach is reported


def paired_differences(summary: pd.DataFrame, metric: str = "auc", ref: str = "ascend",
                       resamples: int = BOOTSTRAP, seed: int = 0) -> pd.DataFrame:
    """Per (experiment, K) and other variant: the mean over seeds of ``ref``'s ``metric`` minus
    the other's on the same seed, with a percentile-bootstrap 95 % interval (seeds resampled)."""
    rng = np.random.default_rng(seed)
    rows = []
    for (exp, k), cell in summary.groupby(["experiment", "k"], sort=False):
        wide = cell.pivot_table(index="seed", columns="variant", values=metric)
        if ref not in wide:
            continue
        for other in [v for v in wide.columns if v != ref]:
            d = (wide[ref] - wide[other]).dropna().to_numpy()
            if len(d) == 0:
                continue
            boot = d[rng.integers(len(d), size=(resamples, len(d)))].mean(1)
            lo, hi = np.percentile(boot, [2.5, 97.5])
            rows.append({"experiment": exp, "k": k, "vs": other, "seeds": len(d), f"d_{metric}": d.mean(),
                         "ci95_lo": lo, "ci95_hi": hi, "holds": bool(lo > 0), "fails": bool(hi < 0)})
    return pd.DataFrame(rows)


def ground_truth(summary: pd.DataFrame, arms: pd.DataFrame) -> pd.DataFrame:
    """Per (experiment, K): the uniform compressor with the best mean AUC (the arm that should
    win there) and the share of ASCEND's exploit choices that went to it."""
    rows = []
    uni = summary[summary["variant"].isin(UNIFORM)]
    for (exp, k), cell in uni.groupby(["experiment", "k"], sort=False):
        auc = cell.groupby("variant")["auc"].mean().sort_values(ascending=False)
        best = auc.index[0]
        rec = {"experiment": exp, "k": k, "best_uniform": best, "auc_best": auc.iloc[0],
               "auc_runner_up": auc.iloc[1] if len(auc) > 1 else float("nan")}
        if len(arms) and f"exploit_{best}" in arms:
            a = arms[(arms["experiment"] == exp) & (arms["k"] == k) & (arms["variant"] == "ascend")
                     & (arms["by"] == "all")]
            rec["ascend_exploits_best"] = float(a[f"exploit_{best}"].mean()) if len(a) else float("nan")
        rows.append(rec)
    return pd.DataFrame(rows)


def cell_budgets(summary: pd.DataFrame) -> pd.Series:
    """Per run, the common simulated-time budget of its (experiment, K, seed): the shortest run
    there that did not diverge (a diverged run stays at its last accuracy, ~chance, for the rest
    of the budget); the shortest run of all if every one diverged."""
    keys = [summary["experiment"], summary["k"], summary["seed"]]
    ran = summary["sim_time_s"].where(~summary["diverged"].astype(bool))
    return ran.groupby(keys).transform("min").fillna(summary["sim_time_s"].groupby(keys).transform("min"))


def curve_metrics(run_dir: str, budget: float) -> dict[str, float]:
    """Over [0, budget] simulated seconds: the accuracy of the last round finished in time, the
    mean accuracy (area under accuracy-vs-time / budget; a step function, 0.1 = chance before the
    first round), and the simulated time at which each target accuracy is first reached."""
    from engine.results.tables import load_run

    r = load_run(run_dir).rounds
    t, a = r["sim_time_s"].to_numpy(), r["global_acc"].to_numpy()
    ok = t <= budget + 1e-9
    out = {"acc_at_budget": float(a[ok][-1]) if ok.any() else float("nan")}
    edges = np.concatenate([[0.0], t[ok], [budget]])
    vals = np.concatenate([[0.1], a[ok]])
    out["auc"] = float(np.sum(np.diff(edges) * vals) / budget) if budget > 0 else float("nan")
    for target in TARGETS:
        hit = np.nonzero(a >= target)[0]
        out[f"t_to_{target:g}"] = float(t[hit[0]]) if len(hit) else float("nan")
    return out


def arm_shares(rows: pd.DataFrame) -> pd.DataFrame:
    """Per link, architecture and overall: the share of each arm among the policy's own choices
    (after warm-up, not forced) and among its exploit choices only (epsilon-greedy)."""
    from engine.results.tables import load_run

    parts = []
    for row in rows.itertuples():
        if row.variant not in ADAPTIVE:
            continue
        c = load_run(row.run_dir).clients
        c = c[c["arm"].notna()]
        for by in ("net_tier", "arch", None):
            groups = c.groupby(by) if by else [("all", c)]
            for g, sub in groups:
                own = sub[sub["arm_reason"].isin(POLICY_REASONS)]
                exploit = sub[sub["arm_reason"] == "exploit"]
                rec = {"experiment": row.experiment, "k": row.k, "variant": row.variant, "seed": row.seed,
                       "by": by or "all", "group": g, "n": len(own), "n_exploit": len(exploit)}
                for a in ARMS4 if row.variant == "ascend4" else ARMS4[:3]:  # joint arms: by compressor
                    rec[f"share_{a}"] = float((own["arm"] == a).mean()) if len(own) else float("nan")
                    rec[f"exploit_{a}"] = float((exploit["arm"] == a).mean()) if len(exploit) else float("nan")
                if row.variant == "ascend_joint":  # and by (compressor, K) label
                    for label in sorted(c["arm_label"].dropna().unique()):
                        rec[f"share_{label}"] = float((own["arm_label"] == label).mean()) if len(own) else float("nan")
                parts.append(rec)
    return pd.DataFrame(parts)


def fmt(v: Any, spec: str = ".3f") -> str:
    if isinstance(v, (float, np.floating)):
        return "—" if np.isnan(v) else format(v, spec)
    return str(v)


def markdown(df: pd.DataFrame, spec: str = ".3f") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt(r[c], spec) for c in cols) + " |" for _, r in df.iterrows()]
    return "\n".join(lines)


def spread(df: pd.DataFrame, keys: list[str], cols: list[str], spec: str = ".3f") -> pd.DataFrame:
    """Per group: ``mean [min, max]`` over seeds of each column (NaN-aware), and the seed count."""
    rows = []
    for key, g in df.groupby(keys, sort=False):
        rec = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        rec["seeds"] = int(g["seed"].nunique())
        for c in cols:
            v = g[c].astype(float)
            n = int(v.notna().sum())
            if n == 0:
                rec[c] = "—"
            else:
                rec[c] = (f"{v.mean():{spec}} [{v.min():{spec}}, {v.max():{spec}}]"
                          + (f" ({n}/{len(v)})" if n < len(v) else ""))
        rows.append(rec)
    return pd.DataFrame(rows)


def write_markdown(out: Path, args, summary: pd.DataFrame, arms: pd.DataFrame, wall: float,
                   paired: pd.DataFrame | None = None, truth: pd.DataFrame | None = None,
                   paired_final: pd.DataFrame | None = None, paired_at_budget: pd.DataFrame | None = None,
                   paired_v4: pd.DataFrame | None = None) -> None:
    keys = ["experiment", "k", "variant"]
    acc_cols = ["final_acc", "auc", "acc_at_budget"] + [f"t_to_{t:g}" for t in TARGETS]
    other = ["diverged", "rounds_run", "final_acc_lenet5_half", "final_acc_lenet5", "final_acc_cifar_cnn",
             "sim_time_s", "mb_up", "rollbacks", "exploit_frac"]
    reward = ["reward_mean", "reward_clipped", "reward_lost", "reward_df_median", "reward_dd_median",
              "reward_dd_min", "reward_dd_max", "reward_phi_median", "reward_psi_median", "tbar_over_t_p05",
              "tbar_over_t_p95", "reward_factor_p05", "reward_factor_p95", "select_share", "measure_share"]
    have = lambda cols: [c for c in cols if c in summary.columns and summary[c].notna().any()]  # noqa: E731
    lines = [
        "# ASCEND study results",
        "",
        f"dataset `{'cifar_like (parquet, the regime cell)' if args.design == 'v4' else args.dataset}`, "
        f"Dirichlet({args.alpha}) unless the experiment says otherwise, "
        f"{args.num_clients} clients, participation {args.participation}, {args.rounds} rounds, seeds "
        f"{args.seeds}, distill_steps {args.distill_steps}, lr {args.lr}; {wall:.0f} s wall for this call.",
        "",
        "Cells: mean [min, max] over seeds; `(n/m)`: only n of m seeds have a value (a target not "
        "reached). Accuracy = mean over the architectures' global models on the global test set. `auc`: "
        "mean accuracy over [0, budget] simulated seconds, budget = the shortest run of the same "
        "experiment, K and seed; `acc_at_budget`: accuracy of the last round finished within it; "
        "`t_to_X`: simulated seconds until accuracy X is first reached.",
        "",
        "## Accuracy against simulated time",
        "",
        markdown(spread(summary, keys, have(acc_cols))),
        "",
        "## Other figures",
        "",
        markdown(spread(summary, keys, have(other))),
        "",
        "## Reward diagnostics (adaptive variants)",
        "",
        "`reward_clipped`: share of closed rewards at ±1; `reward_lost`: share of lost uploads; "
        "`reward_df_median`, `reward_dd_*`: the local and alignment terms.",
        "",
        markdown(spread(summary[summary["variant"].isin(ADAPTIVE)], keys, have(reward))),
        "",
    ]
    if len(arms):
        share_cols = [c for c in arms.columns if c.startswith(("share_", "exploit_")) and arms[c].notna().any()]
        tab = arms.groupby(["experiment", "k", "variant", "by", "group"], sort=False)
        mean = tab[share_cols + ["n", "n_exploit"]].mean().reset_index()
        lo, hi = tab[share_cols].min().reset_index(), tab[share_cols].max().reset_index()
        for c in share_cols:
            mean[c] = [f"{m:.2f} [{a:.2f}, {b:.2f}]" if not np.isnan(m) else "—"
                       for m, a, b in zip(mean[c], lo[c], hi[c])]
        mean["n"] = mean["n"].round().astype(int)
        mean["n_exploit"] = mean["n_exploit"].round().astype(int)
        lines += [
            "## Arm choice",
            "",
            "`share_*`: share of each arm among the policy's own choices (after warm-up, not forced); "
            "`exploit_*`: among the epsilon-greedy exploit choices only; mean [min, max] over seeds; "
            "`n`, `n_exploit`: choices per seed.",
            "",
            markdown(mean),
            "",
        ]
    if truth is not None and len(truth):
        lines += ["## Ground truth per cell (v3)", "",
                  "`best_uniform`: the uniform compressor with the best mean AUC; `ascend_exploits_best`: the "
                  "share of ASCEND's exploit choices that went to it.", "", markdown(truth), ""]
    if paired is not None and len(paired):
        lines += ["## Paired differences of AUC, ASCEND minus the other (v3)", "",
                  f"Same seeds; mean and percentile-bootstrap 95 % interval ({BOOTSTRAP} resamples of the "
                  "seeds); `holds`: the interval is above 0, `fails`: below 0.", "", markdown(paired, ".4f"), ""]
    if paired_v4 is not None and len(paired_v4):
        lines += ["## Paired differences of AUC, ASCEND with reward v4 minus the other (v4 design)", "",
                  markdown(paired_v4, ".4f"), ""]
    for title, table in (("final accuracy (after all rounds)", paired_final),
                         ("accuracy at the common simulated-time budget", paired_at_budget)):
        if table is not None and len(table):
            lines += [f"## Paired differences of {title}, ASCEND minus the other (v3)", "", markdown(table, ".4f"), ""]
    (out / "results.md").write_text("\n".join(lines))
