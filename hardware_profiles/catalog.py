"""Named device and network tiers (built-in ``catalog.yaml`` + user YAML).

``load_catalog(extra)`` merges user tiers into the built-in ones:

* a new tier name extends the catalog and must give every required field;
* an existing tier name overrides it field by field (so ``{devices: {rpi4:
  {availability: 0.5}}}`` changes only rpi4's availability).

Bandwidth *range* (5–500 Mbps) is not checked here, only at profile level,
so a user may define e.g. a 3G tier and use it with ``allow_out_of_range``.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any, Mapping, Union

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .profile import SELECT_FIELDS, HardwareProfile, SelectionCosts, rule_violation
from .suggest import unknown

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")

ExtraCatalog = Union[str, os.PathLike, Mapping[str, Any], None]


class CatalogError(ValueError):
    """A tier's field breaks its rule (the message names the tier and the field)."""


class UnknownTierError(ValueError):
    """A tier name that is not in the catalog (message lists the known ones)."""


def _check(field: str, v: float) -> float:
    # allow_out_of_range=True: range is a profile-level rule, positivity is not.
    msg = rule_violation(field, v, allow_out_of_range=True)
    if msg:
        raise ValueError(msg)
    return v


class _DeviceTierHead(BaseModel):
    """The fields of :class:`DeviceTier` before its selection costs (kept in this order, as the
    YAML lists them and as its errors are reported)."""

    gflops: float
    memory_gb: float
    availability: float
    dropout: float
    source: str = ""
    # power model (hardware_profiles.energy); left out: NaN, the tier's energy is unknown
    train_w: float = math.nan
    idle_w: float = math.nan
    battery_wh: float = 0.0  # 0: mains-powered
    power_source: str = ""


