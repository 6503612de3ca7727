"""Fingerprints of twelve asynchronous runs, to show a change of the event loop changes no number.

Each config exercises one part of the loop (FedBuff, FedAsync, staleness cut, deadline, offline
tasks, batteries with and without charging, fleet conditions, error feedback, heterogeneous
models, a selection policy that reads the clients' history, timing-only); its fingerprint is
the SHA-256 of its rounds and clients tables without the wall-clock columns.

    PYTHONPATH=. .venv/bin/python bench/async_fingerprint.py --save /tmp/before.json   # before a change
    PYTHONPATH=. .venv/bin/python bench/async_fingerprint.py --check /tmp/before.json  # after it

The figures depend on the machine's floating point (torch kernels): compare on one machine.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.config.schema import load_config  # noqa: E402
from engine.results.tables import WALL_COLUMNS, load_run  # noqa: E402
from engine.run.api import run_experiment  # noqa: E402

BASE = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=10", "checkpoint.every=0",
        "partition.scheme=iid", "rounds=8"]
MIXED = "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}"
BATTERIES = ("clients.profiles={network: {4g: 1.0}, battery: {start: 0.6, threshold: 0.2, charging: %s}, "
             "overrides: {0: {battery_wh: 0.003}, 1: {battery_wh: 0.01}}}")
CONFIGS = {
    "fedbuff": [MIXED, "asynchronous={mode: fedbuff, concurrency: 5, buffer_size: 2}"],
    "fedasync": [MIXED, "asynchronous={mode: fedasync, concurrency: 4, staleness: {kind: polynomial, a: 0.5}}"],
    "max_staleness": [MIXED, "asynchronous={mode: fedbuff, concurrency: 8, buffer_size: 2, max_staleness: 1}"],
    "deadline": [MIXED, "clock.deadline_s=0.05", "asynchronous={mode: fedbuff, concurrency: 6, buffer_size: 2}"],
    "offline": ["clock.apply_dropout=true", "clock.start=00:00", "asynchronous={mode: fedasync, concurrency: 3}"],
    "batteries_never": [BATTERIES % "never", "asynchronous={mode: fedbuff, concurrency: 4, buffer_size: 2}"],
    "batteries_online": [BATTERIES % "online", "asynchronous={mode: fedbuff, concurrency: 4, buffer_size: 2}"],
    "conditions": ["clients.profiles={network: {4g: 1.0}, conditions: {sets: {x: {share: 0.5}, y: {share: 0.5, down: "
                   "{kind: trace, file: 'builtin:fluctuating_links'}}}}}",
                   "asynchronous={mode: fedbuff, concurrency: 4, buffer_size: 2}"],
    "error_feedback": [MIXED, "algorithm={name: fedavg_compressed, compressor: topk, k: 0.1}",
                       "asynchronous={mode: fedbuff, concurrency: 5, buffer_size: 3, max_staleness: 2}"],
    "heterogeneous": ["dataset.name=mnist5k", "model.name=lenet5", "clients.num_clients=6", "rounds=4",
                      "model.per_client={0: lenet5_half, 1: lenet5_half, 2: lenet5_half}",
                      "asynchronous={mode: fedbuff, concurrency: 4, buffer_size: 2}"],
    "selection": [MIXED, f"plugins=['{ROOT}/examples/selectors/power_of_choice.py']",
                  "clients.selection={name: power_of_choice, d: 6}",
                  "asynchronous={mode: fedbuff, concurrency: 5, buffer_size: 2}"],
    "timing_only": [MIXED, "clock.mode=timing_only", "clients.num_clients=200",
                    "asynchronous={mode: fedbuff, concurrency: 20, buffer_size: 5}"],
}


def digest(run) -> str:
    h = hashlib.sha256()
    for table in (run.rounds, run.clients):
        keep = table.drop(columns=[c for c in table.columns if c in WALL_COLUMNS or c.startswith("wall")])
        h.update(keep.sort_index(axis=1).to_csv(index=False, float_format="%.17g").encode())
    return h.hexdigest()[:16]


def fingerprints() -> dict[str, str]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, over in CONFIGS.items():
            cfg = load_config(None, [*BASE, f"output.dir={tmp}", *over])
            out[name] = digest(load_run(run_experiment(cfg, Path(tmp) / name)))
            print(f"{name:18s} {out[name]}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", type=Path, help="write the fingerprints here")
    group.add_argument("--check", type=Path, help="compare with fingerprints written by --save")
    args = ap.parse_args(argv)
    now = fingerprints()
    if args.save:
        args.save.write_text(json.dumps(now, indent=1))
        return 0
    before = json.loads(args.check.read_text())
    differ = [n for n in before if before[n] != now.get(n)]
    print("identical" if not differ else f"differ: {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
