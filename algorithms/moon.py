"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021).

Each client adds a model-contrastive term to its cross-entropy: with ``z`` the representation of
the model it trains, ``z_glob`` the round's global model's and ``z_prev`` its own model after its
last local training (:mod:`algorithms.frozen_models`: the input of the output layer),

    l_con = -log( exp(cos(z, z_glob) / tau) / (exp(cos(z, z_glob) / tau) + exp(cos(z, z_prev) / tau)) )
    loss  = CE(logits, y) + mu * mean_batch(l_con)

(the paper's eq. 3 and 4, one previous model as its code's default ``model_buffer_size``). The
frozen global and previous models run in evaluation mode. Before a client's first training its
previous model is the initial global model (what it holds before it ever trains, as PFLlib's MOON
keeps it). Uploads and aggregation are FedAvg's (the full state, sample-weighted), so asynchronous
runs take the engine's FedBuff/FedAsync step and timing-only runs FedAvg's wire format; the two
frozen forwards per trained sample are charged (:func:`~algorithms.frozen_models.with_forwards`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from algorithms.base import AlgorithmSpec, ArchShape, Client, ClientContext, ClientResult, Payload
from algorithms.baseline_params import MoonParams
from algorithms.fedavg import FedAvgServer, state_payload
from algorithms.frozen_models import ForwardsTiming, FrozenCopies, representation, with_forwards
from algorithms.training import flat_state, load_flat_state, local_sgd


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """MOON's ``l_con`` averaged over the batch: cross-entropy of the cosine similarities (positive:
    the global model's representation, negative: the previous local model's) over the temperature."""
    sims = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1)
    return F.cross_entropy(sims / temperature, torch.zeros(len(z), dtype=torch.long, device=z.device))


class MoonClient(Client):
    params: MoonParams

    def __init__(self, params: MoonParams):
        super().__init__(params)
        self.frozen = FrozenCopies()
        self.initial: dict[str, torch.Tensor] = {}  # per architecture: the initial model

    def forwards(self) -> int:
        """Frozen forward passes per trained sample: the global and the previous model (none at mu = 0)."""
        return 2 if self.params.mu > 0 else 0

    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        if ctx.arch not in self.initial:  # the host resets its workspace to the initial model before each client
            self.initial[ctx.arch] = flat_state(ctx.model)
        load_flat_state(ctx.model, broadcast.arrays["state"])

    def batch_loss(self, ctx: ClientContext, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z, logits = representation(model, x)
        loss = F.cross_entropy(logits, y)
        if not self.forwards():
            return loss
        with torch.no_grad():
            z_glob = representation(self.frozen.get(ctx, "global"), x)[0]
            z_prev = representation(self.frozen.get(ctx, "previous"), x)[0]
        return loss + self.params.mu * contrastive_loss(z, z_glob, z_prev, self.params.temperature)

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        if self.forwards():  # here, not in receive: a host may receive every client before the first fit
            previous = ctx.state.get("previous")  # before its first training: the initial model
            self.frozen.load(ctx, "previous", self.initial[ctx.arch] if previous is None else previous)
            self.frozen.load(ctx, "global", broadcast.arrays["state"])
        loss, seen = local_sgd(ctx, loss=self.loss_of(ctx))
        state = flat_state(ctx.model)
        ctx.state["previous"] = state.detach().cpu().numpy().copy()
        return ClientResult(ctx.client_id, ctx.arch, state_payload(state), len(ctx.train_y),
                            with_forwards(ctx.flops_per_sample, seen, self.forwards()), metrics={"train_loss": loss})


class MoonServer(FedAvgServer):
    @classmethod
    def timing_payload(cls, params: MoonParams, shapes: dict[str, ArchShape]) -> ForwardsTiming:
        """FedAvg's full state down and up; the frozen global and previous forwards on the clock."""
        return ForwardsTiming(shapes, 2 if params.mu > 0 else 0)


SPEC = AlgorithmSpec("moon", MoonParams, MoonClient, MoonServer, "MOON: model-contrastive loss (mu, temperature)")