class DeviceTier(SelectionCosts, _DeviceTierHead):
    """A device tier: :class:`_DeviceTierHead`'s fields, the :class:`SelectionCosts` (left out:
    NaN, the op-count model prices selection), then where those came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    select_source: str = ""

    @field_validator("gflops", "memory_gb", "availability", "dropout", "train_w", "idle_w", "battery_wh",
                     *SELECT_FIELDS)
    @classmethod
    def _rules(cls, v: float, info) -> float:
        return _check(info.field_name, v)


class NetworkTier(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    down_mbps: float
    up_mbps: float
    latency_s: float
    source: str = ""
    rx_w: float = math.nan
    tx_w: float = math.nan
    tail_j: float = math.nan
    power_source: str = ""

    @field_validator("down_mbps", "up_mbps", "latency_s", "rx_w", "tx_w", "tail_j")
    @classmethod
    def _rules(cls, v: float, info) -> float:
        return _check(info.field_name, v)


class Catalog(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    devices: dict[str, DeviceTier]
    networks: dict[str, NetworkTier]

    def device(self, name: str) -> DeviceTier:
        try:
            return self.devices[name]
        except KeyError:
            raise UnknownTierError(unknown("device tier", name, self.devices, "known device tiers")) from None

    def network(self, name: str) -> NetworkTier:
        try:
            return self.networks[name]
        except KeyError:
            raise UnknownTierError(unknown("network tier", name, self.networks, "known network tiers")) from None

    def profile(self, device: str, network: str, *, allow_out_of_range: bool = False) -> HardwareProfile:
        """A single :class:`HardwareProfile` for ``device`` on ``network``."""
        d, n = self.device(device), self.network(network)
        return HardwareProfile(
            name=f"{device}@{network}",
            gflops=d.gflops,
            memory_gb=d.memory_gb,
            availability=d.availability,
            dropout=d.dropout,
            train_w=d.train_w,
            idle_w=d.idle_w,
            battery_wh=d.battery_wh,
            **{f: getattr(d, f) for f in SELECT_FIELDS},
            rx_w=n.rx_w,
            tx_w=n.tx_w,
            tail_j=n.tail_j,
            down_mbps=n.down_mbps,
            up_mbps=n.up_mbps,
            latency_s=n.latency_s,
            tier=device,
            net_tier=network,
            allow_out_of_range=allow_out_of_range,
        )


@functools.lru_cache(maxsize=1)
def _builtin_raw() -> dict[str, Any]:
    with open(CATALOG_PATH, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _read_extra(extra: ExtraCatalog) -> dict[str, Any]:
    if extra is None:
        return {}
    if isinstance(extra, Mapping):
        data: Any = extra
    elif isinstance(extra, os.PathLike) or (isinstance(extra, str) and _looks_like_path(extra)):
        with open(extra, encoding="utf-8") as f:
            data = _parse(f, f"file {str(extra)!r}")
    elif isinstance(extra, str):
        data = _parse(extra, "text")  # inline YAML text
    else:
        raise TypeError(f"extra catalog must be a path, YAML text, dict or None, got {type(extra).__name__}")
    data = data or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"extra catalog must be a mapping with 'devices'/'networks', got {type(data).__name__}")
    unknown = set(data) - {"devices", "networks"}
    if unknown:
        raise ValueError(f"extra catalog has unknown top-level keys {sorted(unknown)}; "
                         "allowed: ['devices', 'networks']")
    return dict(data)


class _UniqueKeys(yaml.SafeLoader):
    """A tier or a field given twice in a catalog is refused (PyYAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise CatalogError(f"catalog: {key!r} is given twice (lines {seen[key].start_mark.line + 1} "
                                       f"and {key_node.start_mark.line + 1}); give each tier and field once")
                seen[key] = key_node
            except TypeError:  # an unhashable key: the mapping's own check refuses it
                continue
        return super().construct_mapping(node, deep=deep)


def _parse(text: Any, what: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:  # a user's text: said as a catalog error, not a parser's traceback
        raise CatalogError(f"extra catalog {what} is not valid YAML: {' '.join(str(err).split())}") from None


def _looks_like_path(s: str) -> bool:
    # A one-line string ending in .yaml/.yml or naming an existing file is a path;
    # anything else is treated as inline YAML.
    return "\n" not in s and (s.endswith((".yaml", ".yml")) or os.path.isfile(s))


def load_catalog(extra_yaml: ExtraCatalog = None) -> Catalog:
    """Built-in catalog, extended/overridden by ``extra_yaml``.

    ``extra_yaml`` may be a path to a YAML file, inline YAML text, an already
    parsed dict, or None. Keys are stringified so YAML like ``5mbps`` and
    numeric-looking names behave the same.
    """
    base = _builtin_raw()
    extra = _read_extra(extra_yaml)
    merged: dict[str, dict[str, dict[str, Any]]] = {}
    for section in ("devices", "networks"):
        tiers = {str(k): dict(v) for k, v in (base.get(section) or {}).items()}
        given = extra.get(section) or {}
        if not isinstance(given, Mapping):
            raise CatalogError(f"catalog {section} = {given!r} must be a mapping of tier names to their fields")
        for name, fields in given.items():
            if not isinstance(fields, Mapping):
                raise ValueError(f"{section}.{name} must be a mapping of fields, got {fields!r}")
            tiers[str(name)] = {**tiers.get(str(name), {}), **fields}
        merged[section] = tiers
    try:
        return Catalog.model_validate(merged)
    except ValidationError as err:  # one line per field, named as in the YAML
        lines = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"])
            text = str(e["msg"]).removeprefix("Value error, ")
            if e["type"] == "missing":
                lines.append(f"catalog {where}: missing (a new tier gives every field without a default)")
            elif e["type"] == "value_error":
                lines.append(f"catalog {where}: {text}")
            else:
                lines.append(f"catalog {where} = {e.get('input')!r}: {text}")
        raise CatalogError("; ".join(lines)) from None


@functools.lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The built-in catalog (cached; Catalog is immutable)."""
    return load_catalog(None)
