"""Assign hardware profiles to N clients, deterministically by seed.

Profiles are kept as column arrays (:class:`ProfileTable`), never as N
pydantic objects, so 10,000+ clients cost a few hundred KB.

Assignment order (later steps win, most specific last):

1. device mix ``devices`` (default: every client ``laptop_cpu``);
2. network mix ``network`` *or* sampled ``bandwidth`` (default: ``50mbps``);
3. ``table`` (CSV/Parquet, one row per client): a ``tier``/``net_tier`` cell
   pulls in that tier's catalog values, then any numeric columns overwrite;
   the table may hold any subset of the columns;
4. global ``availability`` / ``dropout`` overrides;
5. per-client ``overrides`` (same tier-then-fields rule as the table).

Proportion mixes use exact counts: largest-remainder rounding of p × N, ties
to the tier listed first, then a seeded permutation. Device and network
assignments use independent permutations.

Over 400 lines because the fleet specification, its validation and the vectorised sampler that
reads it are one concern; splitting them would separate each rule from the field it checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, create_model, field_validator, model_validator

from .catalog import Catalog, default_catalog, load_catalog
from .condition_spec import ConditionsSpec
from .energy import BatterySpec

if TYPE_CHECKING:  # pandas is imported where a table is read or built (config validation needs none)
    import pandas as pd
from .profile import (
    BANDWIDTH_MAX_MBPS,
    BANDWIDTH_MIN_MBPS,
    FIELD_RULES,
    LABEL_FIELDS,
    NUMERIC_FIELDS,
    OPTIONAL_RULES,
    POWER_FIELDS,
    SELECT_FIELDS,
    HardwareProfile,
    rule_violation,
)

DEFAULT_DEVICE = "laptop_cpu"
DEFAULT_NETWORK = "50mbps"

# Stream salts: each random decision gets its own stream of the same seed.
SALT_DEVICES = 0x0DE5
SALT_NETWORK = 0x0E7
SALT_BANDWIDTH = 0xB4D

DEVICE_FIELDS = ("gflops", "memory_gb", "availability", "dropout", "train_w", "idle_w", "battery_wh", *SELECT_FIELDS)
NETWORK_FIELDS = ("down_mbps", "up_mbps", "latency_s", "rx_w", "tx_w", "tail_j")
RADIO_FIELDS = ("rx_w", "tx_w", "tail_j")
TABLE_COLUMNS = NUMERIC_FIELDS + LABEL_FIELDS  # canonical column order


class ProfileValidationError(ValueError):
    """A profile table violates the HardwareProfile rules."""


# --------------------------------------------------------------------------- spec


class BandwidthDist(BaseModel):
    """Per-client sampled bandwidth (Mbps); up = down × up_ratio."""

    model_config = ConfigDict(extra="forbid")

    distribution: Literal["uniform", "loguniform"] = "loguniform"
    low: float = BANDWIDTH_MIN_MBPS
    high: float = BANDWIDTH_MAX_MBPS
    up_ratio: float = 1.0
    latency_s: float = 0.02  # same as the 50mbps tier; a sampled link needs some latency
    # radio power model of a sampled link; left out: the 50mbps tier's
    rx_w: float | None = None
    tx_w: float | None = None
    tail_j: float | None = None

    @model_validator(mode="after")
    def _check(self) -> "BandwidthDist":
        if not (math.isfinite(self.low) and self.low > 0):
            raise ValueError(f"bandwidth.low={self.low!r} is not allowed: must be > 0")
        if not (math.isfinite(self.high) and self.high >= self.low):
            raise ValueError(f"bandwidth.high={self.high!r} is not allowed: must be >= low ({self.low!r})")
        if not (math.isfinite(self.up_ratio) and self.up_ratio > 0):
            raise ValueError(f"bandwidth.up_ratio={self.up_ratio!r} is not allowed: must be > 0")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"bandwidth.latency_s={self.latency_s!r} is not allowed: must be >= 0")
        for f in RADIO_FIELDS:
            v = getattr(self, f)
            if v is not None and (msg := rule_violation(f, v)):
                raise ValueError(f"bandwidth.{msg}")
        return self


# Per-client override (``profiles.overrides``): ``tier``/``net_tier`` pull in catalog values
# first, then any profile number replaces the pulled one. Built from the profile's own field list
# so that a number added to HardwareProfile can be overridden without being listed again here.
ProfileOverride = create_model(
    "ProfileOverride",
    __config__=ConfigDict(extra="forbid"),
    **{f: (str | None, None) for f in LABEL_FIELDS},
    **{f: (float | None, None) for f in NUMERIC_FIELDS},
)


def _check_mix(name: str, mix: dict[str, float] | None) -> dict[str, float] | None:
    if mix is None:
        return None
    if not mix:
        raise ValueError(f"{name} mix is empty; give at least one tier with a proportion")
    for k, p in mix.items():
        if not (math.isfinite(p) and p >= 0):
            raise ValueError(f"{name}[{k!r}]={p!r} is not allowed: proportions must be >= 0")
    total = sum(mix.values())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"{name} proportions sum to {total!r}; they must sum to 1 (within 1e-6)")
    return mix


class ProfileSpec(BaseModel):
    """How to assign profiles to a fleet (the ``profiles:`` config section).

    The empty spec puts every client on ``laptop_cpu`` / ``50mbps``.
    """

    model_config = ConfigDict(extra="forbid")

    devices: dict[str, float] | None = None
    network: dict[str, float] | None = None
    bandwidth: BandwidthDist | None = None
    table: str | None = None  # CSV/Parquet path, relative to the working directory
    overrides: dict[int, ProfileOverride] = {}
    allow_out_of_range: bool = False
    availability: float | None = None
    dropout: float | None = None
    catalog: str | dict[str, Any] | None = None  # extra tiers, see load_catalog
    conditions: ConditionsSpec | None = None  # processes over virtual time (hardware_profiles.conditions)
    battery: BatterySpec | None = None  # batteries of the clients whose battery_wh > 0 (hardware_profiles.energy)

    @field_validator("devices", "network", mode="before")
    @classmethod
    def _str_keys(cls, v: Any) -> Any:
        # YAML may parse a tier name like 500 as an int.
        return {str(k): val for k, val in v.items()} if isinstance(v, Mapping) else v

    @model_validator(mode="after")
    def _check(self) -> "ProfileSpec":
        _check_mix("devices", self.devices)
        _check_mix("network", self.network)
        if self.network is not None and self.bandwidth is not None:
            raise ValueError("give either 'network' (tier mix) or 'bandwidth' (distribution), not both")
        for f in ("availability", "dropout"):
            v = getattr(self, f)
            if v is not None and (msg := rule_violation(f, v)):
                raise ValueError(msg)
        for cid in self.overrides:
            if cid < 0:
                raise ValueError(f"overrides: client id {cid} is not allowed: must be >= 0")
        return self

    @classmethod
    def parse(cls, data: "ProfileSpec | Mapping[str, Any] | None") -> "ProfileSpec":
        """Accept a spec, a dict (optionally wrapped in ``{profiles: ...}``) or None."""
        if data is None:
            return cls()
        if isinstance(data, ProfileSpec):
            return data
        if set(data) == {"profiles"}:
            data = data["profiles"] or {}
        return cls.model_validate(dict(data))


# --------------------------------------------------------------------------- table


@dataclass(eq=False)
class ProfileTable:
    """Column-wise profiles; row ``i`` is client ``i``."""

    gflops: np.ndarray
    down_mbps: np.ndarray
    up_mbps: np.ndarray
    latency_s: np.ndarray
    memory_gb: np.ndarray
    availability: np.ndarray
    dropout: np.ndarray
    tier: np.ndarray
    net_tier: np.ndarray
    allow_out_of_range: bool = field(default=False)
    # the power model; None: not given (NaN; battery_wh: 0, no battery)
    train_w: np.ndarray | None = None
    idle_w: np.ndarray | None = None
    rx_w: np.ndarray | None = None
    tx_w: np.ndarray | None = None
    tail_j: np.ndarray | None = None
    battery_wh: np.ndarray | None = None
    # the selection-cost model; None: not given (NaN)
    cache_bytes: np.ndarray | None = None
    topk_ns_in_cache: np.ndarray | None = None
    topk_ns_out_of_cache: np.ndarray | None = None
    randomk_ns_per_kept: np.ndarray | None = None
    periodick_ns_per_kept: np.ndarray | None = None
    quant_ns_per_elem: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.gflops)
        for f in POWER_FIELDS + ("battery_wh",) + SELECT_FIELDS:
            if getattr(self, f) is None:
                setattr(self, f, np.full(n, 0.0 if f == "battery_wh" else np.nan))
        for f in NUMERIC_FIELDS:
            setattr(self, f, np.ascontiguousarray(getattr(self, f), dtype=np.float64))
        for f in LABEL_FIELDS:
            setattr(self, f, np.asarray(getattr(self, f), dtype=object))
        for f in TABLE_COLUMNS:
            a = getattr(self, f)
            if a.ndim != 1 or len(a) != n:
                raise ProfileValidationError(f"column {f} has shape {a.shape}; expected ({n},)")
        self.validate()

    def __len__(self) -> int:
        return len(self.gflops)

    def validate(self) -> None:
        """Vectorised HardwareProfile rules; reports the lowest offending client id."""
        worst: tuple[int, int, str] | None = None  # (client id, column order, column)
        lo, hi = BANDWIDTH_MIN_MBPS, BANDWIDTH_MAX_MBPS
        for order, f in enumerate(NUMERIC_FIELDS):
            a, rule = getattr(self, f), FIELD_RULES[f]
            bad = np.isinf(a) if rule in OPTIONAL_RULES else ~np.isfinite(a)
            if rule in ("pos", "bw"):
                bad |= a <= 0
            elif rule in ("nonneg", *OPTIONAL_RULES):
                bad |= a < 0
            elif rule == "prob":
                bad |= (a < 0) | (a > 1)
            if rule == "bw" and not self.allow_out_of_range:
                bad |= (a < lo) | (a > hi)
            idx = np.flatnonzero(bad)
            if idx.size and (worst is None or (idx[0], order) < worst[:2]):
                worst = (int(idx[0]), order, f)
        if worst is not None:
            cid, _, f = worst
            msg = rule_violation(f, getattr(self, f)[cid], self.allow_out_of_range)
            raise ProfileValidationError(f"client {cid}: {msg}")

    def profile(self, i: int) -> HardwareProfile:
        """Client ``i``'s profile as a pydantic object (build on demand)."""
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"client id {i} out of range [0, {len(self)})")
        return HardwareProfile(
            name=f"client_{i}",
            **{f: float(getattr(self, f)[i]) for f in NUMERIC_FIELDS},
            **{f: str(getattr(self, f)[i]) for f in LABEL_FIELDS},
            allow_out_of_range=self.allow_out_of_range,
        )

    def to_frame(self) -> pd.DataFrame:
        """One row per client: ``client_id`` then the HardwareProfile columns."""
        import pandas as pd  # here, not above: see the TYPE_CHECKING import

        data: dict[str, Any] = {"client_id": np.arange(len(self), dtype=np.int64)}
        for f in TABLE_COLUMNS:
            data[f] = getattr(self, f)
        return pd.DataFrame(data)

    @classmethod
    def from_frame(cls, df: pd.DataFrame, *, allow_out_of_range: bool = False) -> "ProfileTable":
        """Full table (every column required); ``client_id`` optional, reorders rows."""
        df = _order_by_client_id(df, len(df))
        # folders written before the power and selection-cost models lack them
        optional = POWER_FIELDS + ("battery_wh",) + SELECT_FIELDS
        missing = [c for c in NUMERIC_FIELDS if c not in df.columns and c not in optional]
        if missing:
            raise ProfileValidationError(f"profile table is missing columns {missing}")
        kw: dict[str, Any] = {f: df[f].to_numpy(dtype=np.float64) for f in NUMERIC_FIELDS if f in df.columns}
        for f in LABEL_FIELDS:
            kw[f] = _labels(df[f]) if f in df.columns else np.full(len(df), "", dtype=object)
        return cls(**kw, allow_out_of_range=allow_out_of_range)

    @classmethod
    def from_profiles(cls, profiles: list[HardwareProfile]) -> "ProfileTable":
        kw = {f: np.array([getattr(p, f) for p in profiles]) for f in TABLE_COLUMNS}
        return cls(**kw, allow_out_of_range=any(p.allow_out_of_range for p in profiles))

    @property
    def nbytes(self) -> int:
        # object arrays: count the pointers (tier strings are shared/interned)
        return sum(getattr(self, f).nbytes for f in TABLE_COLUMNS)


