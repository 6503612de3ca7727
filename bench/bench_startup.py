"""Start-up and fixed costs: every figure next to its goal, interleaved repeats.

    .venv/bin/python bench/bench_startup.py                  # all figures, 3 repeats (~3 min)
    .venv/bin/python bench/bench_startup.py cli ray          # some of: cli ray rayjob attach light sweep
    .venv/bin/python bench/bench_startup.py --repeats 5 --timeline
    .venv/bin/python bench/bench_startup.py cli ray --timeline --baseline /tmp/before
                      # the same figures of another checkout (e.g. `git worktree add /tmp/before
                      # <commit>`), interleaved with this one's: before/after on one machine state
    .venv/bin/python bench/bench_startup.py rayjob --repeats 10 --baseline /tmp/a --baseline /tmp/b
                      # several baselines, each labelled by its folder's name
    .venv/bin/python bench/bench_startup.py rayjob --compile --repeats 15 --baseline /tmp/before
                      # every tree's bytecode written first: where PYTHONDONTWRITEBYTECODE is set
                      # a larger tree otherwise pays its compilation in every process

Each figure is a fresh process (``python -m hetsim ...``) timed from launch to exit; the repeats
are interleaved (help, validate, in-process, Ray, help, ...) so that load changes on a shared
machine hit every figure alike (the trees' order rotates from one repeat to the next), and each
figure prints its median and range. Figures:

* ``cli``     ``hetsim --help`` (goal <= 0.5 s) and ``hetsim validate`` (default config, <= 1.5 s).
* ``ray``     the reference job (below) with the Ray executor, whole process (<= 10 s), and its
              rounds against the same job in-process (rounds: sum of ``rounds.parquet`` wall_s;
              in-process ÷ Ray >= 1.7, computed per repeat). ``--timeline`` prints where the
              seconds of the median Ray run went (``HETSIM_TRACE``, see engine/trace.py).
              Next to them, the same rounds as bare PyTorch (bench_engine.BareLoop / BarePool):
              one process ÷ a hand-written pool of 2 processes, the speed-up this machine's two
              cores give any engine, and bare pool ÷ Ray (> 1: Ray rounds faster than the pool).
              With ``--flower PYTHON`` (an environment with ``flwr[simulation]`` that also sees
              torch; docs/studies/benchmarks.md), the same job as a Flower simulation (bench/flower_job.py)
              in each repeat: whole process, rounds, Ray job ÷ Flower job, and rounds 2-5 of
              Flower ÷ those of the Ray job (Flower starts its actors inside round 1).
* ``rayjob``  the Ray job's whole process alone (with its ``--timeline``): the one ``ray`` figure
              that start-up changes move, at a third of the time per repeat on a loaded machine.
* ``attach``  the same Ray job attached to a running local Ray (``ray start --head`` once, then
              ``ray.address=auto``): what repeated runs on one machine pay.
* ``light``   in one process, in-process engine rounds ÷ a bare PyTorch loop over the same
              clients, batches and aggregation (bench_engine.BareLoop), reference job: 10 x
              repeats pairs of rounds, alternated, ratios of CPU time and of wall time (goal
              <= 1.05; CPU time is what a loaded machine disturbs least).
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

from bench_engine import COMPUTE_BOUND  # noqa: E402 - this folder is on sys.path when run as a script

# bench_engine's compute-bound setting with light rounds: 1 epoch of batch 16, 5 rounds
REFERENCE_JOB = [*COMPUTE_BOUND, "train.local_epochs=1", "train.batch_size=16", "rounds=5", "ray.num_cpus=2"]
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
    "bare rounds: 1 process ÷ pool of 2": ("", None),
    "Ray job, rounds: bare pool ÷ Ray": ("", None),
    "Flower job, whole process": ("", None),
    "Flower job, rounds (strategy.start)": ("", None),
    "Ray job ÷ Flower job, whole process": ("about 0.5", None),
    "rounds 2-5: Flower ÷ Ray": ("", None),
    "in-process job, whole process": ("", None),
    "Ray job attached (ray.address=auto)": ("", None),
    "light rounds: engine ÷ bare loop, CPU": ("<= 1.05", lambda v: v <= 1.05),
    "light rounds: engine ÷ bare loop, wall": ("<= 1.05", lambda v: v <= 1.05),
    "sweep fixed overhead": ("<= 8 s", lambda v: v <= 8.0),
    "sweep per-trial overhead": ("<= 0.5 s", lambda v: v <= 0.5),
}


def hetsim(args: list[str], tree: Path = REPO, trace: Path | None = None, check: bool = True) -> float:
    """Wall seconds of ``python -m hetsim ARGS`` (the checkout ``tree``) from launch to exit."""
    # RAY_ADDRESS=local: a Ray started by `ray start` elsewhere on this (shared) machine must not
    # be joined by the runs that are meant to start their own; the attach figure names its own.
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_ADDRESS": "local"}
    env.pop("HETSIM_TRACE", None)
    if trace is not None:
        env["HETSIM_TRACE"] = str(trace)
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "hetsim", *args], capture_output=True, text=True,
                          env=env, cwd=tree)
    wall = time.time() - t0
    if check and proc.returncode != 0:
        raise RuntimeError(f"hetsim {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    if trace is not None:
        with open(trace, "a") as f:
            f.write(f"{t0:.4f} 0 launch\n{t0 + wall:.4f} 0 exit\n")
    return wall


def rounds_wall(run_dir: Path, first: int = 0) -> float:
    """Sum of ``rounds.parquet``'s wall_s from round ``first`` on."""
    import pandas as pd

    return float(pd.read_parquet(run_dir / "rounds.parquet")["wall_s"].iloc[first:].sum())


