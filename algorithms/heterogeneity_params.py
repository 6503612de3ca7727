"""The options of the methods built for heterogeneous fleets (FedNova, SCAFFOLD, the FedOpt family),
importable without torch: validating a config imports these classes, never the methods
(:mod:`algorithms.fednova`, :mod:`algorithms.scaffold`, :mod:`algorithms.fedopt`). Each method's
equations and sources are in docs/toolbox.md.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from algorithms.base import AlgorithmParams


class FedNovaParams(AlgorithmParams):
    """FedNova (Wang et al., 2020): each client's update normalised by its local steps, then scaled
    by the round's effective number of steps."""

    uploads_whole_model: ClassVar[bool] = True
    synchronous_only: ClassVar[str | None] = (
        "FedNova normalises the updates a round aggregates by the local steps of each of its clients, and an "
        "asynchronous server has no rounds")


class ScaffoldParams(AlgorithmParams):
    """SCAFFOLD (Karimireddy et al., 2020), control variates of option II."""

    uploads_whole_model: ClassVar[bool] = True
    synchronous_only: ClassVar[str | None] = (
        "SCAFFOLD's control variates are updated once per round from the clients of that round (option II divides "
        "a client's drift by its K local steps between two broadcasts), and an asynchronous server has no rounds")
    server_lr: float = Field(1.0, gt=0, allow_inf_nan=False, description="the global step size eta_g: x <- x + "
                             "eta_g * mean of the clients' model deltas")
    weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="how the model deltas are averaged: uniform over the round's clients (the paper), "
        "or by their training samples (as FedAvg)")


# Reddi et al. tune the server learning rate per task; these defaults are in the range that worked
# for their image tasks (sgd/momentum: FedAvg's and FedAvgM's step of 1)
DEFAULT_SERVER_LR = {"sgd": 1.0, "momentum": 1.0, "adam": 0.01, "yogi": 0.01, "adagrad": 0.1}


class FedOptParams(AlgorithmParams):
    """The FedOpt family (Reddi et al., 2021): the server treats the round's mean model delta as a
    pseudo-gradient and steps with its own optimiser (sgd: FedAvg, momentum: FedAvgM, adam: FedAdam,
    yogi: FedYogi, adagrad: FedAdagrad)."""

    uploads_whole_model: ClassVar[bool] = True
    server_optimizer: Literal["sgd", "momentum", "adam", "yogi", "adagrad"] = Field(
        "adam", description="the server's optimiser: sgd (FedAvg with a server learning rate), momentum (FedAvgM, "
        "Hsu et al. 2019), adam (FedAdam), yogi (FedYogi), adagrad (FedAdagrad)")
    server_lr: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="the server learning rate eta (null: 1.0 for sgd and momentum, "
        "0.01 for adam and yogi, 0.1 for adagrad)")
    beta1: float = Field(0.9, ge=0, lt=1, description="the first-moment decay (momentum: the momentum)")
    beta2: float = Field(0.99, ge=0, lt=1, description="the second-moment decay (adam, yogi)")
    tau: float = Field(1e-3, gt=0, allow_inf_nan=False, description="the adaptivity tau: the step is eta m / (sqrt(v) "
                       "+ tau), and v starts at tau^2 (adam, yogi, adagrad)")

    @property
    def lr(self) -> float:
        """``server_lr``, or the optimiser's default."""
        return DEFAULT_SERVER_LR[self.server_optimizer] if self.server_lr is None else float(self.server_lr)
