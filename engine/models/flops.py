"""Training FLOPs per sample of a registered model, counted once and kept.

``training_flops_per_sample(name, input_shape, num_classes, **params)`` builds the model, runs one
forward + backward pass under ``torch.utils.flop_counter.FlopCounterMode`` and divides by the batch.
Counts are memoised per process; the built-in models' counts are also kept on disk
(:mod:`engine.cache`), keyed by the arguments, torch's version and the digest of this file and
``zoo.py`` (a changed model or counting rule is a new key).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from engine.cache import cached_number
from engine.models.zoo import _as_shape, build_model
from engine.registry import MODELS as MODEL_REGISTRY

__all__ = ["training_flops_per_sample"]

_FLOP_BATCH = 2  # >1 so BatchNorm in train mode works for any spatial size


def _freeze(value: Any) -> Any:
    """Turn params into something hashable for the lru_cache key."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, set):
        return tuple(sorted(_freeze(v) for v in value))
    return value


def _count_without_dynamo() -> None:
    """Let FlopCounterMode count without importing ``torch._dynamo``.

    Its ``__torch_dispatch__`` is wrapped in ``torch._disable_dynamo`` (as every dispatch
    mode's), whose first call imports torch._dynamo - ~1.3 s of CPU, as much as torch itself -
    to build the variant that ``torch.compile`` must not trace, cached on the function as
    ``__dynamo_disable``. Outside ``torch.compile`` that variant just calls the function, and
    nothing here compiles, so the cache gets the function itself. A wrapper of another shape
    (another torch) is left alone, and torch._dynamo is then imported as before.
    """
    from torch.utils.flop_counter import _FlopCounterMode  # imports triton (~70 ms): only to count

    wrapper = _FlopCounterMode.__dict__.get("__torch_dispatch__")
    fn, code = getattr(wrapper, "__wrapped__", None), getattr(wrapper, "__code__", None)
    if fn is not None and code is not None and code.co_filename.endswith("_compile.py"):
        if getattr(fn, "__dynamo_disable", None) is None:
            setattr(fn, "__dynamo_disable", fn)


@functools.lru_cache(maxsize=None)
def _training_flops_cached(
    name: str, input_shape: tuple[int, ...], num_classes: int, frozen_params: tuple
) -> int:
    """Per process; the counts of the built-in models also on disk (:mod:`engine.cache`), so
    that a process that finds its count there neither imports the FLOP counter nor runs the pass."""
    def count() -> int:
        return _count_training_flops(name, input_shape, num_classes, frozen_params)

    if MODEL_REGISTRY.origin(name).kind != "built-in":  # a model of the user's: counted here, not kept on disk
        return count()
    key = f"{name}|{input_shape}|{num_classes}|{frozen_params!r}|torch {torch.__version__}|{_source_digest()}"
    return int(cached_number("training_flops", key, count))


@functools.lru_cache(maxsize=None)
def _source_digest() -> str:
    """Of the models and this counting rule: a change to either is a new disk-cache key."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for source in (here / "zoo.py", here / "flops.py"):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def _count_training_flops(
    name: str, input_shape: tuple[int, ...], num_classes: int, frozen_params: tuple
) -> int:
    params = dict(frozen_params)
    # Do not disturb the caller's global RNG stream (model init draws from it).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_model(name, input_shape, num_classes, **params)
    model.train()
    x = torch.zeros((_FLOP_BATCH, *input_shape))
    y = torch.zeros(_FLOP_BATCH, dtype=torch.long)
    # FlopCounterMode only counts matmul / conv-like ops (mm, addmm, bmm, conv,
    # their backward kernels, attention). Elementwise ops (ReLU, bias add in
    # conv, BatchNorm, pooling, softmax / cross-entropy, optimiser update) are
    # NOT counted. The backward pass costs ~2x the forward (grad w.r.t. the
    # layer input + grad w.r.t. the weights), so training ~= 3x forward. It is
    # slightly less than 3x because the first layer needs no grad w.r.t. the
    # data input (e.g. exactly 2x for logistic regression).
    from torch.utils.flop_counter import FlopCounterMode  # imports triton (~70 ms): only to count

    _count_without_dynamo()
    with torch.enable_grad(), FlopCounterMode(display=False) as counter:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
    total = int(counter.get_total_flops())
    return total // _FLOP_BATCH


def training_flops_per_sample(name: str, input_shape: tuple[int, ...], num_classes: int, **params: Any) -> int:
    """FLOPs of one forward+backward pass for ONE sample (cached per arguments).

    Counted once with ``torch.utils.flop_counter.FlopCounterMode`` on a batch
    of ``_FLOP_BATCH`` samples (forward + ``loss.backward()``), divided by the
    batch size. Only matmul/conv FLOPs are counted (see comment in the
    implementation); backward ~= 2x forward. Built-in models' counts are kept on disk too.
    """
    return _training_flops_cached(name, _as_shape(input_shape), int(num_classes), _freeze(params))


training_flops_per_sample.cache_info = _training_flops_cached.cache_info  # type: ignore[attr-defined]
training_flops_per_sample.cache_clear = _training_flops_cached.cache_clear  # type: ignore[attr-defined]
