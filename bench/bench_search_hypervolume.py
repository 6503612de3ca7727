"""Optuna (a multi-objective sampler) against random search on the FedCSPACK trade-off example.

Runs ``sweeps/examples/fedcspack_optuna.yaml`` (pack size x K x weighting on personalized
accuracy max and upload bytes min) twice per search seed with the same number of trials: once as
in the spec (Optuna, TPE by default) and once with ``search: {algorithm: random}`` over the
same space (its grid keys as choices, so both draw from the same distributions), and prints the
2-D hypervolume of each sweep's trials against one reference point for all of them:
(pers_acc 0, upload bytes = 1.1 x the largest upload any trial of the comparison made).

    .venv/bin/python bench/bench_search_hypervolume.py --seeds 0 1 2          # 32 trials, TPE
    .venv/bin/python bench/bench_search_hypervolume.py --trials 16 --seeds 0 1 --sampler nsga2
"""
from __future__ import annotations

import argparse
import copy
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "sweeps" / "examples" / "fedcspack_optuna.yaml"
OBJECTIVES = ("objective_pers_acc", "total_bytes_up")
MODES = ("max", "min")


def specs(trials: int, seed: int, sampler: str, population: int, rounds: int | None) -> dict[str, dict]:
    base = yaml.safe_load(EXAMPLE.read_text())
    base["num_samples"] = trials
    base["search_seed"] = seed
    if rounds is not None:
        base["base"]["rounds"] = rounds
    optuna = copy.deepcopy(base)
    options = {"population_size": population} if sampler in ("nsga2", "nsga3") else (
        {"n_startup_trials": population} if sampler in ("tpe", "gp") else {})
    optuna["search"] = {"algorithm": "optuna", "sampler": sampler, "seed": seed, "sampler_options": options}
    rand = copy.deepcopy(base)
    rand["search"] = {"algorithm": "random"}
    rand["space"] = {k: ({"choice": list(d["grid"])} if "grid" in d else d) for k, d in base["space"].items()}
    return {f"optuna-{sampler}": optuna, "random": rand}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=32, help="trials per sweep (num_samples)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="search seeds (one pair of sweeps each)")
    ap.add_argument("--sampler", default="tpe", help="the Optuna sampler (tpe, nsga2, ...)")
    ap.add_argument("--population", type=int, default=6,
                    help="nsga2/nsga3 population_size, tpe/gp n_startup_trials (random trials first)")
    ap.add_argument("--rounds", type=int, default=None, help="override the example's rounds")
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args(argv)

    from engine.ray.cluster import init_ray
    from sweeps import run_sweep
    from sweeps.stats import hypervolume_2d

    init_ray(num_cpus=args.cpus)
    tmp = Path(tempfile.mkdtemp(prefix="bench_hv_"))
    points: dict[tuple[str, int], np.ndarray] = {}
    walls: dict[tuple[str, int], float] = {}
    try:
        for seed in args.seeds:
            for name, spec in specs(args.trials, seed, args.sampler, args.population, args.rounds).items():
                t0 = time.perf_counter()
                s = run_sweep({**spec, "name": f"{name}-{seed}"}, storage=tmp / f"{name}-{seed}", quiet=True)
                walls[name, seed] = time.perf_counter() - t0
                ok = s.trials[s.trials["status"] == "finished"]
                points[name, seed] = ok[list(OBJECTIVES)].to_numpy(dtype=float)
                print(f"  {name:<14} seed {seed}: {len(ok)}/{len(s.trials)} trials finished in "
                      f"{walls[name, seed]:.0f} s", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    reference = (0.0, 1.1 * max(float(np.nanmax(p[:, 1])) for p in points.values()))
    print(f"{args.trials} trials per sweep, FedCSPACK example ({EXAMPLE.relative_to(ROOT)}), "
          f"reference point (pers_acc 0, upload {reference[1] / 1e6:.3f} MB)")
    print(f"{'search':<16}{'seed':>5}{'hypervolume':>13}{'  (acc x MB)':>12}{'best pers_acc':>15}"
          f"{'min upload MB':>15}{'wall s':>8}")
    by_name: dict[str, list[float]] = {}
    for (name, seed), p in points.items():
        hv = hypervolume_2d(p, reference, MODES)
        by_name.setdefault(name, []).append(hv)
        print(f"{name:<16}{seed:>5}{hv:>13.4g}{hv / 1e6:>12.4f}{np.nanmax(p[:, 0]):>15.3f}"
              f"{np.nanmin(p[:, 1]) / 1e6:>15.3f}{walls[name, seed]:>8.0f}")
    for name, hvs in by_name.items():
        print(f"mean {name:<11}{'':>5}{np.mean(hvs):>13.4g}{np.mean(hvs) / 1e6:>12.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
