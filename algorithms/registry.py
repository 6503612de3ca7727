"""Registries of the names a config may use, and where each entry came from.

One :class:`Registry` class serves every kind of plugin: methods, compressors, client-selection
policies and metrics (here) and models and datasets (:mod:`engine.registry`). An entry maps a name
to an object given directly or as a lazy reference ``"package.module:attribute"``, imported on first
use, so a registry of heavy objects costs nothing until one of them is asked for (validating a
config imports no torch). Names are looked up when they are used, never copied at import:
registering works at any time in a process. Registering a name again is an error unless it is the
same object (or the same class defined again in ``__main__``, a notebook cell run twice).

Every entry records its :class:`Origin`: built in, a ``plugins:`` entry of a config (imported in
every process of a run, see :mod:`engine.plugin_sources`), an installed package's entry point
(group ``hetsim.plugins``), or the running session (a notebook, a script), whose entries travel to
Ray actors by value. Installed packages are asked for their entry points the first time a name is
missing or a registry is listed, so a process that names only built-ins never scans them.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from hardware_profiles.errors import PluginError, user_frames
from hardware_profiles.suggest import unknown

T = TypeVar("T")
ENTRY_POINT_GROUP = "hetsim.plugins"
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
OUR_PACKAGES = ("hardware_profiles", "algorithms", "engine", "sweeps", "hetsim")
PLUGIN_DOCS = "docs/plugins.md"


@dataclass(frozen=True)
class Origin:
    """Where a registry entry came from."""

    kind: str  # "built-in", "plugin" (a config's plugins: entry), "package" (an entry point), "session"
    source: str  # the defining module; the plugins: entry; the distribution and its entry point

    def __str__(self) -> str:
        return self.source if self.kind in ("built-in", "session") else f"{self.kind} {self.source}"


# set while a plugin module or an entry point is imported: what it registers comes from there
_loading: contextvars.ContextVar[Origin | None] = contextvars.ContextVar("hetsim_plugin_origin", default=None)


@contextlib.contextmanager
def loading_from(origin: Origin) -> Iterator[None]:
    """Entries registered inside this block come from ``origin`` (a plugin being imported)."""
    token = _loading.set(origin)
    try:
        yield
    finally:
        _loading.reset(token)


class UnknownNameError(PluginError, KeyError):
    """A name no registry entry has (a ``KeyError`` too, for the mappings built on registries)."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


def import_reference(ref: str, what: str) -> Any:
    """The object a lazy reference ``"package.module:attribute"`` names."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise PluginError(f"{what}: {ref!r} is not a reference 'package.module:attribute'")
    try:
        obj = importlib.import_module(module)
    except ImportError as err:
        raise PluginError(f"{what}: cannot import {module!r} for {ref!r}: {err}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{what}: module {module!r} has no attribute {attr!r} ({ref!r})") from None
    return obj


def _identity(obj: Any) -> Any:
    """What makes two registered objects the same definition: (module, qualified name) of classes
    and functions, the identities of a spec's parts (:func:`dataclasses.astuple`-like), else the object."""
    parts = getattr(obj, "registry_identity", None)
    if callable(parts):
        return tuple(_identity(p) for p in parts())
    name = getattr(obj, "__qualname__", None)
    if name is not None and not isinstance(obj, str):
        return (getattr(obj, "__module__", None), name)
    return obj


def _only_in_main(identity: Any) -> bool:
    if isinstance(identity, tuple) and len(identity) == 2 and identity[0] == "__main__":
        return True
    return isinstance(identity, tuple) and bool(identity) and all(
        isinstance(i, tuple) and _only_in_main(i) or i is None for i in identity)


def describe(obj: Any) -> str:
    """``module.QualName`` of a class or function, else its repr (for messages)."""
    if isinstance(obj, str):
        return obj
    name = getattr(obj, "__qualname__", None)
    return f"{getattr(obj, '__module__', '?')}.{name}" if name else repr(obj)


_UNRESOLVED = object()


@dataclass
class Entry:
    """One name of a registry: the object (or its lazy reference), its metadata and origin."""

    name: str
    ref: Any
    meta: dict[str, Any]
    origin: Origin
    token: str  # the same entry in every process (a session entry travels by value)
    obj: Any = field(default=_UNRESOLVED, repr=False)

    @property
    def resolved(self) -> bool:
        return self.obj is not _UNRESOLVED


