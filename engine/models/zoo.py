"""Model registry, FLOP counting and flat-parameter helpers.

Public API
----------
``MODELS``                      name -> builder ``(input_shape, num_classes, **params) -> nn.Module``
                                (a view of the model registry, :mod:`engine.registry`)
``DEFAULT_INPUT_SHAPES``        name -> the input shape the model was designed for (where registered)
``build_model(name, input_shape, num_classes, **params)``
``training_flops_per_sample(name, input_shape, num_classes, **params)``  (cached)
``count_parameters(model)``     number of trainable parameters
``get_flat_params(model)`` / ``set_flat_params(model, flat)`` / ``num_flat_params(model)``

All models are deterministic given ``torch.manual_seed`` (no dropout, no other
randomness in the forward pass), so training is reproducible across processes.
Every model stores the (validated) per-sample ``input_shape`` it was built for
and ``num_classes`` as attributes.

Over 400 lines because the built-in models and the rule that counts their training FLOPs share
this file on purpose: its source digest keys the FLOP counts in the disk cache, so a changed
model or counting rule is a new key.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn as nn

from engine.cache import cached_number
from engine.registry import MODELS as MODEL_REGISTRY
from engine.registry import build_registered_model

__all__ = [
    "MODELS",
    "DEFAULT_INPUT_SHAPES",
    "build_model",
    "training_flops_per_sample",
    "count_parameters",
    "CNN",
    "LeNet5",
    "LeNet5Half",
    "CifarCNN",
    "CifarResNet18",  # noqa: F822 - built on first use (module __getattr__: torchvision is slow to import)
    "MLP",
]


# --------------------------------------------------------------------------- #
# validation helpers
# --------------------------------------------------------------------------- #
def _as_shape(input_shape: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in input_shape)
    except TypeError as exc:  # not iterable
        raise ValueError(f"input_shape must be a sequence of ints, got {input_shape!r}") from exc
    return shape


def _check_num_classes(model_name: str, num_classes: Any) -> int:
    n = int(num_classes)
    if n < 1:
        raise ValueError(f"model '{model_name}': num_classes must be >= 1, got {num_classes!r}")
    return n


def _shape_error(model_name: str, shape: tuple[int, ...], accepted: str) -> ValueError:
    return ValueError(
        f"model '{model_name}' does not accept input_shape {shape}; it accepts {accepted}"
    )


def _require_chw(model_name: str, shape: tuple[int, ...], accepted: str) -> tuple[int, int, int]:
    if len(shape) != 3 or any(d < 1 for d in shape):
        raise _shape_error(model_name, shape, accepted)
    return shape  # type: ignore[return-value]


# --------------------------------------------------------------------------- #
# models
# --------------------------------------------------------------------------- #
class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d(2)`` whose forward without autograd (evaluation, probes, teacher logits)
    is the maximum of the four strided views of each 2x2 window: the same values (a maximum
    involves no rounding; NaN propagates the same way), ~4x faster than the native CPU kernel
    at LeNet's sizes (``bench/bench_study.py --kernels``). With autograd the native kernel
    runs, so training and its gradients are untouched. State dicts are unchanged (no state)."""

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (torch.is_grad_enabled() and x.requires_grad) or min(x.shape[-2:]) < 2:
            return super().forward(x)  # (an input under 2x2: the native kernel's error)
        h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2  # floor mode: an odd last row/column is dropped
        top = torch.maximum(x[..., 0:h:2, 0:w:2], x[..., 0:h:2, 1:w:2])
        return torch.maximum(top, torch.maximum(x[..., 1:h:2, 0:w:2], x[..., 1:h:2, 1:w:2]))


