"""Worked example of docs/energy.md: FedAvg, FedCSPACK and ASCEND on one heterogeneous,
battery-powered fleet: the joules each spends to reach a target accuracy, and which tier pays.

    .venv/bin/python studies/energy_methods.py [--rounds 20] [--target 0.6] [--fleet lte_wifi|wifi]
    .venv/bin/python studies/energy_methods.py --smoke      # 2 rounds of 8 clients, no reports: seconds

The three runs share the seed, the data (MNIST 5k, Dirichlet(0.5), 10 % public split so that
ASCEND can distil) and the fleet: phones, laptops and Raspberry Pis on LTE (4g) or Wi-Fi, the
phones and laptops on batteries that charge while the device is online. ASCEND gives the slow
devices LeNet5Half (its heterogeneous-model setting, K = 10 % of each model); the others train
LeNet5 everywhere. ``--fleet wifi`` puts every client on Wi-Fi-class links (no LTE tails).
Prints one table per question and writes ``energy_methods.png`` (accuracy against cumulative
fleet energy) and each run's report.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import engine
from engine.results import load_run
from hetsim.compare import time_to_target
from hetsim.report import build_report
from hetsim.report_energy import ENERGY_PHASES, cumulative_energy, energy_to_target

FLEET = {
    "devices": {"phone_low": 0.25, "phone_mid": 0.25, "laptop_cpu": 0.25, "rpi4": 0.25},
    "network": {"4g": 0.5, "wifi": 0.5},
    "battery": {"start": {"low": 0.5, "high": 1.0}, "threshold": 0.2, "charging": "online"},
}
BASE = {
    "dataset.name": "mnist5k", "partition.scheme": "dirichlet", "partition.alpha": 0.5,
    "partition.public_fraction": 0.1, "model.name": "lenet5", "clients.num_clients": 16,
    "clients.participation": 0.5, "evaluation.eval_every": 1,
}
METHODS = {
    "fedavg": {"algorithm": {"name": "fedavg"}},
    "fedcspack": {"algorithm": {"name": "fedcspack"}},
    "ascend": {"algorithm": {"name": "ascend", "k": 0.1},
               "model.zoo": [{"arch": "lenet5_half", "max_gflops": 10}]},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--target", type=float, default=0.6, help="personalized accuracy to reach")
    p.add_argument("--fleet", choices=("lte_wifi", "wifi"), default="lte_wifi")
    p.add_argument("--out", default=None, help="default: runs/energy_methods_<fleet>")
    p.add_argument("--smoke", action="store_true",
                   help="2 rounds of 8 clients, no per-run reports (`hetsim report` draws them): seconds")
    args = p.parse_args()
    rounds, clients = (2, {"clients.num_clients": 8}) if args.smoke else (args.rounds, {})
    out = Path(args.out or f"runs/energy_methods_{args.fleet}")
    fleet = {**FLEET, "network": {"4g": 0.5, "wifi": 0.5} if args.fleet == "lte_wifi" else {"wifi": 0.5, "50mbps": 0.5}}
    runs = {}
    for name, overrides in METHODS.items():
        path = out / name
        if not (path / "manifest.json").exists():
            engine.simulate(None, {**BASE, **clients, "clients.profiles": fleet, **overrides, "rounds": rounds,
                                   "output.dir": str(out), "output.name": name})
        runs[name] = load_run(path)
        if not args.smoke:
            build_report(path)

    metric = "pers_acc"
    rows = []
    for name, run in runs.items():
        r = run.rounds
        time_to, rounds_to = time_to_target(r, metric, args.target)
        rows.append({
            "method": name,
            f"final_{metric}": r[metric].iloc[-1],
            f"rounds_to_{args.target:.0%}": rounds_to,
            "sim_s_to_target": time_to,
            "energy_to_target_kJ": energy_to_target(r, metric, args.target) / 1e3,
            "energy_total_kJ": r["energy_j"].sum() / 1e3,
            "wasted_%": 100 * r["energy_wasted_j"].sum() / r["energy_j"].sum(),
            "upload_MB": r["bytes_up"].sum() / 1e6,
        })
    print(pd.DataFrame(rows).set_index("method").to_string(float_format=lambda v: f"{v:.3g}"))

    print("\nwho pays: share of each method's energy by device tier / network tier, and by phase")
    for name, run in runs.items():
        c = run.clients[run.clients["energy_j"].notna()]
        total = c["energy_j"].sum()
        tiers = (c.groupby("tier")["energy_j"].sum() / total * 100).round(1).to_dict()
        nets = (c.groupby("net_tier")["energy_j"].sum() / total * 100).round(1).to_dict()
        phases = {label: round(float(100 * c[col].sum() / total), 1) for col, label, _ in ENERGY_PHASES}
        print(f"  {name:10s} tiers {tiers}  networks {nets}  phases {phases}")

    from matplotlib.figure import Figure  # matplotlib: only this figure needs it

    fig = Figure(figsize=(7.5, 4.0), layout="constrained")
    ax = fig.subplots()
    for name, run in runs.items():
        r = run.rounds
        ax.plot(cumulative_energy(r) / 1e3, r[metric], marker="o", markersize=3, label=name)
    ax.axhline(args.target, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("cumulative fleet energy (kJ)")
    ax.set_ylabel("personalized accuracy")
    ax.set_title("Accuracy against the energy the fleet spent", loc="left")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(out / "energy_methods.png", dpi=110)
    reports = "" if args.smoke else f"; reports: {out}/<method>/report.html"
    print(f"\nfigure: {out / 'energy_methods.png'}{reports}")


if __name__ == "__main__":
    main()