# --------------------------------------------------------------------------- assignment


def exact_counts(proportions: list[float], n: int) -> np.ndarray:
    """Largest-remainder rounding of p × n; ties go to the earlier entry."""
    p = np.asarray(proportions, dtype=np.float64)
    raw = p / p.sum() * n  # renormalise: a sum of 1 + 1e-7 must not overshoot n
    counts = np.floor(raw).astype(np.int64)
    rest = n - int(counts.sum())
    if rest > 0:
        order = np.argsort(-(raw - counts), kind="stable")
        counts[order[:rest]] += 1
    return counts


def _mix_labels(mix: dict[str, float], n: int, seed: int, salt: int) -> np.ndarray:
    names = list(mix)
    counts = exact_counts([mix[k] for k in names], n)
    labels = np.repeat(np.arange(len(names)), counts)
    np.random.default_rng([seed, salt]).shuffle(labels)
    return np.asarray(names, dtype=object)[labels]


def _labels(col: pd.Series) -> np.ndarray:
    import pandas as pd  # here, not above: see the TYPE_CHECKING import

    return np.array(["" if pd.isna(v) else str(v) for v in col], dtype=object)


def _order_by_client_id(df: pd.DataFrame, n: int, table: str = "") -> pd.DataFrame:
    name = f"profile table {table!r}" if table else "profile table"
    if len(df) != n:
        raise ProfileValidationError(f"{name} has {len(df)} rows; expected one per client ({n})")
    if "client_id" not in df.columns:
        return df.reset_index(drop=True)
    import pandas as pd  # here, not above: see the TYPE_CHECKING import

    ids = pd.to_numeric(df["client_id"], errors="coerce").to_numpy(dtype=np.float64)  # text: NaN
    if not np.array_equal(np.sort(ids), np.arange(n)):  # NaN never equals: text and gaps are refused
        raise ProfileValidationError(f"{name}: client_id must be a permutation of 0..{n - 1}")
    return df.assign(client_id=ids.astype(np.int64)).sort_values("client_id", kind="stable").reset_index(drop=True)


