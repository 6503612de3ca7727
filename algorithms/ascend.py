"""ASCEND: adaptive heterogeneous compression for federated knowledge distillation.

Reward version 3 is the default, with versions 1, 2 and 4 selectable (``reward: v1|v2|v3|v4``).
The method's reference, and how it works (FedKD base, the reward versions, a round on the client
and on the server, its state), is docs/ascend.md.

This module is the method's face: ``SPEC`` (what ``algorithms.ALGORITHMS`` loads) and the names
other modules and tests use. The method itself is in four modules:

* :mod:`algorithms.ascend_policy` - which bandit a client plays and its trace columns;
* :mod:`algorithms.ascend_reward` - the reward of each version (pure functions);
* :mod:`algorithms.ascend_client` - :class:`AscendClient`, the client half;
* :mod:`algorithms.ascend_server` - :class:`AscendServer`, the server half.

Deliberately not here: the bandit policies (:mod:`algorithms.bandits`), the compressors and
error feedback (:mod:`algorithms.compressors`), the hyperparameters' validation
(:mod:`algorithms.params`), Ray and file I/O.
"""
from __future__ import annotations

from algorithms.ascend_client import AscendClient
from algorithms.ascend_policy import policy_values, q_columns
from algorithms.ascend_reward import (
    ascend_reward_v1,
    kl_teacher_student,
    knowledge_fidelity,
    local_fidelity,
    logits_of,
    relative_decrease,
    reward_v2,
    reward_v3,
    reward_v4,
    selection_seconds,
    simulated_seconds,
    time_factor,
)
from algorithms.ascend_server import AscendServer
from algorithms.base import AlgorithmSpec
from algorithms.params import DEFAULT_ARMS, AscendParams

SPEC = AlgorithmSpec(
    "ascend",
    AscendParams,
    AscendClient,
    AscendServer,
    "ASCEND: per-client bandit choice of compressor in federated knowledge distillation, with rollback",
)

__all__ = [
    "SPEC",
    "DEFAULT_ARMS",
    "AscendClient",
    "AscendParams",
    "AscendServer",
    "ascend_reward_v1",
    "kl_teacher_student",
    "logits_of",
    "policy_values",
    "q_columns",
    "relative_decrease",
    "knowledge_fidelity",
    "local_fidelity",
    "reward_v2",
    "reward_v3",
    "reward_v4",
    "selection_seconds",
    "simulated_seconds",
    "time_factor",
]
