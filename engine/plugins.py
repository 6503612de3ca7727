"""Bring your own method, model, dataset, compressor, client-selection policy, local-work policy or metric.

The extension API of hetsim, in one import (``from engine import plugins``): the ``register_*``
functions, the contracts your code implements, the helpers it may use, and :func:`load_plugins`.
The built-ins are registered through the very same functions. A name is looked up when a config
is validated, never copied at import, so registering works at any time in a process; a name
registered twice is an error unless it is the same object.

To run your code on Ray, in a sweep or on a cluster, name it in the config's ``plugins:`` (a
module, or a ``.py`` file or folder relative to the config): every process of the run imports it
(docs/plugins.md). Code registered in a notebook or script travels to Ray by value. An installed
package announces itself through the entry-point group ``hetsim.plugins``.

=====================  ==========================================  ==================================
register ...           what it is                                  the config names it in
=====================  ==========================================  ==================================
``register_method``    params class + Client half + Server half    ``algorithm.name``
``register_model``     ``nn.Module`` class or builder              ``model.name``, ``model.zoo``
``register_dataset``   loader returning an ``ArrayDataset``        ``dataset.name``
``register_compressor``  ``Compressor`` subclass                   ``algorithm.compressor``, ASCEND's arms
``register_selector``  ``SelectionPolicy`` subclass                ``clients.selection.name``
``register_work_policy``  ``fn(view) -> steps`` per client          ``train.work.policy``
``register_metric``    ``fn(outputs, targets) -> float``           ``evaluation.metrics``
=====================  ==========================================  ==================================

Names are resolved on first use (PEP 562): importing this module costs no torch; the contracts
and helpers that need torch (``local_sgd``, ``Compressor``, ...) import it when first named.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from algorithms.plugins import register_compressor as register_compressor
from algorithms.plugins import register_method as register_method
from algorithms.plugins import register_metric as register_metric
from algorithms.plugins import register_selector as register_selector
from algorithms.plugins import register_work_policy as register_work_policy
from algorithms.registry import REGISTRIES, Origin
from engine.plugin_sources import load_plugins as _load_sources
from engine.plugin_sources import resolve_entries
from engine.registry import register_dataset as register_dataset
from engine.registry import register_model as register_model
from hardware_profiles.errors import PluginError as PluginError

if TYPE_CHECKING:  # the lazy names, for IDEs and type checkers
    from algorithms.base import (  # noqa: F401
        FLOAT32_BYTES,
        INDEX_BYTES,
        AlgorithmParams,
        AlgorithmSpec,
        ArchShape,
        Broadcast,
        Client,
        ClientContext,
        ClientResult,
        ModelSize,
        Payload,
        Server,
        ServerContext,
        TimingPayload,
        TrainSettings,
    )
    from algorithms.compressors import Compressed, Compressor  # noqa: F401
    from algorithms.selection import (  # noqa: F401
        ClientHistory,
        Selection,
        SelectionParams,
        SelectionPolicy,
        SelectionView,
    )
    from algorithms.toolkit import group_by_arch, sample_weighted_mean  # noqa: F401
    from algorithms.training import (  # noqa: F401
        flat_params,
        flat_state,
        load_flat_params,
        load_flat_state,
        local_sgd,
    )
    from algorithms.work import WorkParams, WorkView  # noqa: F401
    from engine.data.datasets import ArrayDataset  # noqa: F401

_EXPORTS = {
    # a method's contract (algorithms/base.py): no torch to import it
    "AlgorithmParams": "algorithms.base", "AlgorithmSpec": "algorithms.base", "Client": "algorithms.base",
    "Server": "algorithms.base", "ClientContext": "algorithms.base", "ClientResult": "algorithms.base",
    "ServerContext": "algorithms.base", "Payload": "algorithms.base", "Broadcast": "algorithms.base",
    "TrainSettings": "algorithms.base", "ModelSize": "algorithms.base", "FLOAT32_BYTES": "algorithms.base",
    "INDEX_BYTES": "algorithms.base",
    # a method's wire-size rule for clock.mode: timing_only (Server.timing_payload)
    "TimingPayload": "algorithms.base", "ArchShape": "algorithms.base",
    # a selection policy's contract
    "SelectionPolicy": "algorithms.selection", "SelectionParams": "algorithms.selection",
    "SelectionView": "algorithms.selection", "Selection": "algorithms.selection",
    "ClientHistory": "algorithms.selection",
    # a local-work policy's contract
    "WorkParams": "algorithms.work", "WorkView": "algorithms.work",
    # a dataset's container
    "ArrayDataset": "engine.data.datasets",
    # with torch: a compressor's contract, and the training and aggregation helpers the built-ins use
    "Compressor": "algorithms.compressors", "Compressed": "algorithms.compressors",
    "local_sgd": "algorithms.training", "flat_params": "algorithms.training", "flat_state": "algorithms.training",
    "load_flat_params": "algorithms.training", "load_flat_state": "algorithms.training",
    "sample_weighted_mean": "algorithms.toolkit", "group_by_arch": "algorithms.toolkit",
}

KINDS = {"method": "algorithm", "algorithm": "algorithm", "model": "model", "dataset": "dataset",
         "compressor": "compressor", "selector": "selection policy", "selection policy": "selection policy",
         "work policy": "work policy", "work": "work policy", "metric": "metric"}

__all__ = sorted([*_EXPORTS, "register_method", "register_model", "register_dataset", "register_compressor",
                  "register_selector", "register_work_policy", "register_metric", "unregister", "load_plugins",
                  "registered", "PluginError"])


def load_plugins(*entries: str | Path) -> None:
    """Import plugins now, in this process: module names, or ``.py`` files and folders (relative to
    the working folder). For a run on Ray, a sweep or a cluster, name them in the config's
    ``plugins:`` instead (or pass ``plugins=`` to :func:`engine.simulate`): they then reach every
    process of the run."""
    _load_sources(resolve_entries([str(e) for e in entries], None))


def unregister(kind: str, name: str) -> None:
    """Forget ``name`` of ``kind`` (``"method"``, ``"model"``, ``"dataset"``, ``"compressor"``,
    ``"selector"``, ``"work policy"``, ``"metric"``), e.g. to register another object under it in a notebook;
    built-ins stay."""
    _registry(kind).remove(name)


def registered(kind: str) -> list[tuple[str, Origin]]:
    """``(name, origin)`` of every entry of ``kind``, installed packages' entry points included."""
    reg = _registry(kind)
    return [(name, reg.origin(name)) for name in reg.names()]


def _registry(kind: str):
    if kind not in KINDS:
        raise PluginError(f"unknown kind {kind!r}; allowed: {', '.join(sorted(KINDS))}")
    if KINDS[kind] not in REGISTRIES:  # the engine's registries (models, datasets) are in engine.registry
        importlib.import_module("engine.registry")
    return REGISTRIES[KINDS[kind]]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