def run_job(tmp: Path, tag: str, extra: list[str], tree: Path = REPO,
            trace: Path | None = None) -> tuple[float, float]:
    """(whole process, sum of the rounds' wall_s) of the reference job."""
    out = tmp / tag
    shutil.rmtree(out, ignore_errors=True)
    args = ["run", "-q", "-o", str(out)]
    for item in [*REFERENCE_JOB, *extra]:
        args += ["--set", item]
    wall = hetsim(args, tree, trace)
    return wall, rounds_wall(out)


# ---------------------------------------------------------------- light rounds, in one process


def light_rounds(pairs: int, tree: Path = REPO) -> dict[str, list[float]]:
    """engine ÷ bare ratios of wall time and of CPU time, one per pair of rounds.

    Both sides run in one process with one torch thread; each pair is one engine round (with
    its Parquet writes) and the bare loop's same round, in alternating order. CPU time (this
    process's, all threads) is what a loaded machine disturbs least.
    """
    code = f"""
import json, sys, tempfile, time
sys.path[:0] = [{str(tree)!r}, {str(tree / 'bench')!r}]
import torch
torch.set_num_threads(1)
from bench_engine import BareLoop
try:
    from engine import load_config
    from engine.execution.inprocess import InProcessExecutor
    from engine.loop.simulation import Simulation
    from engine.results.tables import RunWriter
except ImportError:  # a baseline tree from before engine/ had subpackages
    from engine.config import load_config
    from engine.executor import InProcessExecutor
    from engine.results.tables import RunWriter
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
for r in range(2):  # warm-up: first-touch allocations, lazy imports
    engine_round(r); bare.round(r)
out = {{"wall": [], "cpu": []}}
for i in range({pairs}):
    r = 2 + i % (cfg.rounds - 2)
    t = {{}}
    for name, fn in (("engine", engine_round), ("bare", bare.round))[:: 1 if i % 2 == 0 else -1]:
        w, c = time.perf_counter(), time.process_time()
        fn(r)
        t[name] = (time.perf_counter() - w, time.process_time() - c)
    out["wall"].append(t["engine"][0] / t["bare"][0])
    out["cpu"].append(t["engine"][1] / t["bare"][1])
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree)
    if proc.returncode != 0:
        raise RuntimeError(f"light rounds failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bare_rounds(tree: Path = REPO) -> dict[str, float]:
    """Seconds of the reference job's rounds as bare PyTorch (bench_engine), one fresh process
    each way: a single process (BareLoop) and a pool of 2 worker processes (BarePool). Each
    runs one warm-up round first (untimed: first-touch costs, ~1 s in a fresh pool), then times
    as many rounds as the job has; the engine's rounds.parquet counts its round 0 too."""
    code = f"""
import json, sys, time
sys.path[:0] = [{str(tree)!r}, {str(tree / 'bench')!r}]
import torch
torch.set_num_threads(1)
from bench_engine import BareLoop, BarePool
from engine import load_config
rounds = load_config(None, {REFERENCE_JOB!r}).rounds
out = {{}}
for name, make in (("single", lambda: BareLoop(load_config(None, {REFERENCE_JOB!r}))),
                   ("pool", lambda: BarePool({REFERENCE_JOB!r}, workers=2))):
    loop = make()
    loop.round(0)
    t0 = time.perf_counter()
    for r in range(1, rounds + 1):
        loop.round(r)
    out[name] = time.perf_counter() - t0
    getattr(loop, "close", lambda: None)()
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree)
    if proc.returncode != 0:
        raise RuntimeError(f"bare rounds failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def flower_job(python: str, tmp: Path) -> tuple[float, dict[str, float]]:
    """(whole process, {rounds_s, later_rounds_s}) of the reference job as a Flower simulation
    (bench/flower_job.py)."""
    out = tmp / "flower.json"
    env = {**os.environ, "RAY_ADDRESS": ""}  # Flower starts its own local Ray
    t0 = time.perf_counter()
    proc = subprocess.run([python, str(REPO / "bench" / "flower_job.py"), "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"Flower job failed:\n{proc.stderr[-3000:]}")
    return wall, json.loads(out.read_text())


# ---------------------------------------------------------------- sweeps


def sweep_overhead(tmp: Path, trials: int, tree: Path = REPO) -> float:
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
    wall = hetsim(["sweep", "-q", str(spec_path), "--storage", str(storage)], tree)
    inside = sum(json.loads(p.read_text())["wall_s"] for p in storage.glob("runs/*/manifest.json"))
    return wall - inside


# ---------------------------------------------------------------- attached to a running Ray


class LocalRayHead:
    """``ray start --head --block`` for the attach figure, as a child of this process.

    Not ``ray stop`` at the end (it stops every Ray on the machine, other users' too): the
    blocking ``ray start`` process is sent SIGTERM and takes its Ray down with it. Its own temp
    dir keeps other sessions' ``ray.init()`` from finding it; the runs get its address.
    """

    def __init__(self, trace: Path, tmp: Path, tree: Path = REPO):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir = tmp / "ray"
        self.env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                    "HETSIM_TRACE": str(trace), "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)
        self.ray = str(Path(sys.executable).with_name("ray"))

    def __enter__(self):
        self.proc = subprocess.Popen(
            [self.ray, "start", "--head", "--block", "--num-cpus=2", "--include-dashboard=false",
             "--node-ip-address=127.0.0.1", f"--port={self.port}", f"--temp-dir={self.temp_dir}",
             "--disable-usage-stats"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)
        import ray  # wait until the head answers

        deadline = time.time() + 120
        while True:
            try:
                ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
                ray.shutdown()
                return self
            except Exception:  # noqa: BLE001 - not up yet
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("ray start --head did not come up") from None
                time.sleep(0.5)

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


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


def summarize(samples: dict[str, list[float]], trees: list[tuple[str, Path]]) -> list[str]:
    lines = [f"{'figure':<40} {'tree':<9} {'goal':>9} {'median':>8} {'range':>13}  met"]
    for name, (goal, test) in GOALS.items():
        for label, _ in trees:
            vals = samples.get(name + label)
            if not vals:
                continue
            med = statistics.median(vals)
            unit = "x" if "÷" in name else "s"
            rng = f"{min(vals):.2f}–{max(vals):.2f}"
            met = "" if test is None else ("yes" if test(med) else "NO")
            lines.append(f"{name:<40} {label.strip(' []') or 'this':<9} {goal:>9} {med:7.2f}{unit} {rng:>13}  {met}")
            ours = samples.get(name)
            if label and unit == "s" and ours and len(ours) == len(vals):
                # paired within each repeat: what load changes between repeats cancels out
                diff = [a - b for a, b in zip(ours, vals)]
                low, high = median_interval(diff)
                lines.append(f"{'  this - ' + label.strip(' []') + ', per repeat':<50} {'':>9} "
                             f"{statistics.median(diff):+7.2f}s {min(diff):+.2f}–{max(diff):+.2f}"
                             f"  (median's 95% interval {low:+.2f} to {high:+.2f})")
    return lines


def median_interval(values: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap 95% interval of the median (seeded: the same samples print the same)."""
    import numpy as np

    draws = np.random.default_rng(seed).choice(np.asarray(values), (resamples, len(values)))
    return tuple(float(q) for q in np.quantile(np.median(draws, axis=1), [0.025, 0.975]))


PACKAGES = ("engine", "algorithms", "hardware_profiles", "hetsim", "sweeps")


def bytecode_state(tree: Path) -> str:
    """How many of the tree's own modules have a bytecode cache: a fresh process compiles the
    others from source (the Ray job's four processes each compile the project again),
    which a shell with PYTHONDONTWRITEBYTECODE=1 never writes."""
    sources = [f for pkg in PACKAGES for f in (tree / pkg).rglob("*.py")]
    cached = sum(any(f.parent.joinpath("__pycache__").glob(f"{f.stem}.*.pyc")) for f in sources)
    return f"{cached}/{len(sources)} modules with bytecode"


def compile_tree(tree: Path) -> None:
    """Write the tree's bytecode caches (what a checkout's first run writes where
    PYTHONDONTWRITEBYTECODE is unset), so that no figure pays compilation."""
    present = [pkg for pkg in PACKAGES if (tree / pkg).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *present], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", nargs="*", default=["cli", "ray", "attach", "light", "sweep"],
                    help="figures: cli ray rayjob attach light sweep (default: all but rayjob)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeline", action="store_true", help="print the median Ray run's timeline")
    ap.add_argument("--compile", action="store_true",
                    help="write every tree's bytecode caches first (compare trees of different sizes "
                         "where PYTHONDONTWRITEBYTECODE is set: else each process compiles them)")
    ap.add_argument("--flower", metavar="PYTHON",
                    help="the Python of an environment with flwr[simulation]: adds the Flower figures")
    ap.add_argument("--baseline", type=Path, metavar="TREE", action="append", default=[],
                    help="another checkout whose figures are measured interleaved with this one's "
                         "(repeatable: each is then labelled by its folder's name)")
    args = ap.parse_args(argv)
    which = set(args.which)
    unknown = which - {"cli", "ray", "rayjob", "attach", "light", "sweep"}
    if unknown:
        ap.error(f"unknown figure(s) {sorted(unknown)}")
    if "ray" in which:
        which.discard("rayjob")  # its figure is part of ray's
    names = ["baseline"] if len(args.baseline) == 1 else [b.resolve().name for b in args.baseline]
    trees = [("", REPO)] + [(f" [{name}]", b.resolve()) for name, b in zip(names, args.baseline)]

    import ray
    import torch

    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# cpus {os.cpu_count()}, torch {torch.__version__}, ray {ray.__version__}, "
          f"load average before {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
          + "".join(f"; {label.strip(' []')} {tree}" for label, tree in trees[1:]))
    if args.compile:
        for _, tree in trees:
            compile_tree(tree)
    print(f"# PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}; "
          + "; ".join(f"{label.strip(' []') or 'this'}: {bytecode_state(tree)}" for label, tree in trees))
    t_start = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    samples: dict[str, list[float]] = {}
    ray_traces: dict[str, list[tuple[float, Path]]] = {}
    attach_timelines: dict[str, list[str]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    try:
        for rep in range(args.repeats):
            # interleaved: every tree's figures in each repeat, the first tree rotating
            for label, tree in trees[rep % len(trees):] + trees[:rep % len(trees)]:
                if "cli" in which:
                    add("hetsim --help" + label, hetsim(["--help"], tree))
                    add("hetsim validate" + label, hetsim(["validate"], tree))
                if "ray" in which:
                    wall_local, rounds_local = run_job(tmp, "inprocess", ["executor.kind=inprocess"], tree)
                    trace = tmp / f"trace_ray_{rep}{label.strip(' []')}.txt"
                    wall_ray, rounds_ray = run_job(tmp, "ray", ["executor.kind=ray"], tree, trace)
                    add("in-process job, whole process" + label, wall_local)
                    add("Ray job, whole process" + label, wall_ray)
                    add("Ray job, rounds: in-process ÷ Ray" + label, rounds_local / rounds_ray)
                    ray_traces.setdefault(label, []).append((wall_ray, trace))
                    if not label:  # the hardware's own 2-process speed-up on this job
                        bare = bare_rounds(tree)
                        add("bare rounds: 1 process ÷ pool of 2", bare["single"] / bare["pool"])
                        add("Ray job, rounds: bare pool ÷ Ray", bare["pool"] / rounds_ray)
                        if args.flower:
                            wall_flower, flower = flower_job(args.flower, tmp)
                            add("Flower job, whole process", wall_flower)
                            add("Flower job, rounds (strategy.start)", flower["rounds_s"])
                            add("Ray job ÷ Flower job, whole process", wall_ray / wall_flower)
                            add("rounds 2-5: Flower ÷ Ray",
                                flower["later_rounds_s"] / rounds_wall(tmp / "ray", first=1))
                if "rayjob" in which:
                    trace = tmp / f"trace_ray_{rep}{label.strip(' []')}.txt"
                    wall_ray, _ = run_job(tmp, "ray", ["executor.kind=ray"], tree, trace)
                    add("Ray job, whole process" + label, wall_ray)
                    ray_traces.setdefault(label, []).append((wall_ray, trace))
                if "sweep" in which:
                    one = sweep_overhead(tmp, 1, tree)
                    four = sweep_overhead(tmp, 4, tree)
                    add("sweep fixed overhead" + label, one)
                    add("sweep per-trial overhead" + label, (four - one) / 3)
        if "attach" in which:
            for label, tree in trees:
                trace = tmp / f"trace_attach{label.strip(' []')}.txt"
                with LocalRayHead(trace, tmp, tree) as head:
                    # `ray.address: auto` in normal use; the bench names its own head (LocalRayHead)
                    attach = ["executor.kind=ray", f"ray.address={head.address}", "ray.num_cpus=null"]
                    run_job(tmp, "attach", attach, tree)  # the first run after `ray start` (not counted)
                    for _ in range(args.repeats):
                        trace.write_text("")
                        wall, _ = run_job(tmp, "attach", attach, tree, trace)
                        add("Ray job attached (ray.address=auto)" + label, wall)
                    attach_timelines[label] = timeline(trace)
        if "light" in which:
            for label, tree in trees:
                ratios = light_rounds(10 * args.repeats, tree)
                samples["light rounds: engine ÷ bare loop, CPU" + label] = ratios["cpu"]
                samples["light rounds: engine ÷ bare loop, wall" + label] = ratios["wall"]
        print(f"# load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
              f"{args.repeats} repeats, bench took {time.time() - t_start:.0f} s\n")
        print("\n".join(summarize(samples, trees)))
        if args.timeline:
            for label, _ in trees:
                if ray_traces.get(label):
                    runs = sorted(ray_traces[label])
                    wall, trace = runs[len(runs) // 2]
                    print(f"\nmedian Ray run{label} ({wall:.2f} s), seconds since launch (p1 = the hetsim "
                          "command, then the other processes in order of appearance; [cpu] = CPU s "
                          "the process has used):")
                    print("\n".join(timeline(trace)))
                if label in attach_timelines:
                    print(f"\nlast attached run{label}:")
                    print("\n".join(attach_timelines[label]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
