"""ASCEND study: per-client adaptive compression vs uniform Top-K / Random-K / Periodic-K vs EXP3.

Setting (after the spec's "Settings reported"): MNIST (``mnist5k``, offline) or Fashion-MNIST
(``--dataset fashion_mnist``, from /usr/share/datasets/fashion-mnist), Dirichlet(alpha) label
skew, half the clients on slow devices (rpi4, 3 GFLOP/s) running LeNet5Half and half on fast ones
(laptop_cpu, 60 GFLOP/s) running LeNet5, links of 5 / 50 / 500 Mbps (a third each), 10% public
split at the server, several K (absolute counts, as in the paper).

Variants (same FedKD framework, distillation and error feedback everywhere):

* ``ascend``     EMA epsilon-greedy with warm-up (the method), rollback guard on;
* ``ascend_rho0`` ablation: the same with rho = 0 (reward from the local probe loss only);
* ``exp3``       EXP3 per client, rollback guard on;
* ``topk`` / ``randomk`` / ``periodick``: the same compressor for every client (policy fixed),
  rollback guard off (a forced Top-K would break the uniform baseline);
* ``--topk-cost-scale S`` adds ``ascend@topkxS`` and ``topk@topkxS`` at the largest K: Top-K's
  per-element selection cost multiplied by S (a device where selection is S times dearer).

Outputs under ``--out``: ``runs/<K>/<variant>-s<seed>`` run folders, ``summary.parquet`` (one
row per run), ``arms.parquet`` (share of each arm per bandwidth tier / architecture among the
policy's own post-warm-up choices) and ``results.md`` (the tables).

    .venv/bin/python studies/ascend_study.py --quick --out runs/ascend_study_quick
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ADAPTIVE = ("ascend", "ascend_rho0", "exp3")
UNIFORM = ("topk", "randomk", "periodick")
VARIANTS = ADAPTIVE + UNIFORM
POLICY_REASONS = ("explore", "exploit", "sample")  # the policy's own choices (not warm-up / forced)


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "seed": 0,
        "rounds": args.rounds,
        "dataset": {"name": args.dataset},
        "partition": {"scheme": "dirichlet", "alpha": args.alpha, "public_fraction": 0.1},
        "model": {"name": "lenet5", "zoo": [{"arch": "lenet5_half", "max_gflops": 10}]},
        "clients": {
            "num_clients": args.num_clients,
            "participation": args.participation,
            "profiles": {
                "devices": {"rpi4": 0.5, "laptop_cpu": 0.5},
                "network": {"5mbps": 0.34, "50mbps": 0.33, "500mbps": 0.33},
                "availability": 1.0,
                "dropout": 0.0,
            },
        },
        "train": {"local_epochs": 1, "batch_size": 16, "lr": args.lr},
        "evaluation": {"eval_every": 1, "personalized": False},
        "executor": {"kind": "inprocess", "threads_per_actor": 1},
    }


def variant_algorithm(variant: str, k: int, args: argparse.Namespace) -> dict[str, Any]:
    name, _, scaled = variant.partition("@")
    algo: dict[str, Any] = {"name": "ascend", "k": k, "distill_steps": args.distill_steps}
    if name == "ascend":
        algo["policy"] = "egreedy"
    elif name == "ascend_rho0":
        algo.update(policy="egreedy", rho=0.0)
    elif name == "exp3":
        algo["policy"] = "exp3"
    else:
        algo.update(policy="fixed", arm=name, gamma=None)
    if scaled:
        from algorithms.compressors import TOPK_OPS_PER_ELEMENT

        algo["op_costs"] = {"topk_per_element": TOPK_OPS_PER_ELEMENT * args.topk_cost_scale}
    return algo


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """Run one experiment (in a worker process) and return its summary row."""
    import torch

    torch.set_num_threads(1)
    from engine.config import load_config
    from engine.results import load_run
    from engine.run import run_experiment

    cfg = load_config(job["config"])
    path = Path(job["run_dir"])
    if not (path / "rounds.parquet").exists():
        t0 = time.perf_counter()
        run_experiment(cfg, path, command=["studies/ascend_study.py"])
        wall = time.perf_counter() - t0
    else:
        wall = float("nan")
    run = load_run(path)
    return {"k": job["k"], "variant": job["variant"], "seed": job["seed"], "run_dir": str(path), "wall_s": wall,
            **_run_metrics(run)}


def _run_metrics(run) -> dict[str, Any]:
    r = run.rounds
    out: dict[str, Any] = {
        "final_acc": float(r["global_acc"].iloc[-1]),
        "best_acc": float(r["global_acc"].max()),
        "sim_time_s": float(r["sim_time_s"].iloc[-1]),
        "mb_up": float(r["bytes_up"].sum() / 1e6),
        "rollbacks": int(r.get("server_rollback", pd.Series([0])).sum()),
    }
    for col in r.columns:
        if col.startswith("global_acc_"):
            out["final_" + col.removeprefix("global_")] = float(r[col].iloc[-1])
    return out


def acc_at(run_dir: str, budget: float) -> tuple[float, float]:
    """(accuracy of the last round finished within ``budget`` simulated seconds, mean accuracy
    over [0, budget] as a step function of simulated time: the area under acc-vs-time / budget)."""
    from engine.results import load_run

    r = load_run(run_dir).rounds
    t = r["sim_time_s"].to_numpy()
    a = r["global_acc"].to_numpy()
    ok = t <= budget + 1e-9
    at = float(a[ok][-1]) if ok.any() else float("nan")
    # step function: accuracy a_i holds from t_i to t_{i+1}; 0.1 (chance) before the first round
    edges = np.concatenate([[0.0], t[ok], [budget]])
    vals = np.concatenate([[0.1], a[ok]])
    auc = float(np.sum(np.diff(edges) * vals) / budget) if budget > 0 else float("nan")
    return at, auc


def arm_shares(rows: pd.DataFrame) -> pd.DataFrame:
    """Per bandwidth tier, architecture and overall: the share of each arm among the policy's own
    choices (after warm-up, not forced), among its exploit choices only (epsilon-greedy), and the
    mean ``q_<arm>`` at each client's last participation (EXP3: its arm probabilities)."""
    from engine.results import load_run

    parts = []
    for row in rows.itertuples():
        base = row.variant.partition("@")[0]
        if base not in ADAPTIVE:
            continue
        c = load_run(row.run_dir).clients
        c = c[c["arm"].notna()]
        last = c.sort_values("round").groupby("client_id").tail(1)
        for by in ("net_tier", "arch", None):
            groups = c.groupby(by) if by else [("all", c)]
            for g, sub in groups:
                own = sub[sub["arm_reason"].isin(POLICY_REASONS)]
                exploit = sub[sub["arm_reason"] == "exploit"]
                fin = last[last[by] == g] if by else last
                rec = {"k": row.k, "variant": row.variant, "seed": row.seed, "by": by or "all", "group": g,
                       "n": len(own), "n_exploit": len(exploit)}
                for a in UNIFORM:
                    rec[f"share_{a}"] = float((own["arm"] == a).mean()) if len(own) else float("nan")
                for a in UNIFORM:
                    rec[f"exploit_{a}"] = float((exploit["arm"] == a).mean()) if len(exploit) else float("nan")
                for a in UNIFORM:
                    rec[f"q_{a}"] = float(fin[f"q_{a}"].mean())
                parts.append(rec)
    return pd.DataFrame(parts)


