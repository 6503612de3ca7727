"""Checkpoints, resume and actor failure under the Ray executor, with real SIGKILLs of its
actors; runs are started in this process (`hetsim run` processes under signals:
test_ray_resume_signals.py)."""
import os
import signal
import time

import pytest
import ray
from helpers.checkpoint import METHODS, NO_SLEEP, Collect, assert_same_tables, cfg_of, frames, uninterrupted
from helpers.ray_processes import alive, wait_for_cpus, wait_gone

from engine.checkpoint.folder import list_checkpoints
from engine.checkpoint.snapshot import restore_checkpoint
from engine.execution.inprocess import InProcessExecutor
from engine.loop.callbacks import RunCallback, Stop
from engine.loop.simulation import Simulation
from engine.ray import driver as ray_driver
from engine.ray.cluster import ExecutorError
from engine.ray.driver import DriverDiedError
from engine.ray.executor import RayExecutor
from engine.results.tables import load_run
from engine.run.api import resume_run, run_experiment
from engine.run.body import execute_run

pytestmark = pytest.mark.ray
RAY = ["executor.kind=ray", "ray.num_cpus=2"]
# runs on the driver actor that end leave it and its client actor up for the next test's first
# run (executor.keep_warm, result neutral: tests/engine/test_matrix.py): fewer actor starts; one
# client actor where the test is about the driver actor or a resume, not about a pool of several
WARM = [*RAY, "executor.keep_warm=true", "executor.num_actors=1"]
# every client runs every round, so every actor is busy in every round
ALL_RUN = ["clients.participation=1.0", "clock.over_selection=1.0",
           "clients.profiles={devices: {rpi4: 0.5, laptop_cpu: 0.5}, availability: 1.0, dropout: 0.0}"]


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


@pytest.fixture(autouse=True)
def free_cpus(local_ray):
    """Every CPU free for a test's first pool (killed actors give theirs back asynchronously),
    unless warm actors hold them for its first run on the driver actor."""
    if ray_driver._warm is None:  # (engine.ray.driver's own record of the warm actors)
        wait_for_cpus(local_ray)


@pytest.fixture
def fresh_actors(local_ray):
    """A test that starts a RayExecutor of its own: the warm actors give their CPUs back first."""
    ray_driver.release_warm_actors()
    wait_for_cpus(local_ray)


# ------------------------------------------------------------------------------ a client actor dies
class KillActor(RunCallback):
    """After round ``after`` and its checkpoint, SIGKILL client actor ``actor`` and wait until
    its process is gone, so the next round's call meets a dead actor. (Killing it "while busy"
    raced with small rounds: under load the round could finish before the kill landed.)"""

    def __init__(self, after: int, actor: int):
        self.after, self.actor = after, actor
        self.pid = None

    def on_round_end(self, run, record):
        if record.round == self.after:
            self.pid = run.simulation.executor.pids[self.actor]
            os.kill(self.pid, signal.SIGKILL)
            assert not wait_gone([self.pid]), f"actor process {self.pid} still alive after SIGKILL"


def test_a_killed_client_actor_is_replaced_and_the_run_is_unchanged_with_every_round_checkpoints(
        tmp_path, local_ray, fresh_actors):
    overrides = [*METHODS["fedcspack-own_mask"], *ALL_RUN, "rounds=4", "checkpoint.every=1"]  # as the next test
    cfg = cfg_of(*overrides, *RAY)
    killer = KillActor(after=2, actor=1)
    path = execute_run(cfg, tmp_path / "r", [killer], ["test"], executor=RayExecutor(cfg))
    run = load_run(path)
    assert run.manifest["status"] == "finished" and run.manifest["faults"] == 1
    fault = run.table("faults").iloc[0]
    print(fault.to_dict())
    assert fault["round"] == 3 and fault["actor"] == 1 and fault["pid"] == killer.pid
    assert list(fault["clients"]) == [1, 3, 5, 7]  # the lost clients, rerun on the replacement
    assert fault["clients_restored"] == 4 and fault["checkpoint"] == "round-000003"
    assert fault["state_rounds_lost"] == 0 and fault["seconds_lost"] > 0
    assert "ActorDiedError" in fault["cause"] or "RayActorError" in fault["cause"]
    assert not alive(killer.pid)
    assert_same_tables(frames(run), uninterrupted(tmp_path, overrides))


