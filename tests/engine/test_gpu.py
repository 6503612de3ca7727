"""GPU-aware execution, testable on a CPU machine: device resolution and the CUDA-missing
error, fractional GPUs on a local Ray with *declared* GPUs (``ray.init(num_gpus=2)`` schedules
GPUs that do not exist), and GPU trials in sweeps. Where torch sees no CUDA device (CI),
``device: auto`` must resolve to the CPU even on a declared GPU: nothing touches CUDA."""
import json

import pytest
import torch

from engine.clients.device import DeviceError, resolve_device
from engine.config.schema import load_config
from engine.errors import ConfigError
from engine.ray.cluster import ExecutorError
from engine.ray.pool import gpu_capacity, plan_pool
from engine.results.tables import load_run
from engine.run.api import run_experiment
from hetsim.cli import main

NO_CUDA = not torch.cuda.is_available()
needs_no_cuda = pytest.mark.skipif(not NO_CUDA, reason="checks the behaviour without a CUDA device")

TINY = [
    "dataset.name=digits",
    "model.name=mlp",
    "clients.num_clients=12",
    "clients.participation=0.5",
    "clients.profiles={}",
    "rounds=1",
]


# ---------------------------------------------------------------- device resolution (no Ray)


def test_device_resolution_follows_ray_gpu_share_then_torch():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_device("cpu", gpu_ids=None, has_cuda=True) == cpu
    # outside Ray: whatever torch sees
    assert resolve_device("auto", gpu_ids=None, has_cuda=True) == cuda
    assert resolve_device("auto", gpu_ids=None, has_cuda=False) == cpu
    assert resolve_device("cuda", gpu_ids=None, has_cuda=True) == cuda
    # a Ray worker: only with a GPU share from Ray (Ray >= 2.4x leaves CUDA_VISIBLE_DEVICES alone
    # for workers without one, so torch alone would put them on GPU 0 unaccounted)
    assert resolve_device("auto", gpu_ids=[], has_cuda=True) == cpu
    assert resolve_device("auto", gpu_ids=["0"], has_cuda=True) == cuda
    # GPUs declared to Ray but absent: auto stays on the CPU
    assert resolve_device("auto", gpu_ids=["0"], has_cuda=False) == cpu


