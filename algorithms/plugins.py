"""The registries of the algorithms layer and the functions that register into them.

``register_method``, ``register_compressor``, ``register_selector``, ``register_work_policy`` and
``register_metric`` are the public API (re-exported by :mod:`engine.plugins`, with the engine's
``register_model`` and ``register_dataset``); the built-in methods, compressors, selection and work
policies and metrics are registered through them too (:mod:`algorithms`, with lazy ``"module:attribute"`` references so
that validating a config imports no torch). Each function works as a plain call and as a
decorator, and checks what it is given when it is registered (a lazy reference: when it is first
used), raising :class:`~hardware_profiles.errors.PluginError` that names the hook or the field.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, TypeVar, overload

from pydantic import BaseModel

from algorithms.base import AlgorithmParams, AlgorithmSpec, Client, Server
from algorithms.registry import Registry, describe, import_reference
from algorithms.selection import SelectionParams, SelectionPolicy
from algorithms.work import WorkParams
from hardware_profiles.errors import PluginError

C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Any])

DOCS = "docs/plugins.md"


# ---------------------------------------------------------------- methods
def _hooks_missing(cls: type, base: type, hooks: tuple[str, ...]) -> list[str]:
    return [h for h in hooks if getattr(cls, h, None) is getattr(base, h)]


def _check_half(name: str, role: str, cls: Any, base: type, hooks: dict[str, str]) -> None:
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PluginError(f"method {name!r}: {role}={describe(cls)} is not a subclass of "
                          f"{base.__module__}.{base.__qualname__}")
    missing = _hooks_missing(cls, base, tuple(hooks))
    if missing:
        hook = missing[0]
        raise PluginError(f"method {name!r}: the {role} class {describe(cls)} does not define {hook}{hooks[hook]}, "
                          f"which {base.__module__}.{base.__qualname__} leaves to each method ({DOCS})")


CLIENT_HOOKS = {"receive": "(ctx, broadcast)", "fit": "(ctx, broadcast) -> ClientResult"}
SERVER_HOOKS = {"broadcast": "(round) -> Broadcast", "aggregate": "(round, results) -> dict"}


def check_params_class(name: str, params: Any, kind: str = "method", base: type = AlgorithmParams) -> None:
    """``params`` is a pydantic model class of ``base``'s family whose ``name`` admits ``name``."""
    where = f"{kind} {name!r}"
    if not isinstance(params, type) or not issubclass(params, BaseModel):
        raise PluginError(f"{where}: params={describe(params)} is not a pydantic model class; give a subclass of "
                          f"{base.__module__}.{base.__qualname__}")
    if not issubclass(params, base):
        raise PluginError(f"{where}: params class {describe(params)} is a pydantic model but not a subclass of "
                          f"{base.__module__}.{base.__qualname__} (which forbids unknown keys and carries the name)")
    field = params.model_fields.get("name")
    allowed = getattr(field.annotation, "__args__", None) if field is not None else None
    if field is not None and getattr(field.annotation, "__origin__", None) is not None and allowed is not None \
            and all(isinstance(a, str) for a in allowed) and name not in allowed:
        raise PluginError(f"{where}: params class {describe(params)} declares name: Literal{list(allowed)}, "
                          f"which does not admit {name!r}; drop its name field (the registry sets it)")


def _resolve_method(spec: AlgorithmSpec | str, what: str) -> AlgorithmSpec:
    if isinstance(spec, str):  # a lazy reference to a whole spec
        spec = import_reference(spec, what)
        if not isinstance(spec, AlgorithmSpec):
            raise PluginError(f"{what}: {describe(spec)} is not an algorithms.base.AlgorithmSpec")
    if not isinstance(spec.client, str) and not isinstance(spec.server, str):
        return spec  # the registered spec itself (e.g. algorithms.fedavg.FEDAVG_SPEC)
    client = import_reference(spec.client, what) if isinstance(spec.client, str) else spec.client
    server = import_reference(spec.server, what) if isinstance(spec.server, str) else spec.server
    return AlgorithmSpec(spec.name, spec.params, client, server, spec.description)