class Registry(Generic[T]):
    """Name -> object, with lazy references, origins and "did you mean" for unknown names.

    ``resolve(entry_ref) -> object`` turns what was registered into what users of the registry get
    (default: import a ``"module:attribute"`` string); ``check(name, object, meta) -> object``
    validates it (a method's hooks, a model builder's signature) when it is registered or, for a
    lazy reference, first resolved, and raises :class:`PluginError` naming what is wrong.
    """

    def __init__(self, kind: str, *, check: Callable[[str, Any, dict], Any] | None = None,
                 resolve: Callable[[Any, str], Any] | None = None, plural: str | None = None):
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self._check = check
        self._resolve = resolve
        self._entries: dict[str, Entry] = {}
        self._lock = threading.RLock()
        REGISTRIES[kind] = self

    # ---------------------------------------------------------------- registering
    def add(self, name: str, obj: Any, *, origin: Origin | None = None, token: str | None = None,
            **meta: Any) -> Entry:
        """Register ``obj`` (or a lazy ``"module:attribute"`` reference) under ``name``."""
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise PluginError(f"{self.kind} name {name!r} is not allowed: a non-empty name of letters, digits, "
                              "'_', '.' and '-', starting with a letter or '_'")
        lazy = isinstance(obj, str)
        if origin is None:  # hetsim's own objects are built in, whatever import brought them in
            own = _origin_of(obj)
            origin = own if own.kind == "built-in" else (_loading.get() or own)
        with self._lock:
            old = self._entries.get(name)
            if old is not None:
                if self._same(old, obj, meta):
                    return old
                if not self._redefined(old, obj):
                    raise PluginError(
                        f"{self.kind} {name!r} is already registered by {old.origin} ({describe(old.ref)}); "
                        f"registering {describe(obj)} from {origin} under the same name is not allowed: "
                        "give it another name")
            entry = Entry(name, obj, dict(meta), origin, token or uuid.uuid4().hex)
            if not lazy:
                entry.obj = self._checked(name, self._resolved(obj, name), entry.meta)
            self._entries[name] = entry
            return entry

    @staticmethod
    def _same(old: Entry, obj: Any, meta: dict) -> bool:
        if meta and old.meta != meta:
            return False
        if old.ref is obj or old.ref == obj:
            return True
        return old.resolved and (old.obj is obj or old.obj == obj)

    @staticmethod
    def _redefined(old: Entry, obj: Any) -> bool:
        """A class or function defined again in ``__main__`` (a notebook cell run again) replaces the old one."""
        before, now = _identity(old.ref), _identity(obj)
        return old.origin.kind == "session" and before == now and _only_in_main(now)

    def remove(self, name: str) -> None:
        """Forget ``name`` (a session's or a test's own entry; built-ins stay)."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None and entry.origin.kind == "built-in":
                raise PluginError(f"{self.kind} {name!r} is built in and cannot be unregistered")
            self._entries.pop(name, None)

    # ---------------------------------------------------------------- looking up
    def entry(self, name: str) -> Entry:
        """The entry of ``name`` (installed packages are asked once if it is missing)."""
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None and isinstance(name, str) and load_entry_points():
            entry = self._entries.get(name)
        if entry is None:
            raise UnknownNameError(self.unknown(name))
        return entry

    def unknown(self, name: Any) -> str:
        """``unknown <kind> 'x'; did you mean 'y'? allowed: ...`` (as every unknown name is worded),
        and where a name of the user's own comes from."""
        return (f"{unknown(self.kind, name, self.names())}; one of your own: register it in a module or file "
                f"named under plugins: ({PLUGIN_DOCS})")

    def get(self, name: str) -> T:
        """The object registered as ``name`` (a lazy reference is imported and checked now)."""
        entry = self.entry(name)
        if not entry.resolved:
            with self._lock:
                if not entry.resolved:
                    entry.obj = self._checked(name, self._resolved(entry.ref, name), entry.meta)
        return entry.obj

    def meta(self, name: str) -> dict[str, Any]:
        """What was registered beside the object (e.g. a model's default input shape)."""
        return self.entry(name).meta

    def origin(self, name: str) -> Origin:
        return self.entry(name).origin

    def name_of(self, obj: Any) -> str | None:
        """The name ``obj`` (or a spec of which it is a part) is registered under, None if none;
        only resolved entries are looked at (nothing is imported)."""
        for entry in list(self._entries.values()):
            if not entry.resolved:
                continue
            if entry.obj is obj or entry.ref is obj:
                return entry.name
            parts = getattr(entry.obj, "registry_identity", None)
            if callable(parts) and any(p is obj for p in parts()):
                return entry.name
        return None

    def token_of(self, name: str) -> str | None:
        """The token of ``name``'s entry (the same entry in every process), None if it has none here."""
        entry = self._entries.get(name)
        return entry.token if entry is not None else None

    def __contains__(self, name: object) -> bool:
        try:
            self.entry(name)  # type: ignore[arg-type]
        except UnknownNameError:
            return False
        return True

    def names(self, scan: bool = True) -> list[str]:
        """Every name in registration order, installed packages' entry points included (``scan``:
        ask them first, once per process; without it, only what is registered already)."""
        if scan:
            load_entry_points()
        return list(self._entries)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def mapping(self) -> "RegistryMapping[T]":
        """A read-only ``{name: object}`` view (resolved on access)."""
        return RegistryMapping(self)

    # ---------------------------------------------------------------- helpers
    def _resolved(self, ref: Any, name: str) -> Any:
        what = f"{self.kind} {name!r}"
        if self._resolve is not None:
            return self._resolve(ref, what)
        return import_reference(ref, what) if isinstance(ref, str) else ref

    def _checked(self, name: str, obj: Any, meta: dict) -> Any:
        return self._check(name, obj, meta) if self._check is not None else obj

    def __repr__(self) -> str:
        return f"Registry({self.kind}: {', '.join(self._entries)})"


