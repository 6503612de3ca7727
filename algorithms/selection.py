"""Client selection as a policy: the contract, what a policy sees, and the built-in ``uniform`` draw.

The engine owns the mechanics of selection: how many clients a round dispatches (participation and
``clock.over_selection``), who of them is available, their deadlines, and checking what a policy
returns. A :class:`SelectionPolicy` only chooses *which* clients, from what it is shown in a
:class:`SelectionView`: the round, how many to pick, the fleet's profiles (and their conditions at
the round's start), and, for a policy that asks for it (``uses_history = True``), what the clock
measured of each client's past rounds (:class:`ClientHistory`). A policy draws random numbers only
from ``view.rng`` (seeded by the run's seed and the round), so a run selects the same clients on
every executor.

The synchronous loop asks once per round, from the whole fleet (``view.candidates`` is None), or
from the clients the method still trains when it excludes some (``Server.excluded_clients``); the
asynchronous loop asks each time slots free up, from the idle clients that are online now
(``view.candidates``). Numpy only: no torch, no Ray, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class SelectionParams(BaseModel):
    """Base of a selection policy's options (validated, unknown keys rejected), as a method's params."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field("uniform", description="a registered selection policy (`hetsim list selectors`)")


class ClientHistory:
    """What the engine saw of every client's past rounds, one numpy array per column (row = client).

    Kept only for policies that ask (``uses_history``), and checkpointed with the run. After each
    round (an asynchronous run: each resolved update) the engine records, for the clients that ran:
    ``last_round`` (-1: never ran), ``runs``, ``arrivals`` (their upload made it), ``last_duration_s``
    (the clock's whole time of its last run: download, compute, compress, upload; conditions
    included), ``last_compute_s`` and ``last_train_loss`` (the mean training loss it reported; NaN if
    it reports none), and ``last_arrived``.
    """

    COLUMNS = ("last_round", "runs", "arrivals", "last_duration_s", "last_compute_s", "last_train_loss",
               "last_arrived")

    def __init__(self, num_clients: int):
        self.last_round = np.full(num_clients, -1, dtype=np.int64)
        self.runs = np.zeros(num_clients, dtype=np.int64)
        self.arrivals = np.zeros(num_clients, dtype=np.int64)
        self.last_duration_s = np.full(num_clients, np.nan)
        self.last_compute_s = np.full(num_clients, np.nan)
        self.last_train_loss = np.full(num_clients, np.nan)
        self.last_arrived = np.zeros(num_clients, dtype=bool)

    def record(self, round: int, ids: np.ndarray, arrived: np.ndarray, duration_s: np.ndarray,
               compute_s: np.ndarray, train_loss: np.ndarray) -> None:
        """The clients ``ids`` ran in ``round``; arrays aligned with ``ids``."""
        ids = np.asarray(ids, dtype=np.int64)
        self.last_round[ids] = round
        self.runs[ids] += 1
        self.arrivals[ids] += np.asarray(arrived, dtype=np.int64)
        self.last_arrived[ids] = arrived
        self.last_duration_s[ids] = duration_s
        self.last_compute_s[ids] = compute_s
        self.last_train_loss[ids] = train_loss

    def state(self) -> dict[str, np.ndarray]:
        return {c: getattr(self, c) for c in self.COLUMNS}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        for c in self.COLUMNS:
            getattr(self, c)[...] = state[c]