def markdown_table(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, (float, np.floating)):
                cells.append("" if np.isnan(v) else format(v, floatfmt))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/ascend_study", help="output folder")
    ap.add_argument("--dataset", default="mnist5k", choices=["mnist5k", "fashion_mnist"])
    ap.add_argument("--quick", action="store_true", help="small setting that finishes in a few minutes on 2 cores")
    ap.add_argument("--ks", type=int, nargs="+", help="K values (coordinate counts)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="+", help="seeds")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--num-clients", type=int)
    ap.add_argument("--participation", type=float)
    ap.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--distill-steps", type=int, help="server distillation steps per round (spec default 50)")
    ap.add_argument("--topk-cost-scale", type=float, default=0.0,
                    help="also run ascend and uniform topk at the largest K with Top-K's per-element cost x this")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (one torch thread each)")
    args = ap.parse_args(argv)
    quick = {"ks": [1000, 10000], "seeds": [0], "rounds": 25, "num_clients": 12, "participation": 1.0,
             "distill_steps": 20}
    full = {"ks": [100, 1000, 5000, 10000], "seeds": [0, 1, 2], "rounds": 100, "num_clients": 20,
            "participation": 0.5, "distill_steps": 50}
    for key, val in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    return args


def main(argv=None) -> Path:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = base_config(args)
    jobs = []
    for k in args.ks:
        variants = list(args.variants)
        if args.topk_cost_scale and k == max(args.ks):
            variants += [f"{v}@topkx{args.topk_cost_scale:g}" for v in ("ascend", "topk") if v in args.variants]
        for variant in variants:
            for seed in args.seeds:
                cfg = {**base, "seed": seed, "algorithm": variant_algorithm(variant, k, args),
                       "output": {"dir": str(out / "runs" / f"k{k}"), "name": f"{variant}-s{seed}"}}
                jobs.append({"config": cfg, "run_dir": str(out / "runs" / f"k{k}" / f"{variant}-s{seed}"),
                             "k": k, "variant": variant, "seed": seed})
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            rows = list(pool.map(run_one, jobs))
    else:
        rows = [run_one(j) for j in jobs]
    summary = pd.DataFrame(rows)
    # accuracy at a common simulated-time budget: the shortest run of the same K and seed
    budgets = summary.groupby(["k", "seed"])["sim_time_s"].transform("min")
    ats = [acc_at(d, b) for d, b in zip(summary["run_dir"], budgets)]
    summary["budget_s"] = budgets
    summary["acc_at_budget"] = [a for a, _ in ats]
    summary["auc_acc_time"] = [u for _, u in ats]
    arms = arm_shares(summary)
    summary.to_parquet(out / "summary.parquet", index=False)
    arms.to_parquet(out / "arms.parquet", index=False)
    write_markdown(out, args, summary, arms, time.perf_counter() - t0)
    print((out / "results.md").read_text())
    return out


