"""Every method's hyperparameters, importable without torch.

``hetsim validate`` and config loading check the ``algorithm`` section against these pydantic
models without importing the methods themselves (torch, numba): each method's module imports its
params class from here. ``ALGORITHM_PARAMS`` maps a method's config name to its class; the
registry of the methods (:data:`algorithms.ALGORITHMS`) has the same names. What validating
them needs lives here too: the one K validator (:func:`check_k`, also exported by
:mod:`algorithms.toolkit`) and the compressors' names and op-count constants.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Literal, Optional, Union

import numpy as np
from pydantic import Field, StrictFloat, StrictInt, field_validator, model_validator

from algorithms.base import AlgorithmParams, ModelSize
from algorithms.plugins import COMPRESSORS, METHODS, compressor_costs, method_params
from hardware_profiles.suggest import given_twice, suggestion

# The built-in compressors and their op-count constants by key (config keys ``<name>_<key>``,
# e.g. ``topk_per_element``), calibrated in algorithms/compressors.py, whose classes take their
# ``COSTS`` from here: listed here so that validating a config needs no torch.
BUILTIN_COMPRESSOR_COSTS: dict[str, dict[str, float]] = {
    "topk": {"per_element": 140.0, "per_selected_log": 70.0},
    "randomk": {"per_index": 210.0},
    "periodick": {"per_index": 4.0},
    "qsgd8": {"per_element": 70.0},
}



ALL = "all"


def check_k(
    value: Any,
    *,
    field: str = "k",
    what: str = "coordinates",
    allow_all: bool = False,
    one_is_ambiguous: bool = False,
) -> int | float | str:
    """The one validator of a "how many" option (``k``): an int count >= 1, a float fraction,
    or ``"all"``.

    A float is a fraction in (0, 1]; with ``one_is_ambiguous`` in (0, 1) and ``1.0`` is rejected
    with a message saying so (one or all?). Numeric strings (YAML 1.1 reads ``1e-2`` as a
    string; CLI overrides may too) are parsed. Raises ``ValueError`` naming the field, the value
    and what is allowed.
    """
    allowed = k_allowed(what, allow_all=allow_all, one_is_ambiguous=one_is_ambiguous)
    if isinstance(value, str):
        text = value.strip()
        if allow_all and text == ALL:
            return ALL
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{field}={value!r} is not allowed: must be {allowed}") from None
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{field}={value!r} is not allowed: must be {allowed}")
    if isinstance(value, (int, np.integer)):
        if value < 1:
            raise ValueError(f"{field}={value} is not allowed: must be {allowed}")
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if one_is_ambiguous and value == 1.0:
            raise ValueError(
                f"{field}=1.0 is ambiguous (one of the {what} or all of them?): write {field}: 1 for one"
                + (f" or {field}: all for all" if allow_all else "")
            )
        ok = 0.0 < value < 1.0 if one_is_ambiguous else 0.0 < value <= 1.0
        if not (math.isfinite(value) and ok):
            raise ValueError(f"{field}={value!r} is not allowed: must be {allowed}")
        return value
    raise ValueError(f"{field}={value!r} is not allowed: must be {allowed}")


def k_allowed(what: str, *, allow_all: bool = False, one_is_ambiguous: bool = False) -> str:
    """What :func:`check_k` allows, in words (for messages)."""
    upper = "1)" if one_is_ambiguous else "1]"
    return f"an int count >= 1 of {what}, a float fraction in (0, {upper}" + (" or 'all'" if allow_all else "")


# ------------------------------------------------------------------------------ FedAvg, FedProx
class FedAvgParams(AlgorithmParams):
    name: Literal["fedavg"] = "fedavg"
    uploads_whole_model: ClassVar[bool] = True


class FedProxParams(AlgorithmParams):
    name: Literal["fedprox"] = "fedprox"
    uploads_whole_model: ClassVar[bool] = True
    mu: float = Field(0.01, ge=0, description="proximal coefficient")


# ------------------------------------------------------------ compressed FedAvg (uniform compressor)
def validate_k(k: Any) -> int | float:
    """A compressor's K option: int count >= 1, or float ratio of the model size in (0, 1]."""
    return check_k(k, what="coordinates")


