"""ASCEND's bandit side: the policy a client plays (epsilon-greedy, EXP3 or a fixed arm), its
trace columns, and whether the server rolled back a client's choice.

The bandits themselves are :mod:`algorithms.bandits`; this module says which one ASCEND builds from
its parameters and how their values show in the tables (``q_<arm>`` columns).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from algorithms.ascend_reward import FIDELITY_REWARDS
from algorithms.bandits import EpsilonGreedyEMA, Exp3, FixedArm
from algorithms.compressors import COMPRESSORS
from algorithms.params import AscendParams

FORCED_ARM = "topk"  # [paper] the arm a rollback forces


def q_columns(arms: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``q_<arm>`` trace columns: one per registered compressor (a fixed schema whatever the
    arms), plus one per joint (compressor, K) arm label of ``arms``."""
    return tuple(f"q_{a}" for a in dict.fromkeys([*COMPRESSORS, *arms]))




def policy_values(policy: Any, arms: tuple[str, ...] = ()) -> dict[str, float]:
    """``q_<arm>`` trace columns (those of ``arms``, the run's arms, too): epsilon-greedy's Q
    (warm-up running means until the warm-up ends), EXP3's arm probabilities, NaN for a fixed
    arm / arms not in the set."""
    out = {c: math.nan for c in q_columns(tuple(arms))}
    if isinstance(policy, EpsilonGreedyEMA):
        if policy.warmed_up:
            vals = policy.q
        else:
            cnt = policy.warmup_count
            vals = np.where(cnt > 0, policy.warmup_sum / np.maximum(cnt, 1), np.nan)
    elif isinstance(policy, Exp3):
        vals = policy.probabilities()
    else:
        return out
    for arm, v in zip(policy.arms, vals):
        out[f"q_{arm}"] = float(v)
    return out


def rolled_back(round: int, client_id: int, meta: dict[str, Any]) -> bool:
    """Whether the server discarded this client's upload of ``round``: a synchronous rollback
    names the round (``rolled_back``), an asynchronous one each discarded update by (client,
    wave) (``rolled_back_updates``: the other clients of that wave may have been applied)."""
    return (round in set(meta.get("rolled_back", ()))
            or [client_id, round] in meta.get("rolled_back_updates", []))


def new_policy(p: AscendParams, rng: np.random.Generator | None = None):
    """The client's policy; v3's warm-up order is a permutation of the arms drawn from ``rng``
    (the client's generator at its first participation: random per client, reproducible
    from the seed), played in blocks."""
    if p.policy == "egreedy":
        v3 = p.reward in FIDELITY_REWARDS
        if v3 and rng is None:
            raise ValueError("reward v3's warm-up order needs the client's generator")
        return EpsilonGreedyEMA(
            list(p.arms), warmup=p.warmup, c=p.eps_c, eps_min=p.eps_min,
            epsilon_fixed=p.epsilon, lam=p.ema_lambda, mean=p.q_update == "mean",
            order=rng.permutation(len(p.arms)).tolist() if v3 else None, blocks=v3,
        )
    if p.policy == "exp3":
        return Exp3(list(p.arms), gamma=p.exp3_gamma)
    return FixedArm(p.arm)


def sync_policy_params(p: AscendParams, policy) -> None:
    """The config's exploration settings win over those a restored policy carries (a state
    restored under new hyperparameters, e.g. Population Based Training changing epsilon);
    the learned values (Q, counts) stay. A no-op when the config is the one it was built with."""
    if isinstance(policy, EpsilonGreedyEMA):
        policy.c, policy.eps_min, policy.epsilon_fixed, policy.lam = p.eps_c, p.eps_min, p.epsilon, p.ema_lambda
        policy.mean = p.q_update == "mean"
    elif isinstance(policy, Exp3):
        policy.gamma = p.exp3_gamma
