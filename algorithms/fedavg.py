"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020).

Both share the full model state (parameters and floating-point buffers) uncompressed and
aggregate it weighted by local sample counts. FedProx adds the proximal term
``mu/2 ||w - w_global||^2`` to the local objective.
"""
from __future__ import annotations

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
from algorithms.params import FedAvgParams, FedProxParams
from algorithms.toolkit import group_by_arch, sample_weighted_mean
from algorithms.training import flat_params, flat_state, load_flat_state, local_sgd


def state_payload(vector: torch.Tensor) -> Payload:
    array = vector.detach().cpu().numpy().astype("float32", copy=True)  # leaves the device
    return Payload(arrays={"state": array}, nbytes=FLOAT32_BYTES * array.size)


class FedAvgClient(Client):
    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        load_flat_state(ctx.model, broadcast.arrays["state"])

    def prox_mu(self) -> float:
        return getattr(self.params, "mu", 0.0)

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        mu = self.prox_mu()
        center = flat_params(ctx.model) if mu > 0 else None
        loss, seen = local_sgd(ctx, prox_center=center, prox_mu=mu, loss=self.loss_of(ctx))
        return ClientResult(
            client_id=ctx.client_id,
            arch=ctx.arch,
            upload=state_payload(flat_state(ctx.model)),
            num_samples=len(ctx.train_y),
            train_flops=ctx.flops_per_sample * seen,
            metrics={"train_loss": loss},
        )


class FedAvgServer(Server):
    def broadcast(self, round: int) -> Broadcast:
        return {arch: state_payload(flat_state(m)) for arch, m in self.models.items()}

    @classmethod
    def timing_payload(cls, params, shapes: dict[str, ArchShape]) -> TimingPayload:
        """The full state (float32) down and up; no compression."""
        full = {arch: FLOAT32_BYTES * shape.state for arch, shape in shapes.items()}
        return TimingPayload(full, full)

    def aggregate(self, round: int, results: list[ClientResult]) -> dict:
        for arch, mine in group_by_arch(results, self.models).items():
            load_flat_state(self.models[arch], sample_weighted_mean(mine, "state"))
        return {}


FEDAVG_SPEC = AlgorithmSpec("fedavg", FedAvgParams, FedAvgClient, FedAvgServer, "FedAvg")
FEDPROX_SPEC = AlgorithmSpec("fedprox", FedProxParams, FedAvgClient, FedAvgServer, "FedProx (mu)")
