"""Generators of what a user types (Hypothesis strategies), and the property every entry point
keeps: a valid result or a :class:`engine.errors.UserError` whose message names something the
user wrote; never another exception, never a hang.

The configs start from the default experiment and every shipped example and template, and are
mutated at every depth: a section or field given as another YAML type (scalar, list, mapping,
null), a part left out, an unknown key, NaN, ±inf, huge and negative numbers, booleans for
numbers, numbers with units, unicode and very long strings; as a mapping and as ``--set`` text.

Budget: the ``ci`` profile (the default, derandomised: the same examples on every run, a few
seconds in all) and ``long`` (``HYPOTHESIS_PROFILE=long``, random, thousands of examples; ``make
fuzz``). A case a long run finds is kept as an ``@example`` of its test (the example database,
``.hypothesis/``, is not in a fresh clone).
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import typing
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from helpers import REPO

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture])
settings.register_profile(
    "long", max_examples=4000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HANG_S = 60  # one example past this is a hang, whatever the machine's load


def examples(share: float) -> int:
    """A test's number of examples: ``share`` of the profile's (an entry point that loads data
    takes a smaller share than one that only parses)."""
    return max(3, int(settings.default.max_examples * share))


@contextlib.contextmanager
def no_hang(seconds: int = HANG_S):
    """Fail (not wait) when the body runs past ``seconds``."""
    def _raise(signum, frame):
        raise AssertionError(f"no answer after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------- values


UNITS = ["ms", "s", "min", "h", "us", "Mbps", "kbps", "Gbps", "bit/s", "MB/s", "GB", "MB", "KiB", "W", "mJ",
         "Wh", "%", "x", "parsecs", "TFLOPS"]
NAMES = ["fedavg", "fedprox", "ascend", "topk", "digits", "mlp", "cnn", "iid", "natural", "ray", "auto",
         "laptop_cpu", "5mbps", "wifi", "builtin:fluctuating_links", "night_charging", "all", "fedbuff"]
ODD_TEXT = ["", " ", "~", "$UNSET_VAR_X", "..", "/", "a/b", "\x00", "\u00e9t\u00e9", "\U0001f600", "NaN",
            "1e-3", "true", "null", "0x1F", "-", "s3://bucket/x", "traces/x.csv"]


def numbers() -> st.SearchStrategy:
    return st.one_of(
        st.integers(-5, 60),
        st.sampled_from([0, -1, 2 ** 31, 2 ** 63, 2 ** 64, -2 ** 64, 10 ** 30, 10 ** 400 // 10 ** 300]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, -0.0, 0.5, 1.0, 1e-300, 1e300, float("nan"), float("inf"), -float("inf"), 5e6]))


def with_units() -> st.SearchStrategy:
    return st.builds(lambda n, sep, u: f"{n}{sep}{u}", st.sampled_from(["500", "2", "0.5", "1e3", "-3", "5"]),
                     st.sampled_from(["", " "]), st.sampled_from(UNITS))


def scalars(long_strings: bool = True) -> st.SearchStrategy:
    texts = [st.text(max_size=12), st.sampled_from(NAMES + ODD_TEXT), with_units()]
    if long_strings:
        texts.append(st.sampled_from(["x" * 300, "\u00e9" * 5000, "a." * 2000]))
    return st.one_of(st.none(), st.booleans(), numbers(), *texts)


def keys() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(["name", "low", "high", "kind", "file", "sets", "a", "0"] + NAMES),
                     st.text(min_size=1, max_size=8), st.integers(-2, 3))


def values(long_strings: bool = True) -> st.SearchStrategy:
    """Any YAML value: scalars, lists and mappings of them."""
    return st.recursive(scalars(long_strings),
                        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                st.dictionaries(keys(), inner, max_size=3)),
                        max_leaves=6)


def light_values() -> st.SearchStrategy:
    """Values that cannot ask for a huge computation (small numbers): for the entry points that
    load the data and build the models, where a field may legitimately size the work."""
    small = st.one_of(st.none(), st.booleans(), st.integers(-3, 12),
                      st.sampled_from([0.0, 0.5, 1.0, 1.5, -0.1, float("nan"), float("inf")]),
                      st.sampled_from(NAMES + ODD_TEXT), with_units())
    return st.recursive(small, lambda inner: st.one_of(st.lists(inner, max_size=2),
                                                       st.dictionaries(keys(), inner, max_size=2)), max_leaves=4)


# ---------------------------------------------------------------- configs and their paths


def read_config(path: Path) -> dict[str, Any]:
    """A config file as the mapping ``load_config`` reads from it (paths resolved against its folder)."""
    from engine.config.paths import resolve_paths
    from engine.config.yamlio import read_yaml_file

    raw, _ = resolve_paths(read_yaml_file(path), path.parent, str(path))
    return raw


def base_configs() -> dict[str, dict[str, Any]]:
    """The default experiment, every shipped example config and study config, and every template."""
    from hetsim.templates import TEMPLATES, render

    files = [REPO / "engine/config/default.yaml", *sorted((REPO / "configs").glob("*.yaml")),
             REPO / "studies/energy_wearables.yaml"]
    out = {str(p.relative_to(REPO)): read_config(p) for p in files}
    for name in TEMPLATES:
        out[f"template:{name}"] = yaml.safe_load(render(name, "exp.yaml"))
    return out


SMALL = {"rounds": 1, "dataset": {"name": "digits"}, "model": {"name": "mlp"}, "partition": {"scheme": "iid"},
         "clients": {"num_clients": 4, "participation": 1.0}, "output": {"dir": "runs"}}


def paths_of(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a mapping (keys; list positions as ints), the root excluded."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*prefix, k))
            out += paths_of(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((*prefix, i))
            out += paths_of(v, (*prefix, i))
    return out


@functools.cache
def schema_paths(model=None, prefix: tuple = (), depth: int = 0) -> tuple[tuple, ...]:
    """Every field path of a pydantic schema, the experiment's by default (a mapping's key as
    ``a``, a list's item as 0)."""
    from pydantic import BaseModel

    from engine.config.schema import ExperimentConfig

    model = model or ExperimentConfig
    out = []
    if depth > 6:
        return out
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        out.append(path)
        for t in _alternatives(field.annotation):
            origin, args = typing.get_origin(t), typing.get_args(t)
            if isinstance(t, type) and issubclass(t, BaseModel):
                out += schema_paths(t, path, depth + 1)
            elif origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
                out += schema_paths(args[1], (*path, "a"), depth + 1)
            elif origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
                out += schema_paths(args[0], (*path, 0), depth + 1)
    return tuple(sorted(set(out), key=lambda p: tuple(map(str, p))))


