"""The Ray executor: same results as in-process, a driver actor, and no silent hangs."""
import os

import pandas as pd
import pytest

from engine.config.schema import load_config
from engine.errors import ConfigError
from engine.ray.cluster import ExecutorError
from engine.ray.pool import PoolSizeError, plan_pool, plan_when_free
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import run_experiment, run_in_folder

pytestmark = pytest.mark.ray

TINY = [
    "dataset.name=digits",
    "model.name=mlp",
    "clients.num_clients=12",
    "clients.participation=0.5",
    "clients.profiles={devices: {rpi4: 0.5, laptop_cpu: 0.5}, network: {5mbps: 0.5, 500mbps: 0.5}}",
    "rounds=3",
]
# Rounds of TINY take milliseconds: a run that must still be going when the caller acts (its
# callbacks see a round only at the next half-second poll) sleeps 0.1 s per round.
PACED = ["clock.mode=realtime", "clock.max_sleep_s=0.1", "clock.time_scale=1000000"]
# A driver and 2 client actors cost seconds of both cores to start (torch import). The first Ray run
# of TINY's pool starts them fresh and keeps them warm; the runs after it with that pool reuse them
# (each builds its hosts afresh: same tables as on new actors, tests/engine/test_matrix.py). The
# tests are ordered so: fresh, warm..., then those whose runs fail or stop (their actors are killed),
# then other pools (which release the warm ones).
RAY = ["executor.kind=ray", "executor.keep_warm=true"]


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


def test_plan_pool_sizes_from_cpus_and_refuses_unplaceable_requests():
    assert plan_pool(10_000, 2, 1.0) == 2
    assert plan_pool(1, 2, 1.0) == 1
    assert plan_pool(10, 2, 0.2, clients_per_actor=1) == 10
    # measured: 21 actors x 0.1 CPU on 2 CPUs -> the 21st never starts; we refuse up front
    with pytest.raises(ExecutorError, match=r"clients_per_actor=1 for 21 clients needs 21 actors.*wait forever"):
        plan_pool(21, 2, 0.1, clients_per_actor=1)
    with pytest.raises(ExecutorError, match="num_actors=3"):
        plan_pool(100, 2, 1.0, num_actors=3)
    with pytest.raises(ExecutorError, match="exceeds the cluster's 2 CPUs"):
        plan_pool(100, 2, 4.0)


def test_a_pool_that_fits_the_cluster_waits_for_the_cpus_dead_actors_hold():
    freed = iter([{"CPU": 0.0}, {"CPU": 1.0}, {"CPU": 2.0}])  # a killed run's actors give them back
    polls = []

    def free():
        polls.append(len(polls))
        return next(freed)

    def two_actors(res):
        return plan_pool(10, res.get("CPU", 0.0), 1.0, num_actors=2)

    assert plan_when_free(two_actors, free, {"CPU": 2.0}, timeout_s=60) == 2 and polls == [0, 1, 2]
    polls.clear()
    freed = iter([{"CPU": 2.0}])
    with pytest.raises(PoolSizeError, match="exceeds the cluster's 2 CPUs"):  # not even the cluster: at once
        plan_when_free(lambda res: plan_pool(10, res.get("CPU", 0.0), 4.0), free, {"CPU": 2.0}, timeout_s=60)
    assert polls == [0]
    with pytest.raises(PoolSizeError, match="but the cluster has 1;"):  # still held when the time is up
        plan_when_free(two_actors, lambda: {"CPU": 1.0}, {"CPU": 2.0}, timeout_s=0)


def test_a_run_started_while_a_dead_actor_holds_the_cpus_gets_its_whole_pool(local_ray, monkeypatch):
    """As a resume just after a SIGKILLed run: Ray frees a dead actor's CPUs asynchronously, and
    the pool was sized from what was free at that instant (0 CPUs: PoolSizeError)."""
    import time

    from engine.ray.driver import release_warm_actors
    from engine.ray.executor import RayExecutor

    release_warm_actors()  # (none if run in file order) they would hold the hog's CPUs
    ray = local_ray
    hog = ray.remote(num_cpus=2)(type("Hog", (), {"ready": lambda self: True})).remote()
    ray.get(hog.ready.remote())
    real_free = ray.available_resources
    deadline = time.monotonic() + 60
    while real_free().get("CPU", 0.0) > 0 and time.monotonic() < deadline:  # Ray's view catches up
        time.sleep(0.1)
    seen = []

    def free_then_kill_the_hog():
        seen.append(real_free().get("CPU", 0.0))
        if len(seen) == 1:
            ray.kill(hog)  # dies now; its CPUs come back a little later
        return {"CPU": seen[-1]}

    monkeypatch.setattr(ray, "available_resources", free_then_kill_the_hog)
    executor = RayExecutor(load_config(None, [*TINY, "executor.kind=ray"]))
    try:
        executor.launch()
        assert seen[0] == 0 and seen[-1] == 2 and executor.num_actors == 2, seen
    finally:
        executor.close()


