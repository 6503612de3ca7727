"""Where client training runs: ``executor.device`` resolved to a torch device, per process.

``executor.device`` is ``cpu`` (default), ``cuda`` or ``auto``. What "a GPU is there" means
depends on who asks:

* **A Ray worker** (a client actor, the driver actor, a Tune trial): the GPU(s) Ray assigned to
  it (``ray.get_gpu_ids()``) *and* a CUDA device torch can use. Ray (>= 2.4x) no longer clears
  ``CUDA_VISIBLE_DEVICES`` for workers that hold no GPU, so torch alone would let an actor
  without a GPU share run on GPU 0 unaccounted; asking Ray first prevents that.
* **Any other process** (``hetsim run`` with the in-process executor): torch sees a CUDA device.

``auto`` is CUDA when there is one by that rule, else CPU. With GPUs *declared* to Ray but
absent (``ray.init(num_gpus=2)`` on a CPU machine, as the tests do), Ray assigns ids but
``torch.cuda.is_available()`` is False, so ``auto`` resolves to CPU on purpose: nothing touches
CUDA. ``cuda`` where there is none is a :class:`DeviceError` naming ``executor.device``.

This module imports no Ray: the Ray layer records a worker's GPU share (:func:`set_ray_gpu_ids`).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch is imported where used: check_device_request runs in torch-free processes
    import torch  # here, not above: see the TYPE_CHECKING import

from engine.errors import ConfigError

DeviceName = Literal["auto", "cpu", "cuda"]
FIELD = "executor.device"
# cuBLAS needs this before its first call for deterministic GEMMs (torch's reproducibility notes)
CUBLAS_DETERMINISTIC = ":4096:8"


class DeviceError(ConfigError):
    """A device was asked for that this process cannot use (a :class:`ConfigError`: the CLI
    prints it without a traceback)."""


def cuda_available() -> bool:
    import torch  # here, not above: see the TYPE_CHECKING import

    return torch.cuda.is_available()


_ray_gpu_ids: list[str] | None = None  # set in a Ray worker by the Ray layer: its GPU share


def set_ray_gpu_ids(gpu_ids: list[str] | None) -> None:
    """Record the GPU ids Ray assigned to this process (a client actor, a driver actor, a
    Tune trial). Called by :mod:`engine.ray` and :mod:`sweeps`, which own Ray, so that device
    resolution here needs no Ray."""
    global _ray_gpu_ids
    _ray_gpu_ids = None if gpu_ids is None else [str(g) for g in gpu_ids]


def ray_gpu_ids() -> list | None:
    """GPU ids Ray assigned to this process if it is a Ray worker (actor or task), else None."""
    return _ray_gpu_ids


def resolve_device(
    requested: str,
    gpu_ids: list | None | Literal["ask"] = "ask",
    has_cuda: bool | None = None,
    where: str = "this process",
) -> torch.device:
    """The torch device for ``executor.device = requested``.

    ``gpu_ids``: the Ray GPU ids of this worker, None outside Ray; ``"ask"`` finds out
    (:func:`ray_gpu_ids`). ``has_cuda``: whether torch can use CUDA (default: ask torch).
    """
    import torch  # here, not above: see the TYPE_CHECKING import

    if requested == "cpu":
        return torch.device("cpu")
    if requested not in ("auto", "cuda"):
        raise DeviceError(f"invalid experiment config:\n  {FIELD} = {requested!r}: allowed: auto, cpu, cuda")
    if gpu_ids == "ask":
        gpu_ids = ray_gpu_ids()
    has_cuda = cuda_available() if has_cuda is None else has_cuda
    if gpu_ids is not None and not gpu_ids:  # a Ray worker without a GPU share
        if requested == "cuda":
            raise DeviceError(
                f"invalid experiment config:\n  {FIELD} = 'cuda': {where} holds no GPU from Ray "
                "(give it one with executor.gpus_per_actor / executor.driver_gpus / "
                "resources_per_trial.gpus, or use device: auto or cpu)")
        return torch.device("cpu")
    if has_cuda:
        return torch.device("cuda")
    if requested == "cuda":
        held = f" (Ray assigned GPU ids {gpu_ids}, but they are not real CUDA devices here)" if gpu_ids else ""
        raise DeviceError(
            f"invalid experiment config:\n  {FIELD} = 'cuda': no CUDA device is visible to {where}"
            f"{held}; torch.cuda.is_available() is False (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}); allowed here: auto, cpu")
    return torch.device("cpu")


def check_device_request(cfg) -> None:
    """Refuse ``device: cuda`` before anything starts when this process would run the clients
    (in-process executor) and has no CUDA device. Under the Ray executor the actors check it
    themselves at start-up (they may be on other nodes), after the pool is checked against the
    cluster's GPUs."""
    ex = cfg.executor
    if ex.kind == "inprocess" and ex.device == "cuda":
        resolve_device("cuda", where="the in-process executor")


def prepare_device(device: torch.device, deterministic: bool = True) -> None:
    """Per-process CUDA settings before the first CUDA work: deterministic algorithms (ops that
    have no deterministic CUDA kernel warn instead of failing) and no cuDNN autotuning."""
    if device.type != "cuda":
        return
    import torch  # here, not above: see the TYPE_CHECKING import

    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    torch.cuda.set_device(device if device.index is not None else 0)


def describe_device(device: torch.device) -> dict:
    """Manifest fields: the resolved device and, for CUDA, the GPU's name and memory."""
    out: dict = {"device": device.type}
    if device.type == "cuda":
        import torch  # here, not above: see the TYPE_CHECKING import

        props = torch.cuda.get_device_properties(device)
        out.update(gpu_name=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1))
    return out