def test_asking_for_cuda_without_one_names_the_field_and_why():
    with pytest.raises(DeviceError, match=r"executor\.device = 'cuda': no CUDA device is visible to "
                       r"this process; torch\.cuda\.is_available\(\) is False.*allowed here: auto, cpu"):
        resolve_device("cuda", gpu_ids=None, has_cuda=False)
    with pytest.raises(DeviceError, match=r"Ray assigned GPU ids \['1'\], but they are not real CUDA devices"):
        resolve_device("cuda", gpu_ids=["1"], has_cuda=False)
    with pytest.raises(DeviceError, match=r"executor\.device = 'cuda': the actor holds no GPU from Ray"):
        resolve_device("cuda", gpu_ids=[], has_cuda=True, where="the actor")
    assert issubclass(DeviceError, ConfigError)  # the CLI prints it without a traceback


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        (["executor.kind=ray", "executor.device=cuda"],
         r"device = 'cuda' with executor\.kind = 'ray' needs executor\.gpus_per_actor > 0"),
        (["executor.device=auto", "executor.gpus_per_actor=1.5"],
         r"executor\.gpus_per_actor = 1\.5: .*a fraction of one GPU \(<= 1\) or a whole number"),
        (["executor.gpus_per_actor=0.5"], r"reserve GPUs that executor\.device = 'cpu' never uses"),
        (["executor.device=gpu"], r"executor\.device = 'gpu': Input should be 'auto', 'cpu' or 'cuda'"),
    ],
)
def test_gpu_fields_are_validated(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(None, [*TINY, *overrides])


@needs_no_cuda
def test_cuda_where_there_is_none_is_refused_before_anything_starts(tmp_path, capsys):
    cfg = load_config(None, [*TINY, "executor.device=cuda"])
    with pytest.raises(DeviceError, match=r"executor\.device = 'cuda': no CUDA device is visible"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written
    code = main(["run", "--set", "executor.device=cuda", "--set", f"output.dir={tmp_path}", "-q"])
    assert code == 2
    err = capsys.readouterr().err
    assert "executor.device = 'cuda'" in err and "Traceback" not in err
    assert main(["validate", "--set", "executor.device=cuda"]) == 2


@needs_no_cuda
def test_auto_without_cuda_runs_on_the_cpu_and_says_so(tmp_path):
    auto = load_run(run_experiment(load_config(None, [*TINY, "executor.device=auto"]), tmp_path / "a"))
    cpu = load_run(run_experiment(load_config(None, TINY), tmp_path / "c"))
    assert auto.manifest["executor"]["device"] == "cpu"
    assert auto.rounds["global_acc"].tolist() == cpu.rounds["global_acc"].tolist()


# ---------------------------------------------------------------- fractional GPUs: the plan


def test_gpu_shares_bound_the_pool_like_cpus():
    assert plan_pool(100, 2, 0.25, gpus_per_actor=0.5, cluster_gpus=2) == 4  # sized by the GPUs
    assert plan_pool(100, 2, 0.25, num_actors=4, gpus_per_actor=0.5, cluster_gpus=2) == 4
    with pytest.raises(ExecutorError, match=r"num_actors=5 x gpus_per_actor=0\.5 GPUs = 2\.5 GPUs, but only 4 "
                       r"such actors fit the cluster's 2 free GPUs; Ray would wait forever.*e\.g\. 0\.4\b"):
        plan_pool(100, 2, 0.25, num_actors=5, gpus_per_actor=0.5, cluster_gpus=2)
    with pytest.raises(ExecutorError, match=r"gpus_per_actor=1 does not fit the cluster's 0 free GPUs"):
        plan_pool(100, 2, 0.25, gpus_per_actor=1.0, cluster_gpus=0)
    # a share comes from one node: 2 nodes x 1 GPU hold 4 actors of 0.4, not 5 (2 / 0.4)
    assert gpu_capacity(0.4, 2, [1, 1]) == 4 and gpu_capacity(0.4, 2) == 5
    with pytest.raises(ExecutorError, match=r"per node: 1, 1.*e\.g\. 0\.333\)"):
        plan_pool(100, 4, 0.25, num_actors=5, gpus_per_actor=0.4, cluster_gpus=2, node_gpus=[1, 1])


# ---------------------------------------------------------------- a local Ray with declared GPUs


@pytest.fixture(scope="module")
def fake_gpu_ray():
    import ray as ray_module

    from engine.ray.cluster import init_ray

    ray_module.shutdown()  # a Ray left by another module has no GPUs declared
    ray = init_ray(num_cpus=2, num_gpus=2)
    assert ray.cluster_resources().get("GPU") == 2
    yield ray
    ray.shutdown()


def all_gpus_free(ray, timeout_s=30.0) -> bool:
    """Killed actors give their resources back asynchronously."""
    import time

    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("GPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    return ray.available_resources().get("GPU") == 2


def gpu_actors(n, *extra):
    return load_config(None, [*TINY, "executor.kind=ray", f"executor.num_actors={n}",
                              "executor.cpus_per_actor=0.25", "executor.gpus_per_actor=0.5",
                              "executor.device=auto", *extra])


@pytest.mark.ray
def test_four_half_gpu_actors_share_two_declared_gpus_on_the_cpu(tmp_path, fake_gpu_ray):
    run = load_run(run_experiment(gpu_actors(4), tmp_path / "four"))
    ex = run.manifest["executor"]
    assert ex["actors"] == 4 and ex["gpus_per_actor"] == 0.5
    # each actor holds one GPU id from Ray, two actors per GPU
    assert sorted(ids[0] for ids in ex["gpu_ids"]) == ["0", "0", "1", "1"]
    assert all(len(ids) == 1 for ids in ex["gpu_ids"])
    if NO_CUDA:  # declared GPUs only: auto must not touch CUDA (nor does the driver's evaluation)
        assert ex["device"] == "cpu" and ex["eval_device"] == "cpu"
    assert run.manifest["status"] == "finished" and len(run.rounds) == 1
    assert all_gpus_free(fake_gpu_ray)  # every GPU share was given back


@pytest.mark.ray
def test_a_fifth_half_gpu_actor_is_refused_up_front(fake_gpu_ray):
    from engine.loop.simulation import Simulation
    from engine.ray.executor import RayExecutor

    executor = RayExecutor(gpu_actors(5))
    sim = Simulation(executor.cfg, executor)
    with pytest.raises(ExecutorError, match=r"num_actors=5 x gpus_per_actor=0\.5 GPUs = 2\.5 GPUs, but only 4"):
        sim.start()
    assert executor.actors == []  # refused before any actor was created


@pytest.mark.ray
@needs_no_cuda
def test_cuda_on_declared_but_absent_gpus_is_a_device_error(tmp_path, fake_gpu_ray):
    # the driver actor holds one declared GPU, the client actor half of the other (one actor:
    # each costs seconds of CPU to start, and one meets the error as two would)
    cfg = gpu_actors(1, "executor.device=cuda", "executor.driver_gpus=1")
    with pytest.raises(DeviceError, match=r"executor\.device = 'cuda': no CUDA device is visible to this "
                       r"client host \(Ray assigned GPU ids \['\d'\], but they are not real"):
        run_experiment(cfg, tmp_path / "cuda")
    assert all_gpus_free(fake_gpu_ray)


@pytest.mark.ray
def test_a_driver_gpu_share_this_node_cannot_give_is_refused(tmp_path, fake_gpu_ray):
    with pytest.raises(ExecutorError, match=r"driver_gpus=3: the driver actor runs on this node, which has 2 GPUs"):
        run_experiment(gpu_actors(1, "executor.driver_gpus=3"), tmp_path / "driver3")


# ---------------------------------------------------------------- sweeps with GPU trials

SWEEP_BASE = {
    "seed": 0,
    "rounds": 1,
    "dataset": {"name": "digits"},
    "model": {"name": "mlp"},
    "clients": {"num_clients": 6, "participation": 0.5, "profiles": {}},
    "executor": {"device": "auto"},
}


def test_trial_resources_include_the_client_actors_gpu_shares():
    from sweeps import resolve
    from sweeps.trainable import trial_resources

    ray_base = {**SWEEP_BASE, "executor": {"kind": "ray", "num_actors": 2, "cpus_per_actor": 0.25,
                                           "gpus_per_actor": 0.5, "device": "auto"}}
    resolved = resolve({"name": "g", "base": ray_base, "space": {"train.lr": {"grid": [0.1]}},
                        "resources_per_trial": {"gpus": 0.25}})
    assert trial_resources(resolved).bundles == [
        {"CPU": 0.01, "GPU": 0.25}, {"CPU": 0.25, "GPU": 0.5}, {"CPU": 0.25, "GPU": 0.5}]
    local = resolve({"name": "g", "base": SWEEP_BASE, "space": {"train.lr": {"grid": [0.1]}},
                     "resources_per_trial": {"cpus": 0.5, "gpus": 0.5}})
    assert trial_resources(local).bundles == [{"CPU": 0.5, "GPU": 0.5}]
    from sweeps import SweepSpecError

    with pytest.raises(SweepSpecError, match=r"space\.executor\.gpus_per_actor: executor\.gpus_per_actor is fixed"):
        resolve({"name": "g", "base": ray_base, "space": {"executor.gpus_per_actor": {"grid": [0.5]}}})
    with pytest.raises(SweepSpecError, match=r"resources_per_trial\.gpus = 0: .*device = 'cuda'"):
        resolve({"name": "g", "base": {**SWEEP_BASE, "executor": {"device": "cuda"}},
                 "space": {"train.lr": {"grid": [0.1]}}})


@pytest.mark.ray
def test_a_sweep_places_half_gpu_trials_and_refuses_what_cannot_fit(tmp_path, fake_gpu_ray):
    from sweeps import SweepSpecError, run_sweep

    # one trial at a time: one trial process (a few CPU seconds to start) runs both
    spec = {"name": "g", "base": SWEEP_BASE, "space": {"train.lr": {"grid": [0.05, 0.1]}},
            "resources_per_trial": {"cpus": 0.5, "gpus": 0.5}, "max_concurrent_trials": 1}
    sweep = run_sweep(spec, storage=tmp_path / "sw", quiet=True)
    assert (sweep.trials["status"] == "finished").all(), sweep.trials["error"].tolist()
    for t in sweep.trials.itertuples():
        info = json.loads((sweep.path / t.run_dir / "trial.json").read_text())
        assert len(info["gpu_ids"]) == 1 and info["gpu_ids"][0] in ("0", "1")  # Ray gave it a GPU
        if NO_CUDA:
            assert sweep.run(t.trial_id).manifest["executor"]["device"] == "cpu"
    too_big = {**spec, "resources_per_trial": {"cpus": 0.5, "gpus": 3}}
    with pytest.raises(SweepSpecError, match=r"one trial needs 3 GPUs .* but the Ray cluster has 2"):
        run_sweep(too_big, storage=tmp_path / "sw3", quiet=True)
