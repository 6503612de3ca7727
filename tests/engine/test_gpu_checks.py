"""GPU requests are checked before anything is written: a GPU share with no GPU, ray.num_gpus
beyond the machine's CUDA devices, a GPU share under the in-process executor; and
ray.allow_missing_gpus for clusters whose driver has no GPU."""
import sys

import pytest
import torch

from engine.config.schema import load_config
from engine.run.gpu_checks import gpu_problems
from hetsim.cli import main

TINY = ["dataset.name=digits", "model.name=mlp", "rounds=1", "clients.num_clients=6"]
RAY_GPU = [*TINY, "executor.kind=ray", "executor.device=auto", "executor.gpus_per_actor=0.5"]
no_gpu = pytest.mark.skipif(torch.cuda.device_count() > 0, reason="checks a machine without CUDA GPUs")


def _sets(settings):
    return [a for s in settings for a in ("--set", s)]


@no_gpu
@pytest.mark.parametrize("settings, says", [
    (RAY_GPU, "executor.gpus_per_actor = 0.5: asks for a GPU share, but this machine has 0 CUDA GPU(s)"),
    ([*TINY, "executor.kind=ray", "ray.num_gpus=4"],
     "ray.num_gpus = 4: this machine has 0 CUDA GPU(s) (torch.cuda.device_count()); Ray would schedule"),
    ([*TINY, "executor.device=cuda", "executor.gpus_per_actor=0.25"],
     "executor.gpus_per_actor = 0.25 reserves a GPU share for a Ray actor, but executor.kind = 'inprocess'"),
    ([*TINY, "executor.device=auto", "executor.driver_gpus=1"],
     "executor.driver_gpus = 1 reserves a GPU share for a Ray actor, but executor.kind = 'inprocess'"),
])
def test_a_gpu_request_this_machine_cannot_meet_fails_before_the_folder_exists(tmp_path, capsys, settings, says):
    assert main(["run", "-q", "-o", str(tmp_path / "r"), *_sets(settings)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and "This is a bug" not in err
    assert not (tmp_path / "r").exists()
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()  # no Ray was started


@no_gpu
def test_allow_missing_gpus_accepts_declared_gpus_and_gpu_nodes_elsewhere():
    declared = load_config(None, [*RAY_GPU, "ray.num_gpus=2"])
    assert gpu_problems(declared, ray_running=False)[0].startswith("  ray.num_gpus = 2:")
    assert gpu_problems(load_config(None, [*RAY_GPU, "ray.num_gpus=2", "ray.allow_missing_gpus=true"]),
                        ray_running=False) == []
    cluster = load_config(None, [*RAY_GPU, "ray.address=10.0.0.5:6379"])
    (problem,) = gpu_problems(cluster, ray_running=False)
    assert "runs this run's driver actor" in problem and "ray.allow_missing_gpus: true" in problem
    assert gpu_problems(load_config(None, [*RAY_GPU, "ray.address=10.0.0.5:6379", "ray.allow_missing_gpus=true"]),
                        ray_running=False) == []
    assert gpu_problems(load_config(None, [*TINY, "executor.kind=ray"]), ray_running=False) == []


def test_gpu_checks_agree_with_the_machine():
    have = torch.cuda.device_count()
    fits = load_config(None, [*TINY, "executor.kind=ray", f"ray.num_gpus={have}"])
    assert gpu_problems(fits, ray_running=False) == []
    if have:  # a GPU machine: a share of one of its GPUs is fine, one more GPU than it has is not
        assert gpu_problems(load_config(None, RAY_GPU), ray_running=False) == []
        over = load_config(None, [*RAY_GPU, f"ray.num_gpus={have + 1}"])
        assert gpu_problems(over, ray_running=False)[0].startswith(f"  ray.num_gpus = {have + 1}:")


@no_gpu
def test_hetsim_validate_checks_the_gpu_requests_as_run_does(capsys):
    code = main(["validate", "--set", "executor.kind=ray", "--set", "ray.num_gpus=4"])
    err = capsys.readouterr().err
    assert code == 2 and "ray.num_gpus = 4: this machine has" in err and "ray.allow_missing_gpus" in err
