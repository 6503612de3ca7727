"""hetsim's simulation engine: its public face.

Everything a user, :mod:`sweeps` or :mod:`hetsim` needs is importable from here (``from engine
import run_experiment``); results also from :mod:`engine.results`. The subpackages are the
table of contents, lowest layer first (docs/architecture.md has the map and the layer rule):

    storage/     where folders live: local, s3://, gs://
    config/      the experiment config: schema, YAML reading, the names it checks, the default experiment
    data/        datasets, partitions, the federated data of a config
    models/      the built-in models, architectures per client
    clients/     the client host (many virtual clients in one process), devices, the .pt state format
    execution/   the executor interface and the in-process executor
    loop/        the round loop (Simulation), its callbacks, selection, rows, evaluation
    results/     run folders' tables and manifest
    checkpoint/  snapshots of a simulation, checkpoints in run folders
    ray/         everything that talks to Ray: cluster, pool, actors, Ray executor, driver
    run/         running an experiment: the public API, the run body, folders, validation

Names are resolved on first use (PEP 562): ``import engine`` stays free of torch and Ray, so
``hetsim --help`` starts in a few milliseconds; :data:`_EXPORTS` is the table.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # running experiments
    "simulate": "engine.run.api",
    "run_experiment": "engine.run.api",
    "resume_run": "engine.run.api",
    "resume_config": "engine.run.api",
    "prepare_run": "engine.run.api",
    "run_in_folder": "engine.run.api",
    "execute_run": "engine.run.body",
    "RunStateError": "engine.run.folders",
    "validate_experiment": "engine.run.validate",
    # results (also from engine.results)
    "load_run": "engine.results.tables",
    "Run": "engine.results.tables",
    # configs
    "ExperimentConfig": "engine.config.schema",
    "load_config": "engine.config.schema",
    "apply_overrides": "engine.config.schema",
    "expand_path": "engine.config.schema",
    "dump_config": "engine.config.schema",
    "absolute_trace_files": "engine.config.schema",
    "resolve_paths": "engine.config.paths",
    "resolve_profile_paths": "engine.config.paths",
    "missing_paths": "engine.config.paths",
    "DEFAULT_CONFIG": "engine.config.schema",
    "parse_yaml": "engine.config.yamlio",
    "read_yaml_file": "engine.config.yamlio",
    "UserError": "engine.errors",
    "ConfigError": "engine.errors",
    "EnvironmentFault": "engine.errors",
    "StorageFault": "engine.errors",
    "CorruptRunFolderError": "engine.errors",
    "storage_fault": "engine.errors",
    # the loop and its callbacks
    "Simulation": "engine.loop.simulation",
    "RunCallback": "engine.loop.callbacks",
    "RunContext": "engine.loop.callbacks",
    "RoundRecord": "engine.loop.callbacks",
    "Stop": "engine.loop.callbacks",
    "select_clients": "engine.loop.selection",
    "InProcessExecutor": "engine.execution.inprocess",
    "check_device_request": "engine.clients.device",
    "check_gpu_requests": "engine.run.gpu_checks",
    "set_ray_gpu_ids": "engine.clients.device",
    # checkpoints
    "write_checkpoint": "engine.checkpoint.snapshot",
    "restore_checkpoint": "engine.checkpoint.snapshot",
    "read_meta": "engine.checkpoint.snapshot",
    "CHECKPOINTS": "engine.checkpoint.folder",
    "checkpoint_name": "engine.checkpoint.folder",
    "list_checkpoints": "engine.checkpoint.folder",
    # Ray
    "init_ray": "engine.ray.cluster",
    "shutdown_ray": "engine.ray.cluster",
    "ray_is_up": "engine.ray.cluster",
    "check_while_ray_starts": "engine.ray.cluster",
    "ExecutorError": "engine.ray.cluster",
    "gpu_capacity": "engine.ray.pool",
    "RayExecutor": "engine.ray.executor",
    "DriverDiedError": "engine.ray.cluster",
    "node_disk_filesystem": "engine.ray.node_disk",
    "nodes_sharing": "engine.ray.node_disk",
    # what a config may name (hetsim list)
    "list_entries": "engine.run.listing",
    # start-up trace
    "mark": "engine.trace",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
