"""Checkpoints and resume (in-process executor): bit-identical continuation for every method,
the run folder's checkpoints, config checks on resume, and real kills of `hetsim run`."""
import json
import os
import random
import signal

import pytest
from helpers.checkpoint import (
    KILL_AFTER,
    KILL_IN_PROCESS,
    KILL_METHODS,
    KILL_ROUNDS,
    METHODS,
    NO_SLEEP,
    SLEEPY_ROUNDS,
    Collect,
    assert_same_tables,
    cfg_of,
    frames,
    hetsim_process,
    kill_at_round,
    simulation,
    uninterrupted,
)

from algorithms import ALGORITHMS
from engine.checkpoint.folder import list_checkpoints
from engine.checkpoint.snapshot import restore_checkpoint, write_checkpoint
from engine.clients.format import CheckpointError, load_client_states
from engine.errors import ConfigError
from engine.loop.callbacks import Stop
from engine.results.tables import RunWriter, load_run, read_table
from engine.run.api import resume_run, run_experiment
from engine.run.folders import RunStateError
from hetsim.cli import main


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_continues_bit_identically_from_a_checkpoint(tmp_path, method):
    """Run 5 rounds, checkpoint after round 1; a fresh Simulation restored from it runs rounds
    2-4 exactly as the uninterrupted run did (every table, every column but wall_*). State a
    method keeps but does not checkpoint makes this test fail."""
    cfg = cfg_of(*METHODS[method], "rounds=5")
    full = Collect(checkpoint_after=1, directory=tmp_path / "ckpt")
    simulation(cfg).run([full])
    resumed = simulation(cfg)
    meta = restore_checkpoint(resumed, tmp_path / "ckpt")
    assert meta["next_round"] == resumed.next_round == 2
    tail = Collect()
    assert resumed.run([tail]) == "finished"
    assert [r.round for r in tail.records] == [2, 3, 4]
    assert_same_tables(frames(tail.records), frames(full.records[2:]))


def test_every_registered_method_is_covered_by_the_continuation_test():
    assert {m.split("-")[0] for m in METHODS} == set(ALGORITHMS)
    from algorithms.compressors import COMPRESSORS

    compressed = {m.split("-")[1] for m in METHODS if m.startswith("fedavg_compressed-")}
    assert compressed == set(COMPRESSORS)  # every compressor's client state (residual, sent)


def test_a_checkpoint_refuses_another_config_and_the_middle_of_a_round(tmp_path):
    cfg = cfg_of("rounds=2")
    simulation(cfg).run([Collect(checkpoint_after=0, directory=tmp_path / "c")])
    with pytest.raises(CheckpointError, match="another config"):
        restore_checkpoint(simulation(cfg_of("rounds=2", "train.lr=0.01")), tmp_path / "c")
    sim = simulation(cfg)
    sim.start()
    sim.in_round = True
    with pytest.raises(CheckpointError, match="middle of a round"):
        write_checkpoint(sim, tmp_path / "d")


def test_run_folder_keeps_the_newest_checkpoints_with_an_index(tmp_path):
    path = run_experiment(cfg_of("rounds=7", "checkpoint.every=2", "checkpoint.keep=2"), tmp_path / "r")
    assert [n for n, _ in list_checkpoints(path)] == [4, 6]
    names = sorted(p.name for p in (path / "checkpoints").iterdir())
    assert names == ["index.json", "round-000004", "round-000006"]  # no leftovers of writes
    index = json.loads((path / "checkpoints" / "index.json").read_text())
    assert [e["next_round"] for e in index["checkpoints"]] == [4, 6]
    meta = json.loads((path / "checkpoints" / "round-000006" / "checkpoint.json").read_text())
    # the newest shard holds what changed since the previous checkpoint, whose shards are linked
    assert meta["tables"]["rounds"] == 6 and meta["client_states"][-1]["file"] == "clients-0000.pt"
    assert all(s["linked"] for s in meta["client_states"][:-1])
    assert meta["bytes"] == sum(f.stat().st_size for f in (path / "checkpoints/round-000006").glob("*.pt"))


