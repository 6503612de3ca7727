"""A million registered clients on one machine: memory, set-up and seconds per round.

    .venv/bin/python bench/bench_scale.py                       # lazy synthetic 10k/100k/1M + 1M table
    .venv/bin/python bench/bench_scale.py synthetic --clients 10000 100000
    .venv/bin/python bench/bench_scale.py table --table-dir /tmp/million   # the on-disk Parquet case only
    .venv/bin/python bench/bench_scale.py synthetic --executor ray

Each case is a whole ``hetsim run`` in a fresh process (validation, profiles.parquet, checkpoints
and every table included): FedAvg, logistic regression (``mlp`` without hidden layers), 1,000
clients selected per round, ``--rounds`` rounds. While it runs, the process tree (the CLI and,
with ``--executor ray``, every Ray process it starts) is sampled every 0.1 s from ``/proc``:

* peak RSS: the largest sum over the tree at one sample, and the largest single process;
* set-up: the run's wall time minus its rounds' ``wall_s`` (imports, validation, data, profiles,
  actors, first checkpoint);
* s/round: the median ``wall_s`` of the rounds after the first.

The table case first writes a 1M-client Parquet table with :mod:`bench.make_million_table`
(``--table-dir``; kept between runs) and runs it with ``on_disk: true``; its first run also
builds the row cache, reported separately as ``cache build``.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import threading
import time

import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PER_ROUND = 1000


def _tree_rss(root: int) -> dict[int, int]:
    """RSS in bytes of ``root`` and all its descendants, from /proc."""
    parent, rss = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/statm") as f:
                rss[int(d)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in tree]
        tree.update(kids)
        frontier += kids
    return {p: rss.get(p, 0) for p in tree}


def run_measured(args: list[str], out_dir: str) -> dict:
    """One ``hetsim run`` with the tree's peak RSS sampled while it runs."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([os.path.join(ROOT, ".venv", "bin", "hetsim"), "run", *args,
                             "--set", f"output.dir={out_dir}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = {"sum": 0, "one": 0}

    def sample():
        while proc.poll() is None:
            per = _tree_rss(proc.pid)
            peak["sum"] = max(peak["sum"], sum(per.values()))
            peak["one"] = max(peak["one"], max(per.values(), default=0))
            time.sleep(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    output, _ = proc.communicate()
    wall = time.perf_counter() - t0
    watcher.join()
    if proc.returncode != 0:
        raise RuntimeError(f"hetsim run {' '.join(args)} failed ({proc.returncode}):\n{output[-3000:]}")
    run_dir = sorted(glob.glob(os.path.join(out_dir, "*", "rounds.parquet")))[-1]
    rounds = pd.read_parquet(run_dir)
    return {"wall_s": wall, "setup_s": wall - rounds["wall_s"].sum(),
            "round_s": float(rounds["wall_s"].iloc[1:].median()), "peak_tree_mb": peak["sum"] / 2**20,
            "peak_process_mb": peak["one"] / 2**20, "rounds": len(rounds),
            "arrived": float(rounds["num_arrived"].mean()) if "num_arrived" in rounds else float("nan")}


def common(n: int, rounds: int, executor: str) -> list[str]:
    sets = ["partition.scheme=natural", "model.name=mlp", "model.params={hidden: []}",
            f"clients.num_clients={n}", f"clients.participation={PER_ROUND / n}", f"rounds={rounds}",
            "clients.profiles={bandwidth: {distribution: loguniform}}", f"executor.kind={executor}"]
    if executor == "ray":
        sets += ["executor.num_actors=2", "ray.num_cpus=2"]
    return [a for s in sets for a in ("--set", s)]


def case_synthetic(n: int, rounds: int, executor: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        return run_measured(["--set", "dataset.name=synthetic", "--set", "dataset.params={lazy: true}",
                             *common(n, rounds, executor)], out)


def case_table(table_dir: str, rounds: int, executor: str) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_million_table import CLIENTS, write_table

    path = os.path.join(table_dir, "table")
    if not os.path.exists(os.path.join(path, "_done")):
        t = time.perf_counter()
        write_table(path)
        print(f"    wrote {path} in {time.perf_counter() - t:.0f} s", flush=True)
    cache = os.path.join(table_dir, "cache")
    params = f"dataset.params={{path: {path}, client_column: client, on_disk: true, cache_dir: {cache}}}"
    args = ["--set", "dataset.name=parquet", "--set", params, *common(CLIENTS, rounds, executor)]
    result = {}
    if not glob.glob(os.path.join(cache, "*", "meta.json")):
        with tempfile.TemporaryDirectory() as out:
            first = run_measured(args, out)
        result["cache_build_s"] = first["setup_s"]
        result["cache_build_peak_mb"] = first["peak_tree_mb"]
    with tempfile.TemporaryDirectory() as out:
        result.update(run_measured(args, out))
    return result


def _line(label: str, r: dict) -> str:
    return (f"    {label:<28} {r['peak_tree_mb']:>9.0f} {r['peak_process_mb']:>11.0f} {r['setup_s']:>8.1f} "
            f"{r['round_s']:>8.2f} {r['arrived']:>8.0f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", nargs="*", default=["synthetic", "table"], help="synthetic and/or table")
    p.add_argument("--clients", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--executor", default="inprocess", choices=["inprocess", "ray"])
    p.add_argument("--table-dir", default=os.path.join(tempfile.gettempdir(), "hetsim-million"))
    a = p.parse_args()
    if set(a.which) - {"synthetic", "table"}:
        p.error(f"cases {sorted(set(a.which) - {'synthetic', 'table'})} are unknown; allowed: synthetic, table")
    print(f"# {' '.join(sys.argv)}  (cpus: {os.cpu_count()}, executor: {a.executor}, {PER_ROUND} clients "
          f"selected per round, {a.rounds} rounds)")
    print(f"    {'case':<28} {'tree MB':>9} {'process MB':>11} {'setup s':>8} {'s/round':>8} {'arrived':>8}")
    if "synthetic" in a.which:
        for n in a.clients:
            print(_line(f"lazy synthetic {n:,}", case_synthetic(n, a.rounds, a.executor)), flush=True)
    if "table" in a.which:
        r = case_table(a.table_dir, a.rounds, a.executor)
        if "cache_build_s" in r:
            print(f"    (first run: row cache built; set-up {r['cache_build_s']:.1f} s, tree peak "
                  f"{r['cache_build_peak_mb']:.0f} MB)")
        print(_line("on-disk Parquet 1,000,000", r), flush=True)


if __name__ == "__main__":
    main()