def test_a_replacement_that_dies_too_stops_the_run_naming_the_checkpoint(tmp_path, local_ray, monkeypatch,
                                                                         fresh_actors):
    overrides = [*METHODS["fedcspack-own_mask"], *ALL_RUN, "rounds=4", "checkpoint.every=1"]
    cfg = cfg_of(*overrides, *WARM)  # its resume on the driver actor leaves the actors warm
    executor = RayExecutor(cfg)
    spawned = []
    real_spawn = executor._spawn

    def spawn_and_kill_replacements(i):
        actor = real_spawn(i)
        if executor.actors:  # a replacement (the pool exists already): killed during its start-up,
            # before it imports torch (seconds of CPU); the executor meets it dead as it would once up
            ray.kill(actor, no_restart=True)
            spawned.append(actor)
        return actor

    monkeypatch.setattr(executor, "_spawn", spawn_and_kill_replacements)
    path = tmp_path / "r"
    with pytest.raises(ExecutorError) as info:
        execute_run(cfg, path, [KillActor(after=1, actor=0)], ["test"], executor=executor)
    message = str(info.value)
    assert "round 2: client actor 0 died" in message and "replacement failed too" in message
    assert f"checkpoint round-000002 with: hetsim run --resume {path}" in message
    assert spawned and load_run(path).manifest["status"] == "failed"
    # and the command it names continues the run as if nothing had happened
    wait_for_cpus(local_ray)
    resume_run(path)
    assert_same_tables(frames(load_run(path)), uninterrupted(tmp_path, overrides))


# ------------------------------------------------------------------------------ Ctrl+C
def test_ctrl_c_on_ray_lets_a_long_round_finish_and_checkpoints_it(tmp_path, local_ray):
    """The round in flight at Ctrl+C ends 7 s later: the caller waits for it (it used to kill the
    driver actor after 5 s, so under load the run lost that round and its checkpoint)."""
    from engine.ray.driver import run_on_driver_actor
    from engine.run.api import prepare_run
    from engine.run.signals import interrupt_signals

    overrides = [*METHODS["fedcspack-own_mask"], "rounds=5", "checkpoint.every=0"]  # one reference with
    cfg = cfg_of(*overrides, *WARM)  # test_resume_on_ray_of_a_run_started_in_process
    flag = tmp_path / "ctrl-c-pressed"

    def body(cfg, path, callbacks, command, **kwargs):  # in the driver actor (pickled by value)
        from engine.run.body import execute_run

        class LongRound(RunCallback):
            def on_round_end(self, run, record):
                if record.round == 1:  # before the relay: the caller has seen round 0 only
                    while not flag.exists():
                        time.sleep(0.05)
                    time.sleep(7.0)

        return execute_run(cfg, path, [LongRound(), *callbacks], command, **kwargs)

    def ctrl_c(record):  # in this process, on the relayed round 0
        flag.touch()
        raise KeyboardInterrupt

    prepared = prepare_run(cfg, tmp_path / "r")
    path, warnings = prepared.path, prepared.warnings
    with interrupt_signals(None), pytest.raises(KeyboardInterrupt):
        run_on_driver_actor(body, cfg, path, [ctrl_c], ["test"], warnings=warnings)
    run = load_run(path)
    assert run.manifest["status"] == "interrupted", run.manifest.get("error")
    assert [n for n, _ in list_checkpoints(path)] == [2] and len(run.rounds) == 2  # the long round kept
    wait_for_cpus(local_ray)
    resume_run(path)
    assert_same_tables(frames(load_run(path)), uninterrupted(tmp_path, overrides))


