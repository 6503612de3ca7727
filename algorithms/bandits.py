"""Multi-armed bandit policies for per-client compressor choice (pure numpy).

* :class:`EpsilonGreedyEMA` - ASCEND's policy: round-robin warm-up, then epsilon-greedy on
  exponentially weighted action values (non-stationary rewards), epsilon decaying or fixed.
* :class:`Exp3` - the adversarial-bandit baseline (Auer et al., 2002).
* :class:`FixedArm` - always the same arm (the "uniform compressor" baselines).

Every policy is a plain dataclass of Python scalars/lists/numpy arrays, so it can live in a
client's persistent state and be pickled (Ray) or copied (rollback) as is. Randomness only
comes from the ``np.random.Generator`` passed to ``choose``; the policy holds none, so a
client's choices are reproducible from the engine's per-(seed, round, client) generator.

Protocol: ``choose(rng) -> (arm, reason)`` and ``update(arm, reward)``. Rewards may arrive
late (ASCEND closes round t's reward in round t+1) and may be dropped (rollback): the policies
count choices and rewards separately and never assume one reward per choice. A forced choice
(ASCEND forces Top-K after a rollback) is the caller's business: see :func:`forced`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from algorithms.state import checkpointable

# [ours] defaults of the ASCEND spec
DEFAULT_WARMUP = 2
DEFAULT_EPS_C = 1.0
DEFAULT_EPS_MIN = 0.03
DEFAULT_EMA_LAMBDA = 0.3
DEFAULT_EXP3_GAMMA = 0.1

REASONS = ("warmup", "explore", "exploit", "sample", "fixed", "forced")


def _check_arms(arms: Sequence[str]) -> list[str]:
    arms = list(arms)
    if not arms:
        raise ValueError("arms must not be empty")
    if len(set(arms)) != len(arms):
        raise ValueError(f"arms must be distinct, got {arms}")
    return arms


def _check_reward(reward: float) -> float:
    r = float(reward)
    if not math.isfinite(r):
        raise ValueError(f"reward={reward!r} is not allowed: must be finite")
    return r


def forced(arm: str) -> tuple[str, str]:
    """A choice imposed by the caller (e.g. Top-K after a rollback), in ``choose``'s format."""
    return arm, "forced"


