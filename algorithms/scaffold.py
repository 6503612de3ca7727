"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, 2020, "SCAFFOLD: stochastic controlled
averaging for federated learning", ICML), control variates of option II.

Clients drift towards their own optimum during local steps. SCAFFOLD corrects each local step with
control variates, the server's ``c`` and the client's ``c_i`` (zero at the start):

    y  <-  y - eta (g_i(y) - c_i + c)                        (K local steps from y = x)
    c_i+ = c_i - c + (x - y) / (K eta)                        (option II)
    upload  dy_i = y - x,  dc_i = c_i+ - c_i
    x  <-  x + eta_g mean_S(dy_i),     c  <-  c + (1 / N) sum_S dc_i

(``N``: the clients of the fleet of that architecture; ``S``: the round's clients whose upload
arrived). The correction ``c - c_i`` enters through :meth:`Client.batch_loss` as the linear term
``<w, c - c_i>``, whose gradient it is, added to the objective of the class below it in the MRO
(cross-entropy; a subclass may put another objective there); its value is taken out again
(``lin - lin.detach()``), so ``train_loss`` stays the objective's. The broadcast carries ``c``
beside the model and the upload ``dc_i`` beside the model: twice FedAvg's bytes each way, counted.
A client whose upload is lost (deadline, over-selection) takes back its ``c_i`` (``on_dropped``),
so ``c`` stays the mean of the ``c_i``. Floating buffers (BatchNorm statistics) are averaged as
the deltas are. Synchronous only.
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
    ServerContext,
    TimingPayload,
)
from algorithms.heterogeneity_params import ScaffoldParams
from algorithms.state_rules import float32_payload, params64, set_state, weighted_params
from algorithms.toolkit import group_by_arch, sample_weights
from algorithms.training import flat_params, flat_state, load_flat_state, local_sgd, num_params, round_lr

CONTROL, PREVIOUS = "control", "control_previous"  # the client's c_i, and the one before this round's


class ScaffoldClient(Client):
    def __init__(self, params: ScaffoldParams):
        super().__init__(params)
        self._correction: dict[int, list[torch.Tensor]] = {}  # per client while it trains: c - c_i per parameter

    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        load_flat_state(ctx.model, broadcast.arrays["state"])

    def batch_loss(self, ctx: ClientContext, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The objective of the class below in the MRO (cross-entropy) with the correction's gradient."""
        base = super().batch_loss(ctx, model, x, y)
        lin = sum((p * g).sum() for p, g in zip(model.parameters(), self._correction[ctx.client_id]))
        return base + (lin - lin.detach())  # the gradient of <w, c - c_i>, the value of the objective

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        model = ctx.model
        x = flat_params(model).double()
        c = torch.from_numpy(np.asarray(broadcast.arrays[CONTROL], dtype=np.float64))
        ci = torch.from_numpy(np.asarray(ctx.state.get(CONTROL, np.zeros(len(c), np.float32)), dtype=np.float64))
        diff = (c - ci).float().to(x.device)
        self._correction[ctx.client_id] = [chunk.view_as(p) for chunk, p in
                                           zip(torch.split(diff, [p.numel() for p in model.parameters()]),
                                               model.parameters())]
        try:
            loss, seen = local_sgd(ctx, loss=self.loss_of(ctx))
        finally:
            del self._correction[ctx.client_id]
        k, lr = ctx.steps_done, round_lr(ctx)
        y = flat_params(model).double().cpu()
        ci_new = ci - c + (x.cpu() - y) / (k * lr) if k > 0 else ci  # option II
        ctx.state[PREVIOUS] = ci.float().numpy()
        ctx.state[CONTROL] = ci_new.float().numpy()
        return ClientResult(ctx.client_id, ctx.arch, float32_payload(state=flat_state(model), dcontrol=ci_new - ci),
                            num_samples=len(ctx.train_y), train_flops=ctx.flops_per_sample * seen,
                            metrics={"train_loss": loss})

    def on_dropped(self, state: dict, round: int) -> None:
        if PREVIOUS in state:  # the server never heard of this round's c_i
            state[CONTROL] = state.pop(PREVIOUS)


class ScaffoldServer(Server):
    """Control variates: the server's c, broadcast with the model, corrects every local step."""

    checkpoint_fields = ("control",)

    def __init__(self, params: ScaffoldParams, models, seed: int, context: ServerContext | None = None):
        super().__init__(params, models, seed, context)
        self.control = {arch: np.zeros(num_params(m), dtype=np.float64) for arch, m in models.items()}
        archs = self.context.client_arch
        self.fleet = {arch: (int(np.sum(archs == arch)) if archs is not None else 0) or self.context.num_clients
                      for arch in models}  # N per architecture

    def broadcast(self, round: int) -> Broadcast:
        return {arch: float32_payload(state=flat_state(m), control=self.control[arch]) for arch, m in
                self.models.items()}

    @classmethod
    def timing_payload(cls, params, shapes: dict[str, ArchShape]) -> TimingPayload:
        """The state and the control variate down (c) and up (dc_i)."""
        both = {a: FLOAT32_BYTES * (s.state + s.parameters) for a, s in shapes.items()}
        return TimingPayload(both, both)

    def aggregate(self, round: int, results: list[ClientResult]) -> dict:
        for arch, mine in group_by_arch(results, self.models).items():
            model = self.models[arch]
            x, d = params64(model), num_params(model)
            w = (torch.full((len(mine),), 1.0 / len(mine), dtype=torch.float64) if self.params.weighting == "uniform"
                 else sample_weights(mine))
            dy = weighted_params(w, mine, "state", d) - x  # sum_i w_i y_i - x, the weights summing to 1
            set_state(model, x + self.params.server_lr * dy, mine, weights=w)
            dc = weighted_params(torch.ones(len(mine), dtype=torch.float64), mine, "dcontrol", d)
            self.control[arch] = self.control[arch] + dc.numpy() / max(self.fleet[arch], 1)
        return {}


SPEC = AlgorithmSpec("scaffold", ScaffoldParams, ScaffoldClient, ScaffoldServer,
                     "SCAFFOLD: local steps corrected by control variates (Karimireddy et al., 2020)")
