"""One codec for everything a checkpoint holds: client states, server fields, RNG states.

:func:`encode` turns a Python value into a JSON-able tree plus a list of tensors (the engine
saves the tree as JSON and the tensors with ``torch.save``, and loads them back with
``weights_only=True``: nothing on disk is ever unpickled). :func:`decode` rebuilds the value
with the exact same types. Supported:

* ``torch.Tensor`` (any dtype, device and shape), ``numpy.ndarray`` (any non-object dtype, kept
  with its dtype and shape), numpy scalars (bit-exact) and ``numpy.random.Generator`` (its
  bit generator's state);
* ``None``, ``bool``, ``int``, ``float`` (also NaN, infinities and -0.0), ``str``, ``bytes``;
* ``list``, ``tuple``, ``dict`` (any hashable supported keys), ``OrderedDict``, ``set``,
  ``frozenset``;
* dataclasses whose class is registered with :func:`checkpointable` (an explicit allowlist;
  decoding sets the fields without calling ``__init__``).

Anything else raises :class:`StateCodecError` naming the value's path and type, so state a
method adds later cannot silently go missing from a checkpoint. Objects that occur twice in one
encoded value (the same array under two keys) come back as one object.

No I/O and no Ray here: the engine (:mod:`engine.checkpoint`) owns the files.
"""
from __future__ import annotations

import base64
import dataclasses
import math
import warnings
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np
import torch

_REGISTRY: dict[str, type] = {}
# Tensors and arrays up to this size go into the JSON tree (base64) instead of the tensor list:
# each stored tensor costs torch.save/load a fixed ~0.1 ms, which dominates for the many tiny
# arrays of client states (bandit statistics, pack indices).
INLINE_BYTES = 1024
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


class StateCodecError(TypeError):
    """A value cannot be checkpointed (or a stored one cannot be rebuilt)."""


