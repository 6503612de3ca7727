"""Which model each client trains, and the initial models: the same on the server and every host.

Clients share one model (``model.name``) unless ``model.zoo`` / ``model.per_client`` give
architectures by device (heterogeneous models, as ASCEND's distillation uses). An
architecture's initial weights come from the run's seed, so every process builds the same.
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from engine.config.schema import ExperimentConfig
from engine.models.flops import training_flops_per_sample
from engine.models.zoo import build_model


def assign_architectures(cfg: ExperimentConfig, profiles) -> tuple[list[str], np.ndarray]:
    """Architecture per client: ``[""]`` (one shared model) unless ``model.zoo``/``per_client``.

    Each client gets the first zoo rule whose bounds its profile satisfies, else
    ``model.name``; ``per_client`` entries win. Vectorised over clients.
    """
    m = cfg.model
    n = len(profiles)
    if not m.heterogeneous:
        return [""], np.zeros(n, dtype=np.int16)
    choice = np.full(n, m.name, dtype=object)
    unassigned = np.ones(n, dtype=bool)
    for rule in m.zoo:
        fits = unassigned.copy()
        if rule.max_gflops is not None:
            fits &= profiles.gflops <= rule.max_gflops
        if rule.max_memory_gb is not None:
            fits &= profiles.memory_gb <= rule.max_memory_gb
        choice[fits] = rule.arch
        unassigned &= ~fits
    for cid, arch in m.per_client.items():
        if not 0 <= cid < n:
            raise ValueError(f"model.per_client: client id {cid} out of range [0, {n})")
        choice[cid] = arch
    names, codes = np.unique(choice.astype(str), return_inverse=True)
    return names.tolist(), codes.astype(np.int16)


def build_arch_model(cfg: ExperimentConfig, arch: str, input_shape, num_classes) -> torch.nn.Module:
    """The initial model of one architecture: identical on the server and on every host."""
    name, params = arch_spec(cfg, arch)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        return build_model(name, input_shape, num_classes, **params)


def copy_models(models: dict[str, torch.nn.Module]) -> dict[str, torch.nn.Module]:
    """Copies of the initial models, to change: less CPU than building them again (LeNet-5 1.2x,
    ResNet-18 7x less: ``bench/bench_build_once.py --models``). ``copy.deepcopy``, but each
    parameter and buffer copied by numpy: ``Tensor.clone`` starts torch's intra-op threads for a
    tensor of over 32k elements, which costs more than the copy (LeNet-5 with 2 threads: 7.5 ms
    against 1.8 ms)."""
    out = {}
    for arch, model in models.items():
        memo: dict[int, Any] = {id(b): _serial_copy(b) for b in model.buffers()}
        memo.update({id(p): type(p)(_serial_copy(p), p.requires_grad) for p in model.parameters()})
        out[arch] = copy.deepcopy(model, memo)
    return out


def _serial_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in one thread: numpy's copy where numpy can (a contiguous CPU tensor of a
    numpy dtype), into storage of torch's own (resizable, as a clone's)."""
    t = t.detach()
    out = torch.empty_like(t, memory_format=torch.preserve_format)
    try:
        if t.device.type == "cpu" and t.is_contiguous():
            out.numpy()[...] = t.numpy()
            return out
    except TypeError:  # no numpy dtype (bfloat16, ...)
        pass
    return out.copy_(t)


def arch_flops(cfg: ExperimentConfig, arch: str, input_shape, num_classes) -> float:
    """Training FLOPs of one sample of an architecture (counted once per process).

    Counted by the hosts, which need it, not by the driver, which would count it for them:
    the count runs a forward and backward pass of the model under torch's FLOP counter.
    """
    name, params = arch_spec(cfg, arch)
    return float(training_flops_per_sample(name, input_shape, num_classes, **params))


def arch_spec(cfg: ExperimentConfig, arch: str) -> tuple[str, dict]:
    """Model name and params of an architecture ("" = the one shared ``model.name``; a zoo rule's
    arch of its own name builds the rule's ``model``)."""
    if arch == "":
        return cfg.model.name, cfg.model.params
    default = cfg.model.params if arch == cfg.model.name else {}
    return cfg.model.model_of(arch), cfg.model.arch_params.get(arch, default)
