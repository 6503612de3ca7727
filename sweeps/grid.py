"""``hetsim sweep --grid KEY=v1,v2``: a dimension of a spec's space replaced from the command line.

A key of the spec's ``space`` becomes ``{grid: [v1, v2]}`` whatever its kind (a grid shrunk to a
few values, a range pinned to a few points); a ``named`` or ``cases`` dimension keeps the entries
named (``--grid cell=a,b``). Values are YAML scalars (``0.01``, ``true``, ``null``, ``topk``),
split at commas. The result is validated like the spec's own space (:func:`sweeps.spec.resolve`).
"""
from __future__ import annotations

import copy
from typing import Any

from engine.config.yamlio import parse_yaml
from hardware_profiles.suggest import unknown

NAMED_KINDS = ("named", "cases")  # dimensions whose values are names of entries


class GridError(ValueError):
    """A ``--grid`` item that does not fit the spec (the message names the item)."""


def parse_grid_item(item: str) -> tuple[str, list[Any]]:
    """``"train.lr=0.01,0.1"`` -> ``("train.lr", [0.01, 0.1])``."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or not text.strip():
        raise GridError(f"--grid {item!r}: expected KEY=v1,v2,... (e.g. --grid train.lr=0.01,0.1)")
    values = []
    for part in text.split(","):
        if not part.strip():
            raise GridError(f"--grid {item!r}: an empty value between commas; give KEY=v1,v2,...")
        value = parse_yaml(part, f"--grid {key}")
        if isinstance(value, (dict, list)):
            raise GridError(f"--grid {item!r}: {part.strip()!r} is a {type(value).__name__}; --grid takes "
                            "scalars (numbers, words, true/false, null); put other values in the spec")
        if value in values:
            raise GridError(f"--grid {item!r}: {value!r} is given twice")
        values.append(value)
    return key, values


def apply_grid(space: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """A copy of ``space`` with each ``--grid`` item applied (unknown keys get the closest one)."""
    space = copy.deepcopy(space)
    seen: set[str] = set()
    for item in items:
        key, values = parse_grid_item(item)
        if key in seen:
            raise GridError(f"--grid {key}: the key is given twice; give its values once, comma-separated")
        seen.add(key)
        if key not in space:
            raise GridError(f"--grid {key}: {unknown('key of the space', key, space, 'the space has')} "
                            f"(to fix a key the spec does not sweep, use --set {key}=VALUE)")
        dist = space[key]
        kind = next(iter(dist)) if isinstance(dist, dict) and len(dist) == 1 else None
        if kind in NAMED_KINDS and isinstance(dist[kind], dict):
            entries, what = dist[kind], "case" if kind == "cases" else "name"
            for name in values:
                if str(name) not in entries:
                    raise GridError(f"--grid {key}: {unknown(what, name, entries)}")
            space[key] = {kind: {str(name): entries[str(name)] for name in values}}
        else:
            space[key] = {"grid": values}
    return space