@pytest.mark.parametrize("method", ["fedavg_compressed-topk", "fedcspack-own_mask", "ascend-egreedy"])
def test_checkpoints_write_what_changed_and_link_the_rest_then_resume_bit_identically(tmp_path, method):
    """Checkpoints every round: each writes the states of the clients that changed since the last
    one and hard-links the earlier shards (same inodes, no bytes), compacting before the links
    hold over twice the live states; a run restored from the end of such a chain continues
    exactly as the uninterrupted run."""
    cfg = cfg_of(*METHODS[method], "rounds=8", "clients.num_clients=24", "clients.participation=0.25",
                 "checkpoint.every=1", "checkpoint.keep=8")
    path = run_experiment(cfg, tmp_path / "run")
    found = list_checkpoints(path)
    assert [n for n, _ in found] == list(range(1, 8))  # none after the last round: the run is complete
    metas = [json.loads((d / "checkpoint.json").read_text()) for _, d in found]
    clients = load_run(path).clients
    linked_some = False
    for (n, d), meta, (_, before) in zip(found[1:], metas[1:], found):
        shards = meta["client_states"]
        newest = shards[-1]
        assert newest["file"] == "clients-0000.pt" and not newest["linked"]
        for s in shards[:-1]:  # the earlier shards: the previous checkpoint's files, linked
            assert s["linked"]
            match = [f for f in before.iterdir() if os.stat(f).st_ino == os.stat(d / s["file"]).st_ino]
            assert match, (n, s["file"])
            linked_some = True
        held = sum(s["clients"] for s in shards)
        live = len(load_client_states([d / s["file"] for s in shards], lambda cid: True))
        assert held <= 2 * live + 8, (n, held, live)  # else one full shard is written instead
        if len(shards) > 1:  # a delta: only the clients that ran in round n-1 (and any lost since)
            ran = clients[(clients["round"] == n - 1) & clients["train_loss"].notna()]["client_id"].nunique()
            assert newest["clients"] <= ran + 8, (n, newest["clients"], ran)
        assert meta["written_bytes"] < meta["bytes"] or len(shards) == 1
    assert linked_some
    # the chain's end restores the same states as the uninterrupted run holds
    reference = Collect()
    simulation(cfg).run([reference])
    resumed = simulation(cfg)
    restore_checkpoint(resumed, found[5][1])
    tail = Collect()
    assert resumed.run([tail]) == "finished"
    assert_same_tables(frames(tail.records), frames(reference.records[6:]))


def test_when_every_state_changes_each_round_the_links_are_compacted_into_one_full_shard(tmp_path):
    cfg = cfg_of(*METHODS["fedavg_compressed-topk"], "rounds=6", "clients.participation=1.0",
                 "clock.over_selection=1.0", "clients.profiles={availability: 1.0, dropout: 0.0}",
                 "checkpoint.every=1", "checkpoint.keep=6")
    found = list_checkpoints(run_experiment(cfg, tmp_path / "run"))
    layouts = [[s["linked"] for s in json.loads((d / "checkpoint.json").read_text())["client_states"]]
               for _, d in found]
    # (nearly) every state changes each round: linking would pile up superseded states, so within
    # three checkpoints one full shard is written again, and the files never accumulate
    assert layouts[0] == [False] and [False] in layouts[1:4], layouts
    assert max(len(x) for x in layouts) <= 3, layouts


def test_every_zero_checkpoints_only_when_the_run_ends_early(tmp_path):
    path = tmp_path / "r"
    run_experiment(cfg_of("rounds=6", "checkpoint.every=0"), path,
                   callbacks=[lambda rec: Stop("enough") if rec.round == 2 else None])
    assert [n for n, _ in list_checkpoints(path)] == [3]
    run = load_run(path)
    assert run.manifest["status"] == "stopped"
    assert json.loads((path / "checkpoints/round-000003/checkpoint.json").read_text())["reason"] == "run stopped"


