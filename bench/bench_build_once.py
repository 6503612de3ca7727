"""What building a config once saves (issue 38): validation then the run's set-up (its
:class:`Simulation`, no rounds) of ``--cases`` configs of a sweep in one process.

    .venv/bin/python bench/bench_build_once.py                      # this checkout
    PYTHONPATH=/tmp/old .venv/bin/python bench/bench_build_once.py  # another one, e.g. before

The cases: LeNet-5 on ``mnist5k`` (Dirichlet 0.5, 8 clients), 5 learning rates x 2 seeds,
repeated to ``--cases``, in the order a grid sweep's worker meets them. One warm-up case first
(imports, the disk caches). Prints wall and CPU seconds, total and per case.
"""
from __future__ import annotations

import argparse
import time

from engine.config.schema import load_config
from engine.execution.inprocess import InProcessExecutor
from engine.loop.simulation import Simulation
from engine.run.validate import validate_experiment

BASE = {"dataset.name": "mnist5k", "model.name": "lenet5", "clients.num_clients": 8,
        "partition.scheme": "dirichlet", "partition.alpha": 0.5, "clients.profiles": {}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=50)
    args = ap.parse_args()
    lrs, seeds = (0.02, 0.05, 0.1, 0.2, 0.3), (0, 1)
    grid = [{**BASE, "train.lr": lr, "seed": seed} for seed in seeds for lr in lrs]
    cases = [load_config({}, grid[i % len(grid)]) for i in range(args.cases)]
    warm = load_config({}, {**BASE, "seed": 7})
    validate_experiment(warm)
    Simulation(warm, InProcessExecutor(threads=1))
    wall, cpu = time.perf_counter(), time.process_time()
    for cfg in cases:
        validate_experiment(cfg)
        Simulation(cfg, InProcessExecutor(threads=1))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{args.cases} cases (validate + set up): wall {wall:.2f} s ({1000 * wall / args.cases:.0f} ms a case), "
          f"CPU {cpu:.2f} s ({1000 * cpu / args.cases:.0f} ms a case)")


if __name__ == "__main__":
    main()
