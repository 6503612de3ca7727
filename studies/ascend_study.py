"""ASCEND study, one experiment per claim of the paper, each over several seeds.

Base setting (after the spec's "Settings reported"): MNIST (``mnist5k``, offline), Dirichlet(0.5)
label skew, half the clients on slow devices (rpi4, 3 GFLOP/s) running LeNet5Half and half on
fast ones (laptop_cpu, 60 GFLOP/s) running LeNet5, links of 5 / 50 / 500 Mbps (a third each),
10% public split at the server, K an absolute count of coordinates (as in the paper).

Experiments (``--experiments``; each one answers one claim):

* ``main``   K in {1000, 10000}: ``ascend`` (reward v2, the spec) against ``exp3``, the uniform
  ``topk`` / ``randomk`` / ``periodick`` (policy fixed, rollback guard off: a forced Top-K would
  break a uniform baseline) and, at K = 10000, ``ascend_v1`` (reward version 1). Claims: ASCEND >= every uniform
  compressor and >= EXP3 on accuracy vs simulated time (area under the curve, simulated time to
  a target accuracy); Top-K preferred at 5 Mbps, Random-K at 500 Mbps (arm shares by link);
  reward v1 vs v2; ``ascend_rho0`` (rho = 0: the local term only) separates the two reward terms.
* ``alpha``  ascend, exp3, uniform topk and randomk at Dirichlet(0.1), K = 10000 (robustness).
* ``k``      ASCEND at K in {100, 15000} (with ``main``'s 1000 and 10000: small vs large K;
  15000 is 95 % of LeNet5Half's and 24 % of LeNet5's parameters).
* ``model``  6 clients on the same device and link (laptop_cpu, 50 Mbps), two each with
  LeNet5Half (15.7k parameters), LeNet5 (61.7k) and the 3-conv ``cifar_cnn`` (0.35M): arm shares by
  model size with nothing else different (6 clients: cifar_cnn's training and distillation cost
  ~30x LeNet5's per sample).
* ``qsgd8``  a fourth arm, 8-bit stochastic quantisation: ``ascend4`` (arms topk, randomk,
  periodick, qsgd8) and uniform ``qsgd8`` at K = 10000.

``--design v3`` runs the study design of the spec's version 3 instead (``V3_CELLS``, ``plan_v3``):
K as a ratio of d (``--ratios``), every client of a cell on one bandwidth (``--bandwidths``, 5, 50 and
500 Mbps), >= 60 rounds, >= 5 paired seeds. Cells: ``v3main`` (ASCEND v3 against the uniform
compressors at both bandwidths and K/d 0.01 / 0.1; at 5 Mbps and K/d 0.01 also EXP3 with the same
reward, ASCEND v2 and v1, and joint (compressor, K) arms), ``v3alpha0.1`` / ``v3alpha1`` (Dirichlet
0.1 and 1), ``v3steps`` (10 local SGD steps instead of an epoch), ``v3markov`` (Gilbert-Elliott links:
the EMA bandit against a sample-mean one, ``ascend_mean``, and reward v4, ``ascend_v4`` /
``ascend_v4m``) and the what-ifs ``v3slowtopk``
(Top-K's selection 100x the catalog's ns per element) and ``v3slowrpi`` (the same on the rpi4
clients only). Uniform baselines there are ASCEND with a fixed arm and reward v3: the same
held-out probe, measurement forwards and selection pricing as ASCEND, so a difference is the
choice alone. Results add, per cell, the ground truth (the uniform compressor with the best mean
AUC) and paired differences of AUC, final accuracy and accuracy at the common budget (ASCEND minus
each other variant, same seeds) with bootstrap 95 % intervals.

How it runs (``--runner``): ``sweep`` (default) runs every planned run as one trial of one
``hetsim sweep`` (:func:`sweeps.cases.run_cases`: a ``cases`` dimension ``run`` whose cases are
the runs' overrides of one base, :func:`case_overrides`), so the study gets the sweep engine's
warm trial processes (imports and the dataset cache kept from one run to the next),
``trials.parquet``, trackers and resume;
``--runner pool`` keeps the earlier process pool (for comparison: ``bench/bench_study.py``).

Outputs under ``--out``: the sweep folders ``sweeps/<n>/`` (one per call that had runs left; run
folders in ``sweeps/<n>/runs/``) or, with ``--runner pool``, one run folder per (experiment, K,
variant, seed) under ``runs/``; ``summary.parquet`` (one row per run), ``arms.parquet`` (arm shares
per group and run) and ``results.md`` (the tables: mean and [min, max] over seeds). Finished runs
are kept when the study is started again: a later call runs only the planned runs no earlier
call finished (an interrupted sweep's unfinished runs start again).

    nice -n 3 .venv/bin/python studies/ascend_study.py --quick --jobs 2 --out runs/ascend_claims
    nice -n 3 .venv/bin/python studies/ascend_study.py --design v3 --jobs 2 --out runs/ascend_v3
    nice -n 3 .venv/bin/python studies/ascend_study.py --design v3 --smoke --out /tmp/ascend_v3_smoke

The analysis and ``results.md`` are ``studies/ascend_report.py``.
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

from studies.ascend_report import (  # noqa: E402
    ARMS4,
    POLICY_REASONS,
    arm_shares,
    cell_budgets,
    curve_metrics,
    ground_truth,
    paired_differences,
    write_markdown,
)

EXPERIMENTS = ("main", "alpha", "k", "model", "qsgd8")
EXPERIMENTS_V3 = ("v3main", "v3alpha0.1", "v3alpha1", "v3steps", "v3markov", "v3slowtopk", "v3slowrpi", "v4regime",
                  "v4corner")
JOINT_ARMS = [[a, r] for a in ("topk", "randomk") for r in (0.01, 0.05, 0.25)]  # the spec's example


def plan(args: argparse.Namespace) -> list[tuple[str, int, str, dict[str, Any]]]:
    """(experiment, K, variant, config changes) of every run, most important first."""
    main_variants = ["ascend", "exp3", "topk", "randomk", "periodick"]
    out: list[tuple[str, int, str, dict[str, Any]]] = []
    for exp in args.experiments:
        if exp == "main":  # the reward ablations (v1, rho = 0) at the largest K only
            out += [("main", k, v, {}) for k in args.ks
                    for v in main_variants + (["ascend_v1", "ascend_rho0"] if k == max(args.ks) else [])]
        elif exp == "alpha":
            out += [("alpha0.1", 10000, v, {"alpha": 0.1}) for v in main_variants[:4]]
        elif exp == "k":
            out += [("k", k, "ascend", {}) for k in (100, 15000)]
        elif exp == "model":
            out += [("model", 10000, "ascend", {"model": "three", "num_clients": 6})]
        elif exp == "qsgd8":
            out += [("qsgd8", 10000, v, {}) for v in ("ascend4", "qsgd8")]
    return out


# the v3 cells run (experiment, Mbps, K/d ratios, variants, config changes), sized to the CPU
# budget of one sitting on 2 cores (docs/ascend.md says what ran and for how long)
V3_CELLS: list[tuple[str, int, tuple[float, ...], list[str], dict[str, Any]]] = [
    ("v3main", 5, (0.01,), ["ascend", "exp3", "topk", "randomk", "periodick", "ascend_v2", "ascend_v1",
                            "ascend_joint"], {}),
    ("v3main", 5, (0.1,), ["ascend", "topk", "randomk", "periodick"], {}),
    ("v3main", 500, (0.01, 0.1), ["ascend", "topk", "randomk", "periodick"], {}),
    ("v3main", 50, (0.01, 0.1), ["ascend", "topk", "randomk", "periodick"], {}),
    # the secondary cells run the first 3 seeds only ("seeds": the budget)
    ("v3alpha0.1", 5, (0.01,), ["ascend", "topk"], {"alpha": 0.1, "seeds": 3}),
    ("v3alpha1", 5, (0.01,), ["ascend", "topk"], {"alpha": 1.0, "seeds": 3}),
    ("v3steps", 5, (0.01,), ["ascend", "topk", "randomk", "periodick"], {"local_steps": 10, "seeds": 3}),
    # Gilbert-Elliott links (a tenth of the rate in the bad state): EMA against a stationary bandit,
    # and reward v4 (T_exp at the link's present rates; v4m: from the clock's measured phase times)
    ("v3markov", 5, (0.1,), ["ascend", "ascend_mean", "topk", "randomk", "ascend_v4", "ascend_v4m"],
     {"local_steps": 10, "markov": True, "seeds": 3}),
    # what-if: Top-K's selection 100x the catalog's ns per element (a device without a fast sort)
    ("v3slowtopk", 500, (0.1,), ["ascend", "topk", "randomk"], {"local_steps": 10, "slow_topk": 100.0, "seeds": 3}),
    # what-if: the same on the rpi4 clients only, so the best arm may differ between clients
    ("v3slowrpi", 500, (0.1,), ["ascend", "topk", "randomk"],
     {"local_steps": 10, "slow_topk": 100.0, "slow_tiers": ("rpi4",), "seeds": 3}),
]


# the v4 design: the regime where ASCEND's premise can hold (docs/ascend.md "Study, version 4";
# chosen from studies/ascend_regimes.py): a CIFAR-10-shaped synthetic task, cifar_cnn (586k) on
# rpi4 / phone_low, the down link at 500 Mbps and the up link switching 5 <-> 500 Mbps (Markov),
# 2 local SGD steps, where Top-K's round is 1.4-1.6x Random-K's while the uplink is slow
V4_CELLS: list[tuple[str, int, tuple[float, ...], list[str], dict[str, Any]]] = [
    ("v4regime", 500, (0.1, 0.01), ["ascend", "ascend_v4", "topk", "randomk", "periodick"],
     {"regime": True, "local_steps": 2}),
    # the corner of step 1's table where Top-K's round is longest against Random-K's (1.89x on a slow
    # uplink): fast devices, one local step, K/d 0.1; the two arms that decide the ground truth
    ("v4corner", 500, (0.1,), ["topk", "randomk", "ascend_v4"],
     {"regime": True, "local_steps": 1, "devices": {"edge_gpu": 1.0}}),
]
REGIME_UPLINK = {"kind": "markov", "states": {"fast": 500.0, "slow": 5.0}, "unit": "mbps",
                 "transition": [[0.8, 0.2], [0.2, 0.8]], "slot_s": 1.0}
REGIME_DATA = ROOT / "runs" / "regimes" / "cifar_like.parquet"  # written by ascend_regimes.write_cifar_like
REGIME_PROBES = {"probe_batches": 1, "psi_probe_size": 16, "public_probe_size": 64}  # CPU budget, and the clock


def plan_v3(args: argparse.Namespace) -> list[tuple[str, Any, str, dict[str, Any]]]:
    """(experiment, K/d, variant, config changes) of the v3 (v4) design; every cell on one bandwidth.
    ``--bandwidths`` / ``--ratios`` keep only the cells (and ratios) they name."""
    out: list[tuple[str, Any, str, dict[str, Any]]] = []
    for exp, bw, ratios, variants, change in (V4_CELLS if args.design == "v4" else V3_CELLS):
        if exp not in args.experiments or bw not in args.bandwidths:
            continue
        for r in ratios:
            if r in args.ratios:
                out += [(f"{exp}-{bw}mbps", r, v, {**change, "network": f"{bw}mbps"}) for v in variants]
    return out


def base_config(args: argparse.Namespace, change: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "seed": 0,
        "rounds": args.rounds,
        "dataset": {"name": args.dataset},
        "partition": {"scheme": "dirichlet", "alpha": change.get("alpha", args.alpha), "public_fraction": 0.1},
        "model": {"name": "lenet5", "zoo": [{"arch": "lenet5_half", "max_gflops": 10}]},
        "clients": {
            "num_clients": change.get("num_clients", args.num_clients),
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
    if "network" in change:  # one bandwidth for every client of the cell
        cfg["clients"]["profiles"]["network"] = {change["network"]: 1.0}
    if "local_steps" in change:
        cfg["train"] = {**cfg["train"], "local_steps": change["local_steps"]}
        del cfg["train"]["local_epochs"]
    if change.get("markov"):
        cfg["clients"]["profiles"]["conditions"] = {"sets": {"fading": {"down": "gilbert_elliott",
                                                                        "up": "gilbert_elliott"}}}
    if "slow_topk" in change:  # Top-K's ns per element scaled on slow_tiers (default: every tier), a catalog override
        from hardware_profiles.catalog import load_catalog

        tiers, fields = load_catalog().devices, ("topk_ns_in_cache", "topk_ns_out_of_cache")
        cfg["clients"]["profiles"]["catalog"] = {"devices": {
            name: {f: getattr(tiers[name], f) * change["slow_topk"] for f in fields}
            for name in change.get("slow_tiers", cfg["clients"]["profiles"]["devices"])}}
    if change.get("regime"):  # cifar_cnn on slow tiers, a CIFAR-shaped task, the uplink switching
        cfg["dataset"] = {"name": "parquet", "params": {"path": str(REGIME_DATA), "shape": [3, 32, 32],
                                                        "split_column": "split"}}
        cfg["model"] = {"name": "cifar_cnn"}
        cfg["clients"]["profiles"]["devices"] = {"rpi4": 0.5, "phone_low": 0.5}
        cfg["clients"]["profiles"]["conditions"] = {"sets": {"uplink": {"up": REGIME_UPLINK}}}
        if "devices" in change:
            cfg["clients"]["profiles"]["devices"] = change["devices"]
    if change.get("model") == "three":  # same device and link for all; only the model differs
        n = cfg["clients"]["num_clients"]
        arch = ["lenet5_half", "lenet5", "cifar_cnn"]
        cfg["model"] = {"name": "lenet5", "per_client": {c: arch[c * 3 // n] for c in range(n)}}
        cfg["clients"]["profiles"].update(devices={"laptop_cpu": 1.0}, network={"50mbps": 1.0})
    return cfg


def variant_algorithm(variant: str, k: int | float, args: argparse.Namespace) -> dict[str, Any]:
    # the v2 design reproduces the v2 study: its variants say reward v2 (the default is now v3)
    algo: dict[str, Any] = {"name": "ascend", "k": k, "distill_steps": args.distill_steps,
                            "reward": "v2" if args.design == "v2" else "v3"}
    if args.design == "v4":
        algo.update(REGIME_PROBES)
    if variant == "ascend":
        algo["policy"] = "egreedy"
    elif variant == "ascend_v1":
        algo.update(policy="egreedy", reward="v1")
    elif variant == "ascend_v2":
        algo.update(policy="egreedy", reward="v2")
    elif variant == "ascend_joint":
        algo.update(policy="egreedy", arms=JOINT_ARMS)
    elif variant == "ascend_mean":
        algo.update(policy="egreedy", q_update="mean")
    elif variant == "ascend_v4":
        algo.update(policy="egreedy", reward="v4")
    elif variant == "ascend_v4m":
        algo.update(policy="egreedy", reward="v4", time_model="measured")
    elif variant == "ascend_rho0":
        algo.update(policy="egreedy", rho=0.0)
    elif variant == "ascend4":
        algo.update(policy="egreedy", arms=list(ARMS4))
    elif variant == "exp3":
        algo["policy"] = "exp3"
    else:
        algo.update(policy="fixed", arm=variant, gamma=None, arms=list(ARMS4))
    return algo


def case_name(job: dict[str, Any]) -> str:
    """A run's name in the sweep (the ``run`` column of trials.parquet)."""
    return f"{job['experiment']}.k{job['k']:g}.{job['variant']}.s{job['seed']}"