def validate_compressor(name: Any, field: str = "compressor") -> str:
    if not isinstance(name, str) or name not in COMPRESSORS:  # a missing name asks installed plugins once
        allowed = sorted(compressor_costs(scan=True))
        raise ValueError(f"{field}={name!r} is not allowed: {suggestion(name, allowed)}choose one of {allowed}")
    return name


def validate_op_costs(v: Any) -> dict[str, float]:
    """``op_costs``: overrides of the registered compressors' op-count constants by key
    ``<compressor>_<key>``; unknown keys and values that are not finite and >= 0 are rejected
    with the key, the value and what is allowed."""
    def keys(scan: bool = False) -> list[str]:
        return sorted(f"{name}_{key}" for name, costs in compressor_costs(scan).items() for key in costs)

    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"op_costs={v!r} is not allowed: a mapping of {keys()} to numbers")
    for key, x in v.items():
        if key not in keys() and key not in keys(scan=True):
            raise ValueError(f"op_costs.{key} is not allowed: the keys are {keys()}")
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)) \
                or not (math.isfinite(x) and x >= 0):
            raise ValueError(f"op_costs.{key}={x!r} is not allowed: must be a finite number >= 0")
    return {key: float(x) for key, x in v.items()}


class CompressionOptions(AlgorithmParams):
    """The compression options every compressed-upload method shares (fedavg_compressed, ASCEND)."""

    k: Union[StrictInt, StrictFloat] = Field(  # noqa: UP007
        0.01, description="coordinates sent: int count >= 1, or float ratio of the model size in (0, 1]"
    )
    error_feedback: bool = Field(True, description="accumulate what was not sent into a residual")
    clamp_k: bool = Field(False, description="an int k above the model size sends every coordinate instead of failing")
    buffers: Literal["dense", "local"] = Field("dense", description="BatchNorm buffers: uploaded dense, or kept local")
    op_costs: dict[str, float] = Field(
        default_factory=dict, description="op-count constants by key <compressor>_<constant> (defaults: "
        "algorithms/compressors.py)")

    @field_validator("k", mode="before")
    @classmethod
    def _check_k(cls, v):
        return validate_k(v)

    @field_validator("op_costs", mode="before")
    @classmethod
    def _check_op_costs(cls, v):
        return validate_op_costs(v)

    def check(self, model: ModelSize) -> list[str]:
        d = model.parameters
        if isinstance(self.k, int) and self.k > d and not self.clamp_k:
            return [f"  algorithm.k = {self.k}: more coordinates than the model has ({model}); "
                    f"give k <= {d} (k is {k_allowed('coordinates')}), or algorithm.clamp_k: true"]
        return []


class CompressedFedAvgParams(CompressionOptions):
    name: Literal["fedavg_compressed"] = "fedavg_compressed"
    compressor: str = Field("topk", description="the compressor every client uses (a registered name)")

    @field_validator("compressor", mode="before")
    @classmethod
    def _check_compressor(cls, v):
        return validate_compressor(v)


# ------------------------------------------------------------------------------ FedCSPACK
class FedCSPACKParams(AlgorithmParams):
    name: Literal["fedcspack"] = "fedcspack"
    pack_size: int = Field(1024, description="values per pack (P)")
    k: Union[int, float, Literal["all"]] = Field(
        "all", description="Top-K cap: pack count >= 1, fraction of packs in (0, 1), or 'all'")
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
        return check_k(v, what="packs", allow_all=True, one_is_ambiguous=True)

    def check(self, model: ModelSize) -> list[str]:
        d = model.parameters
        if self.pack_size > d:
            return [f"  algorithm.pack_size = {self.pack_size}: larger than the model ({model}), "
                    f"so it would be one pack; give pack_size <= {d}"]
        packs = math.ceil(d / self.pack_size)
        if isinstance(self.k, int) and self.k > packs:
            allowed = k_allowed("packs", allow_all=True, one_is_ambiguous=True)
            return [f"  algorithm.k = {self.k}: more packs than the model has ({packs} packs "
                    f"of {self.pack_size} for {model}); give k <= {packs} (k is {allowed})"]
        return []


