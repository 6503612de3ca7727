"""The energy ledger (joules per client and round, from the clock's phase times) and the
batteries it drains (the ``clients.profiles.battery`` section).

Ledger of a client that ran in a round, with its profile's power model (``catalog.yaml``)::

    energy_download_j = (idle_w + rx_w) * download_s + tail_j
    energy_train_j    = train_w * compute_s
    energy_compress_j = train_w * compress_s
    energy_upload_j   = (idle_w + tx_w) * upload_s + tail_j
    energy_j          = the sum of the four

``download_s`` and ``upload_s`` include the latency (the radio is up and waiting); with
conditions over time they are the durations the processes gave, so a slow link costs more.
A client that stops before its upload ends (it went offline, or its battery emptied) at time
``t`` after the round's start pays each phase only until ``t``, and a transfer's tail only if
that transfer finished before ``t``. Unknown power numbers (NaN) give NaN energy.

Batteries: a client whose ``battery_wh`` is > 0 has one. Its level starts at ``start`` (a
fraction of capacity, or a seeded uniform draw per client), and per round:

* selected while below ``threshold`` (a fraction of capacity): it does not take part (drop
  reason ``battery``);
* on the charger (decided at the round's start for the whole round: ``charging``) it gains
  ``charge_w`` for the round's length and cannot run empty;
* off the charger it pays the ledger, and with ``idle_drain`` also ``idle_w`` for the rest of
  the round; a client whose ledger would exceed its charge stops when the battery empties
  (drop reason ``battery``) and ends the round at 0 Wh;
* levels stay within [0, capacity].
"""
from __future__ import annotations

import copy
import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from .condition_spec import Uniform

ENERGY_COLUMNS = ("energy_download_j", "energy_train_j", "energy_compress_j", "energy_upload_j", "energy_j")
SALT_BATTERY_START = 0xBA77
J_PER_WH = 3600.0


class BatterySpec(BaseModel):
    """The ``clients.profiles.battery`` section (applies to clients whose ``battery_wh`` > 0)."""

    model_config = ConfigDict(extra="forbid")

    start: float | Uniform = 1.0  # level at the run's start: a fraction of capacity, or {low, high}
    threshold: float = 0.2  # a selected client below this fraction of capacity sits the round out
    charge_w: float = 10.0  # charging power (assumption: a 5 V / 2 A phone charger)
    # on the charger: never; always; while online (the availability process or coin at the
    # round's start: a phone online at night is charging); or during local ``hours``
    charging: Literal["never", "always", "online", "hours"] = "online"
    hours: tuple[float, float] = (22.0, 6.0)  # [from, to) in local hours; may wrap midnight
    idle_drain: bool = False  # off the charger, pay idle_w between a client's tasks too

    @model_validator(mode="after")
    def _check(self) -> "BatterySpec":
        levels = [self.start] if isinstance(self.start, (int, float)) else [self.start.low, self.start.high]
        for v in levels:
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"battery.start={v!r} is not allowed: a start level is a fraction of the "
                                 "capacity, in [0, 1]")
        if not (math.isfinite(self.threshold) and 0.0 <= self.threshold <= 1.0):
            raise ValueError(f"battery.threshold={self.threshold!r} is not allowed: it is a fraction of the "
                             "capacity in [0, 1] (above 1 is above the capacity: no client could ever take part)")
        if not (math.isfinite(self.charge_w) and self.charge_w >= 0):
            raise ValueError(f"battery.charge_w={self.charge_w!r} is not allowed: must be >= 0 W")
        for h in self.hours:
            if not (math.isfinite(h) and 0.0 <= h <= 24.0):
                raise ValueError(f"battery.hours={list(self.hours)!r} is not allowed: local hours in [0, 24]")
        return self


# --------------------------------------------------------------------------- the ledger