def case_overrides(job: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The config sections in which a run differs from the study's base (its seed, method,
    fleet, training): its case in the sweep. The sweep places run folders (no ``output``)."""
    return {k: v for k, v in job["config"].items() if k != "output" and base.get(k) != v}


def run_as_sweep(jobs: list[dict[str, Any]], args: argparse.Namespace, out: Path) -> None:
    """Run the jobs no earlier call finished as one sweep (:func:`sweeps.cases.run_cases`);
    point every job at its run folder."""
    from sweeps.cases import run_cases

    base = {**base_config(args, {}), "algorithm": jobs[0]["config"]["algorithm"]}
    earlier = {case_name(j): Path(j["run_dir"]) for j in jobs if _finished(Path(j["run_dir"]))}  # --runner pool
    cases = {case_name(j): case_overrides(j, base) for j in jobs}
    if args.report_only:
        from sweeps.cases import finished_cases

        done = {**earlier, **finished_cases(out)}
    else:
        done = run_cases(cases, out, base=base, name="ascend_study", jobs=args.jobs, done=earlier,
                         command=["studies/ascend_study.py", *sys.argv[1:]])
    for job in jobs:
        if case_name(job) in done:
            job["run_dir"] = str(done[case_name(job)])
    missing = [case_name(j) for j in jobs if case_name(j) not in done]
    if missing:
        print(f"{len(missing)} planned run(s) did not finish (first: {missing[0]}); they are left out of the "
              "tables; run the study again to run them", flush=True)


def summary_row(job: dict[str, Any]) -> dict[str, Any]:
    """A finished run's row: its job's keys, its wall seconds (from its manifest) and metrics."""
    from engine.results.tables import load_run

    run = load_run(Path(job["run_dir"]))
    return {key: job[key] for key in ("experiment", "k", "variant", "seed")} | {
        "run_dir": job["run_dir"], "wall_s": float(run.manifest.get("wall_s") or float("nan")), **run_metrics(run)}


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """Run one experiment (in a worker process) and return its summary row."""
    import torch

    torch.set_num_threads(1)
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    path = Path(job["run_dir"])
    wall = float("nan")
    if not _finished(path):
        t0 = time.perf_counter()
        run_experiment(load_config(job["config"]), path, command=["studies/ascend_study.py"])
        wall = time.perf_counter() - t0
        print(f"{job['experiment']} k={job['k']} {job['variant']} seed {job['seed']}: {wall:.0f} s", flush=True)
    run = load_run(path)
    if np.isnan(wall):  # run by an earlier call: its own record
        wall = float(run.manifest.get("wall_s") or float("nan"))
    return {key: job[key] for key in ("experiment", "k", "variant", "seed")} | {
        "run_dir": str(path), "wall_s": wall, **run_metrics(run)}


def _finished(path: Path) -> bool:
    """Finished, or stopped as diverged (non-finite uploads; a result too: not run again)."""
    from engine.results.tables import load_run

    try:
        return load_run(path).manifest.get("status") in ("finished", "diverged")
    except Exception:  # noqa: BLE001 - no run folder yet, or an unreadable one
        return False


def run_metrics(run) -> dict[str, Any]:
    """Accuracy, time, bytes, rollbacks and reward diagnostics of one run."""
    r, c = run.rounds, run.clients
    out: dict[str, Any] = {
        "diverged": run.manifest.get("status") == "diverged",
        "rounds_run": len(r),
        "final_acc": float(r["global_acc"].iloc[-1]),
        "sim_time_s": float(r["sim_time_s"].iloc[-1]),
        "mb_up": float(r["bytes_up"].sum() / 1e6),
        "rollbacks": int(r.get("server_rollback", pd.Series([0])).sum()),
        "capped": int(r.get("server_rollback_capped", pd.Series([0])).sum()),
    }
    for col in r.columns:
        if col.startswith("global_acc_"):
            out["final_" + col.removeprefix("global_")] = float(r[col].iloc[-1])
    closed = c[c["reward_round"] >= 0] if "reward_round" in c else c.iloc[:0]
    if len(closed):
        out["reward_mean"] = float(closed["reward"].mean())
        out["reward_sd"] = float(closed["reward"].std())
        clipped = closed["reward"].abs() >= 1.0 - 1e-12
        out["reward_clipped"] = float(clipped.mean())
        factor = closed["reward_factor"].dropna()
        if len(factor):  # the time factor's spread (v3: T̄/T, v4: T_exp/T; inverted for g < 0)
            out["reward_factor_p05"] = float(factor.quantile(0.05))
            out["reward_factor_p95"] = float(factor.quantile(0.95))
        if "reward_lost" in closed:
            out["reward_lost"] = float(closed["reward_lost"].astype(bool).mean())
        for part in ("reward_df", "reward_dd", "reward_phi", "reward_psi"):
            v = closed[part].replace([np.inf, -np.inf], np.nan).dropna()
            if len(v):
                out[f"{part}_median"] = float(v.median())
                out[f"{part}_min"] = float(v.min())
                out[f"{part}_max"] = float(v.max())
    own = c[c["arm_reason"].isin(POLICY_REASONS)] if "arm_reason" in c else c.iloc[:0]
    out["exploit_frac"] = float((own["arm_reason"] == "exploit").mean()) if len(own) else float("nan")
    if "sim_T_select" in c and c["sim_T_select"].notna().any():  # v3: the time term's spread and parts
        out["tbar_over_t_p05"] = float((c["sim_Tbar"] / c["sim_T"]).quantile(0.05))
        out["tbar_over_t_p95"] = float((c["sim_Tbar"] / c["sim_T"]).quantile(0.95))
        out["select_share"] = float((c["sim_T_select"] / c["sim_T"]).median())
        out["measure_share"] = float((c["sim_T_measure"] / c["sim_total_s"]).median())
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/ascend_claims", help="output folder")
    ap.add_argument("--dataset", default="mnist5k", choices=["mnist5k", "fashion_mnist"])
    ap.add_argument("--quick", action="store_true", help="a setting sized for 2 shared cores")
    ap.add_argument("--design", choices=("v2", "v3", "v4"), default="v2",
                    help="v3: the spec's version-3 study design; v4: the regime cells (V4_CELLS)")
    ap.add_argument("--smoke", action="store_true", help="v3 design, tiny: checks the pipeline in ~1 minute")
    ap.add_argument("--experiments", nargs="+", choices=list(EXPERIMENTS) + list(EXPERIMENTS_V3))
    ap.add_argument("--ks", type=int, nargs="+", help="K values of the main experiment (coordinate counts)")
    ap.add_argument("--ratios", type=float, nargs="+", help="v3: K as a ratio of each model's d")
    ap.add_argument("--bandwidths", type=int, nargs="+", help="v3: Mbps of the cells (one per cell)")
    ap.add_argument("--seeds", type=int, nargs="+", help="seeds")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--num-clients", type=int)
    ap.add_argument("--participation", type=float)
    ap.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration of the base setting")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--distill-steps", type=int, help="server distillation steps per round (spec default 50)")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (one torch thread each)")
    ap.add_argument("--report-only", action="store_true", help="only summarise the finished runs")
    ap.add_argument("--runner", choices=["sweep", "pool"], default="sweep",
                    help="sweep: one hetsim sweep with warm trial processes (default); pool: a process pool")
    args = ap.parse_args(argv)
    quick = {"ks": [1000, 10000], "seeds": [0, 1, 2], "rounds": 25, "num_clients": 12, "participation": 1.0,
             "distill_steps": 20}
    full = {"ks": [100, 1000, 5000, 10000], "seeds": [0, 1, 2], "rounds": 100, "num_clients": 20,
            "participation": 0.5, "distill_steps": 50}
    v3 = {"experiments": list(EXPERIMENTS_V3), "ratios": [0.01, 0.1], "bandwidths": [5, 50, 500],
          "seeds": [0, 1, 2, 3, 4], "rounds": 60, "num_clients": 12, "participation": 1.0, "distill_steps": 20}
    smoke = {**v3, "experiments": ["v3main"], "ratios": [0.01], "bandwidths": [5], "seeds": [0, 1],
             "rounds": 3, "num_clients": 4, "distill_steps": 3}
    v4 = {**v3, "experiments": ["v4regime"], "bandwidths": [500], "seeds": [0, 1, 2], "rounds": 30,
          "num_clients": 6, "distill_steps": 1}
    if args.smoke:
        args.design = "v3"
    chosen = (smoke if args.smoke else v3 if args.design == "v3" else v4 if args.design == "v4"
              else quick if args.quick else full)
    chosen.setdefault("experiments", list(EXPERIMENTS))
    for key, val in chosen.items():
        if getattr(args, key, None) is None:
            setattr(args, key, val)
    return args


def main(argv=None) -> Path:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    cells = plan_v3(args) if args.design in ("v3", "v4") else plan(args)
    if args.design == "v4":  # the regime cells' synthetic data, written once (deterministic)
        from studies.ascend_regimes import write_cifar_like  # only the v4 design needs it

        write_cifar_like(REGIME_DATA)
    if args.smoke:  # the pipeline on a few variants only
        cells = [c for c in cells if c[2] in ("ascend", "topk", "randomk")]
    for seed in args.seeds:  # every experiment's first seed first: partial results are usable
        for exp, k, variant, change in cells:
            if seed not in args.seeds[:change.get("seeds", len(args.seeds))]:
                continue  # a cell that runs fewer seeds
            run_dir = out / "runs" / exp / f"k{k}" / f"{variant}-s{seed}"
            cfg = {**base_config(args, change), "seed": seed, "algorithm": variant_algorithm(variant, k, args),
                   "output": {"dir": str(run_dir.parent), "name": run_dir.name, "overwrite": True}}
            jobs.append({"config": cfg, "run_dir": str(run_dir), "experiment": exp, "k": k, "variant": variant,
                         "seed": seed})
    t0 = time.perf_counter()
    if args.runner == "sweep":
        run_as_sweep(jobs, args, out)
        rows = [summary_row(j) for j in jobs if _finished(Path(j["run_dir"]))]
    else:
        if args.report_only:
            jobs = [j for j in jobs if _finished(Path(j["run_dir"]))]
        if args.jobs > 1 and not args.report_only:
            with ProcessPoolExecutor(max_workers=args.jobs) as pool:
                rows = list(pool.map(run_one, jobs))
        else:
            rows = [run_one(j) for j in jobs]
    summary = pd.DataFrame(rows)
    budgets = cell_budgets(summary)
    curves = pd.DataFrame([curve_metrics(d, b) for d, b in zip(summary["run_dir"], budgets)])
    summary = pd.concat([summary.assign(budget_s=budgets), curves], axis=1)
    arms = arm_shares(summary)
    summary.to_parquet(out / "summary.parquet", index=False)
    arms.to_parquet(out / "arms.parquet", index=False)
    extra = {}
    if args.design in ("v3", "v4"):
        extra = {"paired": paired_differences(summary), "truth": ground_truth(summary, arms),
                 "paired_final": paired_differences(summary, "final_acc"),
                 "paired_at_budget": paired_differences(summary, "acc_at_budget")}
        if args.design == "v4":  # reward v4 as the reference too
            extra["paired_v4"] = paired_differences(summary, ref="ascend_v4")
        for name, df in extra.items():
            df.to_parquet(out / f"{name}.parquet", index=False)
    write_markdown(out, args, summary, arms, time.perf_counter() - t0, **extra)
    print((out / "results.md").read_text())
    return out


if __name__ == "__main__":
    main()