def test_ray_and_inprocess_give_identical_metrics(tmp_path, local_ray):
    from engine.ray.driver import release_warm_actors

    release_warm_actors()  # on new actors: the comparison that does not rest on warm reuse
    relayed = []
    ray_run = load_run(run_experiment(
        load_config(None, [*TINY, *RAY]), tmp_path / "ray", callbacks=[relayed.append]))
    # the driver actor relays every finished round to the caller's callbacks (progress bar)
    assert [rec.round for rec in relayed] == [0, 1, 2]
    local_run = load_run(run_experiment(
        load_config(None, [*TINY, "executor.kind=inprocess"]), tmp_path / "local"))
    for a, b in ((ray_run.rounds, local_run.rounds), (ray_run.clients, local_run.clients)):
        pd.testing.assert_frame_equal(
            a.drop(columns=list(WALL_COLUMNS), errors="ignore"),
            b.drop(columns=list(WALL_COLUMNS), errors="ignore"),
        )
    assert ray_run.manifest["executor"]["kind"] == "ray"
    assert ray_run.manifest["executor"]["actors"] == 2
    # the round loop ran in the driver actor, not in this process
    assert ray_run.manifest["loop_pid"] != os.getpid()
    assert local_run.manifest["loop_pid"] == os.getpid()


@pytest.mark.parametrize("method", [["algorithm.name=fedavg"],
                                    # reads its profile: the conditions at the round's start travel too
                                    ["algorithm={name: ascend, warmup: 1}", "partition.public_fraction=0.2"]])
def test_conditions_over_time_give_identical_tables_on_ray_and_in_process(tmp_path, local_ray, method):
    changing = [*TINY, *method, "rounds=4", "clock.start=Wed 23:00", "clock.deadline_s=5",
                "clients.profiles.conditions={sets: {fading: {share: 0.5, down: gilbert_elliott, "
                "up: gilbert_elliott, compute: thermal_throttling}, "
                "night: {share: 0.5, availability: night_charging}}}"]
    runs = [load_run(run_experiment(load_config(None, [*changing, *executor]), tmp_path / kind))
            for kind, executor in (("ray", RAY), ("inprocess", ["executor.kind=inprocess"]))]
    assert runs[0].clients["down_state"].isin(["good", "bad"]).any()  # the test is about something
    for a, b in ((runs[0].rounds, runs[1].rounds), (runs[0].clients, runs[1].clients)):
        keep = [c for c in a.columns if c not in WALL_COLUMNS]
        pd.testing.assert_frame_equal(a[keep], b[keep])


def test_lost_uploads_reach_the_actors_with_the_next_call_and_before_a_checkpoint(tmp_path, local_ray):
    """Error feedback puts a lost upload back into the residual (CompressedFedAvg.on_dropped).
    Under Ray the lost ids travel with the next round's call, and with the checkpoint's save
    call when a checkpoint comes first: the runs equal the in-process run, whose host hears of
    them at once, and a run resumed from a checkpoint written right after a lossy round too."""
    lossy = [*TINY, "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}, availability: 1.0, dropout: 0.0}",
             "clock.deadline_s=0.05", "algorithm.name=fedavg_compressed", "algorithm.compressor=topk",
             "rounds=4"]
    local = load_run(run_experiment(load_config(None, [*lossy, "executor.kind=inprocess"]), tmp_path / "local"))
    assert (local.clients["drop_reason"] == "deadline").any()  # the test is about something
    for every in (0, 1):  # no checkpoint: told with the next round; one every round: with its save
        ray_path = run_experiment(load_config(None, [*lossy, *RAY, f"checkpoint.every={every}"]),
                                  tmp_path / f"ray-{every}")
        ray_run = load_run(ray_path)
        for a, b in ((ray_run.rounds, local.rounds), (ray_run.clients, local.clients)):
            keep = [c for c in a.columns if c not in WALL_COLUMNS]
            pd.testing.assert_frame_equal(a[keep], b[keep])
    # a checkpoint written after round 1 holds the residuals as restored: resuming from it
    # (the newer checkpoints removed) recomputes rounds 2-3 exactly
    import shutil

    from engine.checkpoint.folder import list_checkpoints
    from engine.results.manifest import update_manifest
    from engine.run.api import resume_run

    for n, d in list_checkpoints(ray_path):
        if n > 2:
            shutil.rmtree(d)
    update_manifest(ray_path, status="interrupted")
    resumed = load_run(resume_run(ray_path))
    keep = [c for c in local.clients.columns if c not in WALL_COLUMNS]
    pd.testing.assert_frame_equal(resumed.clients[keep], local.clients[keep])


