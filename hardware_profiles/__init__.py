"""Hardware profiles and the deterministic virtual clock (no torch, no ray).

Each simulated client gets a :class:`HardwareProfile` (stored column-wise in a
:class:`ProfileTable`); :func:`client_times` turns FLOPs, compression ops and
payload bytes into simulated seconds, and :func:`resolve_round` applies
availability, dropout, deadline and over-selection; :func:`ledger` turns the phase times
into joules and :class:`FleetBatteries` keeps the fleet's battery levels.
"""

from .catalog import (
    CATALOG_PATH,
    Catalog,
    CatalogError,
    DeviceTier,
    NetworkTier,
    UnknownTierError,
    default_catalog,
    load_catalog,
)
from .clock import (
    DROP_REASONS,
    OPS_TO_FLOPS,
    RoundOutcome,
    RoundPolicy,
    client_times,
    client_uniforms,
    compress_seconds,
    compute_seconds,
    draw_availability,
    draw_dropout,
    draw_participation,
    resolve_round,
    round_seconds,
    transfer_seconds,
)
from .energy import ENERGY_COLUMNS, BatterySpec, FleetBatteries, empties_at, ledger
from .profile import BANDWIDTH_MAX_MBPS, BANDWIDTH_MIN_MBPS, HardwareProfile
from .sampler import (
    DEFAULT_DEVICE,
    DEFAULT_NETWORK,
    BandwidthDist,
    ProfileOverride,
    ProfileSpec,
    ProfileTable,
    ProfileValidationError,
    assign_profiles,
    exact_counts,
)

__all__ = [
    "BANDWIDTH_MAX_MBPS",
    "BANDWIDTH_MIN_MBPS",
    "CATALOG_PATH",
    "DEFAULT_DEVICE",
    "DEFAULT_NETWORK",
    "DROP_REASONS",
    "ENERGY_COLUMNS",
    "OPS_TO_FLOPS",
    "BandwidthDist",
    "BatterySpec",
    "Catalog",
    "CatalogError",
    "DeviceTier",
    "FleetBatteries",
    "HardwareProfile",
    "NetworkTier",
    "ProfileOverride",
    "ProfileSpec",
    "ProfileTable",
    "ProfileValidationError",
    "RoundOutcome",
    "RoundPolicy",
    "UnknownTierError",
    "assign_profiles",
    "client_times",
    "client_uniforms",
    "compress_seconds",
    "compute_seconds",
    "default_catalog",
    "draw_availability",
    "draw_dropout",
    "draw_participation",
    "empties_at",
    "ledger",
    "round_seconds",
    "exact_counts",
    "load_catalog",
    "resolve_round",
    "transfer_seconds",
]
