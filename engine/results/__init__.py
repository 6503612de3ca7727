"""A run's results: its folder's tables (Parquet, pandas-first), its manifest, and where
folders live (a local path or object storage). The schema is in docs/results.md."""
from engine.atomic import write_json_atomic
from engine.config.schema import redact
from engine.results.manifest import (
    HEARTBEAT_S,
    SCHEMA_VERSION,
    read_manifest,
    run_status,
    update_manifest,
    utc_now,
    write_manifest,
)
from engine.results.tables import (
    CLIENT_COLUMNS,
    FAULT_COLUMNS,
    PROFILE_COLUMNS,
    ROUND_COLUMNS,
    WALL_COLUMNS,
    Run,
    RunFolderError,
    RunWriter,
    load_run,
    read_table,
)
from engine.storage.locations import (
    DirectoryMirror,
    Storage,
    StorageError,
    check_writable,
    is_uri,
    open_storage,
)
from engine.storage.remote import StorageUnreachable

__all__ = [
    "CLIENT_COLUMNS", "FAULT_COLUMNS", "HEARTBEAT_S", "PROFILE_COLUMNS", "ROUND_COLUMNS", "SCHEMA_VERSION",
    "WALL_COLUMNS", "DirectoryMirror", "Run", "RunFolderError", "RunWriter", "Storage",
    "StorageError", "StorageUnreachable", "check_writable", "is_uri", "load_run", "open_storage",
    "read_manifest", "read_table", "redact", "run_status", "update_manifest", "utc_now", "write_json_atomic",
    "write_manifest",
]