def _apply_table(cols: dict[str, np.ndarray], table: str, n: int, catalog: Catalog) -> None:
    """A profile table's columns over the mixes' values; every problem names the table (and its
    row and column)."""
    import pandas as pd  # here, not above: see the TYPE_CHECKING import

    df = _order_by_client_id(read_table(table), n, table)
    allowed = set(TABLE_COLUMNS) | {"client_id", "name"}
    unknown = [c for c in df.columns if c not in allowed]
    if unknown:
        raise ProfileValidationError(
            f"profile table {table!r} has unknown columns {unknown}; allowed: {sorted(allowed)}"
        )
    for f, apply in (("tier", _apply_device), ("net_tier", _apply_network)):
        if f in df.columns:
            labels = _labels(df[f])
            for name in dict.fromkeys(labels):
                if name:  # empty cell keeps the mix's assignment
                    try:
                        apply(cols, labels == name, name, catalog)
                    except (KeyError, ValueError) as err:  # an unknown tier: said of the table's column
                        raise ProfileValidationError(f"profile table {table!r}, column {f}: "
                                                     f"{err.args[0] if err.args else err}") from None
    for f in NUMERIC_FIELDS:
        if f in df.columns:
            values = pd.to_numeric(df[f], errors="coerce").to_numpy(dtype=np.float64)
            text = np.flatnonzero(np.isnan(values) & df[f].notna().to_numpy())
            if text.size:  # a word where a number goes (an empty cell is NaN: the field's own rule)
                raise ProfileValidationError(f"profile table {table!r}: row {int(text[0]) + 2}: {f} = "
                                             f"{df[f].iloc[int(text[0])]!r} is not a number")
            cols[f][:] = values


