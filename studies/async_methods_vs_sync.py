"""FedCSPACK and ASCEND: synchronous rounds against FedBuff on the straggler fleet (docs/async.md).

The fleet, data and model of ``studies/async_vs_sync.py`` (20 clients on digits, MLP, 30 %
phone_low and 30 % on 5 Mbps links, the catalog's availability and dropout). Synchronous: 10
clients a round, 40 rounds. FedBuff: 10 in flight, a step every 5 updates, polynomial staleness
(``a = 0.5``), 80 steps. FedCSPACK with its defaults; ASCEND with ``distill_steps: 10`` and a 10 %
public split. Prints, per method, mode and seed: the simulated time to the target global
accuracy, the final and best accuracy, the simulated time used, the updates applied, the fleet's
energy and the wall time.

    .venv/bin/python studies/async_methods_vs_sync.py --out runs/async_methods --seeds 0
    .venv/bin/python studies/async_methods_vs_sync.py --smoke     # seconds: the pipeline only
"""
from __future__ import annotations

import argparse
import time

import pandas as pd
from async_vs_sync import BASE, smoke, time_to  # its sibling: run as a script, studies/ is on the path

import engine

FEDBUFF = {"mode": "fedbuff", "concurrency": 10, "buffer_size": 5, "staleness": {"kind": "polynomial", "a": 0.5}}
ALGORITHMS = {"fedcspack": {"algorithm": {"name": "fedcspack"}},
              "ascend": {"algorithm": {"name": "ascend", "distill_steps": 10}, "partition.public_fraction": 0.1}}
MODES = {"sync": {"clients.participation": 0.5, "rounds": 40}, "fedbuff": {"rounds": 80, "asynchronous": FEDBUFF}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/async_methods")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--smoke", action="store_true", help="seed 0, 4 clients, 2 rounds: checks the pipeline")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds[:1] if args.smoke else args.seeds:
        for method, algo in ALGORITHMS.items():
            for mode, over in MODES.items():
                t0 = time.perf_counter()
                over = smoke(over) if args.smoke else over
                run = engine.simulate(None, {**BASE, **algo, **over, "seed": seed, "output.dir": args.out,
                                             "output.name": f"{method}-{mode}-s{seed}"})
                r = run.rounds.dropna(subset=["global_acc"])
                rows.append({"method": method, "mode": mode, "seed": seed,
                             f"sim_s_to_{args.target}": time_to(r, args.target),
                             "final_acc": r["global_acc"].iloc[-1], "best_acc": r["global_acc"].max(),
                             "sim_s": run.rounds["sim_time_s"].iloc[-1],
                             "updates": int(run.rounds["num_arrived"].sum()),
                             "energy_j": run.rounds["energy_j"].sum(), "wall_s": time.perf_counter() - t0})
    pd.set_option("display.width", 160)
    print(pd.DataFrame(rows).round(3).to_string(index=False))


if __name__ == "__main__":
    main()
