"""Checkpoint benchmarks: size, write and restore time, memory, per-round overhead.

    .venv/bin/python bench/bench_checkpoint.py                 # everything below
    .venv/bin/python bench/bench_checkpoint.py overhead        # or one of: overhead, scale
    .venv/bin/python bench/bench_checkpoint.py scale --clients 10000

overhead: the default experiment (engine/config/default.yaml: FedAvg, CNN on mnist5k, 20
    clients), `--rounds` rounds with `checkpoint.every: 0` and `checkpoint.every: 1`, each in a
    fresh process, best of `--repeat`; wall seconds per round (rounds 1.. , the first is warm-up,
    measured after every callback, so the checkpoint write is inside) and the size and write time
    of its checkpoints. Goal: every-round checkpoints cost <= 5 % per round.
scale: `--clients` FedCSPACK clients (own_mask: each keeps its personal model; MLP on
    `synthetic`), all trained once, then one checkpoint written and restored, in-process and on
    Ray (2 actors, each writing its own shard). Peak RSS during the write is measured per process
    (Linux: /proc/<pid>/clear_refs resets the high-water mark), so it shows that no process holds
    the client states twice.
Each case runs in its own subprocess so that memory and thread settings do not leak.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _status_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def case_overhead(rounds: int, every: int) -> dict:
    from engine.checkpoint.folder import CheckpointCallback
    from engine.config.schema import load_config
    from engine.run.api import run_experiment

    cfg = load_config(None, [f"rounds={rounds}", f"checkpoint.every={every}"])
    stamps: list[float] = []
    spent: list[float] = []  # seconds in the checkpoint callback per round (write, prune, index)
    timed = CheckpointCallback.on_round_end

    def on_round_end(self, run, record):
        t0 = time.perf_counter()
        timed(self, run, record)
        spent.append(time.perf_counter() - t0)

    CheckpointCallback.on_round_end = on_round_end
    with tempfile.TemporaryDirectory() as tmp:
        path = run_experiment(cfg, Path(tmp) / "run", callbacks=[lambda rec: stamps.append(time.perf_counter())])
        index = Path(path) / "checkpoints" / "index.json"
        entries = json.loads(index.read_text())["checkpoints"] if index.exists() else []
        meta = json.loads((Path(path) / "checkpoints" / entries[-1]["path"] / "checkpoint.json").read_text()) \
            if entries else {}
    per_round = [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "every": every,
        "rounds": rounds,
        "s_per_round": sum(per_round) / len(per_round),
        "checkpoint_bytes": meta.get("bytes"),
        "callback_s": spent[:-1],  # the last round writes none
    }


def case_scale(clients: int, executor: str) -> dict:
    import numpy as np

    from engine.checkpoint.snapshot import restore_checkpoint, write_checkpoint
    from engine.config.schema import load_config
    from engine.loop.simulation import Simulation
    from engine.run.body import make_executor

    cfg = load_config(None, [
        "dataset.name=synthetic", "partition.scheme=natural", "model.name=mlp",
        f"clients.num_clients={clients}", "clients.participation=1.0", "rounds=1",
        "clients.profiles={bandwidth: {distribution: loguniform}, availability: 1.0, dropout: 0.0}",
        "algorithm={name: fedcspack, personalization: own_mask, pack_size: 256}",
        "evaluation.personalized=false", "evaluation.global_model=false",
        f"executor.kind={executor}", "ray.num_cpus=2", "executor.num_actors=2",
    ])
    sim = Simulation(cfg, executor=make_executor(cfg))
    sim.start()
    t0 = time.perf_counter()
    sim.run_round(0)
    sim.next_round = 1
    train_s = time.perf_counter() - t0
    ex = sim.executor
    pids = [os.getpid(), *getattr(ex, "pids", [])]
    state_mb = (ex.state_nbytes() if executor == "ray" else ex.host.state_nbytes()) / 1e6
    rss_before = {p: _status_mb(p, "VmRSS") for p in pids}
    for p in pids:
        _reset_peak(p)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        t0 = time.perf_counter()
        meta = write_checkpoint(sim, Path(tmp) / "ckpt")
        write_s = time.perf_counter() - t0
        peak = {p: _status_mb(p, "VmHWM") for p in pids}
        t0 = time.perf_counter()
        restore_checkpoint(sim, Path(tmp) / "ckpt")
        restore_s = time.perf_counter() - t0
    restored_mb = (ex.state_nbytes() if executor == "ray" else ex.host.state_nbytes()) / 1e6
    out = {
        "executor": executor,
        "clients": clients,
        "params_per_client": int(sum(p.numel() for p in sim.models[""].parameters())),
        "train_s": train_s,
        "client_state_mb": state_mb,
        "restored_state_mb": restored_mb,
        "checkpoint_mb": meta["bytes"] / 1e6,
        "shards": len(meta["client_states"]),
        "write_s": write_s,
        "restore_s": restore_s,
        "rss_before_mb": [round(rss_before[p]) for p in pids],
        "peak_during_write_mb": [round(peak[p]) for p in pids],
        "extra_peak_mb": [round(peak[p] - rss_before[p]) for p in pids],
    }
    assert np.isclose(restored_mb, state_mb), (restored_mb, state_mb)
    ex.close()
    return out


CASES = {"overhead": case_overhead, "scale": case_scale}


def run_case(name: str, *args) -> dict:
    cmd = [sys.executable, __file__, "--case", name, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"case {name}{args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="*", default=["overhead", "scale"])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        name, *rest = args.case
        parsed = [int(x) if x.lstrip("-").isdigit() else x for x in rest]
        print(json.dumps(CASES[name](*parsed)))
        return
    if "overhead" in args.what:
        best = {}
        for _ in range(args.repeat):
            for every in (0, 1):
                r = run_case("overhead", args.rounds, every)
                if every not in best or r["s_per_round"] < best[every]["s_per_round"]:
                    best[every] = r
        off, on = best[0], best[1]
        spent = sorted(on["callback_s"])
        median = spent[len(spent) // 2]
        print(f"default experiment, {args.rounds} rounds, best of {args.repeat}: "
              f"{off['s_per_round']:.3f} s/round without checkpoints, {on['s_per_round']:.3f} s/round "
              f"with one every round: {100 * (on['s_per_round'] / off['s_per_round'] - 1):+.1f} % end to end")
        print(f"  checkpoint {on['checkpoint_bytes'] / 1e3:.1f} KB; the checkpoint callback takes "
              f"{1e3 * spent[0]:.1f}-{1e3 * spent[-1]:.1f} ms per round (median {1e3 * median:.1f} ms = "
              f"{100 * median / off['s_per_round']:.2f} % of a round; goal <= 5 %)")
    if "scale" in args.what:
        for executor in ("inprocess", "ray"):
            r = run_case("scale", args.clients, executor)
            print(json.dumps(r))


if __name__ == "__main__":
    main()