def _check_method(name: str, spec: AlgorithmSpec, meta: dict) -> AlgorithmSpec:
    if spec.name != name or ("params" in meta and spec.params is not meta["params"]):
        raise PluginError(f"method {name!r}: the spec registered is {spec.name!r} with params {describe(spec.params)}"
                          f"; it must be {name!r}" + (f" with {describe(meta['params'])}" if "params" in meta else ""))
    check_params_class(name, spec.params)
    _check_half(name, "client", spec.client, Client, CLIENT_HOOKS)
    _check_half(name, "server", spec.server, Server, SERVER_HOOKS)
    return spec


METHODS: Registry[AlgorithmSpec] = Registry("algorithm", check=_check_method, resolve=_resolve_method)


@overload
def register_method(name: AlgorithmSpec) -> AlgorithmSpec: ...
@overload
def register_method(name: str, spec: str, *, params: type[AlgorithmParams]) -> str: ...
@overload
def register_method(name: str, *, params: type[AlgorithmParams] | None = ..., client: type[Client] | str,
                    server: type[Server] | str, description: str = ...) -> AlgorithmSpec: ...
@overload
def register_method(name: str, *, params: type[AlgorithmParams] | None = ..., client: type[Client] | str,
                    description: str = ...) -> Callable[[C], C]: ...
@overload
def register_method(name: str, *, params: type[AlgorithmParams] | None = ..., server: type[Server] | str,
                    description: str = ...) -> Callable[[C], C]: ...


def register_method(name, spec=None, *, params=None, client=None, server=None, description=""):
    """Register a federated-learning method under ``name`` (what ``algorithm.name`` selects).

    A method is a params class (its options under ``algorithm:``, a subclass of
    :class:`~algorithms.base.AlgorithmParams`; None: no options), a client half (a
    :class:`~algorithms.base.Client` subclass defining ``receive`` and ``fit``) and a server half (a
    :class:`~algorithms.base.Server` subclass defining ``broadcast`` and ``aggregate``). Forms::

        register_method("fedavgm", params=FedAvgMParams, client=FedAvgClient, server=FedAvgMServer)

        @register_method("fedavgm", params=FedAvgMParams, client=FedAvgClient)
        class FedAvgMServer(Server): ...      # decorating one half; the other given

        register_method(spec)                 # an AlgorithmSpec

        register_method("fedavgm", "my_pkg.fedavgm:SPEC", params=FedAvgMParams)   # lazy

    ``client``/``server`` may be lazy references ``"package.module:Class"``, and so may the whole
    spec (then ``params`` is given: validating a config needs it, not the halves). Returns the
    :class:`~algorithms.base.AlgorithmSpec` (the decorator returns the class it decorates).
    """
    if isinstance(spec, str):
        if params is None or client is not None or server is not None:
            raise PluginError(f"method {name!r}: a lazy spec reference {spec!r} takes params= (and nothing else)")
        check_params_class(name, params)
        METHODS.add(name, spec, params=params)
        return spec
    if spec is not None:
        raise PluginError(f"method {name!r}: the second argument is a lazy reference 'package.module:SPEC'; "
                          "give the halves as client= and server=")
    if isinstance(name, AlgorithmSpec):
        if params is not None or client is not None or server is not None:
            raise PluginError("register_method(spec): give the spec alone (its params, client and server are in it)")
        _register_spec(name)
        return name
    params = AlgorithmParams if params is None else params
    check_params_class(name, params)
    if client is not None and server is not None:
        spec = AlgorithmSpec(name, params, client, server, description)
        _register_spec(spec)
        return spec
    if client is None and server is None:
        raise PluginError(f"method {name!r}: give client= and server= (or decorate one half and give the other)")

    def decorate(cls):
        half = "server" if client is not None else "client"
        base = Server if half == "server" else Client
        if not (isinstance(cls, type) and issubclass(cls, (Client, Server))):
            raise PluginError(f"@register_method({name!r}) decorates a Client or Server subclass, not {describe(cls)}")
        if not issubclass(cls, base):
            raise PluginError(f"@register_method({name!r}, {'client' if half == 'server' else 'server'}=...) "
                              f"decorates the {half} half, a {base.__qualname__} subclass; {describe(cls)} is not one")
        spec = AlgorithmSpec(name, params, client or cls, server or cls, description or (cls.__doc__ or "").strip())
        _register_spec(spec)
        return cls

    return decorate