def checkpointable(cls: type) -> type:
    """Class decorator: allow instances of this dataclass in checkpoints (by qualified name)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"@checkpointable needs a dataclass, got {cls.__qualname__}")
    _REGISTRY[_class_name(cls)] = cls
    return cls


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def registered_classes() -> dict[str, type]:
    return dict(_REGISTRY)


# ------------------------------------------------------------------------------------ encode
def encode(value: Any, tensors: list[torch.Tensor], path: str = "state") -> Any:
    """The JSON-able tree of ``value``; its tensors and arrays are appended to ``tensors``."""
    return _Encoder(tensors).encode(value, path)


class _Encoder:
    def __init__(self, tensors: list[torch.Tensor]):
        self.tensors = tensors
        self.memo: dict[int, int] = {}  # id(object) -> reference number (pre-order)
        self.keep: list[Any] = []  # keeps memoised objects alive while encoding

    def _remember(self, obj: Any) -> None:
        self.memo[id(obj)] = len(self.memo)
        self.keep.append(obj)

    def encode(self, v: Any, path: str) -> Any:
        t = type(v)
        if v is None or t is bool or t is int or t is str:
            return v
        if t is float:
            return v if math.isfinite(v) else {"$f": repr(v)}
        ref = self.memo.get(id(v))
        if ref is not None:
            return {"$ref": ref}
        if t is list:
            self._remember(v)
            return [self.encode(x, f"{path}[{i}]") for i, x in enumerate(v)]
        if t is dict or t is OrderedDict:
            self._remember(v)
            plain = t is dict and all(type(k) is str and not k.startswith("$") for k in v)
            if plain:
                return {k: self.encode(x, f"{path}[{k!r}]") for k, x in v.items()}
            items = [[self.encode(k, f"{path}.<key>"), self.encode(x, f"{path}[{k!r}]")] for k, x in v.items()]
            return {"$odict" if t is OrderedDict else "$dict": items}
        if t is tuple:
            return {"$tuple": [self.encode(x, f"{path}[{i}]") for i, x in enumerate(v)]}
        if t is set or t is frozenset:
            if t is set:
                self._remember(v)
            return {"$" + t.__name__: [self.encode(x, f"{path}.<item>") for x in v]}
        if t is bytes:
            return {"$bytes": v.hex()}
        if isinstance(v, torch.Tensor) and (t is torch.Tensor or t is torch.nn.Parameter):
            self._remember(v)
            if (t is torch.Tensor and v.device.type == "cpu" and not v.requires_grad
                    and v.numel() * v.element_size() <= INLINE_BYTES):
                raw = v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                return {"$ti": [str(v.dtype).removeprefix("torch."), list(v.shape), _b64(raw)]}
            return {"$t": self._add_tensor(v)}
        if t is np.ndarray:
            self._remember(v)
            if v.nbytes <= INLINE_BYTES and not v.dtype.hasobject:
                raw = np.ascontiguousarray(v).tobytes()
                return {"$npi": [np.lib.format.dtype_to_descr(v.dtype), list(v.shape), _b64(raw)]}
            return {"$np": self._add_array(v, path)}
        if isinstance(v, np.generic):
            if v.dtype.hasobject:
                raise StateCodecError(f"cannot checkpoint {path}: numpy object scalar")
            return {"$nps": [np.lib.format.dtype_to_descr(v.dtype), v.tobytes().hex()]}
        if t is np.random.Generator:
            self._remember(v)
            name = type(v.bit_generator).__name__
            if name not in _BIT_GENERATORS:
                raise StateCodecError(f"cannot checkpoint {path}: bit generator {name} is not supported")
            return {"$gen": [name, self.encode(v.bit_generator.state, f"{path}.bit_generator.state")]}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return self._dataclass(v, path)
        raise StateCodecError(
            f"cannot checkpoint {path}: type {t.__module__}.{t.__qualname__} is not supported "
            "(tensors, numpy arrays/scalars/Generators, Python scalars, str, bytes, list, tuple, "
            "dict, set and @checkpointable dataclasses are)"
        )

    def _add_tensor(self, v: torch.Tensor) -> int:
        t = v.detach()
        if t.untyped_storage().nbytes() > t.numel() * t.element_size():
            t = t.clone()  # a view: torch.save would write its whole base storage
        self.tensors.append(t)
        return len(self.tensors) - 1

    def _add_array(self, a: np.ndarray, path: str) -> list:
        if a.dtype.hasobject:
            raise StateCodecError(f"cannot checkpoint {path}: numpy array of dtype object")
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        with warnings.catch_warnings():  # read-only arrays (from Ray's object store) warn
            warnings.simplefilter("ignore", UserWarning)
            self.tensors.append(torch.from_numpy(raw))
        return [len(self.tensors) - 1, np.lib.format.dtype_to_descr(a.dtype), list(a.shape)]

    def _dataclass(self, v: Any, path: str) -> dict:
        cls = type(v)
        name = _class_name(cls)
        if _REGISTRY.get(name) is not cls:
            raise StateCodecError(
                f"cannot checkpoint {path}: dataclass {name} is not registered; decorate it with "
                "@algorithms.state.checkpointable"
            )
        names = [f.name for f in dataclasses.fields(v)]
        extra = sorted(set(getattr(v, "__dict__", {})) - set(names))
        if extra:
            raise StateCodecError(
                f"cannot checkpoint {path}: {name} has attributes that are not dataclass fields: {extra}"
            )
        self._remember(v)
        return {"$dc": [name, {n: self.encode(getattr(v, n), f"{path}.{n}") for n in names}]}


# ------------------------------------------------------------------------------------ decode
def decode(tree: Any, tensors: Sequence[torch.Tensor], copy: bool = False) -> Any:
    """Rebuild the value :func:`encode` produced. ``copy``: clone tensors and arrays (e.g.
    when ``tensors`` are memory-mapped from a file that may go away)."""
    return _Decoder(tensors, copy).decode(tree)


class _Decoder:
    def __init__(self, tensors: Sequence[torch.Tensor], copy: bool):
        self.tensors, self.copy = tensors, copy
        self.memo: list[Any] = []

    def decode(self, v: Any) -> Any:
        if isinstance(v, list):
            out: list = []
            self.memo.append(out)
            out.extend(self.decode(x) for x in v)
            return out
        if not isinstance(v, dict):
            return v
        if len(v) != 1 or not next(iter(v)).startswith("$"):
            out_d: dict = {}
            self.memo.append(out_d)
            for k, x in v.items():
                out_d[k] = self.decode(x)
            return out_d
        (tag, body), = v.items()
        if tag == "$f":
            return float(body)
        if tag == "$ref":
            return self.memo[body]
        if tag in ("$dict", "$odict"):
            out_m: dict = {} if tag == "$dict" else OrderedDict()
            self.memo.append(out_m)
            for k, x in body:
                out_m[self.decode(k)] = self.decode(x)
            return out_m
        if tag == "$tuple":
            return tuple(self.decode(x) for x in body)
        if tag == "$set":
            slot = len(self.memo)
            self.memo.append(None)
            out_s = {self.decode(x) for x in body}
            self.memo[slot] = out_s
            return out_s
        if tag == "$frozenset":
            return frozenset(self.decode(x) for x in body)
        if tag == "$bytes":
            return bytes.fromhex(body)
        if tag == "$t":
            t = self.tensors[body]
            t = t.clone() if self.copy else t
            self.memo.append(t)
            return t
        if tag == "$np":
            index, descr, shape = body
            raw = self.tensors[index].numpy()
            a = raw.view(np.lib.format.descr_to_dtype(_descr(descr))).reshape(shape)
            a = a.copy() if self.copy else a
            self.memo.append(a)
            return a
        if tag == "$ti":
            dtype, shape, data = body
            raw = bytearray(base64.b64decode(data))
            dt = getattr(torch, dtype)
            t = torch.frombuffer(raw, dtype=dt).reshape(shape) if raw else torch.empty(shape, dtype=dt)
            self.memo.append(t)
            return t
        if tag == "$npi":
            descr, shape, data = body
            a = np.frombuffer(base64.b64decode(data), dtype=np.lib.format.descr_to_dtype(_descr(descr)))
            a = a.reshape(shape).copy()  # writable, owned
            self.memo.append(a)
            return a
        if tag == "$nps":
            descr, hexbytes = body
            dtype = np.lib.format.descr_to_dtype(_descr(descr))
            return np.frombuffer(bytes.fromhex(hexbytes), dtype=dtype)[0]
        if tag == "$gen":
            name, state = body
            if name not in _BIT_GENERATORS:
                raise StateCodecError(f"unknown bit generator {name!r} in a checkpoint")
            gen = np.random.Generator(getattr(np.random, name)())
            self.memo.append(gen)
            gen.bit_generator.state = self.decode(state)
            return gen
        if tag == "$dc":
            return self._dataclass(*body)
        raise StateCodecError(f"unknown tag {tag!r} in a checkpoint")

    def _dataclass(self, name: str, fields: dict) -> Any:
        cls = _REGISTRY.get(name)
        if cls is None:
            raise StateCodecError(
                f"checkpoint holds a {name}, which is not a registered @checkpointable dataclass "
                "(renamed or not imported?)"
            )
        names = [f.name for f in dataclasses.fields(cls)]
        if sorted(names) != sorted(fields):
            raise StateCodecError(
                f"checkpoint holds a {name} with fields {sorted(fields)}, the class now has {sorted(names)}"
            )
        obj = cls.__new__(cls)
        self.memo.append(obj)
        for n in names:
            object.__setattr__(obj, n, self.decode(fields[n]))
        return obj


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _descr(d: Any) -> Any:
    """JSON turns the tuples of a structured dtype's descr into lists; turn them back."""
    if isinstance(d, list):
        return [tuple(_descr(x) for x in item) if isinstance(item, list) else item for item in d]
    return d
