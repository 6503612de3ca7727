"""What the energy ledger and the batteries cost a round (the goal: <= 2 % of a
round's engine time).

    .venv/bin/python bench/bench_energy.py                      # 200 clients, 40 selected a round
    .venv/bin/python bench/bench_energy.py --clients 5000 --participation 0.2

Runs a real simulation (in-process executor, synthetic data and an MLP: a cheap model, so the engine's own work
is as large a share of a round as it gets) with a battery-powered fleet, and times every call
that only the ledger and the batteries make (``ledger``, ``empties_at``, the battery state's
``too_low``/``fraction``/``on_charger``/``charge_j``/``advance``, and the rows' energy and battery
columns) against the rounds' whole engine time (``rounds.wall_s``). The first round is not
counted (warm-up).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402 - after the thread setting

from engine.config.schema import load_config  # noqa: E402
from engine.loop import rows  # noqa: E402
from engine.results.tables import load_run  # noqa: E402
from engine.run.api import run_experiment  # noqa: E402
from hardware_profiles import round_clock  # noqa: E402
from hardware_profiles.energy import FleetBatteries  # noqa: E402

SPENT: dict[str, list[float]] = defaultdict(list)


def timed(owner, name: str, label: str) -> None:
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SPENT[label].append(time.perf_counter() - t0)

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--participation", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    for owner, name in ((round_clock, "ledger"), (round_clock, "empties_at"), (rows, "energy_summary"),
                        (rows, "add_battery_columns"), (FleetBatteries, "too_low"), (FleetBatteries, "fraction"),
                        (FleetBatteries, "charge_j"), (FleetBatteries, "advance"),
                        (round_clock.RoundClock, "on_charger")):  # (FleetBatteries.on_charger within)
        timed(owner, name, name)
    cfg = load_config(None, [
        "dataset.name=synthetic", "model.name=mlp", f"clients.num_clients={args.clients}",
        f"clients.participation={args.participation}", f"rounds={args.rounds}", "partition.scheme=iid",
        "evaluation.eval_every=10",
        "clients.profiles={devices: {phone_low: 0.4, phone_mid: 0.3, laptop_cpu: 0.3}, "
        "network: {4g: 0.5, wifi: 0.5}, battery: {start: {low: 0.3, high: 1.0}, charging: online, "
        "idle_drain: true}}",
    ])
    with tempfile.TemporaryDirectory() as tmp:
        run = load_run(run_experiment(cfg, Path(tmp) / "r"))
    walls = run.rounds["wall_s"].to_numpy()[1:]
    per_round = sum(sum(v[1:]) if len(v) == args.rounds else sum(v) * (args.rounds - 1) / args.rounds
                    for v in SPENT.values()) / (args.rounds - 1)
    engine_s = float(np.mean(walls))
    print(f"{args.clients} clients, {int(run.rounds['num_selected'].mean())} selected a round, "
          f"{args.rounds - 1} rounds timed")
    print(f"round engine time (rounds.wall_s, mean): {1e3 * engine_s:.2f} ms")
    print(f"ledger + batteries per round:            {1e3 * per_round:.3f} ms = "
          f"{100 * per_round / engine_s:.2f} % of the round")
    for label, v in sorted(SPENT.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {label:22s} {1e6 * sum(v) / len(v):8.1f} us a call, {len(v)} calls")


if __name__ == "__main__":
    main()