def _segments(profiles, ids, times) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(power W, duration s, energy J) of a round's six segments per client, shape (n, 6):
    download, its tail, train, compress, upload, its tail (tails take no time)."""
    p = profiles
    radio_in = p.idle_w[ids] + p.rx_w[ids]
    radio_out = p.idle_w[ids] + p.tx_w[ids]
    zero = np.zeros(len(ids))
    power = np.stack([radio_in, zero, p.train_w[ids], p.train_w[ids], radio_out, zero], axis=1)
    duration = np.stack([times["download_s"], zero, times["compute_s"], times["compress_s"],
                         times["upload_s"], zero], axis=1)
    energy = power * duration
    energy[:, 1] = energy[:, 5] = p.tail_j[ids]
    return power, duration, energy


def ledger(profiles, ids, times, stop_s=None) -> dict[str, np.ndarray]:
    """The energy columns of the runnable ``ids`` (float64, aligned with them); ``stop_s``:
    seconds after the round's start at which each client stopped (inf or None: it did not)."""
    ids = np.asarray(ids, dtype=np.int64)
    power, duration, energy = _segments(profiles, ids, times)
    if stop_s is not None:
        stop = np.asarray(stop_s, dtype=np.float64).reshape(-1, 1)
        begins = np.cumsum(duration, axis=1) - duration
        ran = np.clip(stop - begins, 0.0, duration)
        energy = np.where(duration > 0, power * ran, energy)
        ends = begins + duration
        tails = ends[:, [1, 5]] < stop  # a tail counts once its transfer finished
        energy[:, [1, 5]] = np.where(tails, energy[:, [1, 5]], 0.0)
    out = {
        "energy_download_j": energy[:, 0] + energy[:, 1],
        "energy_train_j": energy[:, 2],
        "energy_compress_j": energy[:, 3],
        "energy_upload_j": energy[:, 4] + energy[:, 5],
    }
    out["energy_j"] = out["energy_download_j"] + out["energy_train_j"] + out["energy_compress_j"] + \
        out["energy_upload_j"]
    return out


def empties_at(profiles, ids, times, charge_j) -> np.ndarray:
    """Seconds after the round's start at which a battery holding ``charge_j`` runs empty while
    the client works through its phases (inf: it lasts the round; NaN charge: never empties)."""
    ids = np.asarray(ids, dtype=np.int64)
    power, duration, energy = _segments(profiles, ids, times)
    charge = np.asarray(charge_j, dtype=np.float64).reshape(-1, 1)
    after = np.cumsum(energy, axis=1)
    before = after - energy
    crossing = after > charge  # NaN compares False: unknown power or no battery never empties
    out = np.full(len(ids), np.inf)
    hit = crossing.any(axis=1)
    if hit.any():
        rows = np.flatnonzero(hit)
        k = crossing[rows].argmax(axis=1)
        begins = (np.cumsum(duration, axis=1) - duration)[rows, k]
        p = power[rows, k]
        with np.errstate(divide="ignore", invalid="ignore"):
            into = np.where(p > 0, (charge[rows, 0] - before[rows, k]) / p, 0.0)
        out[rows] = begins + np.clip(into, 0.0, duration[rows, k])
    return out


# --------------------------------------------------------------------------- batteries


def _local_hour(t_s, tz_h) -> np.ndarray:
    return np.mod(np.asarray(t_s, dtype=np.float64) / 3600.0 + tz_h, 24.0)