def read_table(path: str | Path) -> pd.DataFrame:
    import pandas as pd  # here, not above: see the TYPE_CHECKING import

    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        raise ValueError(f"profile table {str(p)!r}: unsupported extension {suffix!r}; use .csv or .parquet")
    if not p.is_file():
        raise FileNotFoundError(f"profile table {str(p)!r} does not exist")
    try:
        return pd.read_csv(p) if suffix == ".csv" else pd.read_parquet(p)
    except Exception as err:  # noqa: BLE001 - pandas and pyarrow raise many types for a foreign file
        kind = "CSV" if suffix == ".csv" else "Parquet"
        raise ProfileValidationError(f"profile table {str(p)!r} is unreadable as {kind}: "
                                     f"{type(err).__name__}: {' '.join(str(err).split())[:200]}") from None


def _apply_device(cols: dict[str, np.ndarray], mask: Any, name: str, catalog: Catalog) -> None:
    d = catalog.device(name)
    for f in DEVICE_FIELDS:
        cols[f][mask] = getattr(d, f)
    cols["tier"][mask] = name


def _apply_network(cols: dict[str, np.ndarray], mask: Any, name: str, catalog: Catalog) -> None:
    t = catalog.network(name)
    for f in NETWORK_FIELDS:
        cols[f][mask] = getattr(t, f)
    cols["net_tier"][mask] = name