def test_resume_continues_a_stopped_run_with_each_round_once(tmp_path):
    overrides = [*METHODS["fedcspack-own_mask"], "rounds=6", "checkpoint.every=4"]
    ref = load_run(run_experiment(cfg_of(*overrides), tmp_path / "ref"))
    path = tmp_path / "r"
    run_experiment(cfg_of(*overrides), path, callbacks=[lambda rec: rec.round == 1])
    assert load_run(path).manifest["status"] == "stopped"
    assert resume_run(path, command=["test"]) == path
    run = load_run(path)
    assert_same_tables(frames(run), frames(ref))
    assert run.manifest["status"] == "finished" and "error" not in run.manifest
    (entry,) = run.manifest["resumes"]
    assert entry["from_round"] == 2 and entry["checkpoint"] == "checkpoints/round-000002"
    assert entry["previous_status"] == "stopped" and entry["command"] == ["test"]
    with pytest.raises(RunStateError, match="nothing to resume"):
        resume_run(path)


def test_resume_falls_back_to_an_older_checkpoint_when_the_newest_is_damaged(tmp_path):
    """As after a power loss (checkpoints are not fsynced): a truncated file, or garbage."""
    overrides = [*METHODS["fedcspack-own_mask"], "rounds=7", "checkpoint.every=2", "checkpoint.keep=3"]
    ref = load_run(run_experiment(cfg_of(*overrides), tmp_path / "ref"))
    path = tmp_path / "r"
    run_experiment(cfg_of(*overrides), path, callbacks=[lambda rec: rec.round == 5])
    assert [n for n, _ in list_checkpoints(path)] == [2, 4, 6]
    shard = path / "checkpoints/round-000006/clients-0000.pt"
    shard.write_bytes(shard.read_bytes()[:100])  # cut short
    server = path / "checkpoints/round-000004/server.pt"
    server.write_bytes(b"\0" * server.stat().st_size)  # right size, garbage inside
    resume_run(path)
    run = load_run(path)
    entry = run.manifest["resumes"][0]
    assert entry["from_round"] == 2 and entry["checkpoint"] == "checkpoints/round-000002"
    assert [s["checkpoint"] for s in entry["skipped"]] == ["round-000006", "round-000004"]
    assert "incomplete" in entry["skipped"][0]["error"]  # caught by the sizes in checkpoint.json
    assert_same_tables(frames(run), frames(ref))


def test_resume_refuses_a_config_that_changes_results(tmp_path):
    path = tmp_path / "r"
    run_experiment(cfg_of("rounds=3"), path, callbacks=[lambda rec: rec.round == 0])
    with pytest.raises(ConfigError, match=r"train\.lr: 0\.05 -> 0\.01(.|\n)*only these may change"):
        resume_run(path, overrides=["train.lr=0.01"])
    with pytest.raises(ConfigError, match="torch threads per client host: 1 -> 2"):
        resume_run(path, overrides=["executor.threads_per_actor=2"])
    assert main(["run", "--resume", str(path), "-q", "--set", "rounds=4"]) == 2
    # output, checkpoint cadence and executor size do not change results
    resume_run(path, overrides=["checkpoint.every=1", "output.name=x", "executor.threads_per_actor=1"])
    assert load_run(path).manifest["status"] == "finished"
    assert load_run(path).config["checkpoint"]["every"] == 1


def test_rewind_drops_later_rounds_from_parts_and_compacted_tables(tmp_path):
    w = RunWriter(tmp_path)
    for r in range(5):
        w.append("rounds", [{"round": r, "x": r}])
    w.append("trace", {"round": [1, 2, 3], "y": [1, 2, 3]})  # one part spanning rounds
    w.append("faults", [{"round": 4, "actor": 0}])  # history: never dropped
    w.finalize()
    # killed while compacting: the table is compacted, its parts not yet removed
    w.append("rounds", [{"round": 4, "x": 4}])
    w2 = RunWriter(tmp_path)
    dropped = w2.rewind(3, {"rounds": 9})
    assert dropped == {"rounds": 2, "trace": 1}
    assert read_table(tmp_path, "rounds")["round"].tolist() == [0, 1, 2]
    assert read_table(tmp_path, "trace")["round"].tolist() == [1, 2]
    assert read_table(tmp_path, "faults")["round"].tolist() == [4]
    assert w2.sequence()["rounds"] == 9
    w2.append("rounds", [{"round": 3, "x": 3}])
    w2.finalize()
    assert read_table(tmp_path, "rounds")["round"].tolist() == [0, 1, 2, 3]


