"""GPU requests of a Ray run checked against this machine (or the Ray it is connected to)
before Ray starts and before a run folder exists (:func:`engine.run.startup.validate_while_ray_starts`).

Not in :func:`engine.run.validate.validate_experiment`: sweeps validate their base experiment
with it, and their trials run on the sweep's Ray, whose GPUs :mod:`sweeps.cluster` checks.
"""
from __future__ import annotations

from engine.config.schema import ExperimentConfig
from engine.ray.cluster import import_ray, ray_is_up
from engine.run.validate import fail


def gpu_problems(cfg: ExperimentConfig, ray_running: bool) -> list[str]:
    """GPU requests of a Ray run that this machine, or the Ray it is connected to, cannot meet:
    checked before Ray starts, since Ray would otherwise wait for the GPUs forever, or schedule
    declared GPUs that do not exist while the clients train on the CPU. ``ray.allow_missing_gpus``
    accepts them (GPUs on the cluster's other nodes; declared GPUs for tests)."""
    ex, ray_cfg = cfg.executor, cfg.ray
    if ex.kind != "ray":  # the in-process executor: the schema refuses GPU shares, device: cuda is
        return []         # checked by engine.clients.device.check_device_request
    wanted = [(f"executor.{name}", getattr(ex, name)) for name in ("gpus_per_actor", "driver_gpus")
              if getattr(ex, name) > 0]
    if ray_running:  # the run uses this Ray and its GPUs
        have = import_ray().cluster_resources().get("GPU", 0.0)
        return [f"  {field} = {value:g}: the Ray this process is connected to has no GPUs; set it to 0, "
                "or connect to a Ray with GPUs" for field, value in wanted if have == 0]
    if not wanted and (ray_cfg.num_gpus is None or ray_cfg.address is not None):
        return []  # nothing to compare: torch is not even imported
    machine = _cuda_device_count()
    counted = f"this machine has {machine} CUDA GPU(s) (torch.cuda.device_count())"
    switch = "or set ray.allow_missing_gpus: true"
    problems = []
    if ray_cfg.address is None:  # a local Ray, started for this run
        if ray_cfg.num_gpus is not None and ray_cfg.num_gpus > machine and not ray_cfg.allow_missing_gpus:
            problems.append(
                f"  ray.num_gpus = {ray_cfg.num_gpus}: {counted}; Ray would schedule GPUs that are not there "
                f"and the clients would train on the CPU; give at most {machine}, {switch} to declare them "
                "anyway (placement tests)")
        declared = ray_cfg.num_gpus if ray_cfg.num_gpus is not None else machine
        if not problems and declared == 0:
            problems += [f"  {field} = {value:g}: asks for a GPU share, but {counted} and ray.num_gpus "
                         f"= {ray_cfg.num_gpus}; set it to 0 (executor.device: cpu or auto), or run where "
                         "there is a GPU" for field, value in wanted]
    elif machine == 0 and not ray_cfg.allow_missing_gpus:  # a cluster: the driver actor runs here
        problems += [f"  {field} = {value:g}: asks for a GPU share, but {counted}, which runs this run's "
                     f"driver actor; if only the cluster's other nodes have GPUs, set ray.allow_missing_gpus: "
                     "true (client actors then go there; executor.driver_gpus must stay 0)"
                     for field, value in wanted]
    return problems


def _cuda_device_count() -> int:
    import torch  # only for runs that ask for GPUs

    return torch.cuda.device_count()


def check_gpu_requests(cfg: ExperimentConfig) -> None:
    """:func:`gpu_problems` against the Ray this process is connected to, or this machine; a
    :class:`~engine.errors.ConfigError` listing them (``hetsim validate``)."""
    fail(gpu_problems(cfg, ray_is_up()))
