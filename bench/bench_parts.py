"""Part files of a long run and how fast it stops: files and SIGTERM exit time.

    .venv/bin/python bench/bench_parts.py                      # 10,000 rounds, merged parts
    .venv/bin/python bench/bench_parts.py --rounds 2000 --legacy   # and parts never merged (before)
    .venv/bin/python bench/bench_parts.py --append 5000       # the writer's ms per round, both ways

A real ``python -m hetsim run`` of a trivially cheap config (digits, logistic regression, 2
clients, no evaluation, no periodic checkpoints) runs until ``rounds_done`` reaches ``--rounds``;
then the script counts the run folder's files (all of them, and those under ``_parts/``), sends
SIGTERM and times the process's exit (the round in flight, the interruption checkpoint, the
compaction of every table, the final manifest). ``--legacy`` runs the same with the incremental
merge switched off (``COMPACT_PARTS`` set beyond the run), which is how runs wrote their tables
before: two parts per round, compacted only at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHEAP = ["dataset.name=digits", "model.name=mlp", "model.params={hidden: []}", "clients.num_clients=2",
         "evaluation.eval_every=1000000", "evaluation.global_model=false", "checkpoint.every=0"]
# the child: the CLI, with the merge switched off for --legacy
CHILD = """
import sys
import engine.results.tables as tables
if sys.argv.pop(1) == "legacy":
    tables.COMPACT_PARTS = 10**12
from hetsim.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _rounds_done(run: Path) -> int:
    try:
        return int(json.loads((run / "manifest.json").read_text()).get("rounds_done", 0))
    except (OSError, ValueError):
        return 0


def measure(rounds: int, legacy: bool, workdir: Path) -> dict:
    run = workdir / ("legacy" if legacy else "merged")
    sets = [a for s in [*CHEAP, f"rounds={rounds * 10}"] for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, "legacy" if legacy else "merged", "run", "-q",
                             "-o", str(run), *sets], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while _rounds_done(run) < rounds:
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read())
        time.sleep(0.5)
    run_s = time.monotonic() - t0
    files = sum(len(names) for _, _, names in os.walk(run))
    parts = sum(len(names) for _, _, names in os.walk(run / "_parts"))
    at = _rounds_done(run)
    t1 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    exit_s = time.monotonic() - t1
    rounds_saved = _rounds_done(run)
    return {"mode": "legacy" if legacy else "merged", "rounds_at_sigterm": at, "files": files,
            "part_files": parts, "sigterm_exit_s": round(exit_s, 2), "returncode": proc.returncode,
            "rounds_saved": rounds_saved, "files_after": sum(len(n) for _, _, n in os.walk(run)),
            "run_s": round(run_s, 1)}


def append_cost(rounds: int, workdir: Path) -> dict:
    """In one process: the run writer's time per round (a 35-column rounds row and two client
    rows, as the cheap config writes) with the merge and without it, appending alone and with
    the final compaction (which the unmerged parts pay at the end, all at once)."""
    import engine.results.tables as tables

    out = {"mode": "append", "rounds": rounds}
    for merged in (True, False):
        tables.COMPACT_PARTS = 64 if merged else 10**12
        writer = tables.RunWriter(workdir / f"append-{merged}")
        t0 = time.perf_counter()
        for r in range(rounds):
            writer.append("rounds", [{"round": r, **{f"m{i}": r * 0.5 + i for i in range(34)}}])
            writer.append("clients", [{"round": r, "client_id": c, **{f"c{i}": float(c + i) for i in range(33)}}
                                      for c in range(2)])
        t1 = time.perf_counter()
        writer.finalize()
        t2 = time.perf_counter()
        mode = "merged" if merged else "legacy"
        out[f"append_ms_per_round_{mode}"] = round(1000 * (t1 - t0) / rounds, 3)
        out[f"finalize_s_{mode}"] = round(t2 - t1, 2)
        out[f"total_ms_per_round_{mode}"] = round(1000 * (t2 - t0) / rounds, 3)
    tables.COMPACT_PARTS = 64
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--legacy", action="store_true", help="also measure the run without merging")
    parser.add_argument("--append", type=int, metavar="ROUNDS",
                        help="only the run writer's cost per round, merged and not, over ROUNDS rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hetsim-bench-parts-") as tmp:
        if args.append:
            print(json.dumps(append_cost(args.append, Path(tmp))), flush=True)
            return
        modes = [False, True] if args.legacy else [False]
        for legacy in modes:
            print(json.dumps(measure(args.rounds, legacy, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
