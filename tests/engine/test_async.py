"""Asynchronous server steps (FedBuff, FedAsync) on the virtual clock: event order, staleness,
drops, the synchronous limit, determinism, checkpoints and validation (docs/async.md)."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from helpers import REPO

from algorithms.asynchronous import fedbuff_step, staleness_weight
from algorithms.training import flat_state
from engine.checkpoint.snapshot import restore_checkpoint, write_checkpoint
from engine.config.schema import load_config
from engine.errors import ConfigError
from engine.loop.callbacks import RunCallback
from engine.loop.simulation import Simulation
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import run_experiment

BASE = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=10", "checkpoint.every=0",
        "partition.scheme=iid"]
FIXED = ["clock.apply_availability=false", "clock.apply_dropout=false"]  # every client runs, no coins


def run(tmp_path, name, *over):
    cfg = load_config(None, [*BASE, f"output.dir={tmp_path}", *over])
    return load_run(run_experiment(cfg, tmp_path / name))


def test_staleness_functions():
    tau = np.array([0, 1, 3, 8])
    assert staleness_weight("constant", tau).tolist() == [1, 1, 1, 1]
    assert np.allclose(staleness_weight("polynomial", tau, a=0.5), [1, 2**-0.5, 0.5, 1 / 3])
    # hinge, a = 0.5, b = 2: 1 up to 2 versions old, then 1 / (0.5 (tau - 2) + 1)
    assert np.allclose(staleness_weight("hinge", tau, a=0.5, b=2), [1, 1, 1 / 1.5, 1 / 4])
    with pytest.raises(ValueError, match="allowed: constant, polynomial, hinge"):
        staleness_weight("exp", tau)


def test_fedbuff_step_is_the_documented_formula():
    cur, bases = np.array([1.0, 2.0]), np.array([[1.0, 2.0], [0.0, 0.0]])
    states = np.array([[3.0, 2.0], [0.0, 4.0]])
    # w + lr * sum_i (m_i / sum m) s_i (w_i - b_i) = [1, 2] + 0.5 * (0.25 * [2, 0] + 0.75 * 0.5 * [0, 4])
    out = fedbuff_step(cur, states, bases, [1, 3], [1.0, 0.5], 0.5)
    assert np.allclose(out, [1.25, 2.75])


def test_event_order_staleness_and_versions_rebuild_from_the_tables(tmp_path):
    """Every update's arrival is start_s + the closed-form phase times of profiles.parquet; the
    server handles them by (arrival, client id); its version at each arrival and each update's
    base version follow from the step times in rounds.parquet."""
    r = run(tmp_path, "run", "rounds=8", *FIXED, "clients.profiles={network: {5mbps: 0.5, 50mbps: 0.5}}",
            "asynchronous={mode: fedbuff, concurrency: 6, buffer_size: 3, staleness: {kind: constant}}")
    c, rounds, prof = r.clients, r.rounds, r.profiles.set_index("client_id")
    p = prof.loc[c["client_id"]].reset_index()
    down = p["latency_s"] + 8 * c["bytes_down"] / (p["down_mbps"] * 1e6)
    up = p["latency_s"] + 8 * c["bytes_up"] / (p["up_mbps"] * 1e6)
    compute = c["train_flops"] / (p["gflops"] * 1e9)
    assert np.allclose(c["upload_end_s"], c["start_s"] + down + compute + up, rtol=0, atol=1e-12)
    assert (c["drop_reason"] == "").all() and c["made_deadline"].all()
    # handled in (arrival, client id) order; ties happen (equal shards, equal profiles)
    key = list(zip(c["upload_end_s"], c["client_id"]))
    assert key == sorted(key)
    assert c.duplicated("upload_end_s").any()
    # the server's version when an update arrives: steps applied at or before then (M = 3 per step)
    assert (c["applied_version"] == np.arange(len(c)) // 3 + 1).all()
    step_s = rounds["sim_time_s"].to_numpy()  # clock.start is 00:00: sim time is absolute time
    assert (rounds["version"] == np.arange(1, 9)).all()
    base = np.searchsorted(step_s, c["start_s"].to_numpy(), side="right")  # a step at the instant counts
    assert (c["base_version"] == base).all()
    assert (c["staleness"] == c["applied_version"] - 1 - c["base_version"]).all()
    assert (rounds["staleness_max"] > 0).any()  # the test is about something
    # the steps' times are the arrivals that filled the buffer
    assert np.array_equal(step_s, c["resolved_s"].to_numpy()[2::3])
    assert np.allclose(rounds["energy_j"], c.groupby("round")["energy_j"].sum())


@pytest.mark.parametrize("method", ["algorithm.name=fedavg", "algorithm={name: fedavg_compressed, k: 0.2}"])
def test_fedbuff_with_the_whole_fleet_in_one_buffer_is_synchronous_fedavg(tmp_path, method):
    """concurrency = buffer_size = every client, constant staleness, server_lr 1: each step waits
    for all of them (a client whose update is buffered is not dispatched again), all trained on
    the current version, so the step is the synchronous round's: FedAvg w + sum_i p_i (w_i - w) =
    sum_i p_i w_i; compressed FedAvg w + sum_i p_i delta_i. The clients see the same seeds
    (wave r = round r), error feedback included."""
    over = [*BASE, "clients.num_clients=6", "clients.participation=1.0", "clients.profiles={}", "rounds=3",
            *FIXED, f"output.dir={tmp_path}", method]
    sync = Simulation(load_config(None, over))
    sync.run()
    asyn = Simulation(load_config(None, [*over, "asynchronous={concurrency: 6, buffer_size: 6, staleness: "
                                                "{kind: constant}}"]))
    asyn.run()
    a, b = (flat_state(s.server.models[""]).numpy() for s in (sync, asyn))
    diff = float(np.abs(a - b).max())
    assert diff < 1e-6, diff  # float64 sums in another order: rounding only (measured: ~1e-8)
    assert np.abs(a).max() > 0.1  # the model moved


def test_fedbuff_step_one_equals_fedavg_round_zero_with_stragglers(tmp_path):
    """On a fleet with stragglers the first step (the first M arrivals, all from version 0) is
    the FedAvg aggregate of those M clients."""
    over = [*BASE, "rounds=1", *FIXED, "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}",
            "asynchronous={concurrency: 10, buffer_size: 4, staleness: {kind: constant}}", f"output.dir={tmp_path}"]
    sim = Simulation(load_config(None, over))
    sim.start()
    record = sim.run_round(0)
    first = [row["client_id"] for row in record.client_rows]
    assert len(first) == 4 and all(row["base_version"] == 0 for row in record.client_rows)
    ref = Simulation(load_config(None, [*BASE, "rounds=1", *FIXED, f"output.dir={tmp_path}",
                                        "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}"]))
    ref.start()
    broadcast = ref.server.broadcast(0)
    results = ref.executor.run_round(0, sorted(first), broadcast, False).results
    ref.server.aggregate(0, results)
    a, b = (flat_state(s.server.models[""]).numpy() for s in (sim, ref))
    assert float(np.abs(a - b).max()) < 1e-6


def test_max_staleness_drops_with_reason_stale(tmp_path):
    r = run(tmp_path, "run", "rounds=30", *FIXED, "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}",
            "asynchronous={mode: fedasync, concurrency: 6, mixing: 0.6, max_staleness: 1, "
            "staleness: {kind: polynomial, a: 0.5}}")
    c, rounds = r.clients, r.rounds
    stale = c[c["drop_reason"] == "stale"]
    assert len(stale) > 0 and (stale["staleness"] > 1).all() and not stale["made_deadline"].any()
    assert (stale["applied_version"] == -1).all()
    kept = c[c["made_deadline"]]
    assert (kept["staleness"] <= 1).all() and len(kept) == 30  # FedAsync: one update per step
    assert np.allclose(kept["staleness_weight"], (1 + kept["staleness"]) ** -0.5)
    assert rounds["num_stale"].sum() == len(stale)
    assert np.isclose(rounds["energy_wasted_j"].sum(), stale["energy_j"].sum())


def test_a_client_going_offline_mid_task_is_lost_at_that_time(tmp_path):
    online = tmp_path / "online.csv"  # online [0, 0.05 s), then from 100 s on
    pd.DataFrame({"trace_id": ["x", "x"], "start_s": [0.0, 100.0], "end_s": [0.05, 1e7]}).to_csv(online, index=False)
    r = run(tmp_path, "run", "rounds=2", "clients.profiles={network: {5mbps: 1.0}}",
            "clock.apply_dropout=false", "clock.start=00:00",
            f"clients.profiles.conditions={{sets: {{all: {{availability: {{kind: intervals, file: '{online}', "
            "loop: false}}}}",
            "asynchronous={mode: fedasync, concurrency: 3, idle_retry_s: 30}")
    c = r.clients
    lost = c[c["drop_reason"] == "offline"]
    assert len(lost) == 3 and (lost["start_s"] == 0).all()
    assert (lost["left_s"] == 0.05).all() and (lost["resolved_s"] == 0.05).all()
    assert (lost["upload_end_s"] > 0.05).all()  # it would have needed longer
    # the ledger stops at 0.05 s, inside the download: (idle_w + rx_w) x 0.05 s, no tail, nothing else
    power = r.profiles.set_index("client_id").loc[lost["client_id"]]
    assert (lost["download_end_s"] > 0.05).all()
    assert np.allclose(lost["energy_j"], (power["idle_w"] + power["rx_w"]).to_numpy() * 0.05, rtol=0, atol=1e-12)
    # nobody is online from 0.05 s to 100 s: the server retries every 30 s, at 0.05 + 120 s
    kept = c[c["made_deadline"]]
    assert len(kept) == 2 and np.allclose(kept["start_s"], 120.05)
    assert r.rounds["num_offline"].tolist() == [3, 0]


def test_a_task_past_the_deadline_is_abandoned_at_it(tmp_path):
    """clock.deadline_s: an update that would arrive more than D after its dispatch is dropped at
    dispatch + D (reason deadline, not arrived), its client stops working then (less energy than
    its whole task), its slot is refilled at that instant, and everyone else is applied."""
    over = ["rounds=20", *FIXED, "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}",
            "asynchronous={mode: fedbuff, concurrency: 6, buffer_size: 2}"]
    ref = run(tmp_path, "ref", *over).clients
    task = ref["upload_end_s"] - ref["start_s"]
    slow = ref["net_tier"] == "5mbps"
    assert task[slow].min() > task[~slow].max()
    d = float(task[slow].min() + task[~slow].max()) / 2  # between the fast clients' tasks and the slow ones'
    c = run(tmp_path, "cut", *over, f"clock.deadline_s={d!r}").clients
    late = c["drop_reason"] == "deadline"
    assert late.any() and (c.loc[late, "net_tier"] == "5mbps").all()
    assert (c.loc[~late, "drop_reason"] == "").all() and c.loc[~late, "made_deadline"].all()
    assert np.allclose(c.loc[late, "resolved_s"], c.loc[late, "start_s"] + d, rtol=0, atol=1e-12)
    assert not c.loc[late, "arrived"].any() and (c.loc[late, "upload_end_s"] - c.loc[late, "start_s"] > d).all()
    full = ref.groupby("client_id")["energy_j"].first()  # every task of a client costs the same here
    assert (c.loc[late, "energy_j"].to_numpy() < full[c.loc[late, "client_id"]].to_numpy()).all()
    assert set(c.loc[late, "resolved_s"]) & set(c["start_s"])  # the slot is refilled at the deadline


SMALL_BATTERIES = ("clients.profiles={network: {4g: 1.0}, battery: {start: 1.0, threshold: 0.2, charging: never}, "
                   "overrides: {0: {battery_wh: 0.003}, 1: {battery_wh: 0.01}, 2: {battery_wh: 0.02}}}")


def test_batteries_below_the_threshold_are_not_dispatched_and_an_empty_one_stops_its_task(tmp_path):
    """Batteries under asynchronous (charging never): a task's energy leaves the battery at its
    dispatch, so each client's levels replay from its rows (battery_level_end = battery_level -
    energy_j / capacity, 0 once emptied, the next dispatch starts there); nobody is dispatched
    below the threshold; a battery that runs empty mid-task stops it then (reason battery,
    resolved_s = left_s, less energy than a whole task)."""
    c = run(tmp_path, "run", "clients.num_clients=6", "rounds=8", *FIXED, SMALL_BATTERIES,
            "asynchronous={mode: fedbuff, concurrency: 4, buffer_size: 2}").clients
    cap = {0: 0.003 * 3600, 1: 0.01 * 3600, 2: 0.02 * 3600}
    mine = c[c["client_id"].isin(list(cap))].sort_values(["client_id", "start_s"])
    flat = mine["drop_reason"] == "battery"
    want = np.where(flat, 0.0, np.clip(mine["battery_level"] - mine["energy_j"] / mine["client_id"].map(cap), 0, 1))
    np.testing.assert_allclose(mine["battery_level_end"], want, rtol=0, atol=1e-12)
    for _, rows in mine.groupby("client_id"):  # the next dispatch starts where the last one left the battery
        np.testing.assert_array_equal(rows["battery_level"].to_numpy()[1:], rows["battery_level_end"].to_numpy()[:-1])
    assert (c["battery_level"].dropna() >= 0.2).all()  # nobody dispatched below the threshold
    assert flat.any() and (mine.loc[flat, "resolved_s"] == mine.loc[flat, "left_s"]).all()
    assert (mine.loc[flat, "energy_j"] < c.loc[c["drop_reason"] == "", "energy_j"].min()).all()
    assert (mine.loc[flat, "left_s"] < mine.loc[flat, "upload_end_s"]).all()
    assert c.loc[c["client_id"] >= 3, "battery_level"].notna().all()  # the others' big batteries count too


def test_same_seed_same_tables_other_seed_differs(tmp_path):
    over = ["rounds=5", "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}",
            "asynchronous={mode: fedbuff, concurrency: 5, buffer_size: 2, max_staleness: 3}"]
    a, b, other = (run(tmp_path, f"r{i}", f"seed={s}", *over) for i, s in enumerate([1, 1, 2]))

    def tables(x):
        return [t.drop(columns=list(WALL_COLUMNS), errors="ignore") for t in (x.rounds, x.clients)]

    for left, right in zip(tables(a), tables(b)):
        pd.testing.assert_frame_equal(left, right)
    assert not tables(a)[1]["client_id"].equals(tables(other)[1]["client_id"])


def test_synchronous_runs_have_no_async_columns(tmp_path):
    r = run(tmp_path, "sync", "rounds=1")
    assert "version" not in r.rounds and "staleness" not in r.clients


@pytest.mark.parametrize("setting, message", [
    ("clock.over_selection=1.5", "clock.over_selection = 1.5 does not apply"),
    ("train.lr_decay=0.9", "train.lr_decay = 0.9 is per round"),
    ("asynchronous.concurrency=11", "asynchronous.concurrency = 11: more than the 10 clients"),
    ("asynchronous.buffer_size=5", "asynchronous.buffer_size = 5 is not allowed: must be <= concurrency"),
    ("asynchronous.staleness.kind=exp", "asynchronous.staleness.kind = 'exp': Input should be 'constant'"),
    ("asynchronous.server_lr=0", "asynchronous.server_lr = 0: Input should be greater than 0"),
    ("asynchronous.mixing=0", "asynchronous.mixing = 0: Input should be greater than 0"),
    ("asynchronous.max_staleness=-1", "asynchronous.max_staleness = -1: Input should be greater"),
])
def test_validation_names_the_field_the_value_and_what_is_allowed(setting, message):
    over = [*BASE, "asynchronous={concurrency: 4, buffer_size: 2}", setting]
    if setting.startswith("asynchronous.mixing"):
        over[-2] = "asynchronous={mode: fedasync, concurrency: 4}"
    with pytest.raises(ConfigError, match=message):
        load_config(None, over)


def test_options_of_the_other_mode_are_refused():
    with pytest.raises(ConfigError, match="asynchronous.mixing does not apply to mode 'fedbuff'"):
        load_config(None, [*BASE, "asynchronous={mixing: 0.3}"])
    with pytest.raises(ConfigError, match="buffer_size does not apply to mode 'fedasync'"):
        load_config(None, [*BASE, "asynchronous={mode: fedasync, buffer_size: 3}"])


@pytest.mark.ray
def test_ray_pool_and_in_process_give_the_same_tables(tmp_path, ray_session):
    """Each wave is one executor.run_round: two Ray actors train it together, results equal
    (on the suite's shared 2-CPU Ray: starting one costs seconds of both cores)."""
    over = ["rounds=4", "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}",
            "asynchronous={mode: fedbuff, concurrency: 5, buffer_size: 2}"]
    ray_run = run(tmp_path, "ray", *over, "executor.kind=ray", "executor.num_actors=2", "ray.num_cpus=2")
    local = run(tmp_path, "local", *over)
    for left, right in ((ray_run.rounds, local.rounds), (ray_run.clients, local.clients)):
        pd.testing.assert_frame_equal(left.drop(columns=list(WALL_COLUMNS), errors="ignore"),
                                      right.drop(columns=list(WALL_COLUMNS), errors="ignore"))
    assert (local.clients.groupby("wave").size() > 1).any()  # a wave trains several clients together


def test_compressed_fedavg_runs_asynchronously_and_stale_uploads_go_back_into_the_residual(tmp_path):
    cfg = load_config(None, [*BASE, *FIXED, f"output.dir={tmp_path}",
                             "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}",
                             "algorithm={name: fedavg_compressed, compressor: topk, k: 0.1}",
                             "asynchronous={mode: fedbuff, concurrency: 6, buffer_size: 2, max_staleness: 2}"])
    sim = Simulation(cfg)
    sim.start()
    host, told = sim.executor.host, []
    original = sim.executor.notify_dropped

    def notify(wave, ids):  # the host hears of it at once (in-process): its record of what it sent is consumed
        assert all(host.states[c]["sent"]["round"] == wave for c in ids)
        original(wave, ids)
        assert all("sent" not in host.states[c] for c in ids)
        told.extend((wave, c) for c in ids)

    sim.executor.notify_dropped = notify
    rows = [row for r in range(20) for row in sim.run_round(r).client_rows]
    stale = [(row["wave"], row["client_id"]) for row in rows if row["drop_reason"] == "stale"]
    assert stale and told == stale
    assert sum(row["made_deadline"] for row in rows) == 40


def test_heterogeneous_models_step_only_the_architectures_that_sent_updates(tmp_path):
    cfg = load_config(None, ["dataset.name=mnist5k", "model.name=lenet5", "clients.num_clients=6", "rounds=4",
                             "model.per_client={0: lenet5_half, 1: lenet5_half, 2: lenet5_half}", *FIXED,
                             "checkpoint.every=0", f"output.dir={tmp_path}",
                             "asynchronous={mode: fedbuff, concurrency: 4, buffer_size: 2}"])
    r = load_run(run_experiment(cfg, tmp_path / "run"))
    sent = r.clients[r.clients["made_deadline"]].groupby("round")["arch"].agg(set)
    acc = r.rounds.set_index("round")
    idle = [s for s in range(1, 4) if "lenet5" not in sent[s]]
    assert idle  # the test is about something
    for s in idle:  # no lenet5 update in this step: its model (and so its accuracy) did not move
        assert acc.loc[s, "global_acc_lenet5"] == acc.loc[s - 1, "global_acc_lenet5"]
    assert {"lenet5", "lenet5_half"} <= set.union(*sent)


# ------------------------------------------------------------------------------ checkpoints
def _tables(records):
    frames = (pd.DataFrame([r.row for r in records]), pd.DataFrame([c for r in records for c in r.client_rows]))
    return [f.drop(columns=[c for c in f.columns if c in WALL_COLUMNS]) for f in frames]


class Collect(RunCallback):
    def __init__(self, after=None, directory=None):
        self.records, self.after, self.directory = [], after, directory

    def on_round_end(self, run, record):
        self.records.append(record)
        if record.round == self.after:
            self.state = run.simulation.asynchronous.state()
            write_checkpoint(run.simulation, self.directory)


def _online_until(tmp_path) -> str:
    online = tmp_path / "online.csv"  # online [0, 0.05 s), then from 100 s on
    pd.DataFrame({"trace_id": ["x", "x"], "start_s": [0.0, 100.0], "end_s": [0.05, 1e7]}).to_csv(online, index=False)
    return (f"clients.profiles.conditions={{sets: {{all: {{share: 0.5, availability: {{kind: intervals, "
            f"file: '{online}', loop: false}}}}, other: {{share: 0.5, down: gilbert_elliott}}}}}}")


ASCEND_SMALL = ("algorithm={name: ascend, distill_steps: 4, distill_batch: 32, public_probe_size: 64, "
                "probe_batches: 1}", "partition.public_fraction=0.1")


@pytest.mark.parametrize("variant", ["fedbuff-topk", "fedasync-conditions", "fedbuff-batteries", "fedcspack-fedbuff",
                                     pytest.param("ascend-fedbuff", marks=pytest.mark.slow),
                                     pytest.param("ascend-fedasync", marks=pytest.mark.slow)])
def test_an_async_run_continues_bit_identically_from_a_checkpoint(tmp_path, variant):
    """Checkpoint after step 3 with updates in flight (and buffered): a fresh Simulation restored
    from it takes steps 4-9 exactly as the uninterrupted run did. FedCSPACK: the global masks and
    each client's personal model and shared packs; ASCEND: each client's bandit, residual,
    pending reward and undo record, the server's teacher, reference loss and rollbacks."""
    fedbuff = "asynchronous={mode: fedbuff, concurrency: 6, buffer_size: 3, max_staleness: 2}"
    over = {"fedbuff-topk": ["algorithm={name: fedavg_compressed, compressor: topk, k: 0.1}", fedbuff],
            "fedasync-conditions": [_online_until(tmp_path), "clock.start=00:00",
                                    "asynchronous={mode: fedasync, concurrency: 4, max_staleness: 4}"],
            "fedbuff-batteries": [_online_until(tmp_path), "clock.start=00:00", "clients.profiles.battery={start: "
                                  "{low: 0.2, high: 0.6}, threshold: 0.25, charging: online, idle_drain: true}",
                                  "clients.profiles.overrides={0: {battery_wh: 0.01}, 1: {battery_wh: 0.01}}", fedbuff],
            "fedcspack-fedbuff": ["algorithm={name: fedcspack, pack_size: 64, record_packs: true}", fedbuff],
            "ascend-fedbuff": [*ASCEND_SMALL, fedbuff],
            "ascend-fedasync": [*ASCEND_SMALL, _online_until(tmp_path), "clock.start=00:00",
                                "asynchronous={mode: fedasync, concurrency: 4, max_staleness: 4}"]}[variant]
    cfg = load_config(None, [*BASE, f"output.dir={tmp_path}", "rounds=10",
                             "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}", *over])
    full = Collect(after=3, directory=tmp_path / "ckpt")
    Simulation(cfg).run([full])
    assert full.state["flight"] and full.state["events"]  # the test is about something in flight
    resumed = Simulation(cfg)
    assert restore_checkpoint(resumed, tmp_path / "ckpt")["next_round"] == 4
    tail = Collect()
    assert resumed.run([tail]) == "finished"
    for left, right in zip(_tables(tail.records), _tables(full.records[4:])):
        pd.testing.assert_frame_equal(left.reset_index(drop=True), right.reset_index(drop=True))
    for a, b in zip(tail.records, full.records[4:]):  # the methods' own tables (packs, rollbacks)
        assert a.extra_tables.keys() == b.extra_tables.keys()
        for name in a.extra_tables:
            pd.testing.assert_frame_equal(pd.DataFrame(a.extra_tables[name]).drop(columns=["wall_s"], errors="ignore"),
                                          pd.DataFrame(b.extra_tables[name]).drop(columns=["wall_s"], errors="ignore"))
    reasons = set(_tables(full.records)[1]["drop_reason"])
    assert reasons & {"stale", "offline"}  # drops happened


@pytest.mark.parametrize("method", [
    "fedavg",
    pytest.param("fedcspack", marks=pytest.mark.slow),
    pytest.param("ascend", marks=pytest.mark.slow),
])
def test_sigkill_of_an_async_hetsim_run_then_resume_equals_an_uninterrupted_run(tmp_path, method):
    """kill -9 of a running `hetsim run` once step 9 is on disk, `--resume` from its newest
    checkpoint (every 4 steps): the tables equal an uninterrupted run's (FedCSPACK: and its packs
    and global masks; ASCEND: and its rollbacks)."""
    algo = {"fedavg": [], "fedcspack": ["algorithm={name: fedcspack, pack_size: 64, record_packs: true}"],
            "ascend": list(ASCEND_SMALL)}[method]
    rounds = 30  # 21 steps of margin after the kill at step 9; the resume and the reference run all of them
    over = [*BASE, *algo, f"rounds={rounds}", "checkpoint.every=4", "train.local_epochs=4",
            "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}",
            "asynchronous={mode: fedbuff, concurrency: 6, buffer_size: 2, max_staleness: 3}"]
    path = tmp_path / "killed"
    cmd = [sys.executable, "-m", "hetsim", "run", "-q", "-o", str(path)]
    for o in over:
        cmd += ["--set", o]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while len(list((path / "_parts" / "rounds").glob("*.parquet"))) < 9:  # past the checkpoint of step 8
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    killed = load_run(path)
    assert killed.manifest["status"] == "running" and len(killed.rounds) < rounds
    from hetsim.cli import main  # the CLI's --resume, as a user runs it

    assert main(["run", "--resume", str(path), "-q"]) == 0
    resumed = load_run(path)
    ref = load_run(run_experiment(load_config(None, [*over, f"output.dir={tmp_path}"]), tmp_path / "ref"))
    pairs = [(resumed.rounds, ref.rounds), (resumed.clients, ref.clients)]
    for name in ("packs", "global_mask", "rollbacks"):  # the methods' own tables, where the run has them
        left, right = resumed.table(name), ref.table(name)
        assert (left is None) == (right is None)
        if right is not None:
            pairs.append((left, right))
    assert len(pairs) == 2 + 2 * (method == "fedcspack") or method == "ascend"
    for left, right in pairs:
        pd.testing.assert_frame_equal(left.drop(columns=list(WALL_COLUMNS), errors="ignore"),
                                      right.drop(columns=list(WALL_COLUMNS), errors="ignore"))
    assert resumed.manifest["resumes"][0]["previous_status"] == "running"


def test_the_report_shows_staleness_and_clients_in_flight(tmp_path):
    from hetsim.report import build_report

    r = run(tmp_path, "run", "rounds=20", *FIXED, "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}",
            "asynchronous={mode: fedasync, concurrency: 6, mixing: 0.6, max_staleness: 1}")
    text = build_report(r.path, tmp_path / "rep.html").read_text()
    assert "<h2>Asynchronous rounds</h2>" in text
    for fig_id in ("fig-async-staleness", "fig-async-in-flight"):
        assert f'id="{fig_id}"' in text and (tmp_path / "rep_figures" / f"{fig_id}.png").is_file()
    assert "dropped as older than max_staleness" in text  # the staleness figure's caption
    # a synchronous run has no such section
    sync = run(tmp_path, "sync", "rounds=2", *FIXED)
    assert "Asynchronous rounds" not in build_report(sync.path, tmp_path / "sync.html").read_text()


def test_the_async_fields_are_sweepable(tmp_path):
    from sweeps.spec import resolve

    r = resolve({"base": {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "rounds": 2,
                          "clients": {"num_clients": 10},
                          "asynchronous": {"concurrency": 6, "buffer_size": 3}},
                 "space": {"asynchronous.buffer_size": {"grid": [2, 3]},
                           "asynchronous.staleness.a": {"grid": [0.5, 1.0]},
                           "asynchronous.server_lr": {"grid": [0.5, 1.0]}}},
                storage=tmp_path / "sw")
    assert r.num_trials == 8
    with pytest.raises(Exception, match="buffer_size"):  # a grid value the section refuses
        resolve({"base": {"dataset": {"name": "digits"}, "model": {"name": "mlp"},
                          "clients": {"num_clients": 10}, "asynchronous": {"concurrency": 6}},
                 "space": {"asynchronous.buffer_size": {"grid": [2, 9]}}}, storage=tmp_path / "sw2")
