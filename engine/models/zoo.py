"""Model registry, FLOP counting and flat-parameter helpers.

Public API
----------
``MODELS``                      name -> builder ``(input_shape, num_classes, **params) -> nn.Module``
                                (a view of the model registry, :mod:`engine.registry`)
``DEFAULT_INPUT_SHAPES``        name -> the input shape the model was designed for (where registered)
``build_model(name, input_shape, num_classes, **params)``
``count_parameters(model)``     number of trainable parameters
``get_flat_params(model)`` / ``set_flat_params(model, flat)`` / ``num_flat_params(model)``

All models are deterministic given ``torch.manual_seed``, so training is reproducible across
processes: ``fmnist_cnn`` has dropout, whose draws come from torch's generator, which the engine
seeds per client and round (the others have no randomness in the forward pass). Every model
stores the (validated) per-sample ``input_shape`` it was built for and ``num_classes`` as
attributes, and names its output layer ``head`` (the layer whose input is its representation:
:mod:`algorithms.frozen_models`). ``mlp`` and ``fmnist_cnn`` take a ``width`` in (0, 1]
(HeteroFL's sub-models: every hidden layer keeps ``ceil(width n)`` of its ``n`` units and divides
its output by the width while training).

Over 400 lines because the built-in models are classes of this one file, each with the checks
of its input shape: the FLOP counts in the disk cache are keyed by its digest (and that of
:mod:`engine.models.flops`, which counts them), so a changed model is a new key.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn as nn

from engine.registry import MODELS as MODEL_REGISTRY
from engine.registry import build_registered_model

__all__ = [
    "MODELS",
    "DEFAULT_INPUT_SHAPES",
    "build_model",
    "count_parameters",
    "CNN",
    "LeNet5",
    "LeNet5Half",
    "CifarCNN",
    "CifarResNet18",  # noqa: F822 - built on first use (module __getattr__: torchvision is slow to import)
    "MLP",
    "FashionCNN",
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


def _check_width(model_name: str, width: Any) -> float:
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not (0 < width <= 1):
        raise ValueError(f"model '{model_name}': width={width!r} is not allowed: a fraction in (0, 1] of each hidden "
                         "layer's units")
    return float(width)


def _narrow(units: int, width: float) -> int:
    """A hidden layer's units at ``width`` (HeteroFL's ``ceil(width n)``)."""
    return max(1, math.ceil(width * units))


class Scaler(nn.Module):
    """HeteroFL's scaler: a narrow model's hidden output divided by its width while training (as
    inverted dropout), so that the full model's activations keep their scale; identity in evaluation."""

    def __init__(self, width: float):
        super().__init__()
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.width if self.training else x


def _scaled(width: float) -> list[nn.Module]:
    """A :class:`Scaler` for a narrow model, nothing at full width (whose modules stay the reference's)."""
    return [Scaler(width)] if width < 1 else []


class ScaledReLU(Scaler):
    """``relu(x)`` after :class:`Scaler`'s division: a narrow MLP's activation, in the place of the
    full one's ``nn.ReLU`` (so that both have the same parameter names)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(super().forward(x))


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
    """LeNet-style CNN of FedCSPACK's reference code for MNIST (its ``CNNMNIST_LIT``; 44,426
    parameters for 1x28x28 and 10 classes). Its Fashion-MNIST model is :class:`FashionCNN`.

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

    @property
    def head(self) -> nn.Module:
        return self.classifier[-1]

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

    @property
    def head(self) -> nn.Module:
        return self.classifier[-1]

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

    @property
    def head(self) -> nn.Module:
        return self.classifier[-1]

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

        @property
        def head(self) -> nn.Module:
            return self.fc

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
    on the synthetic data sets. ``width`` < 1: each hidden layer keeps
    ``ceil(width h)`` units, its output divided by the width while training
    (HeteroFL's sub-model of the ``width: 1`` MLP).
    """

    NAME = "mlp"
    ACCEPTS = "any non-empty shape with positive dims, e.g. (60,), (64,) or (1, 28, 28)"

    def __init__(
        self,
        input_shape: Sequence[int] = (60,),
        num_classes: int = 10,
        hidden: Iterable[int] = (64,),
        width: float = 1.0,
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
        self.width = _check_width(self.NAME, width)
        self.hidden = tuple(_narrow(h, self.width) for h in widths)
        layers: list[nn.Module] = [nn.Flatten()]
        prev = math.prod(shape)
        for units in self.hidden:
            layers += [nn.Linear(prev, units), nn.ReLU() if self.width == 1 else ScaledReLU(self.width)]
            prev = units
        layers.append(nn.Linear(prev, self.num_classes))
        self.net = nn.Sequential(*layers)

    @property
    def head(self) -> nn.Module:
        return self.net[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class FashionCNN(nn.Module):
    """The Fashion-MNIST CNN of FedCSPACK's reference code (its ``CNNMNIST_BIG``), layer for layer:
    conv(C->10, 5x5) -> maxpool2 -> relu -> conv(10->20, 5x5) -> dropout2d(0.5) -> maxpool2 -> relu ->
    flatten (20*4*4 = 320 for 28x28) -> fc(320->256) -> relu -> dropout(0.5) -> fc(256->50) ->
    fc(50->num_classes) (no activation between the last two, as there). 100,816 parameters for
    1x28x28 and 10 classes.

    Expected input: ``(B, C, 28, 28)`` (the design point); any ``(B, C, H, W)`` with ``H, W >= 14``.

    The reference calls ``F.dropout`` after fc1; here it is an ``nn.Dropout`` module (no parameters,
    the same draws), so that batched training sees the model's randomness and trains its clients one
    by one. ``width`` < 1: HeteroFL's sub-model (``ceil(width n)`` units of each hidden layer, its
    output divided by the width while training).
    """

    NAME = "fmnist_cnn"
    ACCEPTS = "(C, H, W) with H, W >= 14, e.g. (1, 28, 28)"

    def __init__(self, input_shape: Sequence[int] = (1, 28, 28), num_classes: int = 10, width: float = 1.0):
        super().__init__()
        shape = _as_shape(input_shape)
        c, h, w = _require_chw(self.NAME, shape, self.ACCEPTS)
        if min(h, w) < 14:
            raise _shape_error(self.NAME, shape, self.ACCEPTS)
        self.input_shape = shape
        self.num_classes = _check_num_classes(self.NAME, num_classes)
        self.width = _check_width(self.NAME, width)
        c1, c2, f1, f2 = (_narrow(n, self.width) for n in (10, 20, 256, 50))
        self.conv1 = nn.Conv2d(c, c1, kernel_size=5)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        flat = c2 * (((h - 4) // 2 - 4) // 2) * (((w - 4) // 2 - 4) // 2)  # two (5x5 conv, 2x2 pool) blocks
        self.fc1 = nn.Linear(flat, f1)
        self.fc1_drop = nn.Dropout()
        self.fc2 = nn.Linear(f1, f2)
        self.fc = nn.Linear(f2, self.num_classes)
        self.pool = MaxPool2d()
        # after conv1, conv2, fc1 and fc2 (a narrow model only)
        self.scale = nn.ModuleList([m for _ in range(4) for m in _scaled(self.width)])

    @property
    def head(self) -> nn.Module:
        return self.fc

    def _s(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.scale[i](x) if len(self.scale) else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.pool(self._s(0, self.conv1(x))))
        x = torch.relu(self.pool(self.conv2_drop(self._s(1, self.conv2(x)))))
        x = torch.relu(self._s(2, self.fc1(x.flatten(1))))
        x = self._s(3, self.fc2(self.fc1_drop(x)))
        return self.fc(x)


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
