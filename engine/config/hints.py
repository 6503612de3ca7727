"""Plain words for pydantic's type errors in a config: a value with a unit, a string where a
section is expected, an unknown method name (:func:`engine.config.schema._format_errors` asks);
and the names pydantic does not check, the device and network tiers (:func:`tier_problems`)."""
from __future__ import annotations

import re
from typing import Any

from hardware_profiles.catalog import load_catalog
from hardware_profiles.suggest import did_you_mean, unknown

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


def friendly(e: dict[str, Any], loc: list[str]) -> str | None:
    """A clearer message for the pydantic error ``e`` at ``loc``, or None to keep pydantic's."""
    value = e.get("input")
    if e["type"] in _NUMBER_ERRORS and isinstance(value, str):
        m = _WITH_UNIT.match(value)
        unit = unit_of(loc)
        if m:  # '5Mbps', '2 GB': the unit belongs in the field's name, not its value
            where = f"give a number in {unit}" if unit else "give a plain number"
            return f"a number with a unit ({m.group(4)!r}); {where}, e.g. {m.group(1)}"
        kind = "an integer" if e["type"].startswith("int") else "a number"
        return f"not a number; give {kind}{f' in {unit}' if unit else ''}"
    if loc and loc[-1] == "bandwidth" and e["type"] in ("model_type", "dict_type"):
        return ("bandwidth is a distribution of per-client Mbps, e.g. {distribution: loguniform, low: 5, "
                "high: 500}; for one link speed give a network tier mix instead, e.g. network: {5mbps: 1.0} "
                "(`hetsim list tiers`)")
    if e["type"] == "model_type" and not isinstance(value, dict):
        return f"a section of keys is expected here, not a {type(value).__name__}"
    if e["type"] == "literal_error" and isinstance(value, str):  # e.g. partition.scheme: dirichelt
        best = did_you_mean(value, re.findall(r"'([^']+)'", str((e.get("ctx") or {}).get("expected", ""))))
        return f"{e['msg']}; did you mean {best!r}?" if best else None
    return None


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
