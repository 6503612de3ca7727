"""Strict YAML for configs, overrides and sweep specs.

PyYAML's ``safe_load`` keeps the last of two equal keys, reads ``1e-3`` as a string and reports
errors without saying which file. :func:`load_yaml` refuses duplicate keys, reads ``1e-3`` as a
float (as YAML 1.2 and most people do) and raises :class:`YamlError`, whose message is
``<file>:<line>:<column>: <problem>``. :func:`check_values` refuses non-finite numbers
(``.inf``, ``.nan``) anywhere in a mapping, naming the dotted key.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from engine.errors import ConfigError


class YamlError(ConfigError):
    """Unreadable YAML; the message names the file, line and column."""


class _StrictLoader(yaml.SafeLoader):
    pass


# Floats without a dot (1e-3, 5E+2), which YAML 1.1 leaves as strings.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


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
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        if mark is None:
            where = source
        elif source.startswith("--set"):  # a one-line value: the column is enough
            where = f"{source} (column {mark.column + 1} of {text.strip()!r})"
        else:
            where = f"{source}:{mark.line + 1}:{mark.column + 1}"
        problem = " ".join(p for p in (err.context, err.problem) if p)
        raise YamlError(f"{where}: invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise YamlError(f"{source}: invalid YAML: {err}") from None


def read_yaml_file(path: str | Path, what: str = "config file") -> Any:
    """Read and parse a YAML file; a missing, unreadable, binary or empty file is a YamlError."""
    path = Path(path)
    if path.is_dir():
        raise YamlError(f"{what} {str(path)!r} is a directory, not a YAML file")
    if not path.exists():
        raise YamlError(f"{what} {str(path)!r} does not exist")
    try:
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
