"""hetsim's simulation engine: its public face.

The names a user needs are importable from here (``from engine import simulate``): running,
results, configs, callbacks, errors (:data:`_EXPORTS`, at most 15). The rest of the run's
results is :mod:`engine.results`. Plumbing (the Ray cluster, checkpoints, the run body, the
executors) is imported from the module that defines it, by :mod:`sweeps`, :mod:`hetsim` and
tests alike. The subpackages are the table of contents, lowest layer first
(docs/architecture.md has the map and the layer rule):

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
``hetsim --help`` starts in a few milliseconds; :data:`_EXPORTS` is the table. Your own methods,
models, datasets, compressors, selection policies and metrics are registered through
:mod:`engine.plugins` (docs/plugins.md).
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # running experiments
    "simulate": "engine.run.api",
    "run_experiment": "engine.run.api",
    "resume_run": "engine.run.api",
    "validate_experiment": "engine.run.validate",
    # results (more in engine.results)
    "load_run": "engine.results.tables",
    "Run": "engine.results.tables",
    # configs
    "ExperimentConfig": "engine.config.schema",
    "load_config": "engine.config.schema",
    "dump_config": "engine.config.schema",
    # callbacks: see every finished round, add metrics, stop the run
    "RunCallback": "engine.loop.callbacks",
    "RunContext": "engine.loop.callbacks",
    "RoundRecord": "engine.loop.callbacks",
    "Stop": "engine.loop.callbacks",
    # errors (every one a user can cause is a UserError)
    "UserError": "engine.errors",
    "ConfigError": "engine.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name == "plugins":  # the extension API, a face of its own (``from engine import plugins``)
        return importlib.import_module("engine.plugins")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, "plugins"])