@checkpointable
@dataclass(eq=False)  # numpy/torch fields: compare by identity
class EpsilonGreedyEMA:
    """Epsilon-greedy with EMA action values and a round-robin warm-up.

    * Warm-up: the first ``warmup * |S|`` calls of ``choose`` go round-robin over the arms
      (arm 0, 1, ..., |S|-1, 0, 1, ...). Rewards received meanwhile are averaged per arm; at
      the first choice after the warm-up, ``Q(s)`` = that mean (an arm whose warm-up rewards
      were all dropped gets the mean over all warm-up rewards, or 0.0 if there are none).
      With ``blocks`` (ASCEND v3) each arm is played ``warmup`` times in a row instead, the arms
      in ``order`` (indices; e.g. a per-client random permutation), and the first reward of each
      block is left out of the mean when the block has more than one play: with error feedback
      that play also sends the previous arm's residual.
    * Then: ``eps = epsilon`` if fixed, else ``max(eps_min, min(1, c*|S|/t'))`` with t' the
      index (from 1) of this policy's own post-warm-up choice (one policy per client, so t' counts
      the client's own choices, not global rounds). With probability eps a uniformly random arm
      ("explore"), else ``argmax Q`` with ties to the lowest index ("exploit").
    * ``update(arm, r)`` after the warm-up: ``Q(arm) <- (1-lam) Q(arm) + lam r`` (that arm only);
      with ``mean`` (a stationary bandit) ``Q(arm)`` is instead the sample mean of every reward
      the arm has had, its warm-up rewards included.

    Each ``choose`` draws exactly one uniform (the epsilon test; none during warm-up) and, when
    exploring, one integer from ``rng``.
    """

    arms: list[str]
    warmup: int = DEFAULT_WARMUP
    c: float = DEFAULT_EPS_C
    eps_min: float = DEFAULT_EPS_MIN
    epsilon_fixed: float | None = None
    lam: float = DEFAULT_EMA_LAMBDA
    order: list[int] | None = None  # warm-up order of the arm indices; None: 0, 1, ..., |S|-1
    blocks: bool = False  # warm-up in blocks of `warmup` consecutive plays per arm
    mean: bool = False  # Q = sample mean instead of the EMA
    # state
    q: np.ndarray = field(default=None)  # type: ignore[assignment]
    warmup_choices: int = 0
    post_choices: int = 0  # t' of the last post-warm-up choice
    warmed_up: bool = False
    warmup_sum: np.ndarray = field(default=None)  # type: ignore[assignment]
    warmup_count: np.ndarray = field(default=None)  # type: ignore[assignment]
    chosen: np.ndarray = field(default=None)  # type: ignore[assignment]
    updates: np.ndarray = field(default=None)  # type: ignore[assignment]
    warmup_seen: np.ndarray = field(default=None)  # type: ignore[assignment]  # warm-up rewards, skipped included

    def __post_init__(self):
        self.arms = _check_arms(self.arms)
        n = len(self.arms)
        self.order = list(range(n)) if self.order is None else [int(i) for i in self.order]
        if sorted(self.order) != list(range(n)):
            raise ValueError(f"order={self.order!r} is not allowed: must be a permutation of 0..{n - 1}")
        if int(self.warmup) != self.warmup or self.warmup < 0:
            raise ValueError(f"warmup={self.warmup!r} is not allowed: must be an int >= 0")
        self.warmup = int(self.warmup)
        if not (self.c > 0 and math.isfinite(self.c)):
            raise ValueError(f"c={self.c!r} is not allowed: must be > 0")
        if not 0.0 <= self.eps_min <= 1.0:
            raise ValueError(f"eps_min={self.eps_min!r} is not allowed: must be in [0, 1]")
        if self.epsilon_fixed is not None and not 0.0 <= self.epsilon_fixed <= 1.0:
            raise ValueError(f"epsilon={self.epsilon_fixed!r} is not allowed: must be in [0, 1] or None")
        if not 0.0 < self.lam <= 1.0:
            raise ValueError(f"lam={self.lam!r} is not allowed: must be in (0, 1]")
        for name, dtype in (("q", float), ("warmup_sum", float), ("warmup_count", np.int64),
                            ("chosen", np.int64), ("updates", np.int64), ("warmup_seen", np.int64)):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(n, dtype=dtype))
        if self.warmup == 0:
            self.warmed_up = True

    # -- queries ------------------------------------------------------------------------
    @property
    def in_warmup(self) -> bool:
        return self.warmup_choices < self.warmup * len(self.arms)

    def epsilon(self) -> float:
        """The epsilon the next post-warm-up choice uses (1.0 while warming up)."""
        if self.in_warmup:
            return 1.0
        return self.epsilon_at(self.post_choices + 1)

    def epsilon_at(self, t: int) -> float:
        """``max(eps_min, min(1, c*|S|/t))`` for post-warm-up choice t >= 1 (or the fixed eps)."""
        if self.epsilon_fixed is not None:
            return float(self.epsilon_fixed)
        return max(self.eps_min, min(1.0, self.c * len(self.arms) / t))

    def q_values(self) -> dict[str, float]:
        return {a: float(v) for a, v in zip(self.arms, self.q)}

    # -- protocol -----------------------------------------------------------------------
    def choose(self, rng: np.random.Generator) -> tuple[str, str]:
        if self.in_warmup:
            j = self.warmup_choices // self.warmup if self.blocks else self.warmup_choices % len(self.arms)
            i = self.order[j]
            self.warmup_choices += 1
            self.chosen[i] += 1
            return self.arms[i], "warmup"
        if not self.warmed_up:
            self._finish_warmup()
        eps = self.epsilon_at(self.post_choices + 1)
        self.post_choices += 1
        if rng.random() < eps:
            i = int(rng.integers(len(self.arms)))
            reason = "explore"
        else:
            i = int(np.argmax(self.q))  # first maximum: lowest index wins ties
            reason = "exploit"
        self.chosen[i] += 1
        return self.arms[i], reason

    def update(self, arm: str, reward: float) -> None:
        i = self.arms.index(arm)
        r = _check_reward(reward)
        self.updates[i] += 1
        if not self.warmed_up:
            self.warmup_seen[i] += 1
            if self.blocks and self.warmup > 1 and self.warmup_seen[i] == 1:
                return  # the block's first play: it carried the previous arm's residual
            self.warmup_sum[i] += r
            self.warmup_count[i] += 1
            return
        if self.mean:  # rewards in the mean: the warm-up's kept ones and every one since
            n = self.warmup_count[i] + self.updates[i] - self.warmup_seen[i]
            self.q[i] += (r - self.q[i]) / n
        else:
            self.q[i] = (1.0 - self.lam) * self.q[i] + self.lam * r

    def _finish_warmup(self) -> None:
        total = self.warmup_count.sum()
        fallback = self.warmup_sum.sum() / total if total else 0.0
        self.q = np.where(
            self.warmup_count > 0, self.warmup_sum / np.maximum(self.warmup_count, 1), fallback
        ).astype(float)
        self.warmed_up = True

    def state(self) -> dict[str, Any]:
        return {"kind": "egreedy", "q": self.q_values(), "epsilon": self.epsilon(),
                "warmup": self.in_warmup, "post_choices": self.post_choices}