def _register_spec(spec: AlgorithmSpec) -> None:
    METHODS.add(spec.name, spec)


def method_params(name: str) -> type[AlgorithmParams]:
    """The params class of method ``name`` (no import of its halves: validation stays light)."""
    entry = METHODS.entry(name)
    return entry.meta["params"] if "params" in entry.meta else entry.ref.params


# ---------------------------------------------------------------- compressors
def _check_compressor(name: str, cls: Any, meta: dict) -> Any:
    base = getattr(sys.modules.get("algorithms.compressors"), "Compressor", None)
    if base is None or not (isinstance(cls, type) and issubclass(cls, base)):
        raise PluginError(f"compressor {name!r}: {describe(cls)} is not a subclass of "
                          "algorithms.compressors.Compressor")
    if cls.name != name:
        raise PluginError(f"compressor {name!r}: its class {describe(cls)} says name = {cls.name!r}; they must agree")
    missing = [h for h in ("compress", "ops", "to_arrays", "from_arrays")
               if getattr(cls, h).__qualname__.startswith("Compressor.")]
    if missing:
        raise PluginError(f"compressor {name!r}: {describe(cls)} does not define {missing[0]}, which "
                          f"algorithms.compressors.Compressor leaves to each compressor ({DOCS})")
    return cls


COMPRESSORS: Registry[type] = Registry("compressor", check=_check_compressor)


def register_compressor(cls: C | str | None = None, ref: Any = None, *, costs: dict[str, float] | None = None):
    """Register a compressor class (a subclass of :class:`algorithms.compressors.Compressor`) under
    its ``name``: as a class decorator ``@register_compressor``, or ``register_compressor(cls)``.
    ``register_compressor("name", "module:Class", costs={...})`` registers lazily (its op-count
    constants given, so that validating ``op_costs`` imports nothing). Returns the class."""
    if isinstance(cls, str):
        COMPRESSORS.add(cls, ref, **({"costs": dict(costs)} if costs is not None else {}))
        return ref
    if cls is None:
        raise PluginError("register_compressor: give the compressor class (or use it as a class decorator)")
    COMPRESSORS.add(getattr(cls, "name", None) or f"<{describe(cls)} without a name>", cls)
    return cls


def compressor_costs(scan: bool = False) -> dict[str, dict[str, float]]:
    """Every registered compressor's op-count constants by name (lazy ones: those registered with
    it); ``scan``: installed packages' entry points too (see :meth:`Registry.names`)."""
    out = {}
    for name in COMPRESSORS.names(scan):
        meta = COMPRESSORS.meta(name)
        out[name] = dict(meta["costs"]) if "costs" in meta else dict(COMPRESSORS.get(name).COSTS)
    return out


# ---------------------------------------------------------------- client selection policies
def _check_selector(name: str, cls: Any, meta: dict) -> Any:
    if not (isinstance(cls, type) and issubclass(cls, SelectionPolicy)):
        raise PluginError(f"selection policy {name!r}: {describe(cls)} is not a subclass of "
                          "algorithms.selection.SelectionPolicy")
    if cls.select is SelectionPolicy.select:
        raise PluginError(f"selection policy {name!r}: {describe(cls)} does not define select(view) -> ids, which "
                          f"algorithms.selection.SelectionPolicy leaves to each policy ({DOCS})")
    check_params_class(name, meta.get("params") or cls.Params, "selection policy", SelectionParams)
    return cls


SELECTORS: Registry[type] = Registry("selection policy", check=_check_selector, plural="selection policies")


