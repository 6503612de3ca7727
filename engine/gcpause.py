"""A process's start-up imports without the cyclic garbage collector.

Importing torch and the engine creates ~200k long-lived objects, and CPython runs full
collections over the growing heap while they are created: a fifth of a Ray worker's import time
goes to those collections (docs/studies/benchmarks.md has the figures). A run starts three or more such processes
(the command, the driver actor, its client actors) on a machine that may have two cores.

:func:`imports_without_gc` pauses the collector around those imports, then freezes what they
created (``gc.freeze``: moved to a permanent generation that later collections skip, as they
would keep surviving anyway) and resumes collection. Only in processes hetsim owns, which say
so with :func:`own_process` (the ``hetsim`` command, driver and client actors; never a library
user's process, whose objects are not ours to freeze), and once per process: a later call, or one
where the collector is already off, changes nothing, so the objects of a run are never frozen.
Results do not depend on it: the collector only frees unreachable cycles.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_owned = False  # this process is hetsim's own (own_process)
_done = False  # imports_without_gc has run in this process


def own_process() -> None:
    """This process is hetsim's own: :func:`imports_without_gc` may pause its collector."""
    global _owned
    _owned = True


@contextmanager
def imports_without_gc() -> Iterator[None]:
    global _done
    if not _owned or _done or not gc.isenabled():
        yield
        return
    _done = True
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
