"""Checkpoints, resume and actor failure under the Ray executor, with real SIGKILLs."""
import os
import random
import signal
import time
from pathlib import Path

import pytest
from helpers.checkpoint import (
    KILL_METHODS,
    METHODS,
    SLOW_ROUNDS,
    Collect,
    assert_same_tables,
    cfg_of,
    frames,
    hetsim_process,
    kill_at_round,
)

from engine.checkpoint.folder import list_checkpoints
from engine.checkpoint.snapshot import restore_checkpoint
from engine.execution.inprocess import InProcessExecutor
from engine.loop.callbacks import RunCallback, Stop
from engine.loop.simulation import Simulation
from engine.ray.cluster import ExecutorError
from engine.ray.driver import DriverDiedError
from engine.ray.executor import RayExecutor
from engine.results.manifest import process_identity, read_manifest
from engine.results.tables import load_run
from engine.run.api import resume_run, run_experiment
from engine.run.body import execute_run
from hetsim.cli import main

pytestmark = pytest.mark.ray
RAY = ["executor.kind=ray", "ray.num_cpus=2"]
# every client runs every round, so every actor is busy in every round
ALL_RUN = ["clients.participation=1.0", "clock.over_selection=1.0",
           "clients.profiles={devices: {rpi4: 0.5, laptop_cpu: 0.5}, availability: 1.0, dropout: 0.0}"]


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


@pytest.fixture(autouse=True)
def free_cpus(local_ray):
    wait_for_cpus(local_ray)


def descendants(pid: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_states(pids) -> dict[int, str]:
    """Each process's state and command line, for a failure message."""
    out = {}
    for pid in pids:
        try:
            state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            state = "State: gone"
        out[pid] = f"{state.split(':', 1)[1].strip()} {command_line(pid)[:200]}"
    return out


def alive(pid: int, start: int | None = None) -> bool:
    """``pid`` runs (a zombie has finished); with ``start``, only the process that started then:
    the OS hands a dead process's pid to a later one (pid_max 32768 wraps within minutes on a busy
    machine, and another test's Ray worker then looked like a killed run's actor still alive)."""
    try:
        running = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
    return running and (start is None or process_identity(pid)["pid_start"] == start)


def started(pids) -> dict[int, int]:
    """Each running pid's start time (see :func:`alive`); one already gone is left out."""
    starts = {pid: process_identity(pid)["pid_start"] for pid in pids}
    return {pid: start for pid, start in starts.items() if start is not None}


def wait_gone(pids, timeout=30.0) -> list[int]:
    """``pids``: a list, or ``{pid: start time}`` from :func:`started`."""
    starts = pids if isinstance(pids, dict) else dict.fromkeys(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p, s) for p, s in starts.items()):
        time.sleep(0.2)
    return [p for p, s in starts.items() if alive(p, s)]


def wait_for_cpus(ray, cpus=2.0, timeout=60.0):
    """Killed actors give their CPUs back asynchronously; a new pool is sized from what is free."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.1)


def reference(tmp_path, overrides, name="ref"):
    return frames(load_run(run_experiment(cfg_of(*overrides), tmp_path / name)))


# ------------------------------------------------------------------------------ kill -9 of hetsim
def on_this_cluster(ray) -> list[str]:
    """`hetsim run` joins this test's Ray (as on a cluster, `ray.address`): no Ray start-up per run."""
    return ["executor.kind=ray", f"ray.address={ray.get_runtime_context().gcs_address}"]


def join_env() -> dict[str, str]:
    """What a process needs to join this test's private local Ray (docs/security.md): its
    session token, and Ray's local-only mode so that it looks for the cluster on loopback."""
    from engine.ray import cluster as ray_cluster

    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_cluster._local_token,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.mark.parametrize("method", sorted(KILL_METHODS))
