"""Plain words for pydantic's type errors in a config: a value with a unit (converted to the
field's unit), a value of another type where a section is expected, an unknown method name, an
option of another method (:func:`engine.config.schema._format_errors` asks), and the field named
as the user wrote it (:func:`input_loc`: pydantic's union members left out; the sweep spec's
errors use it too); and what pydantic does not check: the device and network tiers
(:func:`tier_problems`), a sampled bandwidth's range (:func:`bandwidth_problems`)."""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

from hardware_profiles.catalog import load_catalog
from hardware_profiles.profile import BANDWIDTH_MAX_MBPS, BANDWIDTH_MIN_MBPS, bandwidth_advice, plain_number
from hardware_profiles.suggest import did_you_mean, suggestion, unknown

# a field's unit, from the end of its name: the schema's convention (down_mbps, memory_gb, ...)
_UNITS = (("_mbps", "Mbps"), ("_gb", "GB"), ("_mb", "MB"), ("_wh", "Wh"), ("_w", "W"), ("_j", "J"),
          ("_bytes", "bytes"), ("_s", "seconds"), ("gflops", "GFLOP/s"))
_WITH_UNIT = re.compile(r"^\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)\s*([A-Za-z/%]+)\s*$")
_NUMBER_ERRORS = {"float_parsing", "int_parsing", "float_type", "int_type"}


def unit_of(loc: list[str]) -> str | None:
    """The unit a numeric field at ``loc`` is in (None if its name does not say)."""
    name = loc[-1] if loc else ""
    if len(loc) >= 2 and loc[-2] == "bandwidth" and name in ("low", "high"):
        return "Mbps"
    if "_ns_" in name:
        return "ns"
    return next((unit for suffix, unit in _UNITS if name.endswith(suffix)), None)


# per unit of a field: the units a value may be written in, and their size in that unit
_SCALES: dict[str, dict[str, float]] = {
    "seconds": {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "secs": 1.0,
                "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0,
                "minutes": 60.0, "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
                "d": 86400.0, "day": 86400.0, "days": 86400.0},
    "Mbps": {"bps": 1e-6, "bit/s": 1e-6, "b/s": 1e-6, "kbps": 1e-3, "kbit/s": 1e-3, "kb/s": 1e-3,
             "mbps": 1.0, "mbit/s": 1.0, "mb/s": 1.0, "gbps": 1e3, "gbit/s": 1e3, "gb/s": 1e3,
             "tbps": 1e6, "tbit/s": 1e6, "Bps": 8e-6, "B/s": 8e-6, "kB/s": 8e-3, "KB/s": 8e-3,
             "MB/s": 8.0, "MBps": 8.0, "GB/s": 8e3, "GBps": 8e3},
    "GB": {"kb": 1e-6, "mb": 1e-3, "gb": 1.0, "tb": 1e3, "kib": 1024 / 1e9, "mib": 2 ** 20 / 1e9,
           "gib": 2 ** 30 / 1e9, "tib": 2 ** 40 / 1e9},
    "MB": {"kb": 1e-3, "mb": 1.0, "gb": 1e3, "tb": 1e6, "kib": 1024 / 1e6, "mib": 2 ** 20 / 1e6,
           "gib": 2 ** 30 / 1e6},
    "bytes": {"b": 1.0, "byte": 1.0, "bytes": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024.0,
              "mib": 2.0 ** 20, "gib": 2.0 ** 30},
    "W": {"mw": 1e-3, "w": 1.0, "kw": 1e3},
    "J": {"mj": 1e-3, "j": 1.0, "kj": 1e3},
    "Wh": {"mwh": 1e-3, "wh": 1.0, "kwh": 1e3},
    "GFLOP/s": {"mflops": 1e-3, "gflops": 1.0, "tflops": 1e3, "gflop/s": 1.0, "tflop/s": 1e3},
    "ns": {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9},
}
# the units whose case carries meaning: B is a byte, b a bit
_CASED = {"Bps", "B/s", "kB/s", "KB/s", "MB/s", "MBps", "GB/s", "GBps"}


