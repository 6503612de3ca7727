"""Hardware profiles and the deterministic virtual clock (no torch, no ray).

Each simulated client gets a :class:`HardwareProfile` (stored column-wise in a
:class:`ProfileTable`); :func:`client_times` turns FLOPs, compression ops and
payload bytes into simulated seconds, and :func:`resolve_round` applies
availability, dropout, deadline and over-selection; :func:`ledger` turns the phase times
into joules and :class:`FleetBatteries` keeps the fleet's battery levels.

Names are resolved on first use (PEP 562), so that importing one light module of this package
(``hardware_profiles.errors``, which the command line imports) does not import numpy and pydantic.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CATALOG_PATH": "hardware_profiles.catalog",
    "Catalog": "hardware_profiles.catalog",
    "CatalogError": "hardware_profiles.catalog",
    "DeviceTier": "hardware_profiles.catalog",
    "NetworkTier": "hardware_profiles.catalog",
    "UnknownTierError": "hardware_profiles.catalog",
    "default_catalog": "hardware_profiles.catalog",
    "load_catalog": "hardware_profiles.catalog",
    "DROP_REASONS": "hardware_profiles.clock",
    "OPS_TO_FLOPS": "hardware_profiles.clock",
    "RoundOutcome": "hardware_profiles.clock",
    "RoundPolicy": "hardware_profiles.clock",
    "client_times": "hardware_profiles.clock",
    "client_uniforms": "hardware_profiles.clock",
    "compress_seconds": "hardware_profiles.clock",
    "compute_seconds": "hardware_profiles.clock",
    "draw_availability": "hardware_profiles.clock",
    "draw_dropout": "hardware_profiles.clock",
    "draw_participation": "hardware_profiles.clock",
    "resolve_round": "hardware_profiles.clock",
    "round_seconds": "hardware_profiles.clock",
    "transfer_seconds": "hardware_profiles.clock",
    "ENERGY_COLUMNS": "hardware_profiles.energy",
    "BatterySpec": "hardware_profiles.energy",
    "FleetBatteries": "hardware_profiles.energy",
    "empties_at": "hardware_profiles.energy",
    "ledger": "hardware_profiles.energy",
    "BANDWIDTH_MAX_MBPS": "hardware_profiles.profile",
    "BANDWIDTH_MIN_MBPS": "hardware_profiles.profile",
    "HardwareProfile": "hardware_profiles.profile",
    "DEFAULT_DEVICE": "hardware_profiles.sampler",
    "DEFAULT_NETWORK": "hardware_profiles.sampler",
    "BandwidthDist": "hardware_profiles.sampler",
    "ProfileOverride": "hardware_profiles.sampler",
    "ProfileSpec": "hardware_profiles.sampler",
    "ProfileTable": "hardware_profiles.sampler",
    "ProfileValidationError": "hardware_profiles.sampler",
    "assign_profiles": "hardware_profiles.sampler",
    "exact_counts": "hardware_profiles.sampler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hardware_profiles' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