class FleetBatteries:
    """Every battery-powered client's level (Wh), advanced round by round."""

    def __init__(self, spec: BatterySpec, profiles, seed: int, tz_offset_h=None):
        self.spec = spec
        self.profiles = profiles
        self.capacity = np.asarray(profiles.battery_wh, dtype=np.float64)
        self.has = self.capacity > 0
        if not self.has.any():
            raise ValueError("the battery section is set but no client has a battery: battery_wh is 0 "
                             "for every tier in use; give battery_wh to a device tier "
                             "(clients.profiles.catalog) or to clients (overrides)")
        unknown = self.has & np.isnan(profiles.train_w + profiles.idle_w + profiles.rx_w + profiles.tx_w
                                      + profiles.tail_j)
        if unknown.any():
            cid = int(np.flatnonzero(unknown)[0])
            raise ValueError(f"client {cid} (tier {profiles.tier[cid]!r}, network {profiles.net_tier[cid]!r}) has "
                             "a battery but no complete power model (train_w, idle_w, rx_w, tx_w, tail_j): "
                             "a battery cannot drain by unknown amounts; give the tier's power numbers")
        n = len(self.capacity)
        if isinstance(spec.start, Uniform):
            u = np.random.default_rng([int(seed), SALT_BATTERY_START]).random(n)
            start = spec.start.low + (spec.start.high - spec.start.low) * u
        else:
            start = np.full(n, float(spec.start))
        self.level = np.where(self.has, start * self.capacity, 0.0)
        self.tz = np.zeros(n) if tz_offset_h is None else np.nan_to_num(np.asarray(tz_offset_h, dtype=np.float64))

    # ------------------------------------------------------------------ state
    def fresh(self) -> "FleetBatteries":
        """A copy whose charge moves apart from this one's; what never changes (the profiles, the
        capacities, the time zones) is shared: a copy of ten million clients' profiles is 1.6 GB."""
        out = copy.copy(self)
        out.level = self.level.copy()
        return out

    def state(self) -> dict:
        return {"level_wh": self.level.copy()}

    def restore(self, state: dict) -> None:
        level = np.asarray(state["level_wh"], dtype=np.float64)
        if level.shape != self.level.shape:
            raise ValueError(f"battery state has {level.size} clients; this fleet has {self.level.size}")
        self.level = level.copy()

    # ------------------------------------------------------------------ a round
    def fraction(self, ids) -> np.ndarray:
        """Level as a fraction of capacity (NaN for mains-powered clients)."""
        ids = np.asarray(ids, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.has[ids], self.level[ids] / self.capacity[ids], np.nan)

    def too_low(self, ids) -> np.ndarray:
        """True where a battery-powered client is below the participation threshold."""
        ids = np.asarray(ids, dtype=np.int64)
        return self.has[ids] & (self.level[ids] < self.spec.threshold * self.capacity[ids] - 1e-12)

    def on_charger(self, start_s: float, online_all=None) -> np.ndarray:
        """Per client (all of them), on the charger for the round that starts at ``start_s``;
        ``online_all``: who is online then (``charging: online``)."""
        mode = self.spec.charging
        n = len(self.level)
        if mode == "never":
            return np.zeros(n, dtype=bool)
        if mode == "always":
            return self.has.copy()
        if mode == "online":
            return self.has & np.asarray(online_all, dtype=bool)
        a, b = self.spec.hours
        h = _local_hour(start_s, self.tz)
        inside = (h >= a) & (h < b) if a <= b else (h >= a) | (h < b)
        return self.has & inside

    def charge_j(self, ids, charging) -> np.ndarray:
        """Joules a runnable client can spend before it runs empty (NaN: it cannot run empty:
        mains-powered, or on the charger)."""
        ids = np.asarray(ids, dtype=np.int64)
        free = ~self.has[ids] | np.asarray(charging, dtype=bool)[ids]
        return np.where(free, np.nan, self.level[ids] * J_PER_WH)

    def advance(self, round_s: float, ran_ids, spent_j, active_s, emptied, charging) -> None:
        """End of a round of ``round_s`` seconds: the ledger of the clients that ran
        (``spent_j``, NaN for none), idle drain for the rest of the round, charging."""
        s = self.spec
        ran = np.asarray(ran_ids, dtype=np.int64)
        spent = np.zeros(len(self.level))
        spent[ran] = np.nan_to_num(np.asarray(spent_j, dtype=np.float64))
        busy = np.zeros(len(self.level))
        busy[ran] = np.minimum(np.asarray(active_s, dtype=np.float64), round_s)
        charging = np.asarray(charging, dtype=bool)
        delta = -spent / J_PER_WH
        if s.idle_drain:
            idle = np.maximum(round_s - busy, 0.0)
            delta -= np.where(charging, 0.0, self.profiles.idle_w * idle) / J_PER_WH
        delta += np.where(charging, s.charge_w * round_s, 0.0) / J_PER_WH
        level = np.clip(self.level + delta, 0.0, self.capacity)
        level[ran[np.asarray(emptied, dtype=bool)]] = 0.0
        self.level = np.where(self.has, level, 0.0)
