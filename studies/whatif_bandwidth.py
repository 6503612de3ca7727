"""What-if study: the same experiment and seed, with the whole fleet on 500 Mbps versus half of
it moved to 5 Mbps. Prints simulated time per round, time-to-accuracy and accuracy for both.

    .venv/bin/python studies/whatif_bandwidth.py [--rounds 20] [--out runs/whatif] [--set KEY=VALUE ...]

Only the network profile differs between the two runs: the data, the selection, the training
and therefore the accuracies are identical; what changes is the simulated time.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from engine.config import load_config
from engine.results import load_run
from engine.run import run_experiment

BASE = [
    "dataset.name=mnist5k",
    "model.name=cnn",
    "clients.num_clients=20",
    "clients.participation=0.5",
    "clients.profiles.devices={phone_mid: 0.5, laptop_cpu: 0.5}",
    "clients.profiles.availability=1.0",
    "clients.profiles.dropout=0.0",
    "clients.profiles.bandwidth=null",
]
SCENARIOS = {
    "all_500mbps": ["clients.profiles.network={500mbps: 1.0}"],
    "half_5mbps": ["clients.profiles.network={500mbps: 0.5, 5mbps: 0.5}"],
}


def time_to_accuracy(rounds: pd.DataFrame, target: float) -> float:
    hit = rounds.loc[rounds["global_acc"] >= target, "sim_time_s"]
    return float(hit.min()) if len(hit) else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default="runs/whatif_bandwidth")
    p.add_argument("--target", type=float, default=0.80, help="accuracy for time-to-accuracy")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args()

    rows = []
    for name, extra in SCENARIOS.items():
        cfg = load_config(None, [*BASE, f"rounds={args.rounds}", *extra, *args.overrides])
        path = run_experiment(cfg, Path(args.out) / name)
        run = load_run(path)
        r, c = run.rounds, run.clients
        rows.append({
            "scenario": name,
            "sim_s_per_round": r["sim_round_s"].mean(),
            "sim_total_s": r["sim_time_s"].iloc[-1],
            "mean_client_upload_s": c["sim_upload_s"].mean(),
            f"time_to_{args.target:.0%}_s": time_to_accuracy(r, args.target),
            "final_global_acc": r["global_acc"].iloc[-1],
        })
    table = pd.DataFrame(rows).set_index("scenario")
    ratio = table.loc["half_5mbps", "sim_s_per_round"] / table.loc["all_500mbps", "sim_s_per_round"]
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    print(f"\nhalf the fleet on 5 Mbps: {ratio:.1f}x the simulated time per round "
          f"(+{table.loc['half_5mbps', 'sim_s_per_round'] - table.loc['all_500mbps', 'sim_s_per_round']:.2f} s)")


if __name__ == "__main__":
    main()