def unit_scale(written: str, unit: str) -> float | None:
    """How many of ``unit`` one ``written`` is (``ms`` in seconds: 0.001), or None if unknown."""
    scales = _SCALES.get(unit, {})
    if written in scales and (written in _CASED or written.lower() == written):
        return scales[written]
    if written not in _CASED:
        return scales.get(written.lower()) if written.lower() not in _CASED else None
    return None


def _with_unit(value: str, written: str, number: str, unit: str | None) -> str:
    """The advice for a number written with a unit: converted to the field's unit when known."""
    if unit is None:
        return f"a number with a unit ({written!r}); the field takes a plain number: write it without the unit"
    scale = unit_scale(written, unit)
    if scale is None:
        return f"a number with a unit ({written!r}) that is not one of {unit}; give a number in {unit}"
    converted = plain_number(float(number) * scale)
    if scale == 1.0:
        return f"a number with a unit ({written!r}); the unit is {unit} already: give {converted}"
    return f"{value.strip()} = {converted} {unit}: give {converted} (the field is in {unit})"


def yaml_kind(value: Any) -> str:
    """What a YAML value is, in a user's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({value!r})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string" if len(value) > 40 else f"a string ({value!r})"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def friendly(e: dict[str, Any], loc: list[str], keys: list[str] = ()) -> str | None:
    """A clearer message for the pydantic error ``e`` at ``loc``, or None to keep pydantic's;
    ``keys``: the keys of the section at ``loc`` (named when a section is given as another type)."""
    value = e.get("input")
    if e["type"] in _NUMBER_ERRORS and isinstance(value, str):
        m = _WITH_UNIT.match(value)
        unit = unit_of(loc)
        if m:  # '5Mbps', '500ms': the unit belongs in the field's name, not its value
            return _with_unit(value, m.group(4), m.group(1), unit)
        kind = "an integer" if e["type"].startswith("int") else "a number"
        return f"not a number; give {kind}{f' in {unit}' if unit else ''}"
    if loc and loc[-1] == "bandwidth" and e["type"] in ("model_type", "dict_type"):
        return ("bandwidth is a distribution of per-client Mbps, e.g. {distribution: loguniform, low: 5, "
                "high: 500}; for one link speed give a network tier mix instead, e.g. network: {5mbps: 1.0} "
                "(`hetsim list tiers`)")
    if e["type"] in ("model_type", "model_attributes_type", "dict_type") and not isinstance(value, dict):
        listed = f" ({', '.join(keys)})" if keys else ""
        return f"{'.'.join(loc) or 'the config'} is a section: a mapping of keys{listed}, not {yaml_kind(value)}"
    if isinstance(e.get("msg"), str) and "allow_out_of_range=True" in e["msg"]:
        return e["msg"].removeprefix("Value error, ").replace(
            "pass allow_out_of_range=True", "set clients.profiles.allow_out_of_range: true")
    if e["type"] == "union_tag_invalid":  # a tagged section's tag picks its class (clock.deadline.policy)
        ctx = e.get("ctx") or {}
        tags = re.findall(r"'([^']+)'", str(ctx.get("expected_tags", "")))
        return unknown(str(ctx.get("discriminator", "name")).strip("'"), ctx.get("tag"), tags)
    if e["type"] == "literal_error" and isinstance(value, str):  # e.g. partition.scheme: dirichelt
        best = did_you_mean(value, re.findall(r"'([^']+)'", str((e.get("ctx") or {}).get("expected", ""))))
        return f"{e['msg']}; did you mean {best!r}?" if best else None
    return None


# pydantic's type errors, as the kind of value that was wanted
TYPE_KINDS = {"string_type": "a string", "dict_type": "a mapping", "model_type": "a mapping",
              "model_attributes_type": "a mapping", "list_type": "a list", "tuple_type": "a list",
              "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
              "float_type": "a number", "float_parsing": "a number", "bool_type": "a boolean",
              "bool_parsing": "a boolean", "none_required": "null"}


def input_loc(loc: tuple, raw: Any) -> tuple[list[str], bool]:
    """Pydantic's ``loc`` as the path the user wrote: the members of a union pydantic tried
    (``str``, ``function-after[...]``, a method's or a process's tag) left out; a missing key kept.
    Also whether the error is about a mapping's key (``[key]``)."""
    out, node, key_error = [], raw, False
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if part == "[key]":
            key_error = True
            if out and str(loc[i - 1]) == out[-1]:
                out.pop()  # the key itself: the mapping it is in is the field
        elif isinstance(node, dict) and _key_in(part, node) is not None:
            key = _key_in(part, node)
            out.append(str(key))
            node = node[key]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(str(part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, str) and not _is_union_member(part):
            out.append(part)  # a list a validator turned into a mapping (trackers: [a, b]): its entry
            node = None
        elif last and isinstance(node, dict) and not _is_union_member(part):
            out.append(str(part))  # a required key left out
    return out, key_error


def _key_in(part: Any, node: dict) -> Any:
    if part in node:
        return part
    return next((k for k in node if str(k) == str(part)), None)


def _is_union_member(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "none", "list", "dict"))


