"""Start-up and fixed costs (issue 15): every figure next to its goal, interleaved repeats.

    .venv/bin/python bench/bench_startup.py                  # all figures, 3 repeats (~3 min)
    .venv/bin/python bench/bench_startup.py cli ray          # some of: cli ray attach light sweep
    .venv/bin/python bench/bench_startup.py --repeats 5 --timeline

Each figure is a fresh process (``python -m hetsim ...``) timed from launch to exit; the repeats
are interleaved (help, validate, in-process, Ray, help, ...) so that load changes on a shared
machine hit every figure alike, and each figure prints its median and range. Figures:

* ``cli``     ``hetsim --help`` (goal <= 0.5 s) and ``hetsim validate`` (default config, <= 1.5 s).
* ``ray``     the reference job (below) with the Ray executor, whole process (<= 10 s), and its
              rounds against the same job in-process (rounds: sum of ``rounds.parquet`` wall_s;
              in-process ÷ Ray >= 1.7, computed per repeat). ``--timeline`` prints where the
              seconds of the median Ray run went (``HETSIM_TRACE``, see engine/trace.py).
* ``attach``  the same Ray job attached to a running local Ray (``ray start --head`` once, then
              ``ray.address=auto``): what repeated runs on one machine pay.
* ``light``   in one process, in-process engine rounds ÷ a bare PyTorch loop over the same
              clients, batches and aggregation (bench_engine.BareLoop), reference job, rounds
              alternated (goal <= 1.05).
* ``sweep``   ``hetsim sweep`` of 1 and of 4 tiny trials (digits, MLP, 10 clients, 2 rounds, one
              at a time): fixed overhead = wall(1) - the trial's own wall_s (goal <= 8 s);
              per-trial overhead = (overhead(4) - overhead(1)) / 3 (goal <= 0.5 s).

Reference job: FedAvg, the CNN on ``mnist5k``, 20 IID clients (150 training samples each), all
selected every round, 1 local epoch of batch 16, 5 rounds, no evaluation, 2 actors x 1 CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

REFERENCE_JOB = [
    "dataset.name=mnist5k",
    "model.name=cnn",
    "clients.num_clients=20",
    "clients.participation=1.0",
    "clients.profiles={availability: 1.0, dropout: 0.0}",
    "partition.scheme=iid",
    "train.local_epochs=1",
    "train.batch_size=16",
    "rounds=5",
    "evaluation.personalized=false",
    "evaluation.global_model=false",
    "ray.num_cpus=2",
]
SWEEP_BASE = {
    "seed": 0,
    "rounds": 2,
    "dataset": {"name": "digits"},
    "model": {"name": "mlp"},
    "clients": {"num_clients": 10, "participation": 0.5, "profiles": {}},
    "algorithm": {"name": "fedavg"},
}
GOALS = {  # figure -> (goal text, test)
    "hetsim --help": ("<= 0.5 s", lambda v: v <= 0.5),
    "hetsim validate": ("<= 1.5 s", lambda v: v <= 1.5),
    "Ray job, whole process": ("<= 10 s", lambda v: v <= 10.0),
    "Ray job, rounds: in-process ÷ Ray": (">= 1.7x", lambda v: v >= 1.7),
    "in-process job, whole process": ("", None),
    "Ray job attached (ray.address=auto)": ("", None),
    "light rounds: engine ÷ bare loop": ("<= 1.05", lambda v: v <= 1.05),
    "sweep fixed overhead": ("<= 8 s", lambda v: v <= 8.0),
    "sweep per-trial overhead": ("<= 0.5 s", lambda v: v <= 0.5),
}


def hetsim(args: list[str], trace: Path | None = None, check: bool = True) -> float:
    """Wall seconds of ``python -m hetsim ARGS`` from launch to exit."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("HETSIM_TRACE", None)
    if trace is not None:
        env["HETSIM_TRACE"] = str(trace)
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "hetsim", *args], capture_output=True, text=True,
                          env=env, cwd=REPO)
    wall = time.time() - t0
    if check and proc.returncode != 0:
        raise RuntimeError(f"hetsim {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    if trace is not None:
        with open(trace, "a") as f:
            f.write(f"{t0:.4f} 0 launch\n{t0 + wall:.4f} 0 exit\n")
    return wall


def rounds_wall(run_dir: Path) -> float:
    import pandas as pd

    return float(pd.read_parquet(run_dir / "rounds.parquet")["wall_s"].sum())


def run_job(tmp: Path, tag: str, extra: list[str], trace: Path | None = None) -> tuple[float, float]:
    out = tmp / tag
    shutil.rmtree(out, ignore_errors=True)
    args = ["run", "-q", "-o", str(out)]
    for item in [*REFERENCE_JOB, *extra]:
        args += ["--set", item]
    wall = hetsim(args, trace)
    return wall, rounds_wall(out)


# ---------------------------------------------------------------- light rounds, in one process


def light_rounds(repeats: int) -> list[float]:
    """engine ÷ bare ratios, one per repeat, both sides in this process (one torch thread)."""
    code = f"""
import json, sys, tempfile, time
sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'bench')!r}]
import torch
torch.set_num_threads(1)
from bench_engine import BareLoop
from engine.config import load_config
from engine.executor import InProcessExecutor
from engine.results import RunWriter
from engine.simulation import Simulation
cfg = load_config(None, {REFERENCE_JOB!r})
sim = Simulation(cfg, executor=InProcessExecutor(threads=1))
sim.start()
bare = BareLoop(cfg, data=sim.data)
writer = RunWriter(tempfile.mkdtemp())
def engine_round(r):
    rec = sim.run_round(r)
    writer.append("rounds", [rec.row])
    writer.append("clients", rec.client_rows)
engine_round(0); bare.round(0)  # warm-up
ratios = []
for rep in range({repeats}):
    times = {{}}
    for name, fn in (("engine", engine_round), ("bare", bare.round)) if rep % 2 == 0 else \\
            (("bare", bare.round), ("engine", engine_round)):
        t = time.perf_counter()
        for r in range(1, cfg.rounds):
            fn(r)
        times[name] = time.perf_counter() - t
    ratios.append(times["engine"] / times["bare"])
print(json.dumps(ratios))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"light rounds failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- sweeps


def sweep_overhead(tmp: Path, trials: int) -> float:
    """Wall of ``hetsim sweep`` minus the trials' own wall_s (run folders' manifests)."""
    import yaml

    name = f"bench{trials}"
    storage = tmp / name
    shutil.rmtree(storage, ignore_errors=True)
    spec = {"name": name, "base": SWEEP_BASE, "max_concurrent_trials": 1,
            "space": {"train.lr": {"grid": [round(0.02 + 0.01 * i, 4) for i in range(trials)]}},
            "ray": {"num_cpus": 2}}
    spec_path = tmp / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    wall = hetsim(["sweep", "-q", str(spec_path), "--storage", str(storage)])
    inside = sum(json.loads(p.read_text())["wall_s"] for p in storage.glob("runs/*/manifest.json"))
    return wall - inside


# ---------------------------------------------------------------- attached to a running Ray


class LocalRayHead:
    """``ray start --head`` for the attach figure; stopped on exit."""

    def __init__(self, trace: Path):
        self.env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                    "HETSIM_TRACE": str(trace), "RAY_USAGE_STATS_ENABLED": "0"}
        self.ray = str(Path(sys.executable).with_name("ray"))

    def __enter__(self):
        subprocess.run([self.ray, "start", "--head", "--num-cpus=2", "--include-dashboard=false",
                        "--node-ip-address=127.0.0.1", "--disable-usage-stats"],
                       check=True, capture_output=True, env=self.env)
        return self

    def __exit__(self, *exc):
        subprocess.run([self.ray, "stop", "--force"], capture_output=True, env=self.env)


# ---------------------------------------------------------------- report


def timeline(trace: Path) -> list[str]:
    """The trace's events as seconds since launch; pid 0 = the bench's launch/exit marks."""
    rows = []
    for line in trace.read_text().splitlines():
        t, pid, event = line.split(" ", 2)
        rows.append((float(t), int(pid), event))
    rows.sort()
    t0 = next(t for t, pid, e in rows if e == "launch")
    names, out = {}, []
    for t, pid, event in rows:
        if pid and pid not in names:
            names[pid] = f"p{len(names) + 1}"
        out.append(f"  {t - t0:6.2f} s  {names.get(pid, '-'):>3}  {event}")
    return out


def summarize(samples: dict[str, list[float]]) -> list[str]:
    lines = [f"{'figure':<40} {'goal':>9} {'median':>8} {'range':>15}  met"]
    for name, (goal, test) in GOALS.items():
        vals = samples.get(name)
        if not vals:
            continue
        med = statistics.median(vals)
        unit = "x" if "÷" in name else "s"
        rng = f"{min(vals):.2f}–{max(vals):.2f}"
        met = "" if test is None else ("yes" if test(med) else "NO")
        lines.append(f"{name:<40} {goal:>9} {med:7.2f}{unit} {rng:>15}  {met}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", nargs="*", default=["cli", "ray", "attach", "light", "sweep"],
                    help="figures: cli ray attach light sweep (default: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeline", action="store_true", help="print the median Ray run's timeline")
    args = ap.parse_args(argv)
    which = set(args.which)
    unknown = which - {"cli", "ray", "attach", "light", "sweep"}
    if unknown:
        ap.error(f"unknown figure(s) {sorted(unknown)}")

    import ray
    import torch

    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# cpus {os.cpu_count()}, torch {torch.__version__}, ray {ray.__version__}, "
          f"load average before {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    t_start = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    samples: dict[str, list[float]] = {}
    ray_traces: list[tuple[float, Path]] = []

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    try:
        for rep in range(args.repeats):
            if "cli" in which:
                add("hetsim --help", hetsim(["--help"]))
                add("hetsim validate", hetsim(["validate"]))
            if "ray" in which:
                wall_local, rounds_local = run_job(tmp, "inprocess", ["executor.kind=inprocess"])
                trace = tmp / f"trace_ray_{rep}.txt"
                wall_ray, rounds_ray = run_job(tmp, "ray", ["executor.kind=ray"], trace)
                add("in-process job, whole process", wall_local)
                add("Ray job, whole process", wall_ray)
                add("Ray job, rounds: in-process ÷ Ray", rounds_local / rounds_ray)
                ray_traces.append((wall_ray, trace))
            if "sweep" in which:
                one = sweep_overhead(tmp, 1)
                four = sweep_overhead(tmp, 4)
                add("sweep fixed overhead", one)
                add("sweep per-trial overhead", (four - one) / 3)
        if "attach" in which:
            trace = tmp / "trace_attach.txt"
            with LocalRayHead(trace):
                run_job(tmp, "attach", ["executor.kind=ray", "ray.address=auto", "ray.num_cpus=null"])
                for _ in range(args.repeats):
                    trace.write_text("")
                    wall, _ = run_job(tmp, "attach", ["executor.kind=ray", "ray.address=auto",
                                                      "ray.num_cpus=null"], trace)
                    add("Ray job attached (ray.address=auto)", wall)
                attach_timeline = timeline(trace)
        if "light" in which:
            for ratio in light_rounds(max(args.repeats, 4)):
                add("light rounds: engine ÷ bare loop", ratio)
        print(f"# load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
              f"{args.repeats} repeats, bench took {time.time() - t_start:.0f} s\n")
        print("\n".join(summarize(samples)))
        if args.timeline and ray_traces:
            wall, trace = sorted(ray_traces)[len(ray_traces) // 2]
            print(f"\nmedian Ray run ({wall:.2f} s), seconds since launch "
                  "(p1 = the hetsim command, then other processes in order of appearance):")
            print("\n".join(timeline(trace)))
            if "attach" in which:
                print("\nlast attached run:")
                print("\n".join(attach_timeline))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