def _alternatives(t: Any) -> list[Any]:
    import types

    origin = typing.get_origin(t)
    if origin is typing.Annotated:
        return _alternatives(typing.get_args(t)[0])
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(t) for a in _alternatives(arg)]
    return [t]


def set_path(raw: dict, path: tuple, value: Any) -> None:
    node = raw
    for part in path[:-1]:
        child = node.get(part) if isinstance(node, dict) else (node[part] if isinstance(node, list)
                                                               and isinstance(part, int) and part < len(node) else None)
        if not isinstance(child, (dict, list)):
            child = {}
            if isinstance(node, dict):
                node[part] = child
            else:
                return
        node = child
    if isinstance(node, dict):
        node[path[-1]] = value
    elif isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node):
        node[path[-1]] = value


def delete_path(raw: dict, path: tuple) -> None:
    node: Any = raw
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(path[-1], None)
    elif isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node):
        node.pop(path[-1])


@st.composite
def mutated(draw, bases: dict[str, dict], value_strategy=None, avoid: tuple[str, ...] = (),
            schema=None) -> tuple[dict, list]:
    """A base mapping with 1-3 mutations; returns it and the paths mutated. ``avoid``: dotted
    prefixes not to touch; ``schema``: the pydantic model whose field paths are mutated too
    (default: the experiment's), so a section the base leaves out is given as well."""
    import copy

    value_strategy = values() if value_strategy is None else value_strategy
    fields = schema_paths(schema)
    name = draw(st.sampled_from(sorted(bases)))
    raw = copy.deepcopy(bases[name])
    touched = []
    for _ in range(draw(st.integers(1, 3))):
        candidates = [p for p in sorted(set(paths_of(raw)) | set(fields), key=lambda p: tuple(map(str, p)))
                      if not dotted(p).startswith(avoid)]
        path = draw(st.sampled_from(candidates))
        op = draw(st.sampled_from(["set", "set", "set", "delete", "unknown", "bool", "unit"]))
        if op == "delete":
            delete_path(raw, path)
        elif op == "unknown":
            set_path(raw, (*path[:-1], draw(st.sampled_from(["lrr", "mu", "modle", "x", "\u00e9"]))),
                     draw(value_strategy))
        elif op == "bool":
            set_path(raw, path, draw(st.booleans()))
        elif op == "unit":
            set_path(raw, path, draw(with_units()))
        else:
            set_path(raw, path, draw(value_strategy))
        touched.append(path)
    return raw, touched


def dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def as_override(path: tuple, value: Any) -> str:
    """``--set`` text of setting ``path`` to ``value`` (the value as YAML flow text)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10 ** 9, allow_unicode=True).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return f"{dotted(path)}={text}"


# ---------------------------------------------------------------- the property


_FIELD = re.compile(r"^\s+(\S+)(?: = |: required)")


def _normal(field: str) -> str:
    return re.sub(r"\[(\d+)\]", r".\1", field)


def known_fields(*raws: Any, extra: tuple[str, ...] = ()) -> set[str]:
    """Every dotted path of the inputs, and their parents."""
    out = set(extra)
    for raw in raws:
        out |= {dotted(p) for p in paths_of(raw)}
    return out


def assert_names_an_input_field(message: str, known: set[str]) -> None:
    """Each problem line of ``message`` names a field of the input: its ``field = `` is a path
    the user gave (or a missing key of a section the user gave), or the line mentions one."""
    lines = [line for line in message.splitlines() if line.strip()]
    assert lines, "an empty message"
    problems = [line for line in lines[1:] if line.startswith("  ")] or lines[:1]
    for line in problems:
        m = _FIELD.match(line)
        if m:
            field = _normal(m.group(1))
            parent = field.rsplit(".", 1)[0] if "." in field else ""
            assert field in known or parent in known or "." not in field or field == "<root>", (field, message)
        else:
            assert any(k in line for k in known if k), (line, message)