def value_at(raw: Any, loc: list[str]) -> Any:
    """The value at ``loc`` (as :func:`input_loc` gives it) in ``raw``; None if there is none."""
    node = raw
    for part in loc:
        key = _key_in(part, node) if isinstance(node, dict) else None
        if key is None:
            return None
        node = node[key]
    return node


def tier_problems(spec: Any) -> list[str]:
    """Unknown tier names of the device and network mixes of ``clients.profiles`` (a raw mapping
    or a validated spec), before the data is loaded: one line each, with the closest name."""
    get = spec.get if isinstance(spec, dict) else (lambda key: getattr(spec, key, None))
    try:
        catalog = load_catalog(get("catalog"))
    except (ValueError, OSError, TypeError):  # a broken catalog is reported where the profiles are built
        return []
    out = []
    for field, known, what in (("devices", catalog.devices, "device tier"), ("network", catalog.networks,
                                                                              "network tier")):
        mix = get(field) or {}
        if isinstance(mix, dict):
            out += [f"  clients.profiles.{field} = {mix!r}: {unknown(what, name, known)}"
                    for name in mix if str(name) not in known]
    return out


def bandwidth_problems(spec: Mapping[str, Any]) -> list[str]:
    """A sampled bandwidth (``clients.profiles.bandwidth``) whose ``low`` or ``high`` is outside
    the catalog range: said of the field given, before any client's link is drawn from it."""
    dist = spec.get("bandwidth")
    if not isinstance(dist, dict) or spec.get("allow_out_of_range") is True:
        return []
    out = []
    for key in ("low", "high"):
        v = dist.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 \
                and not BANDWIDTH_MIN_MBPS <= v <= BANDWIDTH_MAX_MBPS:
            advice = bandwidth_advice(v).replace("pass allow_out_of_range=True",
                                                 "set clients.profiles.allow_out_of_range: true")
            out.append(f"  clients.profiles.bandwidth.{key} = {v!r}: {plain_number(v)} Mbps is outside the "
                       f"catalog range {advice}")
    return out


def algorithm_key_problem(key: str, method: Any, methods: Mapping[str, type]) -> str:
    """An unknown key of the ``algorithm`` section: the options of the method named (with the
    closest one), and the methods that have ``key`` as an option. ``methods``: each method's name
    and its params class (a pydantic model)."""
    cls = methods.get(method) if isinstance(method, str) else None
    allowed = [f for f in cls.model_fields if f != "name"] if cls is not None else []
    owners = sorted(m for m, c in methods.items() if m != method and key in c.model_fields)
    text = "unknown key" if cls is None else (
        f"unknown key; {suggestion(key, allowed)}allowed keys of algorithm {method!r}: {', '.join(['name', *allowed])}")
    if owners:
        text += (f"; {key} is an option of {' and '.join(owners)} (algorithm.name: {owners[0]}), "
                 f"not of {method}")
    return text

