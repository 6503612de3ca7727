"""The options of the baselines FedCSPACK's paper compares with, importable without torch.

MOON, FedNTD, FedSPU and HeteroFL are registered from :mod:`algorithms` through the public
:func:`~algorithms.plugins.register_method`, as a plugin registers its own; validating a config
imports these classes only (no torch). Each default is its paper's, or its authors' code's where
the paper leaves it open (docs/baselines.md says which).
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from algorithms.base import AlgorithmParams


class MoonParams(AlgorithmParams):
    """MOON (Li, He and Song, CVPR 2021): model-contrastive federated learning."""

    name: Literal["moon"] = "moon"
    uploads_whole_model: ClassVar[bool] = True
    mu: float = Field(1.0, ge=0, description="weight of the model-contrastive loss (the paper tunes it in "
                      "{0.1, 1, 5, 10}; its code's default 1)")
    temperature: float = Field(0.5, gt=0, description="temperature tau of the contrastive loss")


class FedNTDParams(AlgorithmParams):
    """FedNTD (Lee et al., NeurIPS 2022): not-true distillation against the global model."""

    name: Literal["fedntd"] = "fedntd"
    uploads_whole_model: ClassVar[bool] = True
    tau: float = Field(1.0, gt=0, description="softmax temperature of the not-true distillation")
    beta: float = Field(1.0, ge=0, description="weight of the not-true distillation loss")


# The paper's five resource levels (update rates 0.2 .. 1.0 of the neurons) on the catalog's device tiers,
# slowest to fastest; a tier not listed (a catalog of your own) takes ``rate``.
FEDSPU_TIER_RATES: dict[str, float] = {
    "phone_low": 0.2, "rpi4": 0.4, "phone_mid": 0.6, "phone_high": 0.8, "laptop_cpu": 1.0, "edge_gpu": 1.0}


def _check_rate(field: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0 < v <= 1):
        raise ValueError(f"{field}={v!r} is not allowed: must be a fraction in (0, 1] of a layer's neurons")
    return float(v)


class FedSPUParams(AlgorithmParams):
    """FedSPU (Niu, Dong and Qin, AAAI 2025): each round a client updates a random subset of each hidden
    layer's neurons (its device's rate) and keeps the rest of its own model frozen; with early stopping."""

    name: Literal["fedspu"] = "fedspu"
    synchronous_only: ClassVar[str | None] = (
        "FedSPU averages each neuron over the round's clients that updated it, and its early stopping retires "
        "clients from a round's selection until fewer are left than a round takes; an asynchronous server has no "
        "rounds")
    rate: float = Field(1.0, description="fraction of each hidden layer's neurons a client updates per round when "
                        "its device tier is not in tier_rates (1: the whole model, as FedAvg)")
    tier_rates: dict[str, float] = Field(
        default_factory=lambda: dict(FEDSPU_TIER_RATES),
        description="update rate by device tier (clients.profiles.devices); default: the paper's five levels 0.2, "
        "0.4, 0.6, 0.8, 1.0 on phone_low, rpi4, phone_mid, phone_high and laptop_cpu (edge_gpu 1.0)")
    early_stopping: bool = Field(True, description="a client whose loss lambda*L_train + (1-lambda)*L_val did not "
                                 "decrease stops being selected; once fewer clients than a round takes are left, the "
                                 "early-stopping round is reached (server_early_stopped) and every client is "
                                 "selected again")
    es_lambda: float = Field(0.7, ge=0, le=1, description="lambda: weight of the training loss in the early-stopping "
                             "loss (its authors' code: 0.7)")
    val_fraction: float = Field(0.3, gt=0, lt=1, description="share of a client's training rows held out of training "
                                "as its early-stopping validation set (its authors' code: a 70/30 split); only "
                                "with early_stopping")

    @field_validator("rate", mode="before")
    @classmethod
    def _check_rate(cls, v: Any) -> float:
        return _check_rate("rate", v)

    @field_validator("tier_rates", mode="before")
    @classmethod
    def _check_tier_rates(cls, v: Any) -> dict[str, float]:
        if not isinstance(v, dict):
            raise ValueError(f"tier_rates={v!r} is not allowed: a mapping of device tier -> rate in (0, 1]")
        return {str(k): _check_rate(f"tier_rates.{k}", x) for k, x in v.items()}


class HeteroFLParams(AlgorithmParams):
    """HeteroFL (Diao, Ding and Tarokh, ICLR 2021): each device tier trains a narrower sub-model (its
    architecture in ``model.zoo``: the same model at a smaller ``width``); the server averages each
    parameter over the clients whose sub-model holds it."""

    name: Literal["heterofl"] = "heterofl"
    uploads_whole_model: ClassVar[bool] = True
    weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="each parameter's mean over the clients that hold it: uniform (the paper) or "
        "weighted by their training samples (as FedAvg)")