@checkpointable
@dataclass(eq=False)  # numpy/torch fields: compare by identity
class Exp3:
    """EXP3 with uniform mixing ``gamma``; rewards in [-1, 1] are mapped to ``r' = (r+1)/2``.

    ``p_i = (1-gamma) w_i / sum(w) + gamma/|S|``; on reward r for arm i:
    ``w_i <- w_i * exp(gamma * r' / (p_i * |S|))``, with p_i the probability the arm had when
    it was chosen (the current one if it was not chosen through ``choose``). Weights are kept
    as logs shifted so that the largest is 0 (the same distribution, never overflows).
    """

    arms: list[str]
    gamma: float = DEFAULT_EXP3_GAMMA
    log_w: np.ndarray = field(default=None)  # type: ignore[assignment]
    pending_p: dict[str, float] = field(default_factory=dict)
    chosen: np.ndarray = field(default=None)  # type: ignore[assignment]
    updates: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self):
        self.arms = _check_arms(self.arms)
        n = len(self.arms)
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma!r} is not allowed: must be in (0, 1]")
        if self.log_w is None:
            self.log_w = np.zeros(n)
        self.log_w = np.asarray(self.log_w, dtype=float)
        if self.log_w.shape != (n,):
            raise ValueError(f"log_w must have one entry per arm ({n})")
        if self.chosen is None:
            self.chosen = np.zeros(n, dtype=np.int64)
        if self.updates is None:
            self.updates = np.zeros(n, dtype=np.int64)

    def set_weights(self, weights: Sequence[float]) -> None:
        w = np.asarray(weights, dtype=float)
        if w.shape != (len(self.arms),) or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ValueError(f"weights={list(weights)} is not allowed: one finite value > 0 per arm")
        self.log_w = np.log(w)

    def weights(self) -> np.ndarray:
        """Normalised weights ``w_i / sum(w)``."""
        z = np.exp(self.log_w - self.log_w.max())
        return z / z.sum()

    def probabilities(self) -> np.ndarray:
        n = len(self.arms)
        return (1.0 - self.gamma) * self.weights() + self.gamma / n

    def choose(self, rng: np.random.Generator) -> tuple[str, str]:
        p = self.probabilities()
        i = int(np.searchsorted(np.cumsum(p), rng.random(), side="right"))
        i = min(i, len(self.arms) - 1)
        self.pending_p[self.arms[i]] = float(p[i])
        self.chosen[i] += 1
        return self.arms[i], "sample"

    def update(self, arm: str, reward: float) -> None:
        i = self.arms.index(arm)
        r = _check_reward(reward)
        r01 = min(1.0, max(0.0, (r + 1.0) / 2.0))
        p = self.pending_p.pop(arm, None)
        if p is None:
            p = float(self.probabilities()[i])
        self.log_w[i] += self.gamma * r01 / (p * len(self.arms))
        self.log_w -= self.log_w.max()
        self.updates[i] += 1

    def state(self) -> dict[str, Any]:
        return {"kind": "exp3", "p": dict(zip(self.arms, self.probabilities().tolist()))}


@checkpointable
@dataclass
class FixedArm:
    """Always ``arm`` (reason "fixed"); rewards are counted and ignored."""

    arm: str
    updates: int = 0

    @property
    def arms(self) -> list[str]:
        return [self.arm]

    def choose(self, rng: np.random.Generator | None = None) -> tuple[str, str]:
        return self.arm, "fixed"

    def update(self, arm: str, reward: float) -> None:
        _check_reward(reward)
        self.updates += 1

    def state(self) -> dict[str, Any]:
        return {"kind": "fixed", "arm": self.arm}


Policy = EpsilonGreedyEMA | Exp3 | FixedArm


def make_policy(kind: str, arms: Sequence[str], **params: Any) -> Policy:
    """``egreedy`` (params: warmup, c, eps_min, epsilon, lam), ``exp3`` (gamma) or
    ``fixed`` (arm; defaults to the only arm when ``arms`` has one)."""
    if kind == "egreedy":
        if "epsilon" in params:
            params["epsilon_fixed"] = params.pop("epsilon")
        return EpsilonGreedyEMA(list(arms), **params)
    if kind == "exp3":
        return Exp3(list(arms), **params)
    if kind == "fixed":
        arm = params.pop("arm", None)
        if params:
            raise ValueError(f"fixed policy takes only 'arm', got {sorted(params)}")
        if arm is None:
            if len(arms) != 1:
                raise ValueError(f"fixed policy needs arm=... (one of {list(arms)})")
            arm = list(arms)[0]
        if arm not in arms:
            raise ValueError(f"arm={arm!r} is not one of {list(arms)}")
        return FixedArm(arm)
    raise ValueError(f"kind={kind!r} is not allowed: choose 'egreedy', 'exp3' or 'fixed'")
