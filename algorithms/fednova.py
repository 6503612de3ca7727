"""FedNova (Wang, Liu, Liang, Joshi and Poor, 2020, "Tackling the objective inconsistency problem in
heterogeneous federated optimization", NeurIPS).

When clients do different numbers of local steps ``tau_i`` (different data sizes under local
epochs, or a work policy that gives slow devices fewer steps), FedAvg's average of their models
weights each client's objective by its ``tau_i``: it converges to the optimum of the wrong
objective. FedNova normalises each client's update by the norm of its local aggregation vector
``a_i`` before averaging, and scales the average by the round's effective number of steps:

    d_i = (x - y_i) / ||a_i||_1,      tau_eff = sum_i p_i ||a_i||_1,
    x  <-  x - tau_eff * sum_i p_i d_i

with ``p_i`` the clients' shares of the round's samples, ``y_i`` the trained model. For local SGD
``a_i = (1, ..., 1)`` (``||a_i||_1 = tau_i``); with momentum ``rho`` (the paper's eq. for momentum
SGD) ``||a_i||_1 = (tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho)``. A client uploads its
model and ``||a_i||_1`` (one float32 more than FedAvg). Floating buffers (BatchNorm statistics)
are averaged as FedAvg's. Synchronous only (:class:`~algorithms.heterogeneity_params.FedNovaParams`).
"""
from __future__ import annotations

import numpy as np
import torch

from algorithms.base import (
    FLOAT32_BYTES,
    AlgorithmSpec,
    ArchShape,
    Broadcast,
    Client,
    ClientContext,
    ClientResult,
    Payload,
    Server,
    TimingPayload,
)
from algorithms.heterogeneity_params import FedNovaParams
from algorithms.state_rules import float32_payload, params64, set_state, weighted_params
from algorithms.toolkit import group_by_arch, sample_weights
from algorithms.training import flat_state, load_flat_state, local_sgd, num_params


def a_norm(tau: int, momentum: float = 0.0) -> float:
    """``||a_i||_1`` of ``tau`` local SGD steps with momentum ``rho`` (Wang et al., 2020)."""
    if tau <= 0:
        return 0.0
    if momentum == 0.0:
        return float(tau)
    rho = float(momentum)
    return (tau - rho * (1.0 - rho ** tau) / (1.0 - rho)) / (1.0 - rho)


class FedNovaClient(Client):
    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        load_flat_state(ctx.model, broadcast.arrays["state"])

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        loss, seen = local_sgd(ctx, loss=self.loss_of(ctx))
        norm = a_norm(ctx.steps_done, ctx.train.momentum)
        return ClientResult(ctx.client_id, ctx.arch, float32_payload(state=flat_state(ctx.model), a=np.array([norm])),
                            num_samples=len(ctx.train_y), train_flops=ctx.flops_per_sample * seen,
                            metrics={"train_loss": loss, "tau": ctx.steps_done})


class FedNovaServer(Server):
    """Normalised averaging: each update divided by its client's local steps."""

    def broadcast(self, round: int) -> Broadcast:
        return {arch: float32_payload(state=flat_state(m)) for arch, m in self.models.items()}

    @classmethod
    def timing_payload(cls, params, shapes: dict[str, ArchShape]) -> TimingPayload:
        """The full state down; the full state and ``||a_i||_1`` up."""
        return TimingPayload({a: FLOAT32_BYTES * s.state for a, s in shapes.items()},
                             {a: FLOAT32_BYTES * (s.state + 1) for a, s in shapes.items()})

    def aggregate(self, round: int, results: list[ClientResult]) -> dict:
        tau_eff = []
        for arch, mine in group_by_arch(results, self.models).items():
            model = self.models[arch]
            x, d = params64(model), num_params(model)
            p = sample_weights(mine)
            a = torch.tensor([float(r.upload.arrays["a"][0]) for r in mine], dtype=torch.float64)
            coef = torch.where(a > 0, p / a.clamp(min=1e-300), torch.zeros_like(p))  # no steps: no update
            # sum_i p_i (x - y_i) / a_i, with the y_i's weighted sum in float64
            direction = x * coef.sum() - weighted_params(coef, mine, "state", d)
            eff = float((p * a).sum())
            set_state(model, x - eff * direction, mine)
            tau_eff.append(eff)
        return {"tau_eff": float(np.mean(tau_eff))} if tau_eff else {}


SPEC = AlgorithmSpec("fednova", FedNovaParams, FedNovaClient, FedNovaServer,
                     "FedNova: updates normalised by each client's local steps (Wang et al., 2020)")