def test_a_resumed_writer_adds_to_the_fault_log_of_earlier_attempts(tmp_path):
    for compacted in (True, False):  # a stopped run's compacted log, a killed run's parts
        path = tmp_path / str(compacted)
        w = RunWriter(path)
        w.append("rounds", [{"round": 0}])
        w.append("faults", [{"round": 0, "actor": 1}])
        if compacted:
            w.finalize()
        w2 = RunWriter(path)
        w2.rewind(1)
        w2.append("rounds", [{"round": 1}])
        w2.append("faults", [{"round": 1, "actor": 2}])
        w2.finalize()
        assert read_table(path, "faults")["actor"].tolist() == [1, 2], compacted


# ------------------------------------------------------------------------------ real processes
@pytest.mark.parametrize("method", sorted({**KILL_METHODS, **KILL_IN_PROCESS}))
def test_sigkill_of_hetsim_run_then_resume_equals_an_uninterrupted_run(tmp_path, method):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    k, delay = rng.choice(KILL_AFTER), rng.uniform(0.0, 0.1)
    why = f"(kill after round {k} + {delay:.3f} s; seed {seed})"
    overrides = [*{**KILL_METHODS, **KILL_IN_PROCESS}[method], *KILL_ROUNDS]
    path = tmp_path / "killed"
    proc = hetsim_process(path, overrides)
    kill_at_round(proc, path, k, delay=delay)
    assert proc.wait(timeout=60) == -signal.SIGKILL, why
    killed = load_run(path)
    assert killed.manifest["status"] == "running", why  # it never got to say otherwise
    assert main(["run", "--resume", str(path), "-q"]) == 0, why
    resumed = load_run(path)
    assert_same_tables(frames(resumed), uninterrupted(tmp_path, overrides))
    assert resumed.manifest["status"] == "finished", why
    assert resumed.manifest["resumes"][0]["previous_status"] == "running"
    assert not (path / "_parts").exists()


def test_sigkill_before_any_checkpoint_resumes_from_round_zero(tmp_path):
    # the experiment of the SIGKILL test above (checkpoints aside): its uninterrupted run is shared
    overrides = [*KILL_METHODS["fedcspack"], *KILL_ROUNDS, "checkpoint.every=0"]
    path = tmp_path / "killed"
    proc = hetsim_process(path, overrides)
    kill_at_round(proc, path, 3)
    proc.wait(timeout=60)
    assert not list_checkpoints(path)
    resume_run(path)
    run = load_run(path)
    assert run.manifest["resumes"][0]["from_round"] == 0
    assert run.manifest["resumes"][0]["checkpoint"] is None
    assert_same_tables(frames(run), uninterrupted(tmp_path, overrides))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_after_the_round_checkpoints_and_resumes(tmp_path, sig):
    overrides = [*METHODS["ascend-exp3"], *SLEEPY_ROUNDS, "checkpoint.every=0"]
    path = tmp_path / "r"
    proc = hetsim_process(path, overrides)
    kill_at_round(proc, path, 2, sig=sig, delay=0.02)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert f"hetsim run --resume {path}" in out
    run = load_run(path)
    assert run.manifest["status"] == "interrupted"
    (n, _), = list_checkpoints(path)
    assert len(run.rounds) == n < 12, "stopped between rounds, and the checkpoint is of that point"
    assert main(["run", "--resume", str(path), "-q", "--set", NO_SLEEP]) == 0
    assert_same_tables(frames(load_run(path)), uninterrupted(tmp_path, [*overrides, NO_SLEEP]))
