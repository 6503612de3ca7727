"""A run's results, for users: its folder's tables (Parquet, pandas-first), its manifest, and
where folders live (a local path or object storage). The schema is in docs/results.md.

Only what a user reads results with is here. The plumbing is imported from its own module: the
writer (:class:`engine.results.tables.RunWriter`), manifest updates
(:mod:`engine.results.manifest`), terminal tables (:mod:`engine.results.text`), storage helpers
(:mod:`engine.storage.locations`).

Names are resolved on first use (PEP 562, as in :mod:`engine`): importing a submodule such as
:mod:`engine.results.manifest` runs this file first, and eager imports here would load pandas
and pyarrow (~0.5 s) into every process that only reads a manifest, e.g. a Ray run's driver
actor before it starts its client actors.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # a run folder's tables
    "Run": "engine.results.tables",
    "load_run": "engine.results.tables",
    "read_table": "engine.results.tables",
    "RunFolderError": "engine.results.tables",
    "ROUND_COLUMNS": "engine.results.tables",
    "CLIENT_COLUMNS": "engine.results.tables",
    "PROFILE_COLUMNS": "engine.results.tables",
    "FAULT_COLUMNS": "engine.results.tables",
    "WALL_COLUMNS": "engine.results.tables",
    # its manifest
    "read_manifest": "engine.results.manifest",
    "run_status": "engine.results.manifest",
    "SCHEMA_VERSION": "engine.results.manifest",
    # where run folders live: a local path or object storage
    "open_storage": "engine.storage.locations",
    "Storage": "engine.storage.locations",
    "StorageError": "engine.storage.locations",
    "StorageUnreachable": "engine.storage.remote",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.results' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
