"""Synchronous FedAvg against FedBuff and FedAsync on a fleet with slow stragglers (docs/async.md).

20 clients on digits (MLP, Dirichlet(0.5) label skew): 30 % phone_low (1.5 GFLOP/s) and 70 %
laptop_cpu (60 GFLOP/s), 30 % on 5 Mbps links and 70 % on 500 Mbps; availability and dropout
coins as the catalog's tiers. Synchronous FedAvg selects 10 clients a round and waits for the
slowest; FedBuff keeps 10 in flight and steps every 5 updates; FedAsync keeps 10 in flight and
mixes every update in. Synchronous FedAvg selects 400 clients in all (40 rounds of 10; those
offline or dropping out never arrive), the asynchronous runs apply 400 updates each.

Prints, per method and seed: the simulated time to the target global accuracy, the final and best
accuracy, the simulated time used, the updates applied and the share of them that came from
stragglers (phone_low or 5 Mbps; 55 % of the clients in seed 0's draw); writes the figure of seed 0.

    .venv/bin/python studies/async_vs_sync.py --out runs/async_vs_sync --png docs/img/async_vs_sync.png
    .venv/bin/python studies/async_vs_sync.py --smoke --png smoke.png     # seconds: the pipeline only
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

import engine

FLEET = {"devices": {"phone_low": 0.3, "laptop_cpu": 0.7}, "network": {"5mbps": 0.3, "500mbps": 0.7}}
BASE = {"dataset.name": "digits", "model.name": "mlp", "clients.num_clients": 20, "clients.profiles": FLEET,
        "checkpoint.every": 0, "output.overwrite": True}
METHODS = {
    "fedavg (sync)": {"clients.participation": 0.5, "rounds": 40},
    "fedbuff": {"rounds": 80, "asynchronous": {"mode": "fedbuff", "concurrency": 10, "buffer_size": 5,
                                               "staleness": {"kind": "polynomial", "a": 0.5}}},
    "fedasync": {"rounds": 400, "evaluation.eval_every": 5,
                 "asynchronous": {"mode": "fedasync", "concurrency": 10, "mixing": 0.3,
                                  "staleness": {"kind": "polynomial", "a": 0.5}}},
}
# --smoke: the pipeline in seconds (4 clients, 2 rounds or server steps, 2 clients in flight)
SMOKE = {"clients.num_clients": 4, "rounds": 2, "evaluation.eval_every": 1}


def smoke(over: dict) -> dict:
    """``over`` (one method's overrides) shrunk to the smoke setting."""
    mode = over.get("asynchronous", {}).get("mode")
    in_flight = {"asynchronous.concurrency": 2} if mode else {}
    buffer = {"asynchronous.buffer_size": 2} if mode == "fedbuff" else {}
    return {**over, **SMOKE, **in_flight, **buffer}


def time_to(rounds: pd.DataFrame, target: float) -> float:
    hit = rounds[rounds["global_acc"] >= target]
    return float(hit["sim_time_s"].iloc[0]) if len(hit) else float("nan")


def straggler_share(clients: pd.DataFrame) -> float:
    """The share of applied updates that came from a phone_low device or a 5 Mbps link."""
    kept = clients[clients["made_deadline"]]
    return float(((kept["tier"] == "phone_low") | (kept["net_tier"] == "5mbps")).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/async_vs_sync")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--png", default=None, help="write the figure of the first seed here")
    ap.add_argument("--smoke", action="store_true", help="seed 0, 4 clients, 2 rounds: checks the pipeline")
    args = ap.parse_args()
    seeds = [args.seeds[0]] if args.smoke else args.seeds
    rows, curves, staleness = [], {}, None
    for seed in seeds:
        for name, over in METHODS.items():
            over = smoke(over) if args.smoke else over
            run = engine.simulate(None, {**BASE, **over, "seed": seed, "output.dir": args.out,
                                         "output.name": f"{name.split()[0]}-s{seed}"})
            r = run.rounds.dropna(subset=["global_acc"])
            rows.append({"method": name, "seed": seed, f"sim_s_to_{args.target:g}": time_to(r, args.target),
                         "final_acc": r["global_acc"].iloc[-1], "best_acc": r["global_acc"].max(),
                         "sim_s": run.rounds["sim_time_s"].iloc[-1], "updates": int(run.rounds["num_arrived"].sum()),
                         "straggler_share": straggler_share(run.clients)})
            if seed == seeds[0]:
                curves[name] = r[["sim_time_s", "global_acc"]]
                if name == "fedbuff":
                    staleness = run.clients.loc[run.clients["made_deadline"], "staleness"]
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 160)
    print(table.round(3).to_string(index=False))
    print("\nmean over seeds:")
    print(table.drop(columns="seed").groupby("method", sort=False).mean().round(3).to_string())
    if args.png:
        import matplotlib  # only for the figure

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # only for the figure

        fig, (ax, hx) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [2, 1]})
        for name, c in curves.items():
            ax.plot(c["sim_time_s"], c["global_acc"], label=name)
        ax.axhline(args.target, color="grey", lw=0.8, ls=":")
        ax.set(xlabel="simulated time (s)", ylabel="global accuracy", title=f"seed {seeds[0]}")
        ax.legend()
        hx.hist(staleness, bins=np.arange(staleness.max() + 2) - 0.5)
        hx.set(xlabel="staleness of applied updates (versions)", ylabel="updates", title="FedBuff")
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print(f"figure: {args.png}")


if __name__ == "__main__":
    main()
