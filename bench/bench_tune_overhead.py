"""Ray Tune's overhead per trial beyond the simulation itself.

Runs N tiny simulations (digits, MLP, 10 clients, a few rounds; one learning rate each) twice:
directly in a loop with ``engine.run.run_experiment`` and as one sweep with
``sweeps.run_sweep`` (in-process executor inside each trial), and prints

    overhead per trial = (sweep wall time - direct loop wall time) / N

with the sweep run one trial at a time (``max_concurrent_trials=1``: same work, same order as
the loop), and optionally with ``--concurrency 2`` for throughput. Ray's start-up is timed
separately and not counted. Goal: <= 3 s per trial.

    .venv/bin/python bench/bench_tune_overhead.py                 # 8 trials, 2 rounds
    .venv/bin/python bench/bench_tune_overhead.py --trials 16 --rounds 3 --concurrency 2
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

BASE = {
    "seed": 0,
    "dataset": {"name": "digits"},
    "model": {"name": "mlp"},
    "clients": {"num_clients": 10, "participation": 0.5, "profiles": {}},
    "algorithm": {"name": "fedavg"},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=1, help="max_concurrent_trials of a second sweep (>1)")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    from engine.ray.cluster import init_ray

    init_ray(num_cpus=args.cpus)
    ray_start = time.perf_counter() - t0

    from engine.config.schema import load_config
    from engine.run.api import run_experiment
    from sweeps import run_sweep

    lrs = [round(0.02 + 0.01 * i, 4) for i in range(args.trials)]
    base = {**BASE, "rounds": args.rounds}
    tmp = Path(tempfile.mkdtemp(prefix="bench_tune_"))
    try:
        # A trial reserves 1 CPU and Ray starts it with OMP_NUM_THREADS=1: the loop uses one torch
        # thread too (two threads on two busy cores are slower, not faster, for this MLP).
        import torch

        torch.set_num_threads(1)
        # warm-up: imports and the dataset cache of this process, so the loop times runs only
        run_experiment(load_config(base), tmp / "warmup")
        t = time.perf_counter()
        for i, lr in enumerate(lrs):
            run_experiment(load_config(base, {"train.lr": lr}), tmp / "direct" / str(i))
        direct = time.perf_counter() - t

        def sweep(concurrency: int, name: str) -> tuple[float, float]:
            spec = {"name": name, "base": base, "space": {"train.lr": {"grid": lrs}},
                    "max_concurrent_trials": concurrency}
            t = time.perf_counter()
            result = run_sweep(spec, storage=tmp / name, quiet=True)
            wall = time.perf_counter() - t
            assert (result.trials["status"] == "finished").all(), result.trials["error"].tolist()
            return wall, float(result.trials["wall_s"].sum())

        seq, seq_sim = sweep(1, "sequential")
        rows = [("direct loop", direct, direct / args.trials, None),
                ("sweep, 1 at a time", seq, seq / args.trials, (seq - direct) / args.trials),
                ("  vs its own sim time", seq, seq / args.trials, (seq - seq_sim) / args.trials)]
        if args.concurrency > 1:
            par, _ = sweep(args.concurrency, f"concurrent{args.concurrency}")
            rows.append((f"sweep, {args.concurrency} at a time", par, par / args.trials,
                         (par - direct) / args.trials))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    import ray

    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"{args.trials} trials x {args.rounds} rounds (digits, mlp, 10 clients); "
          f"Ray start-up {ray_start:.1f} s (not counted)")
    print(f"simulation wall time inside the sequential sweep's trials (run folders' wall_s): {seq_sim:.2f} s")
    print(f"{'':24s} {'wall s':>8s} {'s/trial':>8s} {'overhead s/trial':>17s}")
    for label, wall, per, over in rows:
        print(f"{label:24s} {wall:8.2f} {per:8.2f} {'' if over is None else f'{over:17.2f}'}")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
