"""Study throughput: runs per hour of a fixed 40-run grid, cold against warm, and how close the
rounds come to a bare PyTorch loop on the same shapes.

    .venv/bin/python bench/bench_study.py                    # all modes (~8 min on 2 cores)
    .venv/bin/python bench/bench_study.py --modes pool sweep --rounds 20
    .venv/bin/python bench/bench_study.py --kernels          # max pooling: native vs strided views
    BENCH_CHECKOUT=/tmp/old PYTHONPATH=/tmp/old .venv/bin/python bench/bench_study.py   # another checkout

The grid: LeNet-5 on ``mnist5k`` (Dirichlet 0.5, 8 clients, 4 a round, 5 local steps of batch 16,
global evaluation every 10 rounds), 60 rounds; 4 methods (FedAvg, FedProx, FedAvg with Top-K and
with Random-K at K/d = 0.1) x 5 learning rates x 2 seeds = 40 runs. Modes, each over the whole
grid with 2 runs at a time (the machine's 2 cores, one torch thread each):

* ``cold``   every run a fresh ``python -m hetsim run -c run.yaml`` process: what a shell loop or a
             study that starts a process per run pays (imports, dataset, models, every time).
* ``pool``   two long-lived worker processes, each running its share with
             :func:`engine.run_experiment`: imports once per worker, the dataset from the process's
             cache (what ``studies/*.py --jobs 2`` did).
* ``sweep``  the same 40 runs as one ``hetsim sweep`` (Ray Tune, in-process executor in each
             trial, ``reuse_actors``: trial processes are kept and reused, so imports and the
             dataset cache survive from one trial to the next); its fixed start (Ray, Tune, the
             first trial's imports) is reported apart from the per-trial figure.

Per mode: wall seconds, runs per hour, and the **per-trial overhead** = (wall x 2 workers -
sum of the runs' round seconds) / 40: the capacity each run costs outside its rounds. For the
sweep the fixed start is subtracted first (it is paid once per sweep, not per trial). With
``HETSIM_TRACE`` every process marks where its seconds go; the split is printed per mode as
median seconds per run: ``start`` (from the process's launch (cold) or the previous run's end
in the same process (warm) to the run's start: interpreter, imports, trial set-up, validation
with its dataset, partition and models), ``data`` (the run's dataset and partition),
``model`` (its models, clients and executor), ``rounds``, ``write`` (tables compacted, manifest
closed).

**The limit.** The same clients, batches and aggregation as a bare PyTorch loop
(``bench_engine.BareLoop``) give the training FLOP/s this machine reaches on these shapes with
one thread; the engine's achieved training FLOP/s (sum of ``clients.parquet`` ``train_flops`` over
the sum of the rounds' wall seconds) is printed as a ratio of it, and so is the whole grid's
(the same FLOPs over the mode's wall seconds x 2 cores).
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

# the checkout whose engine runs (``BENCH_CHECKOUT``, with PYTHONPATH pointing at it too): another
# commit's figures from this script, e.g. today's main against a branch, on one machine state
ROOT = Path(os.environ.get("BENCH_CHECKOUT") or Path(__file__).resolve().parents[1])
WORKERS = 2
METHODS = {
    "fedavg": {"name": "fedavg"},
    "fedprox": {"name": "fedprox", "mu": 0.01},
    "topk": {"name": "fedavg_compressed", "compressor": "topk", "k": 0.1},
    "randomk": {"name": "fedavg_compressed", "compressor": "randomk", "k": 0.1},
}
LRS = (0.02, 0.05, 0.1, 0.2, 0.3)
SEEDS = (0, 1)


def base_config(rounds: int) -> dict:
    return {
        "seed": 0,
        "rounds": rounds,
        "dataset": {"name": "mnist5k"},
        "partition": {"scheme": "dirichlet", "alpha": 0.5},
        "model": {"name": "lenet5"},
        "clients": {"num_clients": 8, "participation": 0.5,
                    "profiles": {"devices": {"rpi4": 0.5, "laptop_cpu": 0.5},
                                 "availability": 1.0, "dropout": 0.0}},
        "train": {"local_steps": 5, "batch_size": 16, "lr": 0.05},
        "evaluation": {"eval_every": 10, "personalized": False},
        "executor": {"kind": "inprocess", "threads_per_actor": 1},
    }


def grid(rounds: int) -> list[dict]:
    """The 40 runs, in the order a sweep of the same space enumerates them (seed innermost)."""
    runs = []
    for method, algo in METHODS.items():
        for lr in LRS:
            for seed in SEEDS:
                cfg = base_config(rounds)
                cfg.update(seed=seed, algorithm=dict(algo))
                cfg["train"] = {**cfg["train"], "lr": lr}
                runs.append({"name": f"{method}-lr{lr}-s{seed}", "config": cfg})
    return runs


# ---------------------------------------------------------------- what a finished run cost


def run_figures(run_dir: Path) -> dict:
    import pandas as pd

    rounds = pd.read_parquet(run_dir / "rounds.parquet", columns=["wall_s"])
    clients = pd.read_parquet(run_dir / "clients.parquet", columns=["train_flops"])
    return {"rounds_s": float(rounds["wall_s"].sum()), "train_flops": float(clients["train_flops"].sum())}


def trace_split(path: Path, launches: dict[int, float] | None = None) -> dict[str, float]:
    """Median seconds per run of each phase, from the ``HETSIM_TRACE`` lines of every process."""
    by_pid: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        t, pid, rest = line.split(" ", 2)
        by_pid[int(pid)].append((float(t), rest.rsplit(" [cpu", 1)[0]))
    phases: dict[str, list[float]] = collections.defaultdict(list)
    for pid, marks in by_pid.items():
        begin = None
        prev_end = launches.get(pid, marks[0][0]) if launches else marks[0][0]
        at: dict[str, float] = {}
        for t, event in marks:
            at[event] = t
            if event == "run: begins":
                begin = t
                phases["start"].append(t - prev_end)
            elif event == "sim: data built" and begin is not None and "data" not in at:
                at["data"] = t
            elif event == "run: folder complete" and begin is not None:
                phases["data"].append(at.pop("data", begin) - begin)
                phases["model"].append(at["loop: rounds begin"] - at["sim: data built"])
                phases["rounds"].append(at["loop: rounds end"] - at["loop: rounds begin"])
                phases["write"].append(t - at["loop: rounds end"])
                prev_end, begin = t, None
    return {k: statistics.median(v) for k, v in phases.items() if v}


# ---------------------------------------------------------------- modes


def mode_cold(runs: list[dict], out: Path, trace: Path) -> dict:
    env = {**os.environ, "HETSIM_TRACE": str(trace), "OMP_NUM_THREADS": "1"}
    launches: dict[int, float] = {}

    def one(run: dict) -> None:
        cfg_path = out / f"{run['name']}.yaml"
        cfg_path.write_text(yaml.safe_dump(run["config"]))
        t0 = time.time()
        proc = subprocess.Popen([sys.executable, "-m", "hetsim", "run", "-q", "-c", str(cfg_path),
                                 "-o", str(out / run["name"])], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        launches[proc.pid] = t0
        _, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{run['name']}: exit {proc.returncode}\n{err[-2000:]}")

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(one, runs))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "dirs": [out / r["name"] for r in runs], "split": trace_split(trace, launches)}


def _pool_init(trace: str) -> None:
    os.environ["HETSIM_TRACE"] = trace
    import torch

    torch.set_num_threads(1)
    import engine.trace

    engine.trace._PATH = trace  # read at import; this worker may have imported it already


def _pool_run(run: dict, out: str) -> str:
    from engine import load_config, run_experiment

    path = Path(out) / run["name"]
    run_experiment(load_config(run["config"]), path, command=["bench_study"])
    return str(path)


def mode_pool(runs: list[dict], out: Path, trace: Path) -> dict:
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(WORKERS, initializer=_pool_init, initargs=(str(trace),)) as pool:
        dirs = list(pool.map(_pool_run, runs, [str(out)] * len(runs)))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "dirs": [Path(d) for d in dirs], "split": trace_split(trace)}


def sweep_spec(rounds: int, storage: Path) -> dict:
    base = base_config(rounds)
    return {
        "name": "bench_study",
        "base": {**base, "algorithm": METHODS["fedavg"]},
        "space": {"algorithm": {"named": METHODS}, "train.lr": {"grid": list(LRS)}},
        "repeats": len(SEEDS),
        "metric": "global_acc",
        "mode": "max",
        "max_concurrent_trials": WORKERS,
        "resources_per_trial": {"cpus": 1},
        "storage": str(storage),
        "ray": {"num_cpus": WORKERS},
    }


def mode_sweep(rounds: int, out: Path, trace: Path) -> dict:
    env = {**os.environ, "HETSIM_TRACE": str(trace)}
    spec = out / "spec.yaml"
    spec.write_text(yaml.safe_dump(sweep_spec(rounds, out / "sweep")))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hetsim", "sweep", str(spec), "-q"], env=env, cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    launch = time.time() - wall
    dirs = sorted((out / "sweep" / "runs").iterdir())
    # fixed start: from launch to the first trial's first mark (Ray, Tune, the trial process's imports)
    firsts = [float(line.split(" ", 1)[0]) for line in trace.read_text().splitlines() if "trial: begins" in line]
    return {"wall_s": wall, "dirs": dirs, "split": trace_split(trace), "fixed_s": min(firsts) - launch}


def bare_limit(rounds: int) -> float:
    """Training FLOP/s of a bare PyTorch loop over the grid's first run's clients and batches
    (FedAvg, one thread): the same samples per step, the same model."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_engine import BareLoop

    from engine import load_config
    from engine.models.flops import training_flops_per_sample

    torch.set_num_threads(1)
    cfg = load_config(grid(rounds)[0]["config"])
    cfg.train.local_epochs, steps = 1, cfg.train.local_steps
    loop = BareLoop(cfg)
    n = cfg.train.batch_size * steps  # BareLoop trains epochs: keep the samples a local-steps client sees
    loop.data.train_indices = lambda cid, _f=loop.data.train_indices: _f(cid)[:n]
    per_sample = training_flops_per_sample("lenet5", loop.data.input_shape, loop.data.num_classes)
    loop.round(0)  # warm-up
    samples, t0 = 0, time.perf_counter()
    for r in range(1, 21):
        loop.round(r)
        samples += n * int(cfg.clients.num_clients * cfg.clients.participation)
    return samples * per_sample / (time.perf_counter() - t0)