def register_selector(name: str, policy: type[SelectionPolicy] | str | None = None, *,
                      params: type[SelectionParams] | None = None):
    """Register a client-selection policy (a :class:`~algorithms.selection.SelectionPolicy`
    subclass) under ``name``, what ``clients.selection.name`` selects; its options are ``params``
    (default: the class's ``Params``). Plain call, or decorator ``@register_selector("oort")``."""
    meta = {"params": params} if params is not None else {}
    if policy is None:
        def decorate(cls: C) -> C:
            SELECTORS.add(name, cls, **meta)
            return cls
        return decorate
    SELECTORS.add(name, policy, **meta)
    return policy


def selector_params(name: str) -> type[SelectionParams]:
    """The options class of selection policy ``name`` (without importing a lazy policy)."""
    entry = SELECTORS.entry(name)
    return entry.meta.get("params") or SELECTORS.get(name).Params


# ---------------------------------------------------------------- local-work policies
def _check_work_policy(name: str, fn: Any, meta: dict) -> Any:
    if not callable(fn):
        raise PluginError(f"work policy {name!r}: {describe(fn)} is not callable; give fn(view) -> steps")
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise PluginError(f"work policy {name!r}: {describe(fn)} must take (view): an algorithms.work.WorkView, "
                          "and return the steps of each of view.ids") from None
    except ValueError:  # a builtin without a signature: trust it
        pass
    check_params_class(name, meta.get("params") or WorkParams, "work policy", WorkParams)
    return fn


WORK_POLICIES: Registry[Callable] = Registry("work policy", check=_check_work_policy, plural="work policies")


def register_work_policy(name: str, fn: F | str | None = None, *, params: type[WorkParams] | None = None):
    """Register a local-work policy ``fn(view) -> steps`` under ``name``, what ``train.work.policy``
    selects: given a :class:`~algorithms.work.WorkView` of the clients about to train, one integer
    >= 1 per client of ``view.ids``, the local SGD steps it does this round (the clock charges
    them). Its options are ``params`` (a :class:`~algorithms.work.WorkParams` subclass; they reach
    it as ``view.params``). It must be a pure function of the view. Plain call, or decorator
    ``@register_work_policy("half")``."""
    meta = {"params": params} if params is not None else {}
    if fn is None:
        def decorate(f: F) -> F:
            WORK_POLICIES.add(name, f, **meta)
            return f
        return decorate
    WORK_POLICIES.add(name, fn, **meta)
    return fn


def work_params(name: str) -> type[WorkParams]:
    """The options class of work policy ``name`` (without importing a lazy policy)."""
    return WORK_POLICIES.entry(name).meta.get("params") or WorkParams


# ---------------------------------------------------------------- metrics
def _check_metric(name: str, fn: Any, meta: dict) -> Any:
    if not callable(fn):
        raise PluginError(f"metric {name!r}: {describe(fn)} is not callable; give fn(outputs, targets) -> float")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise PluginError(f"metric {name!r}: {describe(fn)} must take (outputs, targets): the model's outputs and "
                          "the labels of a test set, and return a float") from None
    except ValueError:  # a builtin without a signature: trust it
        pass
    return fn


METRICS: Registry[Callable] = Registry("metric", check=_check_metric)


def register_metric(name: str, fn: F | str | None = None, *, higher_is_better: bool = True):
    """Register a metric ``fn(outputs, targets) -> float`` under ``name``, evaluated beside accuracy
    when ``evaluation.metrics`` names it: on the global model(s) (column ``global_<name>``) and on
    each client's personalised model (``pers_<name>``). ``outputs`` are the model's outputs on a
    whole test set (a tensor), ``targets`` its labels. Plain call, or decorator ``@register_metric("f1")``."""
    meta = {"higher_is_better": bool(higher_is_better)}
    if fn is None:
        def decorate(f: F) -> F:
            METRICS.add(name, f, **meta)
            return f
        return decorate
    METRICS.add(name, fn, **meta)
    return fn
