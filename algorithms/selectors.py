"""System-aware client selection: power-of-choice (``pow_d``), Oort (``oort``) and availability- and
battery-aware selection (``available_first``), on the contract of :mod:`algorithms.selection`.

Each policy ranks the clients the engine offers (``view.pool()``: the fleet in a synchronous
round, the idle clients online now in an asynchronous wave), draws only from ``view.rng``, and
says why it picked each client (``selection_score``, ``selection_reason`` in clients.parquet).
What the clock measured of each client's past rounds comes from ``view.history``
(``uses_history``). Equations and sources: docs/toolbox.md. Numpy only: no torch, no Ray, no I/O.
"""
from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from algorithms.selection import Selection, SelectionParams, SelectionPolicy, SelectionView

LOSSES = ("it ranks clients by the training loss they report, and clock.mode = 'timing_only' trains nothing; "
          "allowed there: a policy that does not read losses (uniform, available_first)")


# ---------------------------------------------------------------- power of choice
class PowDParams(SelectionParams):
    d: int | None = Field(None, ge=1, description="candidates drawn per round (null: twice the count; the count "
                          "itself: a random draw)")
    sampling: Literal["data_size", "uniform"] = Field(
        "data_size", description="how the d candidates are drawn: by their share of the training data (the paper), "
        "or uniformly")
    online_only: bool = Field(False, description="draw the candidates among the clients online at the round's start "
                              "only (the paper does not model availability: false)")


class PowD(SelectionPolicy):
    """Of d candidates, the clients with the highest local loss (power of choice, Cho, Wang and Joshi, 2020)."""

    Params = PowDParams
    uses_history = True
    reads_training = LOSSES

    def select(self, view: SelectionView) -> Selection:
        pool, m = view.pool(), view.count
        if self.params.online_only:
            pool = pool[view.online(pool)]
        m = min(m, len(pool))
        d = min(len(pool), max(m, self.params.d or 2 * m))
        size = view.train_samples[pool].astype(np.float64)
        p = size / size.sum() if self.params.sampling == "data_size" and size.sum() > 0 else None
        candidates = view.rng.choice(pool, size=d, replace=False, p=p)
        loss = view.history.last_train_loss[candidates]
        fresh = np.isnan(loss)
        key = np.where(fresh, np.inf, loss)  # never heard from: first, so every client is tried
        keep = np.argsort(-key, kind="stable")[:m]
        reason = np.where(fresh[keep], f"never ran: first of {d} drawn", f"highest last loss of {d} drawn")
        return Selection(candidates[keep], score=key[keep], reason=reason)


# ---------------------------------------------------------------- Oort
class OortParams(SelectionParams):
    penalty: float = Field(2.0, ge=0, allow_inf_nan=False, description="alpha: a client slower than the preferred "
                           "round duration T has its utility times (T / t)^alpha")
    preferred_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="T, seconds (null: the "
                                      "pacer_quantile of the durations the clock measured of the clients heard from)")
    pacer_quantile: float = Field(0.5, gt=0, le=1, description="T's quantile of the measured durations (when "
                                  "preferred_s is null)")
    exploration: float = Field(0.9, ge=0, le=1, description="epsilon at round 0: the share of the count given to "
                               "clients never heard from")
    exploration_decay: float = Field(0.98, gt=0, le=1, description="epsilon's factor per round")
    exploration_min: float = Field(0.2, ge=0, le=1, description="epsilon never falls below this")
    staleness: float = Field(0.1, ge=0, allow_inf_nan=False, description="the weight of the bonus sqrt(staleness "
                             "ln(r) / r_i) of a client last heard from in round r_i")
    cutoff: float = Field(0.95, ge=0, le=1, description="exploitation samples, by utility, among the clients whose "
                          "utility is at least cutoff x the utility of the count-th best")
    online_only: bool = Field(True, description="choose among the clients online at the round's start only, as "
                              "Oort's coordinator chooses among the clients that check in (false: the whole fleet)")


