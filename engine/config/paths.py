"""Paths in a config, resolved against the file that names them (docs/validation.md#paths).

A relative input path in a config file means: relative to that file's folder, wherever the
command runs. The input paths are the trace files of ``clients.profiles.conditions``, the profile
``table``, the tier ``catalog`` file, ``dataset.root`` and ``dataset.params.path``. ``~`` and
``$VAR`` are expanded; absolute paths and URIs (``s3://``) are kept; ``builtin:NAME`` names a
trace shipped in ``hardware_profiles/traces/``. A ``--set`` value, or a mapping given in Python,
is relative to the working folder. So are the path entries of ``plugins`` (a ``.py`` file or a
folder; a module name stays as it is). Output locations (``output.dir``, ``executor.state_spill_dir``,
``dataset.params.cache_dir``) are where results go and stay relative to the working folder.

:func:`resolve_paths` rewrites a raw mapping and says where each path came from;
:func:`missing_paths` lists the input files that do not exist, each line starting with the path
as given and as resolved (never the whole section it sits in).
"""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, Iterator

from engine.errors import ConfigError
from engine.plugin_sources import resolve_entries
from hardware_profiles.traces import BUILTIN_PREFIX, TraceError, builtin_names, builtin_trace

PROCESSES = ("down", "up", "compute", "availability")  # of a condition set: may replay a file
FROM_WORKING_FOLDER = "the working folder"


def expand_path(value: str) -> str:
    """``~`` and ``$VAR`` expanded (once: the resolved config stores the result)."""
    out = os.path.expandvars(os.path.expanduser(value))
    missing = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", out)
    if missing:
        # a ConfigError is a ValueError too: a field validator reports it as the field's error
        raise ConfigError(f"environment variable {missing[0]} is not set (in {value!r})")
    return out


def _profile_fields(profiles: Any, prefix: str) -> Iterator[tuple[str, Any, Any]]:
    if not isinstance(profiles, dict):
        return
    if isinstance(profiles.get("table"), str):
        yield f"{prefix}.table", profiles, "table"
    if isinstance(profiles.get("catalog"), str) and _names_a_file(profiles["catalog"]):
        yield f"{prefix}.catalog", profiles, "catalog"
    conditions = profiles.get("conditions")
    if isinstance(conditions, dict) and isinstance(conditions.get("sets"), dict):
        for name, spec in conditions["sets"].items():
            for process in PROCESSES if isinstance(spec, dict) else ():
                p = spec.get(process)
                if isinstance(p, dict) and isinstance(p.get("file"), str):
                    yield f"{prefix}.conditions.sets.{name}.{process}.file", p, "file"


def _names_a_file(catalog: str) -> bool:
    """A catalog string is a file (one line, a .yaml name or no YAML punctuation), not inline YAML
    text such as ``{devices: {...}}`` (hardware_profiles.catalog reads both)."""
    return "\n" not in catalog and (catalog.endswith((".yaml", ".yml")) or not any(c in catalog for c in "{}[]:"))


def path_fields(raw: Any) -> Iterator[tuple[str, Any, Any]]:
    """``(dotted key, container, key)`` of every input path string in a raw experiment mapping."""
    if not isinstance(raw, dict):
        return
    dataset = raw.get("dataset")
    if isinstance(dataset, dict):
        if isinstance(dataset.get("root"), str):
            yield "dataset.root", dataset, "root"
        params = dataset.get("params")
        path = params.get("path") if isinstance(params, dict) else None
        if isinstance(path, str):
            yield "dataset.params.path", params, "path"
        elif isinstance(path, list):
            for i, p in enumerate(path):
                if isinstance(p, str):
                    yield f"dataset.params.path[{i}]", path, i
    clients = raw.get("clients")
    if isinstance(clients, dict):
        yield from _profile_fields(clients.get("profiles"), "clients.profiles")


def _is_trace(key: str) -> bool:
    return key.endswith(".file")


