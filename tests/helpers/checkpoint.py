"""Every method with the options whose state differs, and what the checkpoint tests of both
executors share: the tiny experiment, tables without wall clock, and real `hetsim run` processes
killed at a round."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from engine.checkpoint.snapshot import write_checkpoint
from engine.config.schema import load_config
from engine.loop.callbacks import RunCallback
from engine.loop.simulation import Simulation
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import run_experiment
from engine.run.body import make_executor
from helpers import REPO

BASE = [
    "dataset.name=digits", "model.name=mlp", "clients.num_clients=8", "clients.participation=0.5",
    "clients.profiles={devices: {rpi4: 0.5, laptop_cpu: 0.5}, network: {5mbps: 0.5, 500mbps: 0.5}}",
    "partition.public_fraction=0.1",
    "clock.over_selection=1.5",  # over-selected clients are dropped: exercises on_dropped state
]
# a deadline learned from the arrivals (clock state) that the 5 Mbps clients' transfers (0.16 s) nearly fill
ADAPTIVE = "clock.deadline={policy: adaptive, quantile: 0.9, margin: 1.1, initial_s: 0.17}"
# every method with the options whose state differs; the ASCEND ones close rewards, roll back
METHODS = {
    "fedavg": ["algorithm={name: fedavg}"],
    "fedprox": ["algorithm={name: fedprox, mu: 0.1}"],
    "fedavg_compressed-topk": ["algorithm={name: fedavg_compressed, compressor: topk, k: 0.1}"],
    "fedavg_compressed-randomk-local": [
        "algorithm={name: fedavg_compressed, compressor: randomk, k: 0.1, buffers: local}"],
    "fedavg_compressed-periodick": ["algorithm={name: fedavg_compressed, compressor: periodick, k: 0.1}"],
    "fedavg_compressed-qsgd8": ["algorithm={name: fedavg_compressed, compressor: qsgd8}"],
    "fedcspack-own_mask": ["algorithm={name: fedcspack, pack_size: 64, personalization: own_mask}"],
    "fedcspack-global_mask": ["algorithm={name: fedcspack, pack_size: 64, personalization: global_mask, k: 0.5}"],
    "ascend-egreedy": ["algorithm={name: ascend, k: 0.1, warmup: 1, distill_steps: 3, gamma: 0.0, distill_lr: 0.05}",
                       "train.lr=1.0"],  # rolls back in rounds 1, 2 and 4
    "ascend-exp3": ["algorithm={name: ascend, k: 0.1, policy: exp3, distill_steps: 3}"],
    # reward v2 (the default above) with the qsgd8 arm; reward v1 (the architecture's D history)
    "ascend-qsgd8": ["algorithm={name: ascend, k: 0.1, warmup: 1, distill_steps: 3, "
                     "arms: [topk, randomk, periodick, qsgd8]}"],
    "ascend-v1": ["algorithm={name: ascend, k: 0.1, warmup: 1, distill_steps: 3, reward: v1, gamma: 0.0, "
                  "distill_lr: 0.05}", "train.lr=1.0"],
    # the baselines: MOON's previous models, FedSPU's own models, losses and retired clients
    "moon": ["algorithm={name: moon}"],
    "fedntd": ["algorithm={name: fedntd}"],
    # rpi4 updates 40 % of the neurons; at this rate losses rise, and clients retire from round 1 on
    "fedspu": ["algorithm={name: fedspu, val_fraction: 0.5}", "train.lr=3.0"],
    "heterofl": ["algorithm={name: heterofl}", "model.zoo=[{arch: mlp_half, model: mlp, max_gflops: 5}]",
                 "model.arch_params={mlp_half: {width: 0.5}}"],  # rpi4 trains the half-width MLP
    # the heterogeneity toolbox: its methods' state (SCAFFOLD's control variates, FedOpt's moments), and
    # each work and selection policy with what it reads (the clock's adaptive deadline, the history)
    "fednova": ["algorithm={name: fednova}", "train.momentum=0.5"],
    "scaffold": ["algorithm={name: scaffold}"],
    "fedopt-adam": ["algorithm={name: fedopt}"],
    "fedopt-momentum": ["algorithm={name: fedopt, server_optimizer: momentum}"],
    "fedavg-deadline_work": ["train.work=deadline", ADAPTIVE],
    "fedavg-per_tier": ["train.work={policy: per_tier, min_steps: 2}"],
    "fedavg-pow_d": ["clients.selection={name: pow_d, d: 6}"],
    "fedavg-oort": ["clients.selection={name: oort, exploration_decay: 0.5}"],
    "fedavg-available_first": ["clients.selection=available_first", "clients.profiles.availability=0.6"],
}


def cfg_of(*extra):
    return load_config(None, [*BASE, *extra])


def simulation(cfg):
    return Simulation(cfg, make_executor(cfg))  # one torch thread, as `hetsim run`


def frames(run_or_records):
    """rounds, clients and trace tables without the wall-clock columns."""
    if isinstance(run_or_records, list):  # RoundRecords
        recs = run_or_records
        out = {"rounds": pd.DataFrame([r.row for r in recs]),
               "clients": pd.DataFrame([c for r in recs for c in r.client_rows])}
        for name in sorted({n for r in recs for n in r.extra_tables}):
            parts = [pd.DataFrame(r.extra_tables[name]) for r in recs if name in r.extra_tables]
            out[name] = pd.concat(parts, ignore_index=True)
    else:
        run = run_or_records
        out = {"rounds": run.rounds, "clients": run.clients}
        for p in sorted(run.path.glob("*.parquet")):
            if p.stem not in out and p.stem not in ("profiles", "faults"):
                out[p.stem] = pd.read_parquet(p)
    return {k: v.drop(columns=[c for c in v.columns if c in WALL_COLUMNS]).reset_index(drop=True)
            for k, v in out.items()}


def assert_same_tables(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_dtype=False, obj=name)


_UNINTERRUPTED: dict[tuple[str, ...], dict] = {}


def uninterrupted(directory: Path, overrides) -> dict:
    """:func:`frames` of the uninterrupted in-process run of ``overrides``, run once per test
    process: the tests that resume a run of the same experiment compare with the same tables.
    The checkpoint cadence is left out (it cannot change results: RESULT_NEUTRAL_FIELDS), so
    runs that differ only in it share one reference. Read only: the tables are shared."""
    key = tuple(o for o in overrides if not o.startswith("checkpoint."))
    if key not in _UNINTERRUPTED:
        path = run_experiment(cfg_of(*key, "checkpoint.every=0"), Path(directory) / f"ref-{len(_UNINTERRUPTED)}")
        _UNINTERRUPTED[key] = frames(load_run(path))
    return _UNINTERRUPTED[key]


class Collect(RunCallback):
    def __init__(self, checkpoint_after=None, directory=None):
        self.records, self.after, self.directory = [], checkpoint_after, directory

    def on_round_end(self, run, record):
        self.records.append(record)
        if record.round == self.after:
            write_checkpoint(run.simulation, self.directory)


def hetsim_process(path: Path, overrides: list[str], *args: str,
                   env: dict[str, str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hetsim", "run", "-q", "-o", str(path), *args]
    for o in [*BASE, *overrides]:
        cmd += ["--set", o]
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def rounds_written(path: Path) -> int:
    return len(list((path / "_parts" / "rounds").glob("*.parquet")))


def _progress(path: Path) -> tuple[int, int]:
    """What a run shows of its progress: rounds on disk, and the manifest's writes (claimed,
    started, actors up, each round)."""
    try:
        written = (path / "manifest.json").stat().st_mtime_ns
    except OSError:
        written = 0
    return rounds_written(path), written


def kill_at_round(proc: subprocess.Popen, path: Path, k: int, sig=signal.SIGKILL, delay=0.0,
                  timeout: float = 180.0) -> None:
    """Send ``sig`` once round ``k`` is on disk (plus ``delay`` s: lands anywhere in a round).
    Waits for that, or for the process to end, however long its start-up takes under load (a
    Ray run's start-up is bounded by the run's own executor.startup_timeout_s); fails only when
    the run shows no progress for ``timeout`` s (a hang)."""
    last, quiet_since = _progress(path), time.monotonic()
    while last[0] < k:
        if proc.poll() is not None:
            pytest.fail(f"hetsim finished before round {k}:\n{proc.stdout.read()[-3000:]}")
        if time.monotonic() - quiet_since > timeout:
            proc.kill()
            pytest.fail(f"round {k} not reached: no progress for {timeout} s (at round {last[0]})")
        time.sleep(0.01)
        now = _progress(path)
        if now != last:
            last, quiet_since = now, time.monotonic()
    time.sleep(delay)
    proc.send_signal(sig)


# a fleet whose links, compute and availability change over virtual time (Markov chains
# stepped from the run's start, diurnal availability): their state must not survive in memory only
CHANGING = ["clients.profiles.conditions={sets: {x: {share: 0.5, down: gilbert_elliott, up: gilbert_elliott, "
            "compute: thermal_throttling, availability: {preset: night_charging, tz_offset_h: 12}}, "
            f"y: {{share: 0.5, down: {{kind: trace, "
            f"file: '{REPO}/hardware_profiles/traces/fluctuating_links.csv'}}}}}}}}",
            "clock.start=Tue 09:00", "clock.deadline_s=2"]
KILL_METHODS = {
    "fedavg": METHODS["fedavg"],
    "fedavg-conditions": [*METHODS["fedavg"], *CHANGING],
    "fedcspack": METHODS["fedcspack-own_mask"],
    "ascend": METHODS["ascend-egreedy"],
    # the toolbox's state in one run: SCAFFOLD's control variates (clients and server), Oort's
    # history, the deadline work policy on a learned deadline
    "scaffold-oort-deadline_work": [*METHODS["scaffold"], *METHODS["fedavg-oort"], *METHODS["fedavg-deadline_work"]],
}
# the toolbox's other methods and policies, killed in-process only (a process is the same on Ray:
# the case above): FedOpt's moments with power-of-choice's history, FedNova with availability
KILL_IN_PROCESS = {
    "fedopt-pow_d-per_tier": [*METHODS["fedopt-adam"], *METHODS["fedavg-pow_d"], *METHODS["fedavg-per_tier"]],
    "fednova-available_first": [*METHODS["fednova"], *METHODS["fedavg-available_first"]],
}
# SIGKILL after round k in KILL_AFTER (+ up to 0.1 s: anywhere in a round; every position relative
# to the checkpoints of every 3 rounds), so >= 6 rounds of 4 epochs after the kill
KILL_ROUNDS = ["rounds=12", "train.local_epochs=4", "checkpoint.every=3"]
KILL_AFTER = range(1, 7)
# rounds of at least 1.5 s (a realtime clock's capped sleep, no CPU): a Ctrl+C or SIGTERM after
# round 2 lands in a running round however slowly the run's processes are scheduled
SLEEPY_ROUNDS = ["rounds=12", "clock.mode=realtime", "clock.time_scale=1000000", "clock.max_sleep_s=1.5"]
NO_SLEEP = "clock.max_sleep_s=0.001"  # result neutral: a realtime run's resume and reference do not wait