def assign_profiles(
    spec: ProfileSpec | Mapping[str, Any] | None,
    num_clients: int,
    seed: int,
    catalog: Catalog | None = None,
) -> ProfileTable:
    """Profiles for clients ``0..num_clients-1``; same (spec, N, seed) → same table."""
    spec = ProfileSpec.parse(spec)
    n = int(num_clients)
    if n < 0:
        raise ValueError(f"num_clients={num_clients!r} is not allowed: must be >= 0")
    if catalog is None:
        if spec.catalog is not None:
            catalog = load_catalog(spec.catalog)
        else:
            catalog = default_catalog()

    cols: dict[str, np.ndarray] = {f: np.zeros(n, dtype=np.float64) for f in NUMERIC_FIELDS}
    for f in LABEL_FIELDS:
        cols[f] = np.full(n, "", dtype=object)

    # 1. devices
    dev = _mix_labels(spec.devices, n, seed, SALT_DEVICES) if spec.devices else np.full(n, DEFAULT_DEVICE, dtype=object)
    for name in dict.fromkeys(spec.devices or [DEFAULT_DEVICE]):
        _apply_device(cols, dev == name, name, catalog)

    # 2. network
    if spec.bandwidth is not None:
        b = spec.bandwidth
        rng = np.random.default_rng([seed, SALT_BANDWIDTH])
        if b.distribution == "uniform":
            down = rng.uniform(b.low, b.high, n)
        else:
            down = np.exp(rng.uniform(math.log(b.low), math.log(b.high), n))
        down = np.clip(down, b.low, b.high)  # exp(log(x)) may round just outside
        cols["down_mbps"][:] = down
        cols["up_mbps"][:] = down * b.up_ratio
        cols["latency_s"][:] = b.latency_s
        like = catalog.network(DEFAULT_NETWORK)
        for f in RADIO_FIELDS:
            cols[f][:] = getattr(b, f) if getattr(b, f) is not None else getattr(like, f)
        cols["net_tier"][:] = b.distribution
    else:
        mix = spec.network or {DEFAULT_NETWORK: 1.0}
        net = _mix_labels(mix, n, seed, SALT_NETWORK) if spec.network else np.full(n, DEFAULT_NETWORK, dtype=object)
        for name in mix:
            _apply_network(cols, net == name, name, catalog)

    # 3. table
    if spec.table is not None:
        _apply_table(cols, spec.table, n, catalog)

    # 4. global probability overrides
    if spec.availability is not None:
        cols["availability"][:] = spec.availability
    if spec.dropout is not None:
        cols["dropout"][:] = spec.dropout

    # 5. per-client overrides
    for cid, ov in sorted(spec.overrides.items()):
        if cid >= n:
            raise ValueError(f"overrides: client id {cid} is not allowed: must be < num_clients ({n})")
        if ov.tier is not None:
            _apply_device(cols, cid, ov.tier, catalog)
        if ov.net_tier is not None:
            _apply_network(cols, cid, ov.net_tier, catalog)
        for f in NUMERIC_FIELDS:
            v = getattr(ov, f)
            if v is not None:
                cols[f][cid] = v

    return ProfileTable(**cols, allow_out_of_range=spec.allow_out_of_range)
