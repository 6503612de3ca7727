"""`hetsim run` on Ray under real signals: SIGKILL of the process (its driver and client actors
die with it) and Ctrl+C (it stops after the round, checkpoints and says what was saved); each run
resumed equals an uninterrupted one. Apart from tests/engine/ray/test_ray_resume.py so that the
suite's processes run the two at once: each needs real `hetsim run` processes."""
import os
import random
import signal
import time

import pytest
from helpers.checkpoint import (
    KILL_AFTER,
    KILL_METHODS,
    KILL_ROUNDS,
    METHODS,
    NO_SLEEP,
    SLEEPY_ROUNDS,
    assert_same_tables,
    frames,
    hetsim_process,
    kill_at_round,
    uninterrupted,
)
from helpers.ray_processes import (
    command_line,
    descendants,
    join_env,
    on_this_cluster,
    process_states,
    started,
    wait_for_cpus,
    wait_gone,
)

from engine.checkpoint.folder import list_checkpoints
from engine.results.manifest import read_manifest
from engine.results.tables import load_run, read_table
from engine.run.api import resume_run
from hetsim.cli import main

pytestmark = pytest.mark.ray
RAY = ["executor.kind=ray", "ray.num_cpus=2"]
# one 1-CPU client actor: the actor the resumes of this module's runs leave warm (1 CPU of the
# shared Ray) takes the next resume (executor.keep_warm: fewer actor starts) while the next killed
# run's pool has the other CPU; one actor, not two, per run: what dies with a killed process (its
# driver and client actors) is the same, and each actor fewer is seconds of CPU (torch import);
# pool and Ray are result neutral (RESULT_NEUTRAL_FIELDS)
POOL = ["executor.num_actors=1", "executor.cpus_per_actor=1"]


def resume_here(ray) -> list[str]:
    """A resume in this process, on this test's Ray, on the warm actors of the previous one."""
    return [f"ray.address={ray.get_runtime_context().gcs_address}", *POOL, "executor.keep_warm=true"]


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


@pytest.fixture(autouse=True)
def free_cpus(local_ray):
    wait_for_cpus(local_ray, 1.0)  # a killed run's pool (the warm actors hold the other CPU)


@pytest.mark.parametrize("method", ["fedavg", *sorted(set(KILL_METHODS) - {"fedavg"})])
def test_sigkill_of_hetsim_run_on_ray_then_resume_equals_an_uninterrupted_run(tmp_path, local_ray, method):
    """FedAvg's run starts its own local Ray (as `hetsim run` on a laptop), the others join
    this test's Ray (as on a cluster)."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    k, delay = rng.choice(KILL_AFTER), rng.uniform(0.0, 0.1)
    why = f"(kill after round {k} + {delay:.3f} s; seed {seed})"
    overrides = [*KILL_METHODS[method], *KILL_ROUNDS]
    own_ray = method == "fedavg"
    path = tmp_path / "killed"
    proc = hetsim_process(path, [*overrides, *POOL, *(RAY if own_ray else on_this_cluster(local_ray))],
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
    # the job's driver actor and client actors die with it: Ray force-kills them (never the
    # graceful exit that would wait for a running run_round) and SIGKILLs a worker still there
    # 5 s later, so 30 s is 6x the slowest seen (docs/checkpoints.md); nothing writes to the
    # folder any more; a failure names what is left
    left = wait_gone(loop)
    assert not left, f"actors of the killed run still alive after 30 s {why}: {process_states(left)}"
    if own_ray:
        left = wait_gone(own_started)
        for pid in left:  # never leave processes behind
            os.kill(pid, signal.SIGKILL)
        # Ray's dashboard / runtime-env agents notice their raylet is gone only after about a
        # minute (killed above); everything else of that Ray must be gone at once
        assert not [own[p] for p in left if "Agent" not in own[p]], f"processes left {why}"
    resume = [arg for o in resume_here(local_ray) for arg in ("--set", o)]
    assert main(["run", "--resume", str(path), "-q", *resume]) == 0, why  # on this test's Ray
    resumed = load_run(path)
    assert resumed.manifest["executor"]["kind"] == "ray"
    # the in-process executor is the reference: same seed, same tables
    assert_same_tables(frames(resumed), uninterrupted(tmp_path, overrides))


@pytest.fixture(scope="module")
def ctrl_c_run(tmp_path_factory, local_ray) -> dict:
    """One `hetsim run` on Ray, Ctrl+C after round 2, and what it left before anything resumed it:
    the two tests below check what it says and saved, and its resume (one process and two actors
    fewer than a run per test)."""
    overrides = [*METHODS["fedcspack-own_mask"], *SLEEPY_ROUNDS, "checkpoint.every=0"]
    path = tmp_path_factory.mktemp("ctrl-c") / "r"
    proc = hetsim_process(path, [*overrides, *POOL, *on_this_cluster(local_ray)], env=join_env())
    try:
        kill_at_round(proc, path, 2, sig=signal.SIGINT)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=180)  # 12 rounds of 1.5 s: ignored, it would end first
        print(f"exited {time.monotonic() - t0:.1f} s after SIGINT")
    finally:
        proc.kill()
    run = load_run(path)
    return {"path": path, "overrides": overrides, "code": proc.returncode, "out": out,
            "status": run.manifest["status"], "rounds": len(run.rounds),
            "rounds_table": len(read_table(path, "rounds")), "checkpoints": list_checkpoints(path)}


def test_ctrl_c_under_the_ray_executor_is_honoured_and_says_what_was_saved(ctrl_c_run):
    out = ctrl_c_run["out"]  # stdout and stderr
    assert ctrl_c_run["code"] == 130, out
    saved = ctrl_c_run["rounds_table"]
    assert saved >= 2 and f"interrupted; {saved} finished round(s) are saved in {ctrl_c_run['path']}" in out
    assert "Traceback" not in out
    assert ctrl_c_run["status"] == "interrupted" and ctrl_c_run["rounds"] == saved


def test_ctrl_c_of_hetsim_run_on_ray_checkpoints_after_the_round_and_resumes(ctrl_c_run, local_ray):
    path, overrides, out = ctrl_c_run["path"], ctrl_c_run["overrides"], ctrl_c_run["out"]
    assert ctrl_c_run["code"] == 130, out
    assert f"hetsim run --resume {path}" in out
    assert ctrl_c_run["status"] == "interrupted"
    (n, _), = ctrl_c_run["checkpoints"]  # written by the driver actor before its client actors went
    assert ctrl_c_run["rounds"] == n < 12
    resume_run(path, overrides=[NO_SLEEP, *resume_here(local_ray)])
    assert_same_tables(frames(load_run(path)), uninterrupted(path.parent, [*overrides, NO_SLEEP]))