# ------------------------------------------------------------------------------ ASCEND
DEFAULT_ARMS = ("topk", "randomk", "periodick")  # [paper]; a registered compressor joins only if listed
ARM_K_SEP = "@"  # a joint arm's label: "<compressor>@<K>", e.g. "topk@0.01"


def arm_label(arm: Any) -> str:
    """The canonical label of one bandit arm: a compressor name, or ``name@K`` for a (compressor,
    K) pair given as a 2-list or as the label itself; raises naming what is allowed."""
    if isinstance(arm, str) and ARM_K_SEP in arm:
        arm = arm.split(ARM_K_SEP, 1)
    if isinstance(arm, str):
        return validate_compressor(arm, field="arms")
    if isinstance(arm, (list, tuple)) and len(arm) == 2:
        name = validate_compressor(arm[0], field="arms")
        return f"{name}{ARM_K_SEP}{check_k(arm[1], field=f'arms[{name}].k')!r}"
    raise ValueError(f"arms entry {arm!r} is not allowed: a compressor from {sorted(compressor_costs())} "
                     "or a (compressor, K) pair")


def parse_arm(label: str) -> tuple[str, int | float | None]:
    """``(compressor, K)`` of an arm label; K is None for a plain compressor (the method's ``k``)."""
    name, sep, k = label.partition(ARM_K_SEP)
    return name, (check_k(k) if sep else None)


