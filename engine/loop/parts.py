"""The parts of a run, built from its config once per process: the federated data, the fleet
(profiles, conditions over time, batteries), the architecture of each client and one model per
architecture.

:func:`build_parts` is the one builder. The validation (:mod:`engine.run.validate`) calls it with
a ``guard`` that turns each stage's errors into config problems and hands the :class:`Parts` it
built to the run (:func:`engine.run.api.prepare_run` -> :func:`engine.run.body.execute_run` ->
the :class:`Simulation`), so a config is built once per run; a run's driver actor (another
process) builds them once for itself. Each architecture's model is built once too: the built one is never
changed, and whoever changes one (the run's server, the in-process client host's workspace)
takes a copy (:func:`~engine.models.arch.copy_models`: less CPU than a build). A client host in
another process (a Ray client actor) builds its own from the seed, the same weights: once per
process.

Warm processes that run several trials (a sweep's reused trial workers, ``hetsim whatif``, a
notebook) keep more: the federated data per (dataset, partition, clients, seed), within
:data:`DATA_BUDGET_BYTES`, and the initial models per (architecture, input, classes, seed),
within :data:`MODEL_BUDGET_BYTES`; the profiles, conditions and batteries are built per config
(milliseconds). Nothing here changes a result: what is kept is read only, and every
:class:`Simulation` has its own of what a run changes (the models, the batteries' charge).
"""
from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import numpy as np

from engine.config.schema import ExperimentConfig
from engine.data.build import build_data
from engine.models.arch import arch_spec, assign_architectures, build_arch_model, copy_models
from engine.models.zoo import MODELS
from engine.trace import mark
from hardware_profiles.conditions import FleetConditions
from hardware_profiles.energy import FleetBatteries
from hardware_profiles.sampler import assign_profiles

DATA_BUDGET_BYTES = 1 << 30  # federated data kept for later runs of this process (the newest always)
MODEL_BUDGET_BYTES = 256 << 20  # initial models kept for later runs of this process (the newest always)

# guard(stage) or guard("model", arch, data) -> a context that may turn the stage's errors into
# config problems; stages: "data", "profiles", "conditions", "batteries", "architectures", "model"
Guard = Callable[..., ContextManager[Any]]


@dataclass(frozen=True)
class Parts:
    """What a config builds before its first round; read only (see :meth:`take_models`,
    :meth:`fresh_batteries` for what a run changes)."""

    data: Any  # FederatedData or OnDemandFederatedData
    profiles: Any  # hardware_profiles.ProfileTable
    conditions: FleetConditions | None  # None: every client's conditions are constant
    batteries: FleetBatteries | None
    arch_names: list[str]  # architecture name per code; "" when all clients share one model
    client_arch: np.ndarray  # int code per client (into arch_names)
    models: dict[str, Any]  # the initial model of each architecture, never changed (copy_models)
    cfg: ExperimentConfig

    def take_models(self) -> dict[str, Any]:
        """The initial models, the caller's to change (a copy: cheaper than a build)."""
        return copy_models(self.models)

    def fresh_batteries(self) -> FleetBatteries | None:
        return self.batteries.fresh() if self.batteries is not None else None


def _no_guard(stage: str, arch: str = "", data=None) -> ContextManager[Any]:
    return contextlib.nullcontext()


_data: OrderedDict[str, Any] = OrderedDict()  # data key -> federated data, oldest first
_models: OrderedDict[tuple, Any] = OrderedDict()  # model key -> initial model, oldest first


def build_parts(cfg: ExperimentConfig, guard: Guard | None = None, data=None) -> Parts:
    """The parts of ``cfg``, built (the data and initial models from this process's earlier runs
    where they are the same). Hand them to whoever needs them next, rather than building again.

    ``guard`` wraps each stage (see :data:`Guard`); a guard that suppresses an architecture's error
    leaves that model out (the validation collects them all). ``data``: federated data built by the
    caller (a benchmark's), used instead; not kept."""
    guard = guard or _no_guard
    if data is None:
        with guard("data"):
            data = _shared_data(cfg)
    with guard("profiles"):
        profiles = assign_profiles(cfg.clients.profiles, data.num_clients, seed=cfg.seed)
    changing = cfg.clients.profiles.conditions
    with guard("conditions"):
        conditions = (FleetConditions(changing, profiles, cfg.seed, origin_s=cfg.clock.start_s)
                      if changing and changing.sets else None)
    battery = cfg.clients.profiles.battery
    zones = conditions.columns().get("tz_offset_h") if conditions is not None else None
    with guard("batteries"):
        batteries = FleetBatteries(battery, profiles, cfg.seed, zones) if battery else None
    with guard("architectures"):
        arch_names, client_arch = assign_architectures(cfg, profiles)
    models = {}
    for arch in arch_names:
        with guard("model", arch, data):
            models[arch] = _shared_model(cfg, arch, data)
    mark("parts: built")  # (a test counts them: one per run and process)
    return Parts(data, profiles, conditions, batteries, arch_names, client_arch, models, cfg)


def data_key(cfg: ExperimentConfig) -> str:
    """What the federated data depends on: the dataset, the partition, the clients, the seed."""
    return json.dumps([cfg.dataset.model_dump(mode="json"), cfg.partition.model_dump(mode="json"),
                       cfg.clients.num_clients, cfg.seed], sort_keys=True, default=str)


def model_key(cfg: ExperimentConfig, arch: str, input_shape, num_classes: int) -> tuple:
    """What an initial model depends on: its builder and params, the data's shape and classes, the seed."""
    name, params = arch_spec(cfg, arch)
    return (name, MODELS.get(name), json.dumps(params, sort_keys=True, default=str), tuple(input_shape),
            int(num_classes), cfg.seed)


def _shared_data(cfg: ExperimentConfig):
    return _kept(_data, data_key(cfg), lambda: build_data(cfg), DATA_BUDGET_BYTES, _data_nbytes)


def _shared_model(cfg: ExperimentConfig, arch: str, data):
    key = model_key(cfg, arch, data.input_shape, data.num_classes)
    return _kept(_models, key, lambda: build_arch_model(cfg, arch, data.input_shape, data.num_classes),
                 MODEL_BUDGET_BYTES, _model_nbytes)


def _kept(store: OrderedDict, key, build: Callable[[], Any], budget: int, nbytes: Callable[[Any], int]):
    """``store[key]``, built if absent; the oldest entries go while the store is over ``budget``
    bytes (the newest stays)."""
    if key in store:
        store.move_to_end(key)
        return store[key]
    value = store[key] = build()
    while len(store) > 1 and sum(nbytes(v) for v in store.values()) > budget:
        store.popitem(last=False)
    return value


def _data_nbytes(data) -> int:
    x = getattr(data, "x", None)
    return int(x.nbytes) if isinstance(x, np.ndarray) else 0


def _model_nbytes(model) -> int:
    return sum(t.nbytes for t in model.state_dict().values())


def forget() -> None:
    """Drop everything kept (tests; a process that needs the memory back)."""
    _data.clear()
    _models.clear()
