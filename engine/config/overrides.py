"""``--set a.b=value`` overrides and dotted keys, applied to a raw config mapping before it is
validated (so an override is checked exactly like the file)."""
from __future__ import annotations

import copy
from typing import Any, Mapping

from engine.config.yamlio import parse_yaml
from engine.errors import ConfigError


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a", "b", "c"], parsed YAML value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value (e.g. train.lr=0.01)")
    key, raw = item.split("=", 1)
    return split_key(key.strip(), f"override {item!r}"), parse_yaml(raw, f"--set {key.strip()}")


def split_key(key: str, where: str) -> list[str]:
    """``"a.b"`` -> ``["a", "b"]``; an empty key or part (``a..b``, ``.a``) is an error."""
    parts = key.split(".")
    if not key or any(not p.strip() for p in parts):
        raise ConfigError(f"{where}: key {key!r} has an empty part; write dotted keys like train.lr")
    return parts


def apply_overrides(raw: dict[str, Any], overrides: list[str] | dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``raw`` with dotted-key overrides applied.

    Setting one of ``clients.profiles.network`` / ``bandwidth`` drops the other from ``raw``
    (they exclude each other); setting both in the same overrides is left to validation."""
    raw = copy.deepcopy(raw)
    items = overrides.items() if isinstance(overrides, Mapping) else map(parse_override, overrides)
    paths = []
    for key, value in items:
        path = split_key(key, f"override {key!r}") if isinstance(key, str) else key
        paths.append(tuple(path))
        node = raw
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {'.'.join(path)}: {'.'.join(path[:i + 1])} is a value "
                                  f"({child!r}), not a section")
            node = child
        node[path[-1]] = value
    _drop_replaced_link(raw, paths)
    return raw


def overrides_given_twice(items: list[str], where: str = "--set", then: str = "give each key once") -> str | None:
    """A key given twice among ``key=value`` items, naming both (None if each key is given once):
    a spec file's ``overrides:`` list refuses it; the command line's ``--set`` warns (``then``: the
    last one is used), as a shell alias with defaults and a later tweak is common; the Python
    API's lists are code, composed as ``[*BASE, "rounds=3"]``: the last wins."""
    first: dict[str, str] = {}
    for item in items:
        key = item.split("=", 1)[0].strip() if isinstance(item, str) else None
        if key is None:
            continue
        if key in first:
            return f"{where} {key} is given twice ({first[key]!r} and {item!r}); {then}"
        first[key] = item
    return None


LINK_KEYS = ("network", "bandwidth")  # clients.profiles: a tier mix or a distribution, not both


def _drop_replaced_link(raw: dict[str, Any], paths: list[tuple]) -> None:
    # the default config gives `bandwidth`; `--set ...network=` must not fail with "not both"
    given = {k for k in LINK_KEYS if any(p[:3] == ("clients", "profiles", k) for p in paths)}
    clients = raw.get("clients")
    profiles = clients.get("profiles") if isinstance(clients, dict) else None  # a bad section: validation says so
    if len(given) == 1 and isinstance(profiles, dict):
        profiles.pop(next(k for k in LINK_KEYS if k not in given), None)