def _resolve_one(value: str, base_dir: Path | None, trace: bool) -> str:
    if "://" in value:
        return value
    if value.startswith(BUILTIN_PREFIX):
        try:
            return str(builtin_trace(value)) if trace else value
        except TraceError:
            return value  # an unknown name: missing_paths reports it with the closest one
    try:
        expanded = expand_path(value)
    except ValueError:
        return value  # an unset variable: the field's own validator names it
    if os.path.isabs(expanded):
        return expanded
    return os.path.normpath(os.path.join(base_dir if base_dir is not None else os.getcwd(), expanded))


Origins = dict[str, tuple[str, str]]  # dotted key -> (the path as given, what it is relative to)


def resolve_paths(raw: Any, base_dir: str | Path | None = None, source: str | None = None,
                  origins: Origins | None = None) -> tuple[Any, Origins]:
    """A copy of ``raw`` with every input path absolute: relative ones joined to ``base_dir`` (the
    folder of the file ``source`` that names them; None: the working folder).

    Returns the copy and, per rewritten key, the path as given and what it was relative to (added
    to ``origins`` when given, so several passes keep the first)."""
    out = copy.deepcopy(raw)
    origins = dict(origins or {})
    where = f"the folder of {source}" if source else FROM_WORKING_FOLDER
    base = Path(base_dir) if base_dir is not None else None
    for key, container, k in list(path_fields(out)):
        value = container[k]
        resolved = _resolve_one(value, base, _is_trace(key))
        if resolved != value:
            origins.setdefault(key, (value, where))
            container[k] = resolved
    if isinstance(out, dict) and "plugins" in out:  # a single entry is a one-entry list
        entries = [out["plugins"]] if isinstance(out["plugins"], str) else out["plugins"]
        out["plugins"] = resolve_entries(entries, base)
    return out, origins


def resolve_profile_paths(profiles: Any, base_dir: str | Path | None, source: str | None = None
                          ) -> tuple[Any, Origins]:
    """:func:`resolve_paths` of a bare ``clients.profiles`` mapping (a what-if fleet)."""
    wrapped, origins = resolve_paths({"clients": {"profiles": profiles}}, base_dir, source)
    return wrapped["clients"]["profiles"], origins


def missing_paths(raw: Any, origins: Origins | None = None) -> list[str]:
    """One line per input file of ``raw`` that does not exist, the path as given and as resolved
    first. The dataset's paths are left to the data loader (the validation pass names the resolved
    path): ``dataset.root`` may be created by a download, a table may be remote or a folder."""
    origins = origins or {}
    lines = []
    for key, container, k in path_fields(raw):
        value = container[k]
        if key.startswith("dataset.") or "://" in value or "$" in value:
            continue
        if value.startswith(BUILTIN_PREFIX):
            if not _is_trace(key):
                lines.append(f"  {value!r} ({key}): builtin:NAME names a shipped trace, only for a trace "
                             "file; give a file path here")
                continue
            try:
                builtin_trace(value)
            except TraceError as err:
                lines.append(f"  {value!r} ({key}): {err}")
            continue
        what = _not_a_file(value)
        if what is None:
            continue
        given, where = origins.get(key, (value, FROM_WORKING_FOLDER))
        resolved = f"resolved against {where} to {value!r}" if given != value else "an absolute path"
        hint = (f"; shipped traces are named builtin:NAME ({', '.join(builtin_names())})"
                if _is_trace(key) else "")
        lines.append(f"  {given!r} {what} ({resolved}; {key}){hint}")
    return lines


def _not_a_file(value: str) -> str | None:
    """Why ``value`` is not a readable file's path (None if it is one)."""
    try:
        path = Path(value)
        if path.is_file():
            return None
        return "is a folder, not a file" if path.is_dir() else "does not exist"
    except (OSError, ValueError) as err:  # a name too long for the file system, a NUL byte
        return f"cannot be a file here ({getattr(err, 'strerror', None) or err})"