class RegistryMapping(Mapping, Generic[T]):
    """``{name: object}`` over a :class:`Registry`, each object resolved when it is looked up."""

    def __init__(self, registry: Registry[T]):
        self.registry = registry

    def __getitem__(self, name: str) -> T:
        return self.registry.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.registry

    def __iter__(self) -> Iterator[str]:
        return iter(self.registry.names())

    def __len__(self) -> int:
        return len(self.registry.names())

    def __repr__(self) -> str:
        return f"{self.registry.plural}({', '.join(self.registry.names())})"


REGISTRIES: dict[str, Registry] = {}  # kind -> its registry (every registry of the process)


def _origin_of(obj: Any) -> Origin:
    """Built in when the object (or the module a lazy reference names) is hetsim's; else the session."""
    module = obj.partition(":")[0] if isinstance(obj, str) else _defining_module(obj)
    if module.split(".")[0] in OUR_PACKAGES:
        return Origin("built-in", module)
    return Origin("session", module)


def _defining_module(obj: Any) -> str:
    parts = getattr(obj, "registry_identity", None)
    if callable(parts):  # a spec: where its first part of the user's is defined
        modules = [_defining_module(p) for p in parts() if p is not None and not isinstance(p, str)]
        theirs = [m for m in modules if m.split(".")[0] not in OUR_PACKAGES]
        return (theirs or modules or ["?"])[0]
    return getattr(obj, "__module__", None) or "?"


def session_entries() -> list[tuple[str, Entry]]:
    """Every entry the running session registered (not built in, not from a plugin import)."""
    return [(kind, e) for kind, reg in REGISTRIES.items() for e in reg.entries() if e.origin.kind == "session"]


# ---------------------------------------------------------------- installed packages' entry points
_entry_points_loaded: list[tuple[str, str, str]] | None = None  # (distribution, name, value) once loaded
_ep_lock = threading.Lock()


def load_entry_points() -> bool:
    """Import every installed package's ``hetsim.plugins`` entry point, once per process; returns
    whether this call loaded any (so a lookup that missed may try again)."""
    global _entry_points_loaded
    if _entry_points_loaded is not None:
        return False
    with _ep_lock:
        if _entry_points_loaded is not None:
            return False
        from importlib.metadata import entry_points  # ~20-50 ms scan: only when a name is missing

        loaded = []
        _entry_points_loaded = loaded  # set first: what a plugin looks up while it loads must not recurse
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(ep.dist, "name", None) or "?"
            load_entry_point(dist, ep.name, ep.value)
            loaded.append((dist, ep.name, ep.value))
    return bool(_entry_points_loaded)


def load_entry_point(dist: str, name: str, value: str) -> None:
    """Import one entry point (a module, or a callable that registers when called)."""
    origin = Origin("package", dist)
    from importlib.metadata import EntryPoint  # the group's entry-point type: only with a plugin package

    with loading_from(origin):
        try:
            obj = EntryPoint(name, value, ENTRY_POINT_GROUP).load()
            if callable(obj) and not isinstance(obj, type):
                obj()
        except PluginError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure of the package's code is the package's
            frames = user_frames(err, installed=True)
            raise PluginError(f"the installed plugin package {dist!r} ({ENTRY_POINT_GROUP} entry point {name} = "
                              f"{value}) failed to load: {type(err).__name__}: {err}"
                              + (f"\n{frames}" if frames else "")) from None


def loaded_entry_points() -> list[tuple[str, str, str]]:
    """(distribution, name, value) of the entry points this process loaded (none if it never looked)."""
    return list(_entry_points_loaded or [])
