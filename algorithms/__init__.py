"""Federated-learning methods as plain PyTorch/numpy code: no Ray, no file I/O.

The built-in methods, compressors, selection and work policies and metrics are registered here through the
public API (:mod:`algorithms.plugins`, re-exported by :mod:`engine.plugins`), as a user's plugin
registers its own. Each is a lazy ``"module:attribute"`` reference with what validation needs
given now (a method's params class, a compressor's op-count constants), so validating a config
imports no torch and a FedAvg run never imports the other methods. ``ALGORITHMS`` maps a method's
name to its :class:`~algorithms.base.AlgorithmSpec`, importing its module on first access.
"""
from __future__ import annotations

from collections.abc import Mapping

from algorithms.base import AlgorithmSpec
from algorithms.baseline_params import FedNTDParams, FedSPUParams, HeteroFLParams, MoonParams
from algorithms.heterogeneity_params import FedNovaParams, FedOptParams, ScaffoldParams
from algorithms.params import (
    BUILTIN_COMPRESSOR_COSTS,
    AscendParams,
    CompressedFedAvgParams,
    FedAvgParams,
    FedCSPACKParams,
    FedProxParams,
)
from algorithms.plugins import (
    METHODS,
    register_compressor,
    register_method,
    register_metric,
    register_selector,
    register_work_policy,
)
from algorithms.selectors import AvailableFirstParams, OortParams, PowDParams
from algorithms.work import DeadlineWorkParams, PerTierWorkParams

register_method("fedavg", "algorithms.fedavg:FEDAVG_SPEC", params=FedAvgParams)
register_method("fedprox", "algorithms.fedavg:FEDPROX_SPEC", params=FedProxParams)
register_method("fedavg_compressed", "algorithms.compressed_fedavg:SPEC", params=CompressedFedAvgParams)
register_method("fedcspack", "algorithms.fedcspack:SPEC", params=FedCSPACKParams)
register_method("ascend", "algorithms.ascend:SPEC", params=AscendParams)
# the baselines of FedCSPACK's paper (docs/baselines.md)
register_method("moon", "algorithms.moon:SPEC", params=MoonParams)
register_method("fedntd", "algorithms.fedntd:SPEC", params=FedNTDParams)
register_method("fedspu", "algorithms.fedspu:SPEC", params=FedSPUParams)
register_method("heterofl", "algorithms.heterofl:SPEC", params=HeteroFLParams)
register_method("fednova", "algorithms.fednova:SPEC", params=FedNovaParams)
register_method("scaffold", "algorithms.scaffold:SPEC", params=ScaffoldParams)
register_method("fedopt", "algorithms.fedopt:SPEC", params=FedOptParams)

for _name, _cls in (("topk", "TopK"), ("randomk", "RandomK"), ("periodick", "PeriodicK"), ("qsgd8", "QSGD8")):
    register_compressor(_name, f"algorithms.compressors:{_cls}", costs=BUILTIN_COMPRESSOR_COSTS[_name])

register_selector("uniform", "algorithms.selection:Uniform")
register_selector("pow_d", "algorithms.selectors:PowD", params=PowDParams)
register_selector("oort", "algorithms.selectors:Oort", params=OortParams)
register_selector("available_first", "algorithms.selectors:AvailableFirst", params=AvailableFirstParams)

register_work_policy("fixed", "algorithms.work:fixed")
register_work_policy("deadline", "algorithms.work:deadline", params=DeadlineWorkParams)
register_work_policy("per_tier", "algorithms.work:per_tier", params=PerTierWorkParams)

for _name in ("macro_f1", "balanced_accuracy", "top5_accuracy"):
    register_metric(_name, f"algorithms.metrics:{_name}")

ALGORITHMS: Mapping[str, AlgorithmSpec] = METHODS.mapping()
