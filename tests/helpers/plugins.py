"""Plugin tests leave nothing registered behind: the registries and the imported plugin sources as
they were before the test (a plugin stays imported in a process by design; the next test file in
the same pytest process must not see another test's methods)."""
from __future__ import annotations

import contextlib

from algorithms.registry import REGISTRIES
from engine.plugin_sources import active_sources, forget


@contextlib.contextmanager
def isolated_plugins():
    sources = {s.entry for s in active_sources()}
    names = {kind: set(reg.names(scan=False)) for kind, reg in REGISTRIES.items()}
    try:
        yield
    finally:
        for source in active_sources():
            if source.entry not in sources:
                forget(source)
        for kind, reg in REGISTRIES.items():
            for name in set(reg.names(scan=False)) - names.get(kind, set()):
                reg.remove(name)
