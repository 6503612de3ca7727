"""A run's results: its folder's tables (Parquet, pandas-first), its manifest, and where
folders live (a local path or object storage). The schema is in docs/results.md.

Names are resolved on first use (PEP 562, as in :mod:`engine`): importing a submodule such as
:mod:`engine.results.manifest` runs this file first, and eager imports here would load pandas
and pyarrow (~0.5 s) into every process that only reads a manifest, e.g. a Ray run's driver
actor before it starts its client actors (issue 34).
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "write_json_atomic": "engine.atomic",
    "redact": "engine.config.schema",
    "HEARTBEAT_S": "engine.results.manifest",
    "SCHEMA_VERSION": "engine.results.manifest",
    "method_cell": "engine.results.manifest",
    "method_label": "engine.results.manifest",
    "read_manifest": "engine.results.manifest",
    "run_status": "engine.results.manifest",
    "update_manifest": "engine.results.manifest",
    "utc_now": "engine.results.manifest",
    "write_manifest": "engine.results.manifest",
    "StorageUnreachable": "engine.storage.remote",
    "DirectoryMirror": "engine.storage.locations",
    "Storage": "engine.storage.locations",
    "StorageError": "engine.storage.locations",
    "check_writable": "engine.storage.locations",
    "is_uri": "engine.storage.locations",
    "open_storage": "engine.storage.locations",
    "CLIENT_COLUMNS": "engine.results.tables",
    "FAULT_COLUMNS": "engine.results.tables",
    "PROFILE_COLUMNS": "engine.results.tables",
    "ROUND_COLUMNS": "engine.results.tables",
    "WALL_COLUMNS": "engine.results.tables",
    "Run": "engine.results.tables",
    "RunFolderError": "engine.results.tables",
    "RunWriter": "engine.results.tables",
    "load_run": "engine.results.tables",
    "read_table": "engine.results.tables",
    "TERMINAL_WIDTH": "engine.results.text",
    "fold_table": "engine.results.text",
    "wrap": "engine.results.text",
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