def test_batched_ascend_v3_on_ray_equals_sequential_and_its_notice_reaches_the_manifest(tmp_path, local_ray):
    """executor.batch_clients on Ray: each actor trains its clients of one architecture together
    (ASCEND v3: probe held out); the tables equal the in-process sequential run's within the
    tolerance of docs/gpu.md, and a host's single client is said in the manifest (the driver
    actor's log reaches no terminal)."""
    base = [*TINY, "algorithm={name: ascend, warmup: 0}", "partition.public_fraction=0.2", "rounds=4"]
    ray_run = load_run(run_experiment(load_config(None, [*base, *RAY, "executor.batch_clients=true"]),
                                      tmp_path / "ray"))
    seq = load_run(run_experiment(load_config(None, base), tmp_path / "seq"))
    assert ray_run.clients["arm_label"].fillna("").tolist() == seq.clients["arm_label"].fillna("").tolist()
    for a, b in ((ray_run.rounds, seq.rounds), (ray_run.clients, seq.clients)):
        keep = [c for c in a.columns if c not in WALL_COLUMNS]
        pd.testing.assert_frame_equal(a[keep], b[keep], rtol=1e-5, atol=1e-6)
    ran = seq.clients[seq.clients["arm_label"].notna()]
    per_host = ran.groupby(["round", ran["client_id"] % 2]).size()  # 2 actors: client id % 2
    assert (per_host >= 2).any()  # some actor did train clients together
    said = [w for w in ray_run.manifest["warnings"] if "single client" in w]
    assert len(said) == int((per_host == 1).any())


def test_ctrl_c_under_the_driver_actor_keeps_finished_rounds(tmp_path, local_ray):
    """Ctrl+C in the caller: the driver finishes the round in flight, marks the run interrupted
    and compacts its tables."""
    def interrupt(rec):
        if rec.round == 1:
            raise KeyboardInterrupt

    cfg = load_config(None, [*TINY, *PACED, "rounds=100", *RAY])
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "ctrl-c", callbacks=[interrupt])
    run = load_run(tmp_path / "ctrl-c")
    assert run.manifest["status"] == "interrupted"
    assert "stopped by the caller" in run.manifest["error"]
    assert 2 <= len(run.rounds) < 100
    assert list(run.rounds["round"]) == list(range(len(run.rounds)))
    assert not (tmp_path / "ctrl-c" / "_parts").exists()


def test_client_failure_on_an_actor_names_client_and_round_quickly(tmp_path, local_ray):
    import time

    from engine.clients.host import ClientFailure

    cfg = load_config(None, [*TINY, *RAY, "clients.participation=1.0",
                             "executor.inject_failure={round: 1, client: 5}"])
    t0 = time.perf_counter()
    with pytest.raises(ClientFailure, match="client 5 failed in round 1: RuntimeError: failure injected"):
        run_experiment(cfg, tmp_path / "fail")
    assert time.perf_counter() - t0 < 60
    run = load_run(tmp_path / "fail")
    assert list(run.rounds["round"]) == [0]
    assert run.manifest["status"] == "failed" and "client 5" in run.manifest["error"]


def test_one_client_per_actor(tmp_path, local_ray):
    # 4 clients (each actor's process costs seconds of torch import): 4 actors, the 2 selected arrive
    cfg = load_config(None, [*TINY, "clients.num_clients=4", "rounds=1", "executor.kind=ray",
                             "executor.clients_per_actor=1", "executor.cpus_per_actor=0.25"])
    run = load_run(run_experiment(cfg, tmp_path / "one"))
    assert run.manifest["executor"]["actors"] == 4
    assert run.rounds["num_selected"].iloc[0] == run.rounds["num_arrived"].iloc[0] == 2


def test_unplaceable_pool_fails_fast_with_clear_message(tmp_path, local_ray):
    cfg = load_config(None, [*TINY, "clients.num_clients=30", "executor.kind=ray",
                             "executor.clients_per_actor=1", "executor.cpus_per_actor=0.1"])
    # refused by validation (against the running Ray's CPUs), before a run folder exists ...
    with pytest.raises(ConfigError, match="needs 30 actors.*2 CPUs of the running Ray"):
        run_experiment(cfg, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    # ... and by the executor itself, for a caller that skips validation
    with pytest.raises(ExecutorError, match="needs 30 actors"):
        run_in_folder(cfg, tmp_path / "bad")
    assert load_run(tmp_path / "bad").manifest["status"] == "failed"