def write_markdown(out: Path, args, summary: pd.DataFrame, arms: pd.DataFrame, wall: float) -> None:
    keys = ["k", "variant"]
    cols = ["final_acc", "final_acc_lenet5_half", "final_acc_lenet5", "acc_at_budget", "auc_acc_time",
            "budget_s", "sim_time_s", "mb_up", "rollbacks"]
    cols = [c for c in cols if c in summary.columns]
    order = {v: i for i, v in enumerate(summary["variant"].unique())}
    tab = summary.groupby(keys, sort=False)[cols].mean().reset_index()
    tab = tab.sort_values(["k", "variant"], key=lambda s: s.map(order) if s.name == "variant" else s)
    lines = [
        "# ASCEND study results",
        "",
        f"dataset `{args.dataset}`, Dirichlet({args.alpha}), {args.num_clients} clients (rpi4 + LeNet5Half / "
        f"laptop_cpu + LeNet5, 5/50/500 Mbps), participation {args.participation}, {args.rounds} rounds, "
        f"seeds {args.seeds}, distill_steps {args.distill_steps}, lr {args.lr}; "
        f"{'quick' if args.quick else 'full'} mode, {wall:.0f} s wall.",
        "",
        "Accuracy = mean over the two architectures' global models on the global test set. "
        "`acc_at_budget`: accuracy of the last round finished within `budget_s` simulated seconds "
        "(the shortest run of the same K); `auc_acc_time`: mean accuracy over [0, budget] (step function of "
        "simulated time). `mb_up`: MB uploaded in total.",
        "",
        markdown_table(tab),
        "",
    ]
    if len(arms):
        num = [c for c in arms.columns if c.startswith(("n", "share_", "exploit_", "q_"))]
        sh = arms.groupby(["k", "variant", "by", "group"], sort=False)[num].mean().reset_index()
        sh["n"] = sh["n"].round().astype(int)
        sh["n_exploit"] = sh["n_exploit"].round().astype(int)
        lines += [
            "## Arm choice",
            "",
            "`share_*`: share of each arm among the policy's own choices (after warm-up, not forced); "
            "`exploit_*`: among the epsilon-greedy exploit choices only; `q_*`: mean value at each client's "
            "last participation (epsilon-greedy: Q; EXP3: arm probability).",
            "",
            markdown_table(sh, ".2f"),
            "",
        ]
    (out / "results.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
