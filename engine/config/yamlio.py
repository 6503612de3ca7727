"""Strict YAML for configs, overrides and sweep specs.

PyYAML's ``safe_load`` keeps the last of two equal keys, reads ``1e-3`` as a string, ``22:30``
as the base-60 integer 1350, and reports errors without saying which file. :func:`load_yaml`
refuses duplicate keys, reads ``1e-3`` as a float and ``22:30`` as a string (as YAML 1.2 and
most people do) and raises :class:`YamlError`, whose message is
``<file>:<line>:<column>: <problem>``. :func:`check_values` refuses non-finite numbers
(``.inf``, ``.nan``) anywhere in a mapping, naming the dotted key.

Hostile documents are refused before they cost time or memory: a file above
:data:`MAX_YAML_BYTES` (the pure-Python parser reads ~0.3-1 MB/s, so larger configs would take
minutes; profile tables belong in CSV/Parquet files), nesting deeper than :data:`MAX_DEPTH`, and
aliases that expand to more than :data:`MAX_ALIAS_NODES` nodes ("billion laughs": a few hundred
bytes that expand to 10^9 nodes) or that refer to a node containing them (a cycle).
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from engine.errors import ConfigError


class YamlError(ConfigError):
    """Unreadable YAML; the message names the file, line and column."""


MAX_YAML_BYTES = int(float(os.environ.get("HETSIM_YAML_MAX_MB", "10")) * 1_000_000)
MAX_DEPTH = 100  # nested mappings / lists; configs use < 10
MAX_ALIAS_NODES = 100_000  # nodes that aliases may add in total once expanded


class _LimitError(yaml.MarkedYAMLError):
    """A document beyond one of the limits above (reported as refused, not as a syntax error)."""


class _StrictLoader(yaml.SafeLoader):
    """Counts while composing: nesting depth, and the expanded size of every collection, so an
    alias costs its target's full size (aliases are shared nodes, but everything after the
    parser walks them as copies)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}  # id(collection node) -> expanded node count

    def _size(self, node: yaml.Node) -> int | None:
        return 1 if isinstance(node, yaml.ScalarNode) else self._sizes.get(id(node))

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:  # an unknown anchor: PyYAML's own error follows
                size = self._size(target)
                if size is None:
                    raise _LimitError(None, None, f"alias *{event.anchor} refers to a node that "
                                      "contains it (a cycle); hetsim refuses recursive aliases",
                                      event.start_mark)
                self._alias_nodes += size
                if self._alias_nodes > MAX_ALIAS_NODES:
                    raise _LimitError(None, None, f"aliases expand to more than {MAX_ALIAS_NODES:,} "
                                      "nodes (an alias bomb?); hetsim refuses alias expansion beyond "
                                      "that limit", event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _LimitError(None, None, f"nested deeper than {MAX_DEPTH} levels; hetsim refuses "
                              "deeper nesting", self.peek_event().start_mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            self._sizes[id(node)] = 1 + sum(self._size(c) or 0 for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            self._sizes[id(node)] = 1 + sum((self._size(k) or 0) + (self._size(v) or 0)
                                            for k, v in node.value)
        return node


# Floats without a dot (1e-3, 5E+2), which YAML 1.1 leaves as strings.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


class _NoSexagesimal:
    """A resolver pattern that leaves out YAML 1.1's base-60 numbers: ``22:30`` (a time of day,
    e.g. ``clock.start``) stays the string it reads as, not the integer 1350."""

    def __init__(self, pattern):
        self.pattern = pattern

    def match(self, value: str):
        return None if ":" in value else self.pattern.match(value)


for _first, _resolvers in _StrictLoader.yaml_implicit_resolvers.items():  # the subclass's own copy
    _StrictLoader.yaml_implicit_resolvers[_first] = [
        (tag, _NoSexagesimal(rx) if tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float") else rx)
        for tag, rx in _resolvers]


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    loader.flatten_mapping(node)  # merge keys (<<) first: they may be overridden on purpose
    first: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable key {key!r}", key_node.start_mark) from None
        if key in first:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"duplicate key {key!r} (first given on line {first[key].start_mark.line + 1}); "
                "give each key once", key_node.start_mark)
        first[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str) -> Any:
    """Parse ``text`` strictly; ``source`` names it in errors (a path, or e.g. ``--set a.b``)."""
    if len(text) > MAX_YAML_BYTES:  # characters: at least as many bytes
        raise YamlError(_too_large(source, len(text.encode())))
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _LimitError as err:
        mark = err.problem_mark
        raise YamlError(f"{source}:{mark.line + 1}:{mark.column + 1}: YAML refused: {err.problem}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        if mark is None:
            where = source
        elif source.startswith(("--set", "--grid")):  # a one-line value: the column is enough
            where = f"{source} (column {mark.column + 1} of {text.strip()!r})"
        else:
            where = f"{source}:{mark.line + 1}:{mark.column + 1}"
        problem = " ".join(p for p in (err.context, err.problem) if p)
        raise YamlError(f"{where}: invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise YamlError(f"{source}: invalid YAML: {err}") from None


def _too_large(source: str, size: int) -> str:
    return (f"{source} is {size / 1e6:.1f} MB, above the {MAX_YAML_BYTES / 1e6:g} MB limit for YAML "
            "files (set HETSIM_YAML_MAX_MB to raise it; large profile tables belong in a CSV or "
            "Parquet file: clients.profiles.table)")


def read_yaml_file(path: str | Path, what: str = "config file") -> Any:
    """Read and parse a YAML file; a missing, unreadable, binary or empty file is a YamlError."""
    path = Path(path)
    if path.is_dir():
        raise YamlError(f"{what} {str(path)!r} is a directory, not a YAML file")
    if not path.exists():
        raise YamlError(f"{what} {str(path)!r} does not exist")
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:  # refused before reading it
            raise YamlError(f"{what} {_too_large(repr(str(path)), size)}")
        data = path.read_bytes()
    except OSError as err:
        raise YamlError(f"{what} {str(path)!r} cannot be read: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise YamlError(f"{what} {str(path)!r} is not a UTF-8 text file (byte {err.start}: "
                        f"{data[err.start:err.start + 1]!r}); give a YAML file") from None
    if "\x00" in text:
        raise YamlError(f"{what} {str(path)!r} is a binary file (it contains NUL bytes); give a YAML file")
    value = parse_yaml(text, str(path))
    if value is None:
        raise YamlError(f"{what} {str(path)!r} is empty (or only comments); give at least one "
                        "key, or leave out -c to run the built-in default experiment")
    return value


def check_values(raw: Any, prefix: str = "") -> list[str]:
    """Problems with values anywhere in ``raw``: non-finite numbers. One line per problem."""
    problems = []
    if isinstance(raw, dict):
        for key, value in raw.items():
            problems += check_values(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(raw, (list, tuple)):
        for i, value in enumerate(raw):
            problems += check_values(value, f"{prefix}[{i}]")
    elif isinstance(raw, float) and not math.isfinite(raw):
        problems.append(f"  {prefix or '<root>'} = {raw!r}: not a finite number; give a finite value")
    return problems
