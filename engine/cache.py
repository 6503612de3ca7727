"""What one process computed that the next can read instead: a per-user disk cache.

Two things are kept, both cheap to recompute and costly to redo in every process of every run
(the CLI, the validation, the driver and each client actor):

* parsed datasets (:func:`cached_arrays`): ``mnist5k``'s CSV as raw uint8 (3.9 MB) and
  ``digits``' (0.1 MB; reading it through scikit-learn imports scikit-learn, ~1 s), keyed by
  the source file's path, size and modification time;
* training FLOPs per sample of the built-in models (:func:`cached_number`, used by
  :func:`engine.models.flops.training_flops_per_sample`): counting imports torch's FLOP counter (and
  with it triton, ~70 ms) and runs a forward and backward pass; keyed by the model, its
  parameters, the input shape, torch's version and the sources of ``engine/models/zoo.py``
  and ``flops.py``.

The folder is ``$HETSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/hetsim``, else ``~/.cache/hetsim``;
deleting it is always safe. The cache is a convenience only: an entry that cannot be read is
computed again, a folder that cannot be written is skipped, and concurrent writers (a run's
driver, its actors, its CLI) each replace a file atomically (a lost update is recounted later).
No pickle: ``.npz`` without objects and JSON.
"""
from __future__ import annotations

import json
import os
import zlib
from typing import Callable

import numpy as np

from engine.atomic import write_atomic

FORMAT = 1  # bump when what a cached file holds changes


def cache_dir() -> str:
    explicit = os.environ.get("HETSIM_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hetsim")


def _write_atomic(path: str, write: Callable) -> None:
    """:func:`engine.atomic.write_atomic`, or nothing if the folder cannot be written (a
    read-only home: recompute every time)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, write)
    except OSError:
        pass


def cached_arrays(name: str, source: str, keys: tuple[str, ...],
                  parse: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``parse()``'s arrays (named ``keys``), kept in an uncompressed ``.npz`` keyed by
    ``source``'s path, size and modification time: a changed source is parsed again."""
    st = os.stat(source)
    where = zlib.crc32(os.path.realpath(source).encode())
    path = os.path.join(cache_dir(), f"{name}-v{FORMAT}-{st.st_size}-{st.st_mtime_ns}-{where:08x}.npz")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if sorted(npz.files) == sorted(keys):  # else not ours: parse
                return {k: npz[k] for k in keys}
    except Exception:  # noqa: BLE001 - absent, truncated, not ours (zipfile.BadZipFile, ValueError, ...): parse
        pass
    arrays = parse()
    _write_atomic(path, lambda f: np.savez(f, **arrays))
    return arrays


def cached_number(table: str, key: str, compute: Callable[[], float]) -> float:
    """``compute()``, kept under ``key`` in the JSON object ``<table>.json`` of the cache."""
    path = os.path.join(cache_dir(), f"{table}-v{FORMAT}.json")
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
        if not isinstance(entries, dict):
            entries = {}
    except Exception:  # noqa: BLE001 - absent or not ours: start over
        entries = {}
    value = entries.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    value = compute()
    value = int(value) if isinstance(value, (int, np.integer)) else float(value)  # JSON-able
    entries[key] = value
    _write_atomic(path, lambda f: f.write(json.dumps(entries, sort_keys=True).encode()))
    return value
