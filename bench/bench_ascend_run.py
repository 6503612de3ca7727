"""One run of the ASCEND v3 study's main cell, in-process: its CPU seconds and a fingerprint of
its tables (study throughput).

    PYTHONPATH=. .venv/bin/python bench/bench_ascend_run.py --rounds 10          # fingerprint + CPU
    PYTHONPATH=. .venv/bin/python bench/bench_ascend_run.py --rounds 60          # the study's full run
    PYTHONPATH=/other/checkout .venv/bin/python bench/bench_ascend_run.py ...    # another checkout

The run is ``studies/ascend_study.py --design v3``'s ``v3main`` cell at 5 Mbps, K/d 0.01, seed 0
(``--variant`` / ``--ratio`` / ``--seed`` another of its runs), one torch thread. The fingerprint
is a SHA-256 of ``rounds.parquet`` and ``clients.parquet`` as CSV, the wall-clock columns
(``wall_s``, ``wall_fit_s``) left out: two checkouts that print the same lines computed the same
tables bit for bit. CPU: ``time.process_time`` of the run (dataset load and table writing included).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import torch


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--variant", default="ascend")
    ap.add_argument("--ratio", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mbps", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # as the study's runs
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment
    from studies.ascend_study import base_config, parse_args, variant_algorithm

    study = parse_args(["--design", "v3", "--rounds", str(args.rounds)])
    out = Path(tempfile.mkdtemp(prefix="bench_ascend_"))
    cfg = {**base_config(study, {"network": f"{args.mbps}mbps"}), "seed": args.seed,
           "algorithm": variant_algorithm(args.variant, args.ratio, study),
           "output": {"dir": str(out), "name": "run", "overwrite": True}}
    cpu = time.process_time()
    run_experiment(load_config(cfg), out / "run", command=["bench/bench_ascend_run.py"])
    cpu = time.process_time() - cpu
    run = load_run(out / "run")
    for name in ("rounds", "clients"):
        table = getattr(run, name)
        table = table[[c for c in table.columns if not c.startswith("wall_")]]
        print(f"{name}: {table.shape} sha256 {hashlib.sha256(table.to_csv().encode()).hexdigest()[:16]}")
    print(f"cpu {cpu:.2f} s ({args.rounds} rounds, {out / 'run'})")


if __name__ == "__main__":
    sys.exit(main())
