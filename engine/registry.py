"""The engine's registries: models (``model.name``, ``model.zoo``) and datasets (``dataset.name``).

The same :class:`algorithms.registry.Registry` as methods and compressors; ``register_model`` and
``register_dataset`` are public (re-exported by :mod:`engine.plugins`) and register the built-ins
too, below, as lazy ``"module:attribute"`` references: config validation looks names up here
without importing torch (models) or a dataset's loader. :data:`engine.models.zoo.MODELS` and
:data:`engine.data.datasets.DATASETS` are name -> object views of these registries.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence, TypeVar

from algorithms.registry import Registry, describe
from hardware_profiles.errors import PluginError

F = TypeVar("F", bound=Callable[..., Any])
DOCS = "docs/plugins.md"


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature (a builtin): give it everything
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _check_model(name: str, builder: Any, meta: dict) -> Any:
    if not callable(builder):
        raise PluginError(f"model {name!r}: {describe(builder)} is not callable; give an nn.Module class or a "
                          "function (input_shape, num_classes, **params) -> nn.Module")
    shape = meta.get("input_shape")
    if shape is not None and (not isinstance(shape, (tuple, list)) or not shape
                              or not all(isinstance(d, int) and d > 0 for d in shape)):
        raise PluginError(f"model {name!r}: input_shape={shape!r} is not a shape; give positive ints without the "
                          "batch dimension, e.g. (1, 28, 28)")
    return builder


MODELS: Registry[Callable[..., Any]] = Registry("model", check=_check_model)


def register_model(name: str, builder: F | str | None = None, *, input_shape: Sequence[int] | None = None):
    """Register a model under ``name`` (what ``model.name`` and ``model.zoo`` archs select).

    ``builder`` is an ``nn.Module`` class or a function returning one; it is called with the
    keyword arguments it accepts among ``input_shape`` (a sample's shape, without the batch
    dimension, from the dataset) and ``num_classes``, plus the config's ``model.params``. The
    model must be deterministic given ``torch.manual_seed`` (the engine seeds every build, so all
    processes build the same initial weights). ``input_shape``: the shape it was designed for, for
    listings. Plain call, decorator ``@register_model("mynet")``, or a lazy reference
    ``register_model("mynet", "my_pkg.nets:MyNet")``. Returns the builder."""
    meta = {"input_shape": tuple(input_shape)} if input_shape is not None else {}

    def add(b):
        MODELS.add(name, b, **meta)
        return b

    return add if builder is None else add(builder)


def build_registered_model(name: str, input_shape: tuple[int, ...], num_classes: int, **params: Any):
    """Model ``name`` built for ``input_shape`` and ``num_classes`` with ``params``."""
    builder = MODELS.get(name)
    given = {k: v for k, v in (("input_shape", input_shape), ("num_classes", num_classes)) if _accepts(builder, k)}
    model = builder(**given, **params)
    if not callable(getattr(model, "parameters", None)) or not callable(model):
        raise PluginError(f"model {name!r}: {describe(builder)} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _check_dataset(name: str, loader: Any, meta: dict) -> Any:
    if not callable(loader):
        raise PluginError(f"dataset {name!r}: {describe(loader)} is not callable; give a function "
                          "(*, root, download, seed, **params) -> engine.data.datasets.ArrayDataset")
    return loader


DATASETS: Registry[Callable[..., Any]] = Registry("dataset", check=_check_dataset)


def register_dataset(name: str, loader: F | str | None = None):
    """Register a dataset loader under ``name`` (what ``dataset.name`` selects).

    The loader returns an :class:`engine.data.datasets.ArrayDataset` (numpy arrays: float32
    inputs, int64 labels, and optionally the official test split) and is called with the keyword
    arguments it accepts among ``root``, ``download`` and ``seed``, plus ``dataset.params``. Plain
    call, decorator ``@register_dataset("mydata")``, or a lazy ``"module:function"`` reference."""
    def add(f):
        DATASETS.add(name, f)
        return f

    return add if loader is None else add(loader)


# ---------------------------------------------------------------- objects given in Python
def name_for(kind: str, obj: Any) -> str:
    """The config name of ``obj`` for ``kind`` ("algorithm", "model", "dataset", "selection policy",
    "work policy", "metric"): a name as it is; an object already registered (a spec, a decorated half, a model
    class, ...) by its name; any other object registered now under its ``__name__`` (a notebook's
    class), as :func:`engine.plugins.register_model` and its siblings would."""
    from algorithms.base import AlgorithmSpec  # the contract: imported with the method registry
    from algorithms.plugins import register_method, register_metric, register_selector, register_work_policy
    from algorithms.registry import REGISTRIES

    if isinstance(obj, str):
        return obj
    registry = REGISTRIES[kind]
    name = registry.name_of(obj)
    if name is not None:
        return name
    if kind == "algorithm":
        if not isinstance(obj, AlgorithmSpec):
            raise PluginError(f"algorithm={describe(obj)}: give a registered method's name, an AlgorithmSpec, or a "
                              "Client/Server class registered with @register_method")
        return register_method(obj).name
    name = getattr(obj, "__name__", None)
    if not isinstance(name, str):
        raise PluginError(f"{kind} {describe(obj)}: give a name, or an object with a __name__ to register it under")
    add = {"model": register_model, "dataset": register_dataset, "selection policy": register_selector,
           "work policy": register_work_policy, "metric": register_metric}[kind]
    add(name, obj)
    return name


# ---------------------------------------------------------------- the built-ins
for _name, _ref, _shape in (
    ("cnn", "engine.models.zoo:CNN", (1, 28, 28)),
    ("lenet5", "engine.models.zoo:LeNet5", (1, 32, 32)),
    ("lenet5_half", "engine.models.zoo:LeNet5Half", (1, 32, 32)),
    ("cifar_cnn", "engine.models.zoo:CifarCNN", (3, 32, 32)),
    ("resnet18", "engine.models.zoo:cifar_resnet18", (3, 32, 32)),
    ("mlp", "engine.models.zoo:MLP", (60,)),
    ("fmnist_cnn", "engine.models.zoo:FashionCNN", (1, 28, 28)),
):
    register_model(_name, _ref, input_shape=_shape)

for _name, _ref in (
    ("digits", "datasets:load_digits"), ("mnist5k", "datasets:load_mnist5k"), ("synthetic", "datasets:load_synthetic"),
    ("fashion_mnist", "datasets:load_fashion_mnist"), ("mnist", "torchvision_sets:load_mnist"),
    ("fashion_mnist_tv", "torchvision_sets:load_fashion_mnist_tv"), ("emnist", "torchvision_sets:load_emnist"),
    ("cifar10", "torchvision_sets:load_cifar10"), ("cifar100", "torchvision_sets:load_cifar100"),
    ("parquet", "datasets:load_parquet"), ("leaf", "datasets:load_leaf"),
):
    register_dataset(_name, f"engine.data.{_ref}")
