"""What building a config once saves: validation then the run's set-up (its
:class:`Simulation` and its in-process client host, no rounds) of ``--cases`` configs of a sweep
in one process; ``--models``: what building a model costs against copying a built one.

    .venv/bin/python bench/bench_build_once.py                      # this checkout
    PYTHONPATH=/tmp/old .venv/bin/python bench/bench_build_once.py  # another one, e.g. before
    .venv/bin/python bench/bench_build_once.py --models             # build vs copy, per model

The cases: LeNet-5 on ``mnist5k`` (Dirichlet 0.5, 8 clients), 5 learning rates x 2 seeds,
repeated to ``--cases``, in the order a grid sweep's worker meets them. One warm-up case first
(imports, the disk caches). Prints wall and CPU seconds, total and per case.

``--models``: per built-in model, the CPU milliseconds of ``build_arch_model`` (what a run's
set-up calls) and of ``copy_models`` of an untrained model, interleaved, the median of
``--repeats`` each, with 1 torch thread (a client host's) and torch's default (a driver's).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.config.schema import load_config
from engine.execution.inprocess import InProcessExecutor
from engine.loop.simulation import Simulation
from engine.run.validate import validate_experiment

BASE = {"dataset.name": "mnist5k", "model.name": "lenet5", "clients.num_clients": 8,
        "partition.scheme": "dirichlet", "partition.alpha": 0.5, "clients.profiles": {}}


MODEL_SHAPES = {"mlp": (60,), "cnn": (1, 28, 28), "lenet5": (1, 32, 32), "cifar_cnn": (3, 32, 32),
                "resnet18": (3, 32, 32)}


def build_or_copy(repeats: int) -> None:
    from engine.models.arch import build_arch_model, copy_models

    for threads in sorted({1, torch.get_num_threads()}):  # a client host's 1, and a driver's default
        torch.set_num_threads(threads)
        for name, shape in MODEL_SHAPES.items():
            cfg = load_config({}, {"model.name": name})
            built = {"": build_arch_model(cfg, "", shape, 10)}
            spent: dict[str, list[float]] = {"build": [], "copy": []}
            for _ in range(repeats):
                t0 = time.process_time()
                build_arch_model(cfg, "", shape, 10)
                t1 = time.process_time()
                copy_models(built)
                t2 = time.process_time()
                spent["build"].append(1000 * (t1 - t0))
                spent["copy"].append(1000 * (t2 - t1))
            b, c = statistics.median(spent["build"]), statistics.median(spent["copy"])
            print(f"{threads} torch threads  {name:10s} build {b:8.2f} ms  copy {c:8.2f} ms  build/copy {b / c:5.2f}",
                  flush=True)


def set_up(cfg) -> None:
    """What a run does before its first round, in one process: validate, the Simulation, its host."""
    validate_experiment(cfg)
    sim = Simulation(cfg, InProcessExecutor(threads=1))
    sim.start()
    sim.executor.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--models", action="store_true", help="only: building a model against copying one")
    ap.add_argument("--repeats", type=int, default=30, help="with --models: measures of each")
    args = ap.parse_args()
    if args.models:
        build_or_copy(args.repeats)
        return
    lrs, seeds = (0.02, 0.05, 0.1, 0.2, 0.3), (0, 1)
    grid = [{**BASE, "train.lr": lr, "seed": seed} for seed in seeds for lr in lrs]
    cases = [load_config({}, grid[i % len(grid)]) for i in range(args.cases)]
    warm = load_config({}, {**BASE, "seed": 7})
    set_up(warm)
    wall, cpu = time.perf_counter(), time.process_time()
    for cfg in cases:
        set_up(cfg)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{args.cases} cases (validate + set up): wall {wall:.2f} s ({1000 * wall / args.cases:.0f} ms a case), "
          f"CPU {cpu:.2f} s ({1000 * cpu / args.cases:.0f} ms a case)")


if __name__ == "__main__":
    main()
