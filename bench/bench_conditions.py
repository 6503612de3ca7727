"""Resolving one round's times through conditions over virtual time (against its goal).

    .venv/bin/python bench/bench_conditions.py            # 10,000 selected clients, one core

Times :meth:`hardware_profiles.conditions.FleetConditions.timeline` (download, train, compress,
upload of every selected client, each through its processes, plus the link states) for rounds
of ``--clients`` clients, in three fleets: 100-piece replayed link traces (looped, random
offsets), Gilbert-Elliott Markov links with a throttling compute chain, and today's constant
links (the closed form). Goal: <= 20 ms per round for 10,000 clients with 100-piece traces on
one core. The rounds move forward in virtual time as a run's do (each starts where the slowest
client of the previous one ended), and the first round is not counted (it starts the chains).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402 - after the thread setting
import pandas as pd  # noqa: E402

from hardware_profiles import assign_profiles, client_times  # noqa: E402
from hardware_profiles.condition_spec import ConditionsSpec  # noqa: E402
from hardware_profiles.conditions import FleetConditions  # noqa: E402


def traces_file(folder: Path, traces: int, pieces: int) -> Path:
    rng = np.random.default_rng(0)
    rows = []
    for tid in range(traces):
        t = np.cumsum(rng.uniform(1.0, 20.0, pieces + 1)) - 1.0
        down = np.exp(rng.uniform(np.log(2), np.log(200), pieces + 1))
        rows.append(pd.DataFrame({"trace_id": f"t{tid}", "t_s": t, "down_mbps": down, "up_mbps": down / 4}))
    path = folder / "traces.csv"
    pd.concat(rows).to_csv(path, index=False)
    return path


def fleets(folder: Path, pieces: int) -> dict[str, dict]:
    path = traces_file(folder, 20, pieces)
    return {
        f"traces ({pieces} pieces)": {"sets": {"x": {"down": {"kind": "trace", "file": str(path)},
                                                     "up": {"kind": "trace", "file": str(path)}}}},
        "markov (Gilbert-Elliott + throttling)": {"sets": {"x": {"down": "gilbert_elliott", "up": "gilbert_elliott",
                                                                 "compute": "thermal_throttling"}}},
        "constant (closed form)": None,
    }


def bench(spec, n: int, rounds: int) -> float:
    profiles = assign_profiles({"devices": {"phone_mid": 0.5, "laptop_cpu": 0.5},
                                "bandwidth": {"distribution": "loguniform", "low": 5, "high": 500}}, n, seed=0)
    conditions = FleetConditions(ConditionsSpec.model_validate(spec), profiles, 0) if spec else None
    ids = np.arange(n)
    bytes_down, bytes_up = np.full(n, 250_000.0), np.full(n, 60_000.0)
    flops = np.full(n, 2e9)
    start, seconds = 0.0, []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        times = client_times(profiles, ids, bytes_down, bytes_up, flops, 0.0)
        if conditions is not None:
            conditions.timeline(ids, start, times, bytes_down, bytes_up, flops, 0.0)
        seconds.append(time.perf_counter() - t0)
        start += float(times["total_s"].max())
    return float(np.median(seconds[1:]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pieces", type=int, default=100)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"# {args.clients} clients per round, {args.rounds} rounds, median per round, one core")
        for name, spec in fleets(Path(tmp), args.pieces).items():
            ms = 1e3 * bench(spec, args.clients, args.rounds)
            print(f"{name:<40} {ms:8.2f} ms per round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
