"""Which clients a round selects: the mechanics around the configured selection policy.

The engine decides how many clients a round dispatches (``clients.participation`` of the fleet,
more with ``clock.over_selection``); the policy (``clients.selection``, default ``uniform``:
:mod:`algorithms.selection`) decides which, from a :class:`~algorithms.selection.SelectionView`
with its own seeded generator, and its choice is checked. Costs the number selected, not the
fleet size, for the uniform draw.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.plugins import SELECTORS
from algorithms.selection import ClientHistory, Selection, SelectionView, checked_selection
from engine.config.schema import ExperimentConfig
from hardware_profiles.conditions import participation
from hardware_profiles.errors import PluginError, user_frames

SELECT_SALT = 0x5E1EC7
SALT_DISPATCH = 0xA5C7  # the asynchronous loop's draws of whom to dispatch


def target_arrivals(cfg: ExperimentConfig, num_clients: int) -> int:
    """How many uploads a round aims to aggregate: ``participation`` of the fleet, at least 1."""
    return max(1, int(round(cfg.clients.participation * num_clients)))


class ClientSelector:
    """The configured policy with what it sees: the fleet, the clock, and (if it asks) the history.

    ``clock`` is the run's :class:`~hardware_profiles.round_clock.RoundClock` (profiles, conditions,
    batteries, time); ``train_samples`` the clients' local training set sizes.
    """

    def __init__(self, cfg: ExperimentConfig, num_clients: int, train_samples: np.ndarray, clock: Any = None):
        spec = cfg.clients.selection
        self.name = spec.name
        self.cfg, self.num_clients, self.clock = cfg, num_clients, clock
        self.train_samples = np.asarray(train_samples)
        policy_cls = SELECTORS.get(spec.name)
        self.policy = policy_cls(spec, num_clients, cfg.seed)
        self.history = ClientHistory(num_clients) if policy_cls.uses_history else None

    def select(self, r: int, exclude: np.ndarray | None = None) -> tuple[Selection, int]:
        """Round ``r``'s selection (ids sorted) and how many uploads it aims to aggregate. With
        over-selection more clients are selected than needed; the first ``target`` to finish are kept.
        ``exclude``: clients the method does not train this round (``Server.excluded_clients``);
        the policy chooses among the others (``view.candidates``), at most as many as there are."""
        target = target_arrivals(self.cfg, self.num_clients)
        count = self.cfg.clock.num_to_select(target, self.num_clients)
        candidates = None
        if exclude is not None and len(exclude):
            candidates = np.setdiff1d(np.arange(self.num_clients), np.asarray(exclude, dtype=np.int64))
            count = min(count, len(candidates))
        return self.choose(r, count, candidates, SELECT_SALT), target

    def choose(self, r: int, count: int, candidates: np.ndarray | None, salt: int,
               start_s: float | None = None) -> Selection:
        """At most ``count`` clients from ``candidates`` (None: the fleet), by the policy."""
        view = self.view(r, count, candidates, salt, start_s)
        try:
            chosen = self.policy.select(view)
        except Exception as err:  # noqa: BLE001 - the user's policy: said with its name and round
            raise policy_error(self.name, r, "select", err) from err
        try:
            return checked_selection(self.name, chosen, view)
        except ValueError as err:
            raise SelectionError(str(err)) from None

    def view(self, r: int, count: int, candidates: np.ndarray | None, salt: int,
             start_s: float | None = None) -> SelectionView:
        clock = self.clock
        now_s = (clock.policy.start_s + clock.sim_time_s) if start_s is None and clock is not None else start_s
        return SelectionView(
            round=r, count=int(count), num_clients=self.num_clients, candidates=candidates,
            rng=np.random.default_rng([self.cfg.seed, r, salt]),
            profiles=clock.profiles if clock is not None else None, train_samples=self.train_samples,
            now_s=float(now_s or 0.0), history=self.history,
            _conditions=(lambda ids: clock.conditions.now(ids, now_s)) if clock is not None and
            clock.conditions is not None else None,
            _online=(lambda ids: participation(clock.conditions, clock.profiles, ids, clock.seed, r, clock.policy,
                                               now_s)[0]) if clock is not None else None,
            _battery=(lambda ids: clock.batteries.fraction(ids)) if clock is not None and clock.batteries else None,
        )

    def record(self, r: int, ids: np.ndarray, arrived: np.ndarray, times: dict[str, np.ndarray],
               results: list | None) -> None:
        """After round (asynchronous: wave) ``r``: what the clients ``ids`` (that ran) did, for the
        history and the policy's :meth:`~algorithms.selection.SelectionPolicy.observe`; ``results``
        (their :class:`~algorithms.base.ClientResult`, None when nothing trained) give the losses."""
        if len(ids) == 0:
            return
        loss = (np.full(len(ids), np.nan) if results is None else
                np.array([float(res.metrics.get("train_loss", np.nan)) for res in results], dtype=np.float64))
        duration = np.asarray(times["total_s"], dtype=np.float64)
        if self.history is not None:
            self.history.record(r, ids, arrived, duration, np.asarray(times["compute_s"]), loss)
        try:
            self.policy.observe(r, np.asarray(ids), np.asarray(arrived, dtype=bool),
                                {"train_loss": loss, "sim_total_s": duration,
                                 "sim_compute_s": np.asarray(times["compute_s"], dtype=np.float64)})
        except Exception as err:  # noqa: BLE001 - the user's policy
            raise policy_error(self.name, r, "observe", err) from err

    # ---------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        return {"fields": {f: getattr(self.policy, f) for f in self.policy.checkpoint_fields},
                "history": self.history.state() if self.history is not None else None}

    def load_state(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        for f in self.policy.checkpoint_fields:
            setattr(self.policy, f, state["fields"][f])
        if self.history is not None and state.get("history") is not None:
            self.history.load_state(state["history"])


class SelectionError(PluginError):
    """The selection policy raised, or returned what the engine cannot use; the message names the
    policy, the round and the user's frames."""


def policy_error(name: str, round: int, hook: str, err: BaseException) -> SelectionError:
    frames = user_frames(err)
    return SelectionError(f"selection policy {name!r} failed in its {hook}() in round {round}: "
                          f"{type(err).__name__}: {err}" + (f"\n{frames}" if frames else ""))


def select_clients(cfg: ExperimentConfig, num_clients: int, round: int) -> tuple[np.ndarray, int]:
    """Round ``round``'s clients by the configured policy without a clock or history (what a
    validation can foresee: exact for policies that use neither), and the target of arrivals."""
    sel, target = ClientSelector(cfg, num_clients, np.zeros(num_clients, dtype=np.int64)).select(round)
    return sel.ids, target