class Oort(SelectionPolicy):
    """Statistical utility times a penalty for slow clients, with exploration (Oort, Lai et al., 2021)."""

    Params = OortParams
    uses_history = True
    reads_training = LOSSES

    def utility(self, view: SelectionView, ids: np.ndarray) -> np.ndarray:
        """Oort's utility of clients heard from: ``n_i L_i`` (samples x last mean training loss), plus
        the staleness bonus, times ``(T / t_i)^alpha`` where the last duration ``t_i > T``."""
        h, p = view.history, self.params
        stat = view.train_samples[ids] * h.last_train_loss[ids]
        r = max(view.round, 1)
        stat = stat + np.sqrt(p.staleness * math.log(r + 1) / (h.last_round[ids] + 1.0))
        t = h.last_duration_s[ids]
        heard = ~np.isnan(h.last_duration_s)
        T = p.preferred_s if p.preferred_s is not None else (
            float(np.quantile(h.last_duration_s[heard], p.pacer_quantile)) if heard.any() else np.inf)
        slow = t > T
        return np.where(slow, stat * (T / np.where(slow, t, 1.0)) ** p.penalty, stat)

    def select(self, view: SelectionView) -> Selection:
        p, pool, m = self.params, view.pool(), view.count
        if p.online_only:
            pool = pool[view.online(pool)]
        h = view.history
        explored = pool[~np.isnan(h.last_train_loss[pool])]
        fresh = pool[np.isnan(h.last_train_loss[pool])]
        eps = max(p.exploration_min, p.exploration * p.exploration_decay ** view.round)
        n_explore = min(len(fresh), int(round(eps * m)))
        n_exploit = min(len(explored), m - n_explore)
        n_explore = min(len(fresh), m - n_exploit)  # too few heard from: explore more
        ids, score, reason = [], [], []
        if n_exploit:
            util = self.utility(view, explored)
            order = np.argsort(-util, kind="stable")
            bar = p.cutoff * util[order[n_exploit - 1]]
            over = order[util[order] >= bar]
            w = np.maximum(util[over], 0.0)
            pick = view.rng.choice(over, size=n_exploit, replace=False,
                                   p=w / w.sum() if np.count_nonzero(w) >= n_exploit else None)
            ids.append(explored[pick])
            score.append(util[pick])
            reason += ["exploit: utility"] * n_exploit
        if n_explore:  # never heard from: faster devices first (Oort prefers them when it knows their speed)
            speed = view.profiles.gflops[fresh].astype(np.float64)
            pick = view.rng.choice(len(fresh), size=n_explore, replace=False, p=speed / speed.sum())
            ids.append(fresh[pick])
            score.append(np.full(n_explore, np.nan))
            reason += ["explore: never heard from"] * n_explore
        if not ids:
            return Selection(np.zeros(0, dtype=np.int64))
        return Selection(np.concatenate(ids), score=np.concatenate(score), reason=np.array(reason, dtype=object))


# ---------------------------------------------------------------- availability and batteries
class AvailableFirstParams(SelectionParams):
    battery_exponent: float = Field(1.0, ge=0, allow_inf_nan=False, description="with batteries, an online client's "
                                    "chance grows as its charge^battery_exponent (0: uniform among online clients; "
                                    "a mains-powered client counts as full)")


class AvailableFirst(SelectionPolicy):
    """Clients online at the round's start only, those with fuller batteries more likely."""

    Params = AvailableFirstParams
    reads_training: ClassVar[str | None] = None

    def select(self, view: SelectionView) -> Selection:
        pool = view.pool()
        online = pool[view.online(pool)]
        level = view.battery_level(online)
        if level is None:
            pick = view.rng.permutation(online)[:view.count]
            return Selection(pick, score=np.ones(len(pick)), reason="online now")
        charge = np.where(np.isnan(level), 1.0, level)
        w = charge ** self.params.battery_exponent
        k = min(view.count, len(online))
        p = w / w.sum() if np.count_nonzero(w) >= k and w.sum() > 0 else None
        pick = view.rng.choice(len(online), size=k, replace=False, p=p)
        return Selection(online[pick], score=charge[pick], reason="online now, by battery charge")
