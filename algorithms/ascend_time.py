"""ASCEND's time model for reward v4 and ``time_model: measured`` (pure functions: no Ray, no I/O).

A client's round is a **work vector** ``w = (bytes down, training FLOPs, selection seconds, bytes
up)`` (:data:`WORK_FIELDS`) and a state of its links and device is a vector of **unit costs**
``c`` (seconds per unit of each: ``8/(down Mbps·1e6)``, ``1/(GFLOP/s·1e9)``, 1, ``8/(up Mbps·1e6)``).
The round's time is ``T = 2·latency + w·c``: the virtual clock's formula
(:mod:`hardware_profiles.clock`, one latency per transfer), written so that *what the arm does*
(``w``) and *the state it is done in* (``c``) are apart.

Reward v4 (docs/ascend.md, "Reward v4") prices the client's mean work so far, ``w̄``, at the
present costs: ``T_exp = 2·latency + w̄·c``. With constant costs ``T_exp`` is v3's ``T̄`` (the mean
of the client's T); when only the costs change (a fading link), ``T`` and ``T_exp`` change
together and their ratio does not move for a client that keeps its arm.

``time_model: measured``: the unit costs are the ones the clock's phase times of the round imply
(:func:`measured_costs`), so what happened during the round (a link that fades mid-upload) counts,
not only the round-start profile.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

WORK_FIELDS = ("bytes_down", "train_flops", "select_s", "bytes_up")
PHASES = ("download_s", "compute_s", "compress_s", "upload_s")  # the clock's phase times (clients.parquet sim_*)


def work_vector(bytes_down: float, train_flops: float, select_s: float, bytes_up: float) -> np.ndarray:
    """One round's work (float64, the order of :data:`WORK_FIELDS`)."""
    return np.array([bytes_down, train_flops, select_s, bytes_up], dtype=np.float64)


def unit_costs(profile: Any) -> np.ndarray:
    """Seconds per unit of work on ``profile``'s links and device as they are (ctx.profile:
    the round's start)."""
    return np.array([8.0 / (float(profile.down_mbps) * 1e6), 1.0 / (float(profile.gflops) * 1e9), 1.0,
                     8.0 / (float(profile.up_mbps) * 1e6)], dtype=np.float64)


def round_seconds(work: np.ndarray, costs: np.ndarray, latency_s: float) -> np.ndarray | float:
    """``2·latency + work·costs``; ``work`` of shape (4,) or (n, 4) (vectorised over rounds or arms)."""
    t = 2.0 * float(latency_s) + np.asarray(work, dtype=np.float64) @ np.asarray(costs, dtype=np.float64)
    return float(t) if np.ndim(t) == 0 else t


def measured_costs(phases: dict[str, float], work: np.ndarray, latency_s: float, train_share: float) -> np.ndarray:
    """The unit costs the clock's phase times of one round imply for its ``work``.

    ``phases``: ``download_s``, ``compute_s`` (all of the round's FLOPs: training and the
    measurement forwards), ``compress_s``, ``upload_s``; ``train_share`` = training FLOPs / all FLOPs
    of the round (the compute phase's part that ``work`` counts). A unit with no work in the
    round (0 bytes, 0 seconds of selection) keeps cost 0 for bytes and 1 for selection seconds.
    So ``round_seconds(work, measured_costs(...)) = download_s + train_share·compute_s + compress_s
    + upload_s``, the measured T (up to rounding)."""
    w = np.asarray(work, dtype=np.float64)
    lat = float(latency_s)
    spent = np.array([phases["download_s"] - lat, phases["compute_s"] * train_share, phases["compress_s"],
                      phases["upload_s"] - lat], dtype=np.float64)
    default = np.array([0.0, 0.0, 1.0, 0.0])
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(w > 0, spent / np.where(w > 0, w, 1.0), default)
    return c


def measured_seconds(phases: dict[str, float], train_share: float) -> float:
    """The measured T of a round: its phase times, the compute phase's training share only."""
    return float(phases["download_s"] + train_share * phases["compute_s"] + phases["compress_s"]
                 + phases["upload_s"])


def expected_seconds(work_sum: np.ndarray, count: int, costs: np.ndarray, latency_s: float) -> float:
    """Reward v4's ``T_exp``: the client's mean work over its ``count`` rounds (``work_sum``) priced
    at ``costs``; NaN before any round."""
    if count <= 0:
        return math.nan
    return float(round_seconds(np.asarray(work_sum, dtype=np.float64) / count, costs, latency_s))
