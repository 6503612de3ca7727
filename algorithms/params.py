"""Every method's hyperparameters, importable without torch.

``hetsim validate`` and config loading check the ``algorithm`` section against these pydantic
models without importing the methods themselves (torch, numba): each method's module imports its
params class from here. ``ALGORITHM_PARAMS`` maps a method's config name to its class; the
registry of the methods (:data:`algorithms.ALGORITHMS`) has the same names.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional, Union, get_args

import numpy as np
from pydantic import Field, StrictFloat, StrictInt, field_validator, model_validator

from algorithms.base import AlgorithmParams

# The compressors' names and op-count constants (calibrated in algorithms/compressors.py,
# which re-exports them): here so that the params below need no torch.
Strategy = Literal["topk", "randomk", "periodick"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
TOPK_OPS_PER_ELEMENT = 140.0
TOPK_OPS_PER_SELECTED_LOG = 70.0
RANDOMK_OPS_PER_INDEX = 210.0
PERIODICK_OPS_PER_INDEX = 4.0


# ------------------------------------------------------------------------------ FedAvg, FedProx
class FedAvgParams(AlgorithmParams):
    name: Literal["fedavg"] = "fedavg"


class FedProxParams(AlgorithmParams):
    name: Literal["fedprox"] = "fedprox"
    mu: float = Field(0.01, ge=0, description="proximal coefficient")


# ------------------------------------------------------------ compressed FedAvg (uniform compressor)
def validate_k(k: Any) -> int | float:
    """Shared rule for a K option: int count >= 1, or float ratio in (0, 1]."""
    if isinstance(k, str):  # YAML 1.1 reads "1e-2" as a string; CLI overrides may too
        text = k.strip()
        try:
            k = int(text)
        except ValueError:
            try:
                k = float(text)
            except ValueError:
                raise ValueError(
                    f"k={k!r} is not allowed: must be an int count >= 1 or a float ratio in (0, 1]"
                ) from None
    if isinstance(k, np.integer):
        k = int(k)
    elif isinstance(k, np.floating):
        k = float(k)
    if isinstance(k, bool):
        raise ValueError(f"k={k!r} is not allowed: must be an int count >= 1 or a float ratio in (0, 1]")
    if isinstance(k, int):
        if k < 1:
            raise ValueError(f"k={k} is not allowed: an int k is a count and must be >= 1")
        return k
    if isinstance(k, float):
        if not 0.0 < k <= 1.0:
            raise ValueError(
                f"k={k!r} is not allowed: a float k is a ratio of the model size and must be in (0, 1] "
                "(write an int for a count)"
            )
        return k
    raise ValueError(f"k={k!r} is not allowed: must be an int count >= 1 or a float ratio in (0, 1]")


class OpCostParams(AlgorithmParams):
    """Op-count constants of the compressors ([ours]; see algorithms/compressors.py)."""

    topk_per_element: float = Field(TOPK_OPS_PER_ELEMENT, ge=0, description="Top-K ops per element of d")
    topk_per_selected_log: float = Field(TOPK_OPS_PER_SELECTED_LOG, ge=0, description="Top-K ops per K*log2(K)")
    randomk_per_index: float = Field(RANDOMK_OPS_PER_INDEX, ge=0, description="Random-K ops per index")
    periodick_per_index: float = Field(PERIODICK_OPS_PER_INDEX, ge=0, description="Periodic-K ops per index")

    def costs(self):
        """The constants as :class:`algorithms.compressors.OpCosts`."""
        from algorithms.compressors import OpCosts

        return OpCosts(**self.model_dump())


class CompressedFedAvgParams(AlgorithmParams):
    name: Literal["fedavg_compressed"] = "fedavg_compressed"
    compressor: Strategy = Field("topk", description="the compressor every client uses")
    k: Union[StrictInt, StrictFloat] = Field(  # noqa: UP007
        0.01, description="coordinates sent: int count >= 1, or float ratio of the model size in (0, 1]"
    )
    error_feedback: bool = Field(True, description="accumulate what was not sent into a residual")
    clamp_k: bool = Field(False, description="an int k above the model size sends every coordinate instead of failing")
    buffers: Literal["dense", "local"] = Field("dense", description="BatchNorm buffers: uploaded dense, or kept local")
    op_costs: OpCostParams = Field(default_factory=OpCostParams)

    @field_validator("k", mode="before")
    @classmethod
    def _check_k(cls, v):
        return validate_k(v)


# ------------------------------------------------------------------------------ FedCSPACK
_K_HELP = "k must be an int >= 1 (pack count), a float in (0, 1] (fraction of packs) or 'all'"


class FedCSPACKParams(AlgorithmParams):
    name: Literal["fedcspack"] = "fedcspack"
    pack_size: int = Field(1024, description="values per pack (P)")
    k: Union[int, float, Literal["all"]] = Field(
        "all", description="Top-K cap: pack count, fraction of packs in (0, 1], or 'all'")
    weighting: Literal["cskd", "cs", "kd"] = Field(
        "cskd", description="mask weight: |cos+KL| (cskd), |cos| (cs) or |KL| (kd)")
    personalization: Literal["own_mask", "global_mask", "none"] = Field(
        "own_mask", description="which packs of the global model a returning client takes")
    sharing: Literal["packs", "full"] = Field(
        "packs", description="'full': share every pack with weight 1 (FedAvg-like)")
    record_packs: bool = Field(
        False, description="write packs.parquet (each client's shared packs and weights) and "
        "global_mask.parquet (the aggregated mask) for pack-level analysis"
    )

    @field_validator("pack_size", mode="before")
    @classmethod
    def _check_pack_size(cls, v: Any) -> int:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"pack_size must be an integer >= 1, got {v!r}")
        return int(v)

    @field_validator("k", mode="before")
    @classmethod
    def _check_k(cls, v: Any) -> Any:
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, str) and v != "all"):
            raise ValueError(f"{_K_HELP}, got {v!r}")
        if isinstance(v, (int, np.integer)):
            if v < 1:
                raise ValueError(f"{_K_HELP}, got {v!r}")
            return int(v)
        if isinstance(v, (float, np.floating)):
            if not 0.0 < v <= 1.0:
                raise ValueError(f"{_K_HELP}, got {v!r}")
            return float(v)
        if v == "all":
            return v
        raise ValueError(f"{_K_HELP}, got {v!r}")


# ------------------------------------------------------------------------------ ASCEND
class AscendParams(AlgorithmParams):
    """ASCEND's options. Every [ours] value of the spec is here, with the spec's default."""

    name: Literal["ascend"] = "ascend"
    # compression
    k: Union[StrictInt, StrictFloat] = Field(  # noqa: UP007
        0.01, description="coordinates sent: int count >= 1, or float ratio of the model size in (0, 1]"
    )
    arms: tuple[Strategy, ...] = Field(STRATEGIES, description="the candidate compressors (bandit arms)")
    error_feedback: bool = Field(True, description="[paper] residual accumulation")
    clamp_k: bool = Field(False, description="an int k above the model size sends every coordinate")
    buffers: Literal["dense", "local"] = Field("dense", description="BatchNorm buffers: uploaded dense, or local")
    op_costs: OpCostParams = Field(default_factory=OpCostParams)
    # policy
    policy: Literal["egreedy", "exp3", "fixed"] = Field("egreedy", description="the client's bandit policy")
    arm: Optional[Strategy] = Field(None, description="the arm of policy 'fixed' (uniform baselines)")  # noqa: UP007
    warmup: int = Field(2, ge=0, description="round-robin tries of each arm before epsilon-greedy")
    epsilon: Optional[float] = Field(None, description="fixed epsilon in [0, 1]; None = decaying")  # noqa: UP007
    eps_c: float = Field(3.0, gt=0, description="decaying epsilon: max(eps_min, min(1, eps_c*|S|/t'))")
    eps_min: float = Field(0.03, ge=0, le=1, description="floor of the decaying epsilon")
    ema_lambda: float = Field(0.3, gt=0, le=1, description="EMA step of the chosen arm's value")
    exp3_gamma: float = Field(0.1, gt=0, le=1, description="EXP3 uniform-mixing rate")
    learn_from_forced: bool = Field(False, description="feed rewards of forced (post-rollback) rounds to the policy")
    # reward
    rho: float = Field(0.6, ge=0, le=1, description="weight of the alignment term dD (1-rho: local dF)")
    reward_clip: float = Field(1.0, gt=0, description="reward clipped to [-reward_clip, reward_clip]")
    probe_batches: int = Field(4, ge=1, description="local probe set = probe_batches x train.batch_size samples")
    # rollback
    gamma: Optional[float] = Field(0.2, description="rollback when probe loss > (1+gamma) x previous; None = off")  # noqa: UP007
    rollback_loss: Literal["ce", "kl"] = Field(
        "ce", description="global probe loss: cross-entropy with public labels, or mean KL(teacher || student)"
    )
    forced_rounds: int = Field(3, ge=0, description="rounds of forced Top-K after a rollback")
    max_consecutive_rollbacks: Optional[int] = Field(  # noqa: UP007
        3, ge=1, description="after this many rollbacks in a row a finite-loss spike is accepted (the reference "
        "resets); None = never (can freeze training for good)"
    )
    # distillation
    distill_steps: int = Field(50, ge=0, description="Adam steps per architecture per round")
    distill_lr: float = Field(1e-3, gt=0, description="Adam learning rate of the distillation")
    temperature: float = Field(1.0, gt=0, description="distillation temperature tau")
    distill_batch: int = Field(64, ge=1, description="public samples per distillation step")
    teacher: Literal["aggregates", "clients"] = Field(
        "aggregates", description="teacher = mean logits of the per-architecture aggregates, or of every "
        "client's reconstructed model"
    )
    public_probe_size: int = Field(512, ge=1, description="public probe set for D and the rollback loss")
    d_history: int = Field(8, ge=1, description="rounds of D per architecture kept in the broadcast")

    @field_validator("k", mode="before")
    @classmethod
    def _check_k(cls, v):
        return validate_k(v)

    @field_validator("epsilon")
    @classmethod
    def _check_epsilon(cls, v):
        if v is not None and not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ValueError(f"epsilon={v!r} is not allowed: must be a float in [0, 1] or null (decaying)")
        return v

    @field_validator("gamma")
    @classmethod
    def _check_gamma(cls, v):
        if v is not None and not (math.isfinite(v) and v >= 0.0):
            raise ValueError(f"gamma={v!r} is not allowed: must be a float >= 0 or null (no rollback)")
        return v

    @model_validator(mode="after")
    def _check_arms(self) -> "AscendParams":
        allowed = list(STRATEGIES)
        if not self.arms or len(set(self.arms)) != len(self.arms):
            raise ValueError(
                f"arms={list(self.arms)!r} is not allowed: a non-empty list of distinct compressors from {allowed}"
            )
        if self.policy == "fixed":
            if self.arm is None:
                raise ValueError(f"arm is required with policy 'fixed': one of {list(self.arms)}")
            if self.arm not in self.arms:
                raise ValueError(f"arm={self.arm!r} is not allowed: must be one of arms={list(self.arms)}")
        elif self.arm is not None:
            raise ValueError(f"arm={self.arm!r} is only used with policy 'fixed' (policy is {self.policy!r})")
        return self

    @property
    def tbar_window(self) -> int:
        """Participations whose T define T̄: the warm-up (``warmup * |arms|``), at least 1."""
        return max(1, self.warmup * len(self.arms))


ALGORITHM_PARAMS: dict[str, type[AlgorithmParams]] = {
    "fedavg": FedAvgParams,
    "fedprox": FedProxParams,
    "fedavg_compressed": CompressedFedAvgParams,
    "fedcspack": FedCSPACKParams,
    "ascend": AscendParams,
}
