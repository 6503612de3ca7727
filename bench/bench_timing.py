"""Timing-only fleets (``clock.mode: timing_only``): seconds per round and peak memory at a million
and ten million registered clients, against the clock's share of a full run's round.

    .venv/bin/python bench/bench_timing.py                          # every case (CASES)
    .venv/bin/python bench/bench_timing.py timing --clients 1000000 --per-round 10000 --rounds 40
    .venv/bin/python bench/bench_timing.py full --clients 1000000 --per-round 1000 --rounds 6

Each case runs in a fresh process (``run_experiment`` into a temporary folder: validation,
profiles.parquet of every client, the Parquet tables, the final compaction): FedAvg, logistic
regression (``mlp`` without hidden layers) on lazy ``synthetic``, a mixed fleet (phones and laptops,
4G, Wi-Fi and 5 Mbps, the default availability and dropout), ``clock.over_selection: 1.2`` and a
``percentile`` deadline, no checkpoints. Reported per case:

* set-up: the process's wall time up to the first round (imports, validation, data, profiles and
  profiles.parquet); end: compaction and the manifest after the last round;
* s/round: the loop's wall time per round, the recording of its rows included (the runs' own
  ``wall_s``, the round without its recording, in brackets), and rounds per second;
* peak RSS of the process (``ru_maxrss``);
* ``+fleet``: with batteries (every phone) and a Gilbert-Elliott downlink for 60 % of the clients;
* the clock's part of a round: selection (``ClientSelector.select``) and the round clock
  (``RoundClock.begin`` / ``time`` / ``advance``), timed around those calls; in a timing-only
  round the rest is building its rows (``rows.client_columns``) and writing them.

``full`` runs the same fleet with training (the in-process executor): its s/round against the
clock's share of it is what a timing-only run saves.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLEET = ("clients.profiles={devices: {phone_low: 0.2, phone_mid: 0.4, laptop_cpu: 0.4}, "
         "network: {4g: 0.4, wifi: 0.4, 5mbps: 0.2}}")
# batteries on every phone and a Gilbert-Elliott downlink for 60 % of the fleet ("+fleet" cases)
CHANGING = ["clients.profiles.battery={start: {low: 0.3, high: 1.0}}",
            "clients.profiles.conditions={sets: {fading: {share: 0.6, down: gilbert_elliott}, steady: {share: 0.4}}}"]
CASES = (("timing", 1_000_000, 10_000, 40), ("timing", 10_000_000, 100_000, 10),
         ("timing+fleet", 1_000_000, 10_000, 40), ("timing+fleet", 10_000_000, 100_000, 10),
         ("timing", 1_000_000, 1_000, 40), ("full", 1_000_000, 1_000, 6))


def overrides(mode: str, clients: int, per_round: int, rounds: int) -> list[str]:
    return ["dataset.name=synthetic", "dataset.params={lazy: true}", "partition.scheme=natural",
            "model.name=mlp", "model.params={hidden: []}", f"clients.num_clients={clients}",
            f"clients.participation={per_round / clients}", f"rounds={rounds}", "checkpoint.every=0",
            "evaluation.eval_every=1000", FLEET, "clock.over_selection=1.2",
            "clock.deadline={policy: percentile, percent: 80}",
            *(["clock.mode=timing_only"] if mode.startswith("timing") else []),
            *(CHANGING if mode.endswith("+fleet") else [])]


class Timer:
    """Seconds spent in the wrapped callables (one total per name)."""

    def __init__(self):
        self.total: dict[str, float] = {}

    def wrap(self, owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[label] = self.total.get(label, 0.0) + time.perf_counter() - t0
        setattr(owner, name, timed)


def one(mode: str, clients: int, per_round: int, rounds: int) -> dict:
    """One case in this process; returns its figures."""
    t_start = time.perf_counter()
    # here, after t_start: the set-up counts the imports, as a `hetsim run` pays them
    import pyarrow.parquet as pq

    from engine.config.schema import load_config
    from engine.loop import rows
    from engine.loop.callbacks import RunCallback
    from engine.loop.selection import ClientSelector
    from engine.results.tables import RunWriter
    from engine.run.api import run_experiment
    from hardware_profiles.round_clock import RoundClock

    timer = Timer()
    timer.wrap(ClientSelector, "select", "select")
    for name in ("begin", "time", "advance"):
        timer.wrap(RoundClock, name, name)
    timer.wrap(rows, "client_columns", "rows")
    timer.wrap(RunWriter, "append", "write")

    class Loop(RunCallback):
        def on_run_begin(self, run):
            self.t0, self.clock0 = time.perf_counter(), dict(timer.total)

        def on_round_end(self, run, record):
            self.t1 = time.perf_counter()

    loop = Loop()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, overrides(mode, clients, per_round, rounds))
        path = run_experiment(cfg, os.path.join(tmp, "run"), callbacks=[loop], command=[])
        t_end = time.perf_counter()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # before reading anything back
        r = pq.read_table(os.path.join(path, "rounds.parquet"), columns=["wall_s", "num_arrived"]).to_pandas()
        arrived = float(r["num_arrived"].mean())
    in_loop = {k: v - loop.clock0.get(k, 0.0) for k, v in timer.total.items()}
    loop_s = loop.t1 - loop.t0
    return {"mode": mode, "clients": clients, "per_round": per_round, "rounds": rounds,
            "setup_s": loop.t0 - t_start, "end_s": t_end - loop.t1, "s_per_round": loop_s / rounds,
            "wall_s_median": float(r["wall_s"].median()), "arrived_mean": arrived,
            "peak_rss_gib": peak,
            "per_round_parts": {k: v / rounds for k, v in in_loop.items()}}


def run_case(mode: str, clients: int, per_round: int, rounds: int) -> dict:
    """One case in a fresh process (its own peak memory)."""
    out = subprocess.run([sys.executable, __file__, "--one", mode, str(clients), str(per_round), str(rounds)],
                         check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def line(res: dict) -> str:
    parts = res["per_round_parts"]
    clock = sum(parts.get(k, 0.0) for k in ("select", "begin", "time", "advance"))
    share = 100 * clock / res["s_per_round"]
    return (f"| {res['mode']} | {res['clients']:,} | {res['per_round']:,} | {res['rounds']} | "
            f"{res['setup_s']:.1f} s / {res['end_s']:.1f} s | {res['s_per_round'] * 1e3:.1f} ms "
            f"({res['wall_s_median'] * 1e3:.1f}) | {1 / res['s_per_round']:.1f} | {clock * 1e3:.1f} ms "
            f"({share:.0f} %) | {_rows(res)} / {parts.get('write', 0) * 1e3:.1f} ms | "
            f"{res['peak_rss_gib']:.2f} GiB |")


def _rows(res: dict) -> str:
    """Building a round's rows: timing-only's one Arrow table (a full run builds row dicts: not timed)."""
    return f"{res['per_round_parts'].get('rows', 0) * 1e3:.1f}" if res["mode"] != "full" else "–"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        mode, clients, per_round, rounds = sys.argv[2], *map(int, sys.argv[3:6])
        print(json.dumps(one(mode, clients, per_round, rounds)))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", choices=("timing", "timing+fleet", "full"),
                    help="one case (default: all of them)")
    ap.add_argument("--clients", type=int, default=1_000_000)
    ap.add_argument("--per-round", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    cases = [(a.mode, a.clients, a.per_round, a.rounds)] if a.mode else CASES
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    print("| mode | registered | per round | rounds | set-up / end | s per round (its wall_s) | rounds/s "
          "| clock (share) | rows / write | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        print(line(run_case(*case)), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