def test_sigkill_of_hetsim_run_on_ray_then_resume_equals_an_uninterrupted_run(tmp_path, local_ray, method):
    """FedAvg's run starts its own local Ray (as `hetsim run` on a laptop), the others join
    this test's Ray (as on a cluster)."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    k, delay = rng.randint(1, 9), rng.uniform(0.0, 0.1)
    why = f"(kill after round {k} + {delay:.3f} s; seed {seed})"
    overrides = [*KILL_METHODS[method], *SLOW_ROUNDS]
    own_ray = method == "fedavg"
    path = tmp_path / "killed"
    proc = hetsim_process(path, [*overrides, *(RAY if own_ray else on_this_cluster(local_ray))],
                          env=None if own_ray else join_env())
    try:
        kill_at_round(proc, path, k, delay=delay)
        # who they are while they still run: the driver actor and the client actors, and with its
        # own Ray also GCS, raylet and agents
        manifest = read_manifest(path)
        loop = started([manifest["loop_pid"], *manifest["executor"]["actor_pids"]])
        own = {pid: command_line(pid) for pid in descendants(proc.pid)}
        own_started = started(own)
    finally:
        proc.kill()
    proc.wait(timeout=60)
    manifest = load_run(path).manifest
    assert manifest["status"] == "running", why  # it never got to say otherwise
    # the job's driver actor and client actors die with it (Ray ends them asynchronously, in
    # seconds): nothing writes to the folder any more; a failure names what is left
    left = wait_gone(loop)
    assert not left, f"actors of the killed run still alive after 30 s {why}: {process_states(left)}"
    if own_ray:
        left = wait_gone(own_started)
        for pid in left:  # never leave processes behind
            os.kill(pid, signal.SIGKILL)
        # Ray's dashboard / runtime-env agents notice their raylet is gone only after about a
        # minute (killed above); everything else of that Ray must be gone at once
        assert not [own[p] for p in left if "Agent" not in own[p]], f"processes left {why}"
    assert main(["run", "--resume", str(path), "-q"]) == 0, why  # on this test's Ray
    resumed = load_run(path)
    assert resumed.manifest["executor"]["kind"] == "ray"
    # the in-process executor is the reference: same seed, same tables
    assert_same_tables(frames(resumed), reference(tmp_path, overrides))


def test_ctrl_c_of_hetsim_run_on_ray_checkpoints_after_the_round_and_resumes(tmp_path, local_ray):
    overrides = [*METHODS["fedcspack-own_mask"], "rounds=40", "checkpoint.every=0"]
    path = tmp_path / "r"
    proc = hetsim_process(path, [*overrides, *on_this_cluster(local_ray)], env=join_env())
    kill_at_round(proc, path, 2, sig=signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out
    assert f"hetsim run --resume {path}" in out
    run = load_run(path)
    assert run.manifest["status"] == "interrupted"
    (n, _), = list_checkpoints(path)  # written by the driver actor before its client actors went
    assert len(run.rounds) == n
    resume_run(path)
    assert_same_tables(frames(load_run(path)), reference(tmp_path, overrides))


def test_ctrl_c_on_ray_lets_a_long_round_finish_and_checkpoints_it(tmp_path, local_ray):
    """The round in flight at Ctrl+C ends 7 s later: the caller waits for it (it used to kill the
    driver actor after 5 s, so under load the run lost that round and its checkpoint)."""
    from engine.ray.driver import run_on_driver_actor
    from engine.run.api import prepare_run
    from engine.run.signals import interrupt_signals

    overrides = [*METHODS["fedcspack-own_mask"], "rounds=6", "checkpoint.every=0"]
    cfg = cfg_of(*overrides, *RAY)
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

    path, warnings = prepare_run(cfg, tmp_path / "r")
    with interrupt_signals(None), pytest.raises(KeyboardInterrupt):
        run_on_driver_actor(body, cfg, path, [ctrl_c], ["test"], warnings=warnings)
    run = load_run(path)
    assert run.manifest["status"] == "interrupted", run.manifest.get("error")
    assert [n for n, _ in list_checkpoints(path)] == [2] and len(run.rounds) == 2  # the long round kept
    wait_for_cpus(local_ray)
    resume_run(path)
    assert_same_tables(frames(load_run(path)), reference(tmp_path, overrides))


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
        tmp_path, local_ray):
    overrides = [*METHODS["fedcspack-own_mask"], *ALL_RUN, "rounds=6",
                 "checkpoint.every=1"]
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
    assert_same_tables(frames(run), reference(tmp_path, overrides))


def test_a_replacement_that_dies_too_stops_the_run_naming_the_checkpoint(tmp_path, local_ray, monkeypatch):
    overrides = [*METHODS["fedcspack-own_mask"], *ALL_RUN, "rounds=4", "checkpoint.every=1"]
    cfg = cfg_of(*overrides, *RAY)
    executor = RayExecutor(cfg)
    spawned = []
    real_spawn = executor._spawn

    def spawn_and_kill_replacements(i):
        actor = real_spawn(i)
        if executor.actors:  # a replacement (the pool exists already): kill it as soon as it is up
            import ray

            pid, _ = ray.get(actor.where.remote())
            os.kill(pid, signal.SIGKILL)
            spawned.append(pid)
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
    assert_same_tables(frames(load_run(path)), reference(tmp_path, overrides))


# ------------------------------------------------------------------------------ the driver actor dies
def test_driver_actor_death_is_reported_with_the_resume_command(tmp_path, local_ray):
    # still running when killed: the first round reaches the callback at the caller's first
    # poll (0.5 s), and 30 rounds sleep 3 s in all
    overrides = [*METHODS["fedavg"], "rounds=30", "checkpoint.every=2",
                 "clock.mode=realtime", "clock.max_sleep_s=0.1", "clock.time_scale=1000000"]
    path = tmp_path / "r"
    killed = {}

    def kill_driver(record):
        if record.round == 1 and not killed:
            import json

            killed["pid"] = json.loads((path / "manifest.json").read_text())["loop_pid"]
            killed["at"] = time.monotonic()
            os.kill(killed["pid"], signal.SIGKILL)

    with pytest.raises(DriverDiedError, match=rf"driver actor .* died.*hetsim run --resume {path}"):
        run_experiment(cfg_of(*overrides, *RAY), path, callbacks=[kill_driver])
    print(f"driver death reported {time.monotonic() - killed['at']:.1f} s after the kill")
    assert load_run(path).manifest["status"] == "failed"
    wait_for_cpus(local_ray)
    resume_run(path)
    assert_same_tables(frames(load_run(path)), reference(tmp_path, overrides))


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
                                                                        two_torch_threads):
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


def test_resume_on_ray_of_a_run_started_in_process(tmp_path, local_ray):
    overrides = [*METHODS["fedcspack-own_mask"], "rounds=5", "checkpoint.every=2"]
    path = tmp_path / "r"
    run_experiment(cfg_of(*overrides), path, callbacks=[lambda rec: Stop("pause") if rec.round == 2 else None])
    assert [n for n, _ in list_checkpoints(path)] == [2, 3]
    resume_run(path, overrides=RAY)
    run = load_run(path)
    assert run.manifest["executor"]["kind"] == "ray" and run.manifest["status"] == "finished"
    assert_same_tables(frames(run), reference(tmp_path, overrides))