def kernels() -> None:
    import torch
    import torch.nn.functional as F

    from engine.models.zoo import MaxPool2d

    torch.set_num_threads(1)
    pool = MaxPool2d()
    for shape in ((16, 6, 28, 28), (16, 16, 10, 10), (512, 6, 28, 28)):
        x = torch.randn(*shape)
        for name, f in (("native", lambda x=x: F.max_pool2d(x, 2)), ("strided views", lambda x=x: pool(x))):
            with torch.no_grad():
                f()
                t0, n = time.perf_counter(), 200
                for _ in range(n):
                    f()
            print(f"max pooling {shape}, no autograd, {name}: {(time.perf_counter() - t0) / n * 1e3:.3f} ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["cold", "pool", "sweep"], choices=["cold", "pool", "sweep"])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--runs", type=int, default=40, help="the first N runs of the grid (default all 40)")
    ap.add_argument("--kernels", action="store_true", help="only time max pooling, native vs strided views")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    if args.kernels:
        kernels()
        return 0
    runs = grid(args.rounds)[: args.runs]
    tmp = Path(tempfile.mkdtemp(prefix="bench_study_"))
    limit = bare_limit(args.rounds)
    print(f"{len(runs)} runs of {args.rounds} rounds, {WORKERS} at a time; bare PyTorch loop: "
          f"{limit / 1e9:.2f} GFLOP/s of training on one thread")
    results = {}
    try:
        for mode in args.modes:
            out = tmp / mode
            out.mkdir()
            trace = tmp / f"{mode}.trace"
            trace.touch()
            if mode == "sweep" and len(runs) != len(grid(args.rounds)):
                print("sweep: runs the whole grid (--runs applies to cold and pool)")
            r = (mode_cold(runs, out, trace) if mode == "cold" else mode_pool(runs, out, trace) if mode == "pool"
                 else mode_sweep(args.rounds, out, trace))
            figs = [run_figures(d) for d in r.pop("dirs")]
            n = len(figs)
            rounds_s = sum(f["rounds_s"] for f in figs)
            flops = sum(f["train_flops"] for f in figs)
            fixed = r.get("fixed_s", 0.0)
            r.update(runs=n, runs_per_hour=3600 * n / r["wall_s"], rounds_s=rounds_s,
                     overhead_per_trial_s=((r["wall_s"] - fixed) * WORKERS - rounds_s) / n,
                     rounds_vs_limit=flops / rounds_s / limit,
                     grid_vs_limit=flops / (r["wall_s"] * WORKERS) / limit)
            results[mode] = r
            split = ", ".join(f"{k} {v:.2f}" for k, v in r["split"].items())
            print(f"{mode:>6}: {r['wall_s']:7.1f} s wall, {r['runs_per_hour']:6.0f} runs/h, overhead per trial "
                  f"{r['overhead_per_trial_s']:5.2f} s" + (f" (+ {fixed:.1f} s once)" if fixed else "")
                  + f"; training FLOP/s vs bare loop: rounds {r['rounds_vs_limit']:.2f}, whole grid "
                  f"{r['grid_vs_limit']:.2f}\n        median s per run: {split}", flush=True)
        if "cold" in results:
            for mode in results:
                if mode != "cold":
                    print(f"{mode} vs cold: {results['cold']['wall_s'] / results[mode]['wall_s']:.2f}x faster")
        if args.json:
            Path(args.json).write_text(json.dumps({"limit_flops": limit, "rounds": args.rounds, **results},
                                                  indent=1, default=str))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