# ------------------------------------------------------------------------------ the driver actor dies
def test_driver_actor_death_is_reported_with_the_resume_command(tmp_path, local_ray):
    # still running when killed: the first round reaches the callback at the caller's first
    # poll (0.5 s), and 10 rounds sleep 5 s in all (a realtime clock's capped sleep, no CPU)
    overrides = [*METHODS["fedavg"], "rounds=10", "checkpoint.every=2",
                 "clock.mode=realtime", "clock.max_sleep_s=0.5", "clock.time_scale=1000000"]
    path = tmp_path / "r"
    killed = {}

    def kill_driver(record):
        if record.round == 1 and not killed:
            import json

            killed["pid"] = json.loads((path / "manifest.json").read_text())["loop_pid"]
            killed["at"] = time.monotonic()
            os.kill(killed["pid"], signal.SIGKILL)

    with pytest.raises(DriverDiedError, match=rf"driver actor .* died.*hetsim run --resume {path}"):
        run_experiment(cfg_of(*overrides, *WARM), path, callbacks=[kill_driver])
    print(f"driver death reported {time.monotonic() - killed['at']:.1f} s after the kill")
    assert load_run(path).manifest["status"] == "failed"
    wait_for_cpus(local_ray)
    resume_run(path, overrides=[NO_SLEEP])
    assert_same_tables(frames(load_run(path)), uninterrupted(tmp_path, [*overrides, NO_SLEEP]))


# ------------------------------------------------------------------------------ resume on Ray
def test_resume_on_ray_of_a_run_started_in_process(tmp_path, local_ray):
    overrides = [*METHODS["fedcspack-own_mask"], "rounds=5", "checkpoint.every=2"]
    path = tmp_path / "r"
    run_experiment(cfg_of(*overrides), path, callbacks=[lambda rec: Stop("pause") if rec.round == 2 else None])
    assert [n for n, _ in list_checkpoints(path)] == [2, 3]
    resume_run(path, overrides=WARM)
    run = load_run(path)
    assert run.manifest["executor"]["kind"] == "ray" and run.manifest["status"] == "finished"
    assert_same_tables(frames(run), uninterrupted(tmp_path, overrides))


# ------------------------------------------------------------------------------ shards across nodes
@pytest.fixture
def two_torch_threads():
    """This process at 2 torch threads (a fresh process on 2 cores; other tests leave 1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_shards_shipped_in_chunks_and_restored_on_another_executor_size(tmp_path, local_ray, monkeypatch,
                                                                        two_torch_threads, fresh_actors):
    """Actors on another node ship their shard in chunks; a checkpoint of 2 actors restores into
    one actor, and into the in-process executor, with the same results. The round loop runs in
    this process, at 2 torch threads: its numbers must not depend on them (with ASCEND's gamma 0
    a rollback hung on them, and the test failed when nothing before it had left 1 thread)."""
    import engine.ray.executor as rx

    monkeypatch.setattr(rx, "CHUNK_BYTES", 4096)  # many chunks per shard
    overrides = [*METHODS["ascend-egreedy"], "rounds=4"]
    cfg = cfg_of(*overrides, *RAY)
    executor = RayExecutor(cfg)
    executor.state_transfer = "chunks"
    full = Collect(checkpoint_after=1, directory=tmp_path / "ckpt")
    Simulation(cfg, executor).run([full])
    meta_shards = [p.name for p in (tmp_path / "ckpt").glob("clients-*.pt")]
    assert sorted(meta_shards) == ["clients-0000.pt", "clients-0001.pt"]
    expected = frames(full.records[2:])
    one_actor = cfg_of(*overrides, *RAY, "executor.num_actors=1")
    for sim in (Simulation(one_actor, RayExecutor(one_actor)), Simulation(cfg, InProcessExecutor(threads=1))):
        wait_for_cpus(local_ray)
        restore_checkpoint(sim, tmp_path / "ckpt")
        tail = Collect()
        sim.run([tail])
        assert_same_tables(frames(tail.records), expected)