class AscendParams(CompressionOptions):
    """ASCEND's options. Every [ours] value of the spec is here, with the spec's default
    (the compression options ``k``, ``error_feedback``, ``clamp_k``, ``buffers``, ``op_costs``
    come from :class:`CompressionOptions`)."""

    name: Literal["ascend"] = "ascend"
    async_refused_options: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {
        "reward": (("v1", "v2"), "rewards v1 and v2 close with the server's per-round figures (v1: the probe KL of "
                                 "each round's broadcast; v2: each round's alignment ΔD), and an asynchronous server "
                                 "has no rounds")}
    arms: tuple[str, ...] = Field(DEFAULT_ARMS, description="the bandit arms: compressors, e.g. [topk, randomk, "
                                  "periodick, qsgd8], and/or (compressor, K) pairs, e.g. [[topk, 0.01], [randomk, "
                                  "0.25]] (written 'topk@0.01'); a plain name uses k")
    # policy
    policy: Literal["egreedy", "exp3", "fixed"] = Field("egreedy", description="the client's bandit policy")
    arm: Optional[str] = Field(None, description="the arm of policy 'fixed' (uniform baselines)")  # noqa: UP007
    warmup: int = Field(2, ge=0, description="warm-up plays of each arm before epsilon-greedy (v3: a block of "
                        "consecutive plays per arm, in a random order per client; v1/v2: round-robin)")
    epsilon: Optional[float] = Field(None, description="fixed epsilon in [0, 1]; None = decaying")  # noqa: UP007
    eps_c: float = Field(1.0, gt=0, description="decaying epsilon: max(eps_min, min(1, eps_c*|S|/t')), t' = "
                         "the client's own choices since its warm-up")
    eps_min: float = Field(0.03, ge=0, le=1, description="floor of the decaying epsilon")
    ema_lambda: float = Field(0.3, gt=0, le=1, description="EMA step of the chosen arm's value")
    q_update: Literal["ema", "mean"] = Field(
        "ema", description="ema: Q <- (1-ema_lambda) Q + ema_lambda r, tracks arm values that drift (e.g. on "
        "changing links); mean: the sample mean of the arm's rewards, a stationary bandit (for comparison)")
    exp3_gamma: float = Field(0.1, gt=0, le=1, description="EXP3 uniform-mixing rate")
    learn_from_forced: bool = Field(False, description="feed rewards of forced (post-rollback) rounds to the policy")
    # reward
    reward: Literal["v4", "v3", "v2", "v1"] = Field(
        "v3", description="v3: local and knowledge fidelity of the update actually sent, (T/Tbar)^kappa, random "
        "block warm-up, selection priced in seconds; v4: v3 with Tbar replaced by Texp, the client's mean work "
        "priced at the present link and compute rates (link swings cancel); v2: per-client dF and the server's "
        "dD; v1: change of the global model between participations (v1, v2 kept for comparison)")
    time_model: Literal["profile", "measured"] = Field(
        "profile", description="v3/v4: T (and Tbar / Texp) from the round-start profile (profile), or from the "
        "phase times the clock measured for the client's round, delivered at its next participation (measured)")
    rho: Optional[float] = Field(  # noqa: UP007
        None, ge=0, le=1, description="weight of the knowledge term (v3: psi, v1/v2: dD; 1-rho: the local term); "
        "None = the version's default (v3: 0.6, v1/v2: 0.5)")
    kappa: float = Field(1.0, gt=0, description="v3: time exponent, r = g*(Tbar/T)^kappa (g >= 0) or g*(T/Tbar)^kappa")
    probe_fraction: float = Field(0.2, gt=0, lt=1, description="v3: the local probe held out of training is at "
                                  "most this fraction of the client's training data")
    psi_probe_size: int = Field(128, ge=1, description="v3: public probe samples (the first of the server's probe "
                                "set) on which the client measures its knowledge fidelity psi")
    select_cost: Literal["auto", "seconds", "ops"] = Field(
        "auto", description="how a client's selection is priced: 'seconds' from the device tier's select_* "
        "constants (catalog), 'ops' as training-FLOP equivalents (the op-count model); auto: seconds for v3, "
        "ops for v1/v2")
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
    d_history: int = Field(20, ge=1, description="rounds a client's dD (v2; v1: the architecture's D) stays in "
                           "the broadcast")

    @field_validator("arms", mode="before")
    @classmethod
    def _check_arm_names(cls, v):
        if isinstance(v, str) or not isinstance(v, (list, tuple)):
            raise ValueError(f"arms={v!r} is not allowed: a list of compressors from {sorted(compressor_costs())} "
                             "or of (compressor, K) pairs")
        return tuple(arm_label(a) for a in v)

    @field_validator("arm", mode="before")
    @classmethod
    def _check_fixed_arm(cls, v):
        return None if v is None else arm_label(v)

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
        allowed = sorted(compressor_costs())
        twice = given_twice(self.arms, "arms", "", "list each arm once")
        if twice:
            raise ValueError(twice)
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

    @model_validator(mode="after")
    def _check_time_model(self) -> "AscendParams":
        if self.time_model == "measured" and self.reward not in ("v3", "v4"):
            raise ValueError(f"time_model='measured' is not allowed with reward={self.reward!r}: only with v3 or v4")
        return self

    @property
    def rho_value(self) -> float:
        """``rho``, or the reward version's default when it is None."""
        return (0.6 if self.reward in ("v3", "v4") else 0.5) if self.rho is None else float(self.rho)

    @property
    def seconds_pricing(self) -> bool:
        """Whether selection is priced in seconds from the catalog (``select_cost``)."""
        return self.select_cost == "seconds" or (self.select_cost == "auto" and self.reward in ("v3", "v4"))

    @property
    def tbar_window(self) -> int:
        """v1: participations whose T define T̄: the warm-up (``warmup * |arms|``), at least 1."""
        return max(1, self.warmup * len(self.arms))


class _ParamsView(Mapping):
    """Method name -> params class, over the method registry (a plugin's method included)."""

    def __getitem__(self, name: str) -> type[AlgorithmParams]:
        return method_params(name)

    def __iter__(self) -> Iterator[str]:
        return iter(METHODS.names())

    def __len__(self) -> int:
        return len(METHODS.names())


ALGORITHM_PARAMS: Mapping[str, type[AlgorithmParams]] = _ParamsView()