@dataclass
class SelectionView:
    """What a policy sees when it chooses (``candidates`` None: any client of the fleet)."""

    round: int  # the round (asynchronous: the dispatch wave)
    count: int  # how many to choose, at most
    num_clients: int
    candidates: np.ndarray | None  # the ids it may choose from; None: 0 .. num_clients - 1
    rng: np.random.Generator  # the only source of randomness (seeded by the run's seed and the round)
    profiles: Any  # hardware_profiles.ProfileTable: gflops, down_mbps, up_mbps, latency_s, ... per client
    train_samples: np.ndarray  # local training samples per client
    now_s: float  # virtual time of the round's start
    history: ClientHistory | None = None  # for policies with uses_history = True
    _conditions: Callable[[np.ndarray], dict] | None = field(default=None, repr=False)
    _online: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)
    _battery: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)

    def pool(self) -> np.ndarray:
        """The ids it may choose from, as an array (all of the fleet when ``candidates`` is None)."""
        return np.arange(self.num_clients) if self.candidates is None else self.candidates

    def conditions_now(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The profile fields of ``ids`` at the round's start where a fleet's conditions change them
        over time (e.g. ``down_mbps``, ``gflops``); {} for a fleet without conditions."""
        return self._conditions(np.asarray(ids)) if self._conditions is not None else {}

    def online(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` would be available at the round's start (the clock's own draw:
        availability, its conditions over time, dropout), as the round will find them."""
        ids = np.asarray(ids)
        return self._online(ids) if self._online is not None else np.ones(len(ids), dtype=bool)

    def battery_level(self, ids: np.ndarray) -> np.ndarray | None:
        """Battery charge of ``ids`` as a fraction in [0, 1]; None for a fleet without batteries."""
        return self._battery(np.asarray(ids)) if self._battery is not None else None


@dataclass
class Selection:
    """A policy's choice, with why: ``score`` and ``reason`` (aligned with ``ids``) go into
    clients.parquet as ``selection_score`` / ``selection_reason``."""

    ids: np.ndarray
    score: np.ndarray | None = None
    reason: Any = None  # a sequence of str, or one str for all


class SelectionPolicy:
    """Chooses which clients run. Subclass it, set ``Params`` to your options (a
    :class:`SelectionParams` subclass) and implement :meth:`select`; register it with
    :func:`engine.plugins.register_selector`.

    One instance lives with the round loop for the whole run. Attributes named in
    ``checkpoint_fields`` are saved in checkpoints (numpy arrays, numbers, lists, dicts) so a resumed
    run chooses as the uninterrupted one would.
    """

    Params: ClassVar[type[SelectionParams]] = SelectionParams
    uses_history: ClassVar[bool] = False  # True: the engine keeps view.history for it
    # why it needs what only training reports (e.g. the clients' losses): clock.mode: timing_only refuses it
    reads_training: ClassVar[str | None] = None
    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: SelectionParams, num_clients: int, seed: int):
        self.params, self.num_clients, self.seed = params, num_clients, seed

    def select(self, view: SelectionView) -> np.ndarray | Selection:
        """At most ``view.count`` distinct client ids from ``view.pool()`` (any order)."""
        raise NotImplementedError

    def observe(self, round: int, ids: np.ndarray, arrived: np.ndarray, metrics: dict[str, np.ndarray]) -> None:
        """After a round: the clients that ran (``ids``), whether each arrived, and their
        clients.parquet columns (e.g. ``train_loss``, ``sim_total_s``); optional."""


class Uniform(SelectionPolicy):
    """A seeded uniform draw without replacement: every client equally likely (the default)."""

    def select(self, view: SelectionView) -> np.ndarray:
        if view.candidates is None:
            return view.rng.choice(view.num_clients, size=view.count, replace=False)
        return view.rng.permutation(view.candidates)[:view.count]


def checked_selection(name: str, chosen: Any, view: SelectionView) -> Selection:
    """What a policy returned, checked: distinct ids from the pool, at most ``count``, sorted
    (score and reason follow their ids); raises ValueError saying what is wrong."""
    sel = chosen if isinstance(chosen, Selection) else Selection(chosen)
    try:
        ids = np.asarray(sel.ids)
        if ids.dtype == object or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise TypeError
    except TypeError:
        raise ValueError(f"selection policy {name!r} returned {type(sel.ids).__name__} {sel.ids!r:.80}, not an "
                         "array of client ids (integers)") from None
    ids = ids.astype(np.int64).reshape(-1)
    where = f"selection policy {name!r} in round {view.round}"
    if len(ids) > view.count:
        raise ValueError(f"{where} chose {len(ids)} clients; at most {view.count} may be chosen (view.count)")
    values, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{where} chose client(s) {values[counts > 1][:5].tolist()} more than once")
    pool = view.candidates
    outside = ids[(ids < 0) | (ids >= view.num_clients)] if pool is None else ids[~np.isin(ids, pool)]
    if len(outside):
        allowed = f"0..{view.num_clients - 1}" if pool is None else "view.candidates"
        raise ValueError(f"{where} chose client(s) {outside[:5].tolist()} outside {allowed}")
    order = np.argsort(ids, kind="stable")
    score = None if sel.score is None else np.asarray(sel.score, dtype=np.float64).reshape(-1)
    reason = sel.reason
    for label, col in (("score", score), ("reason", None if isinstance(reason, str) or reason is None else reason)):
        if col is not None and len(col) != len(ids):
            raise ValueError(f"{where} gave {len(col)} {label} values for {len(ids)} clients")
    if reason is not None and not isinstance(reason, str):
        reason = np.asarray(reason, dtype=object)[order]
    return Selection(ids[order], None if score is None else score[order], reason)
