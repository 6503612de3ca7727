"""How plugins travel: inside a pickled config (or a :class:`Carrier`), to every process of a run.

:func:`pack` turns the ``plugins:`` entries into their sources (plain data: names, files and
digests, :mod:`engine.plugin_sources`) and one cloudpickle of what must be imported first to read
the rest: the session's own registrations (a notebook's classes travel by value), the installed
packages' entry points this process loaded, and the object itself. :func:`unpack` in the receiving
process imports the sources, registers the session's entries and returns the object, or a
:class:`NotLoaded` stand-in whose use raises the plugin's error (naming the node): Ray unpickles an
actor's arguments before the actor's code runs, and an error there would reach the caller as a
dead actor without its cause.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from algorithms.registry import REGISTRIES, Origin, load_entry_point, loaded_entry_points, session_entries
from engine.plugin_sources import PluginSource, activate, active_sources, here, load_plugins
from hardware_profiles.errors import PluginError, is_users_file


@dataclass(frozen=True)
class SessionEntry:
    kind: str  # the registry's kind
    name: str
    obj: Any  # what was registered (pickled by value where it is not importable elsewhere)
    meta: dict
    token: str
    source: str  # its origin's source, for messages


def pack(entries: list[str] | tuple[str, ...], obj: Any) -> tuple[tuple, bytes] | None:
    """What another process needs to unpickle ``obj`` and see the registries this one sees: the
    ``plugins:`` sources (plain data), and one cloudpickle of the session's own entries, the
    installed packages' entry points this process loaded, and ``obj``; None when there is none
    of the three (``obj`` then pickles as usual)."""
    sources = tuple(_source_fields(s) for s in load_plugins(list(entries))) if entries else ()
    session = tuple(SessionEntry(kind, e.name, e.ref, dict(e.meta), e.token, e.origin.source)
                    for kind, e in session_entries())
    points = tuple(loaded_entry_points())
    if not (sources or session or points):
        return None
    import cloudpickle  # by value: a notebook's classes, and helper modules no other process has

    for module in shipped_by_value():
        cloudpickle.register_pickle_by_value(module)
    return sources, cloudpickle.dumps((session, points, obj))


def _source_fields(s: PluginSource) -> tuple:
    return (s.entry, s.kind, s.root, s.modules, s.files, s.digest)


def unpack(sources: tuple, blob: bytes) -> Any:
    """Inverse of :func:`pack` in the receiving process: the sources imported, the session's
    entries registered, ``obj`` returned; if any of it fails here, a :class:`NotLoaded` that
    raises the :class:`PluginError` (naming the plugin and this node) when it is used: Ray
    unpickles an actor's arguments before the actor's code runs, and an error there would reach
    the caller as a dead actor without its cause."""
    import pickle  # cloudpickle's output loads with the standard unpickler

    try:
        for i, fields in enumerate(sources):
            activate(PluginSource(*fields), i)
        session, points, obj = pickle.loads(blob)
        adopt(session, points)
        return obj
    except PluginError as err:
        return NotLoaded(str(err))
    except Exception as err:  # noqa: BLE001 - e.g. a plugin's module missing here: said by whoever uses it
        return NotLoaded(f"the plugins of this run cannot be loaded {here() or 'here'}: {type(err).__name__}: {err}")


class NotLoaded:
    """Stands in for what could not be unpickled because a plugin failed to load in this process."""

    def __init__(self, message: str):
        self.message = message

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise PluginError(self.message)

    def check(self) -> None:
        raise PluginError(self.message)


class Carrier:
    """The plugins of a config's ``plugins:`` entries (and the session's own entries), to travel
    inside something that is not a config (a sweep's trial arguments): unpickling it loads them;
    :meth:`check` raises if that failed."""

    def __init__(self, entries: list[str] | tuple[str, ...] = ()):
        self.entries = tuple(entries)

    def __reduce__(self):
        packed = pack(self.entries, None)
        return (Carrier, (self.entries,)) if packed is None else (_unpacked_carrier, (self.entries, *packed))

    def check(self) -> None:
        """Nothing: the plugins loaded (see :class:`NotLoaded`)."""


def _unpacked_carrier(entries, sources, blob) -> Carrier | NotLoaded:
    loaded = unpack(sources, blob)
    return loaded if isinstance(loaded, NotLoaded) else Carrier(entries)


def adopt(session: tuple[SessionEntry, ...], points: tuple[tuple[str, str, str], ...]) -> None:
    """Make this process's registries hold a session's entries and the entry points it loaded."""
    known = set(loaded_entry_points())
    for dist, name, value in points:
        if (dist, name, value) not in known:
            try:
                load_entry_point(dist, name, value)
            except PluginError as err:
                raise PluginError(f"{err} {here() or 'here'} (the installed plugin package {dist!r} must be installed "
                                  "on every node of the cluster)") from None
    for e in session:
        registry = REGISTRIES[e.kind]
        if registry.token_of(e.name) != e.token:
            registry.add(e.name, e.obj, origin=Origin("session", e.source), token=e.token, **e.meta)


def describe_plugins(entries: list[str] | tuple[str, ...]) -> list[dict[str, Any]]:
    """For manifest.json: each plugin source (entry, kind, modules, digest), the installed packages'
    entry points loaded and the session's own entries (kind, name, where defined)."""
    sources = load_plugins(list(entries)) if entries else []
    return ([{"plugin": s.entry, "kind": s.kind, "modules": list(s.modules), "sha256": s.digest} for s in sources]
            + [{"package": f"{d} {n} = {v}"} for d, n, v in loaded_entry_points()]
            + [{"session": f"{kind} {e.name!r}", "from": e.origin.source} for kind, e in session_entries()])


def plugins_key(entries: list[str] | tuple[str, ...]) -> tuple:
    """What decides whether a warm process can run a config's plugins: their digests and the
    session's entries (a process imports a plugin once)."""
    sources = load_plugins(list(entries)) if entries else []
    return (tuple((s.entry, s.digest) for s in sources), tuple(e.token for _, e in session_entries()))


def shipped_by_value() -> list[Any]:
    """The modules of the session's entries that another process cannot import: neither hetsim's,
    nor installed, nor a plugin source's (e.g. a helper module beside a notebook)."""
    plugin_modules = {m for s in active_sources() for m in s.modules}
    out = {}
    for _, e in session_entries():
        for obj in _parts(e.ref):
            name = getattr(obj, "__module__", None)
            module = sys.modules.get(name) if name else None
            if module is None or name == "__main__" or name.split(".")[0] in plugin_modules:
                continue
            if is_users_file(getattr(module, "__file__", "") or ""):
                out[name] = module
    return list(out.values())


def _parts(obj: Any) -> list[Any]:
    parts = getattr(obj, "registry_identity", None)
    return [p for p in parts() if not isinstance(p, str)] if callable(parts) else [obj]
