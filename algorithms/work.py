"""Local work as a policy: how many SGD steps each client does in a round (``train.work``).

The engine owns the mechanics: which clients train, when they start, the round's deadline, the
clock. A *work policy* only says how many local steps each of them does; the clients do exactly
those (:func:`algorithms.training.local_sgd` takes them from ``ctx.train.local_steps``), report
the FLOPs they spent, and the clock charges what was done. The steps each client did are the
``local_steps`` column of ``clients.parquet``.

A policy is a function ``fn(view) -> steps`` (one integer >= 1 per client of ``view.ids``) of a
:class:`WorkView`, registered with :func:`engine.plugins.register_work_policy`; its options (a
:class:`WorkParams` subclass) are ``view.params``. It must be a pure function of the view (a run
resumed from a checkpoint asks it again), so it runs alike on every executor and, without
training, in ``clock.mode: timing_only`` (docs/timing.md). The built-ins:

* ``fixed``: ``train.local_steps`` (or ``train.local_epochs``) for every client, as without a
  policy: the engine then passes nothing to the clients (the run is bit for bit the run without
  ``train.work``) and writes no ``local_steps`` column;
* ``deadline``: the most steps, up to ``max_steps``, whose upload still ends by the round's
  deadline on the virtual clock (:meth:`WorkView.finish_s`), at least one;
* ``per_tier``: the configured steps scaled by the device's speed (``gflops``) over a reference.

Numpy only: no torch, no Ray, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class WorkParams(BaseModel):
    """Base of a work policy's options (validated, unknown keys rejected), as a method's params."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    policy: str = Field("fixed", description="a registered work policy (`hetsim list work`): fixed (train.local_"
                        "steps or local_epochs for everyone), deadline (as many steps as fit before the round's "
                        "deadline), per_tier (steps scaled by device speed), or your own")


class DeadlineWorkParams(WorkParams):
    """``deadline``: as many local steps as fit before the round's deadline on the virtual clock."""

    max_steps: int | None = Field(None, ge=1, description="at most this many steps (null: the configured work, "
                                  "train.local_steps or local_epochs x the client's batches per epoch)")


class PerTierWorkParams(WorkParams):
    """``per_tier``: the configured steps scaled by the device's speed."""

    reference_gflops: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="the device speed (GFLOP/s) that does the configured work; "
        "a device of half that speed does half the steps (null: the fleet's fastest device)")
    min_steps: int = Field(1, ge=1, description="no device does fewer steps than this")


@dataclass
class WorkView:
    """What a work policy sees when it decides (arrays aligned with ``ids``)."""

    round: int  # the round (asynchronous runs: the dispatch wave)
    ids: np.ndarray  # the clients about to train
    configured: np.ndarray  # the steps train.local_steps / local_epochs give each (epochs: E x ceil(rows / B))
    train_samples: np.ndarray  # their training rows
    batch_size: int
    gflops: np.ndarray  # their device speed (GFLOP/s, the profile's)
    profiles: Any  # the fleet's hardware_profiles.ProfileTable (every client)
    start_s: float  # when they start, on the virtual clock
    deadline_s: float | None  # seconds after start_s by which an upload must end; None: no deadline known
    params: WorkParams
    _finish: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)

    def finish_s(self, steps) -> np.ndarray:
        """Seconds after ``start_s`` at which each client's upload would end if it did ``steps``
        (one per client, or one for all): the clock's own arithmetic (its phases through the fleet's
        conditions over time) on the method's wire format; what decides ``made_deadline``."""
        steps = np.broadcast_to(np.asarray(steps, dtype=np.int64), self.ids.shape)
        if self._finish is None:
            raise ValueError("finish_s: this view has no clock")
        return self._finish(steps)


# ---------------------------------------------------------------- the built-in policies
def fixed(view: WorkView) -> np.ndarray:
    """The configured work (``train.local_steps`` or ``train.local_epochs``) for every client."""
    return view.configured


def deadline(view: WorkView) -> np.ndarray:
    """The most steps (at least 1, at most ``max_steps``) whose upload ends by the deadline.

    ``finish_s`` grows with the steps, so each client's count is found by bisection over
    ``[1, max_steps]``, all clients at once; without a deadline (e.g. an adaptive deadline before
    its first arrivals) every client does ``max_steps``."""
    cap = view.configured if view.params.max_steps is None else np.full(len(view.ids), view.params.max_steps)
    cap = np.maximum(np.asarray(cap, dtype=np.int64), 1)
    if view.deadline_s is None or len(view.ids) == 0:
        return cap
    lo, hi = np.ones(len(cap), dtype=np.int64), cap.copy()
    while (lo < hi).any():
        mid = (lo + hi + 1) // 2
        fits = view.finish_s(mid) <= view.deadline_s  # the clock drops a client strictly after it
        lo, hi = np.where(fits, mid, lo), np.where(fits, hi, mid - 1)
    return lo


def per_tier(view: WorkView) -> np.ndarray:
    """The configured steps scaled by the device's speed: ``max(min_steps, floor(configured x gflops /
    reference))``, so slower devices do less."""
    p = view.params
    reference = p.reference_gflops if p.reference_gflops is not None else float(np.max(view.profiles.gflops))
    scaled = np.floor(view.configured * (view.gflops / reference) + 1e-9).astype(np.int64)
    return np.maximum(scaled, p.min_steps)


def configured_steps(rows: np.ndarray, batch_size: int, epochs: int, steps: int | None) -> np.ndarray:
    """The steps ``train.local_steps`` / ``train.local_epochs`` give clients with ``rows`` training
    rows: ``local_steps``, or ``epochs x ceil(rows / batch_size)`` (exactly those epochs' batches,
    :func:`algorithms.training.batch_schedule`); at least 1."""
    rows = np.asarray(rows, dtype=np.int64)
    if steps is not None:
        return np.full(len(rows), int(steps), dtype=np.int64)
    return np.maximum(epochs * -(-rows // batch_size), 1)


def checked_steps(name: str, steps: Any, view: WorkView) -> np.ndarray:
    """What a policy returned, checked: one integer >= 1 per client; raises ValueError saying what is wrong."""
    where = f"work policy {name!r} in round {view.round}"
    try:
        arr = np.asarray(steps)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
            raise TypeError
    except TypeError:
        raise ValueError(f"{where} returned {type(steps).__name__} {steps!r:.80}, not an array of step counts "
                         "(integers, one per client of view.ids)") from None
    arr = np.broadcast_to(arr, view.ids.shape) if arr.ndim == 0 else arr.reshape(-1)
    if len(arr) != len(view.ids):
        raise ValueError(f"{where} gave {len(arr)} step counts for {len(view.ids)} clients (view.ids)")
    bad = ~np.isfinite(arr.astype(np.float64)) | (arr != np.round(arr)) | (arr < 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{where} gave client {int(view.ids[i])} {arr[i].item()!r} steps; each client does an integer "
                         "number of steps >= 1")
    return arr.astype(np.int64)
