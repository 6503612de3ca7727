"""FedNTD (Lee, Jeong, Kim, Lee and Yun, "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning", NeurIPS 2022).

Each client distils the round's global model's predictions on the *not-true* classes (every
class but a sample's label) into the model it trains: with ``l~`` and ``g~`` the local and global
logits without the true class's,

    L_NTD = KL( softmax(g~ / tau) || softmax(l~ / tau) )      (mean over the batch)
    loss  = CE(logits, y) + beta * L_NTD

(the paper's eq. 5 and 6; its code's defaults tau = 1, beta = 1). The global model is a frozen
copy in evaluation mode. Uploads and aggregation are FedAvg's, so asynchronous runs take the
engine's FedBuff/FedAsync step and timing-only runs FedAvg's wire format; the frozen forward per
trained sample is charged (:func:`~algorithms.frozen_models.with_forwards`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from algorithms.base import AlgorithmSpec, ArchShape, Client, ClientContext, ClientResult, Payload
from algorithms.baseline_params import FedNTDParams
from algorithms.fedavg import FedAvgServer, state_payload
from algorithms.frozen_models import ForwardsTiming, FrozenCopies, with_forwards
from algorithms.training import flat_state, load_flat_state, local_sgd


def not_true(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``logits`` without each row's true class: ``(batch, classes - 1)``, the other classes in order."""
    keep = torch.ones_like(logits, dtype=torch.bool).scatter_(1, y.reshape(-1, 1), False)
    return logits[keep].reshape(len(logits), logits.shape[1] - 1)


def ntd_loss(logits: torch.Tensor, global_logits: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """``KL(softmax(g~ / tau) || softmax(l~ / tau))`` averaged over the batch."""
    log_p = F.log_softmax(not_true(logits, y) / tau, dim=1)
    q = F.softmax(not_true(global_logits, y) / tau, dim=1)
    return F.kl_div(log_p, q, reduction="batchmean")


class FedNTDClient(Client):
    params: FedNTDParams

    def __init__(self, params: FedNTDParams):
        super().__init__(params)
        self.frozen = FrozenCopies()

    def forwards(self) -> int:
        """Frozen forward passes per trained sample: the global model's (none at beta = 0)."""
        return 1 if self.params.beta > 0 else 0

    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        load_flat_state(ctx.model, broadcast.arrays["state"])

    def batch_loss(self, ctx: ClientContext, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        if not self.forwards():
            return loss
        with torch.no_grad():
            global_logits = self.frozen.get(ctx, "global")(x)
        return loss + self.params.beta * ntd_loss(logits, global_logits, y, self.params.tau)

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        if self.forwards():  # here, not in receive: a host may receive every client before the first fit
            self.frozen.load(ctx, "global", broadcast.arrays["state"])
        loss, seen = local_sgd(ctx, loss=self.loss_of(ctx))
        return ClientResult(ctx.client_id, ctx.arch, state_payload(flat_state(ctx.model)), len(ctx.train_y),
                            with_forwards(ctx.flops_per_sample, seen, self.forwards()), metrics={"train_loss": loss})


class FedNTDServer(FedAvgServer):
    @classmethod
    def timing_payload(cls, params: FedNTDParams, shapes: dict[str, ArchShape]) -> ForwardsTiming:
        """FedAvg's full state down and up; the frozen global forward on the clock."""
        return ForwardsTiming(shapes, 1 if params.beta > 0 else 0)


SPEC = AlgorithmSpec("fedntd", FedNTDParams, FedNTDClient, FedNTDServer, "FedNTD: not-true distillation (tau, beta)")