class CNN(nn.Module):
    """LeNet-style CNN: FedCSPACK's reference code trains it on MNIST (``CNNMNIST_LIT``, 44,426
    parameters); on Fashion-MNIST the reference trains a larger CNN (docs/fedcspack.md).

    Expected input: ``(B, 1, 28, 28)`` (the design point). Any ``(B, C, H, W)``
    with ``H, W >= 16`` is also accepted; the flatten size is computed with a
    dummy forward pass (16*4*4 = 256 for 28x28).

    Layers: conv(C->6, 5x5) -> relu -> maxpool2 -> conv(6->16, 5x5) -> relu ->
    maxpool2 -> flatten -> fc(flat->120) -> relu -> fc(120->84) -> relu ->
    fc(84->num_classes).
    """

    NAME = "cnn"
    ACCEPTS = "(C, H, W) with H, W >= 16, e.g. (1, 28, 28)"

    def __init__(self, input_shape: Sequence[int] = (1, 28, 28), num_classes: int = 10):
        super().__init__()
        shape = _as_shape(input_shape)
        c, h, w = _require_chw(self.NAME, shape, self.ACCEPTS)
        # spatial: (H-4)//2 after block 1, then ((.)-4)//2 after block 2; must stay >= 1
        if min(h, w) < 16:
            raise _shape_error(self.NAME, shape, self.ACCEPTS)
        self.input_shape = shape
        self.num_classes = _check_num_classes(self.NAME, num_classes)
        self.features = nn.Sequential(
            nn.Conv2d(c, 6, kernel_size=5),
            nn.ReLU(),
            MaxPool2d(),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            MaxPool2d(),
            nn.Flatten(),
        )
        with torch.no_grad():  # dummy forward (no RNG consumed) to get the flatten size
            flat = int(self.features(torch.zeros(1, c, h, w)).shape[1])
        self.classifier = nn.Sequential(
            nn.Linear(flat, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, self.num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class _LeNetBase(nn.Module):
    """Classic LeNet-5 layout with configurable widths (see subclasses)."""

    NAME = "lenet"
    WIDTHS = (6, 16, 120, 84)
    ACCEPTS = "(C, 32, 32), or (C, 28, 28) which is zero-padded by 2 to 32x32"

    def __init__(self, input_shape: Sequence[int] = (1, 32, 32), num_classes: int = 10):
        super().__init__()
        shape = _as_shape(input_shape)
        c, h, w = _require_chw(self.NAME, shape, self.ACCEPTS)
        if (h, w) == (32, 32):
            pad: nn.Module = nn.Identity()
        elif (h, w) == (28, 28):
            pad = nn.ZeroPad2d(2)  # classic MNIST 28x28 -> 32x32 padding; no parameters
        else:
            raise _shape_error(self.NAME, shape, self.ACCEPTS)
        self.input_shape = shape
        self.num_classes = _check_num_classes(self.NAME, num_classes)
        c1, c2, c3, f1 = self.WIDTHS
        self.features = nn.Sequential(
            pad,
            nn.Conv2d(c, c1, kernel_size=5),  # 32 -> 28
            nn.ReLU(),
            MaxPool2d(),  # -> 14
            nn.Conv2d(c1, c2, kernel_size=5),  # -> 10
            nn.ReLU(),
            MaxPool2d(),  # -> 5
            nn.Conv2d(c2, c3, kernel_size=5),  # -> 1
            nn.ReLU(),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(c3, f1),
            nn.ReLU(),
            nn.Linear(f1, self.num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class LeNet5(_LeNetBase):
    """LeNet-5: convs 6-16-120 (5x5) + fc 84 + fc num_classes.

    Expected input: ``(B, C, 32, 32)``; ``(B, C, 28, 28)`` is accepted via
    ``nn.ZeroPad2d(2)``. Exactly 61,706 trainable parameters for 1x32x32 (or
    1x28x28) input and 10 classes.
    """

    NAME = "lenet5"
    WIDTHS = (6, 16, 120, 84)


class LeNet5Half(_LeNetBase):
    """Half-width LeNet-5: convs 3-8-60 (5x5) + fc 42 + fc num_classes.

    Expected input: ``(B, C, 32, 32)``; ``(B, C, 28, 28)`` is accepted via
    ``nn.ZeroPad2d(2)``. Exactly 15,738 trainable parameters for 1x32x32 (or
    1x28x28) input and 10 classes.
    """

    NAME = "lenet5_half"
    WIDTHS = (3, 8, 60, 42)


class CifarCNN(nn.Module):
    """3-conv CNN for CIFAR-style colour images.

    Expected input: ``(B, 3, 32, 32)`` (the design point); any ``(B, C, H, W)``
    with ``H, W >= 8`` is accepted (flatten size from a dummy forward).

    Layers (all convs 3x3, padding 1, so each maxpool halves H and W):
    conv(C->32) -> relu -> maxpool2 -> conv(32->64) -> relu -> maxpool2 ->
    conv(64->64) -> relu -> maxpool2 -> flatten (64*4*4 = 1024 for 32x32) ->
    fc(flat->512) -> relu -> fc(512->num_classes).
    For 3x32x32 / 10 classes: 586,250 trainable parameters.
    """

    NAME = "cifar_cnn"
    ACCEPTS = "(C, H, W) with H, W >= 8, e.g. (3, 32, 32)"

    def __init__(self, input_shape: Sequence[int] = (3, 32, 32), num_classes: int = 10):
        super().__init__()
        shape = _as_shape(input_shape)
        c, h, w = _require_chw(self.NAME, shape, self.ACCEPTS)
        if min(h, w) < 8:
            raise _shape_error(self.NAME, shape, self.ACCEPTS)
        self.input_shape = shape
        self.num_classes = _check_num_classes(self.NAME, num_classes)
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            MaxPool2d(),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            MaxPool2d(),
            nn.Conv2d(64, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            MaxPool2d(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = int(self.features(torch.zeros(1, c, h, w)).shape[1])
        self.classifier = nn.Sequential(
            nn.Linear(flat, 512),
            nn.ReLU(),
            nn.Linear(512, self.num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@functools.lru_cache(maxsize=None)
def _cifar_resnet18_class() -> type:
    # torchvision's import costs ~1 s (it pulls in torch._dynamo): only this model needs it
    from torchvision.models.resnet import BasicBlock, ResNet

    class CifarResNet18(ResNet):
        """CIFAR-style ResNet-18.

        Same architecture (and parameter names) as
        ``torchvision.models.resnet18(weights=None, num_classes=num_classes)``, with
        ``conv1`` replaced by a 3x3 / stride 1 / padding 1 conv taking C input
        channels and ``maxpool`` replaced by ``nn.Identity``.

        Expected input: ``(B, C, H, W)`` with ``H, W >= 8``, designed for
        ``(B, 3, 32, 32)``. 11,173,962 trainable parameters for 3 channels / 10
        classes. Contains BatchNorm (train/eval modes differ; no randomness).
        """

        NAME = "resnet18"
        ACCEPTS = "(C, H, W) with H, W >= 8, e.g. (3, 32, 32)"

        def __init__(self, input_shape: Sequence[int] = (3, 32, 32), num_classes: int = 10):
            shape = _as_shape(input_shape)
            c, h, w = _require_chw(self.NAME, shape, self.ACCEPTS)
            if min(h, w) < 8:
                raise _shape_error(self.NAME, shape, self.ACCEPTS)
            n = _check_num_classes(self.NAME, num_classes)
            # == torchvision.models.resnet18(weights=None, num_classes=n)
            super().__init__(BasicBlock, [2, 2, 2, 2], num_classes=n)
            self.input_shape = shape
            self.num_classes = n
            self.conv1 = nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1, bias=False)
            nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision
            self.maxpool = nn.Identity()

    CifarResNet18.__module__, CifarResNet18.__qualname__ = __name__, "CifarResNet18"  # picklable
    return CifarResNet18


def cifar_resnet18(input_shape: Sequence[int] = (3, 32, 32), num_classes: int = 10) -> nn.Module:
    """CIFAR-style ResNet-18 (:class:`CifarResNet18`, defined on first use).

    Expected input: ``(B, C, H, W)`` with ``H, W >= 8``, designed for ``(B, 3, 32, 32)``.
    """
    return _cifar_resnet18_class()(input_shape, num_classes)


def __getattr__(name: str) -> Any:
    if name == "CifarResNet18":
        return _cifar_resnet18_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class MLP(nn.Module):
    """Fully connected network for flat features.

    Expected input: ``(B, D)`` for ``input_shape == (D,)`` (e.g. digits (64,),
    FedProx synthetic (60,)); image-like input ``(B, *input_shape)`` is
    flattened first, so D = prod(input_shape).

    ``hidden`` lists the hidden widths (ReLU between layers). ``hidden=[]``
    is multinomial logistic regression (a single Linear), as used by FedProx
    on the synthetic data sets.
    """

    NAME = "mlp"
    ACCEPTS = "any non-empty shape with positive dims, e.g. (60,), (64,) or (1, 28, 28)"

    def __init__(
        self,
        input_shape: Sequence[int] = (60,),
        num_classes: int = 10,
        hidden: Iterable[int] = (64,),
    ):
        super().__init__()
        shape = _as_shape(input_shape)
        if len(shape) == 0 or any(d < 1 for d in shape):
            raise _shape_error(self.NAME, shape, self.ACCEPTS)
        self.input_shape = shape
        self.num_classes = _check_num_classes(self.NAME, num_classes)
        widths = [int(h) for h in hidden]
        if any(h < 1 for h in widths):
            raise ValueError(f"model 'mlp': hidden widths must be positive ints, got {list(hidden)!r}")
        self.hidden = tuple(widths)
        layers: list[nn.Module] = [nn.Flatten()]
        prev = math.prod(shape)
        for width in widths:
            layers += [nn.Linear(prev, width), nn.ReLU()]
            prev = width
        layers.append(nn.Linear(prev, self.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# --------------------------------------------------------------------------- #
# registry
# --------------------------------------------------------------------------- #
MODELS: Mapping[str, Callable[..., nn.Module]] = MODEL_REGISTRY.mapping()


class _InputShapes(Mapping):
    """Model name -> the input shape it was designed for (models registered with one)."""

    def _known(self) -> list[str]:
        return [n for n in MODEL_REGISTRY.names() if MODEL_REGISTRY.meta(n).get("input_shape") is not None]

    def __getitem__(self, name: str) -> tuple[int, ...]:
        shape = MODEL_REGISTRY.meta(name).get("input_shape")
        if shape is None:
            raise KeyError(name)
        return shape

    def __iter__(self):
        return iter(self._known())

    def __len__(self) -> int:
        return len(self._known())


DEFAULT_INPUT_SHAPES: Mapping[str, tuple[int, ...]] = _InputShapes()


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **params: Any) -> nn.Module:
    """Build registered model ``name`` for per-sample ``input_shape`` (no batch dim).

    Raises ``ValueError`` for an unknown name (listing the known ones) or an
    input shape the model does not accept (saying which shapes it accepts).
    Initialisation draws from torch's global RNG, so builds are reproducible
    after ``torch.manual_seed``.
    """
    if not isinstance(name, str) or name not in MODEL_REGISTRY:
        raise ValueError(MODEL_REGISTRY.unknown(name))
    return build_registered_model(name, _as_shape(input_shape), num_classes, **params)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable (``requires_grad``) parameter elements."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- #
# FLOP counting
# --------------------------------------------------------------------------- #
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
    """Of this file: a changed model or counting rule is a new disk-cache key."""
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


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
