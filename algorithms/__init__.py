"""Federated-learning methods as plain PyTorch/numpy code: no Ray, no file I/O.

``ALGORITHMS`` maps a method's config name to its :class:`~algorithms.base.AlgorithmSpec`. It
imports a method's module (torch, and numba for FedCSPACK) on first access to that method, so
a FedAvg run never imports the others; the hyperparameter classes alone are in
:mod:`algorithms.params` (no torch), which is what config validation uses. A new method: its
params class and ``ALGORITHM_PARAMS`` entry in :mod:`algorithms.params`, its spec's module and
attribute in ``_SPECS`` below (tests/engine/test_startup.py checks that the two agree).
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from algorithms.base import AlgorithmSpec

# config name -> (module, attribute of its AlgorithmSpec)
_SPECS: dict[str, tuple[str, str]] = {
    "fedavg": ("algorithms.fedavg", "FEDAVG_SPEC"),
    "fedprox": ("algorithms.fedavg", "FEDPROX_SPEC"),
    "fedavg_compressed": ("algorithms.compressed_fedavg", "SPEC"),
    "fedcspack": ("algorithms.fedcspack", "SPEC"),
    "ascend": ("algorithms.ascend", "SPEC"),
}


class _Registry(Mapping):
    """Read-only name -> spec mapping that imports a method's module when it is looked up."""

    def __getitem__(self, name: str) -> AlgorithmSpec:
        module, attr = _SPECS[name]
        return getattr(importlib.import_module(module), attr)

    def __iter__(self) -> Iterator[str]:
        return iter(_SPECS)

    def __len__(self) -> int:
        return len(_SPECS)

    def __repr__(self) -> str:
        return f"ALGORITHMS({', '.join(_SPECS)})"


ALGORITHMS: Mapping[str, AlgorithmSpec] = _Registry()
