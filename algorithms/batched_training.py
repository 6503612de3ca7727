"""Local SGD of many clients of one architecture at once, with ``torch.func``.

Small models leave a GPU mostly idle when clients train one after another: each step is a
handful of tiny kernels. :func:`train_batched` stacks the clients' parameters along a leading
client dimension and runs every step of all of them as one ``vmap`` of
``grad_and_value(functional_call(model, ...))``: one set of (larger) kernels per step.

Each client keeps its own parameters, BatchNorm buffers, momentum buffer, data order (its
batches are given, drawn from its own seeded generator) and FedProx centre, and gets the update
:func:`algorithms.training.local_sgd` would give it: the same loss, the same SGD arithmetic
(``torch.optim.SGD``'s single-tensor rule: weight decay, then momentum with the first step's
buffer a copy of the gradient, then ``p -= lr * d``), the same float64 loss sum. Only the
forward and backward kernels differ (a batched convolution or matmul sums in another order), so
results equal the sequential loop up to float32 reordering; ``docs/gpu.md`` states the measured
tolerance and ``tests/algorithms/test_batched_training.py`` checks it.

**Different dataset sizes.** Clients with fewer samples take fewer steps, and a client's last
batch of an epoch is smaller than the others. Nothing is padded (padding would change
BatchNorm's batch statistics and the mean loss): at step ``t`` only the clients that still have
a ``t``-th batch are active (the others are masked out), and the active ones are grouped by the
size of that batch, one ``vmap`` call per distinct size. In the common case (equal batch sizes)
that is one call for all clients; the tails of the epochs add a few small calls.

This module is plain torch: no Ray, no I/O, no engine imports.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.training import batch_schedule, flat_params


@dataclass
class BatchJob:
    """One client's local training: where it starts and which samples each step sees."""

    params: dict[str, torch.Tensor]  # start parameters, by name (on the training device)
    buffers: dict[str, torch.Tensor]  # start buffers (BatchNorm statistics), by name
    batches: list[torch.Tensor]  # per step: indices into the shared x / y (int64, on the device)
    rows: int | None = None  # how many rows the batches were drawn over (None: not checked)


@dataclass
class TrainedUpdate:
    """What :func:`train_batched` computed for one client; :func:`local_sgd` applies it."""

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    loss: float  # mean training loss, as local_sgd reports it
    seen: int  # samples processed
    prox_mu: float  # the FedProx coefficient it was trained with
    rng_state: dict[str, Any] | None = None  # the client's generator right after its batches were drawn
    rows: int | None = None  # the rows its batches were drawn over (Client.train_rows)
    steps: int = 0  # its batches (local_sgd adds them to ctx.steps_done)
    used: bool = field(default=False)

    @torch.no_grad()
    def apply(self, ctx, prox_center: torch.Tensor | None, prox_mu: float) -> tuple[float, int]:
        """Load the trained state into ``ctx.model`` in place of training it; checks that the
        method asked for the very training that was batched."""
        if self.used:
            raise RuntimeError("batch_clients: local_sgd called twice in one fit; only one local "
                               "training per round can be batched (set executor.batch_clients: false)")
        self.used = True
        mu = prox_mu if prox_center is not None else 0.0
        if mu != self.prox_mu:
            raise RuntimeError(f"batch_clients: fit asked for local_sgd with prox_mu={mu}, but the "
                               f"batch was trained with prox_mu={self.prox_mu} (Client.prox_mu())")
        if self.rows is not None and len(ctx.train_y) != self.rows:
            raise RuntimeError(f"batch_clients: fit trains on {len(ctx.train_y)} rows, but the batch was drawn "
                               f"over {self.rows} (Client.train_rows() must name the rows fit trains on)")
        start = flat_params(ctx.model)  # the model holds what the client received
        if mu > 0 and not torch.equal(prox_center.to(start.device), start):
            raise RuntimeError("batch_clients: the FedProx centre is not the model the client "
                               "received; it cannot be batched")
        if self.rng_state is not None and ctx.rng.bit_generator.state != self.rng_state:
            raise RuntimeError("batch_clients: the method drew from ctx.rng between receive() and "
                               "local_sgd(); the batched data order would differ from the sequential one")
        model = ctx.model
        model.train()
        ctx.steps_done += self.steps
        for name, p in model.named_parameters():
            p.copy_(self.params[name])
        for name, b in model.named_buffers():
            if name in self.buffers:
                b.copy_(self.buffers[name])
        return self.loss, self.seen


def has_randomness(model: torch.nn.Module) -> bool:
    """Dropout draws per call: a vmap over clients cannot reproduce each client's own draws."""
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) for m in model.modules())


def draw_batches(rng: np.random.Generator, train_ids: torch.Tensor, batch_size: int,
                 epochs: int, steps: int | None = None) -> list[torch.Tensor]:
    """The client's batches, drawn exactly as :func:`local_sgd` draws them
    (:func:`~algorithms.training.batch_schedule`), as indices into the shared arrays."""
    return [train_ids[torch.from_numpy(b).to(train_ids.device)]
            for b in batch_schedule(rng, len(train_ids), batch_size, epochs, steps)]


def _stack(jobs: list[BatchJob], attr: str) -> dict[str, torch.Tensor]:
    names = getattr(jobs[0], attr).keys()
    return {n: torch.stack([getattr(j, attr)[n] for j in jobs]) for n in names}


def train_batched(
    model: torch.nn.Module,
    jobs: list[BatchJob],
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    prox_mu: float = 0.0,
) -> list[TrainedUpdate]:
    """Train every job's client from its start state over its batches; one update per job.

    ``model`` is only the architecture (its own parameters are not used). FedProx
    (``prox_mu > 0``) pulls each client towards its own start parameters, as FedAvg's FedProx
    variant asks (``local_sgd(ctx, prox_center=<received model>, prox_mu=mu)``).
    """
    from torch.func import functional_call, grad_and_value, vmap  # torch.func: only batched training uses it

    if not jobs:
        return []
    model.train()
    nclients = len(jobs)
    device = x.device
    params = _stack(jobs, "params")  # name -> (B, *shape)
    buffers = _stack(jobs, "buffers")
    names = list(params)
    centre = {n: p.clone() for n, p in params.items()} if prox_mu > 0 else None
    moment = {n: torch.zeros_like(p) for n, p in params.items()} if momentum != 0 else None

    def loss_fn(p, b, c, xb, yb):
        ce = F.cross_entropy(functional_call(model, (p, b), (xb,)), yb)
        if c is None:
            return ce, ce
        # FedProx exactly as local_sgd writes it: on the flat vector of all parameters
        w = torch.cat([p[n].reshape(-1) for n in names])
        w0 = torch.cat([c[n].reshape(-1) for n in names])
        return ce + 0.5 * prox_mu * torch.sum((w - w0) ** 2), ce

    step_fn = vmap(grad_and_value(loss_fn, has_aux=True),
                   in_dims=(0, 0, 0 if centre is not None else None, 0, 0))
    steps = [len(j.batches) for j in jobs]
    loss_sum = torch.zeros(nclients, dtype=torch.float64, device=device)
    seen = [0] * nclients
    for t in range(max(steps)):
        groups: dict[int, list[int]] = defaultdict(list)  # batch size -> clients with a t-th batch
        for b in range(nclients):
            if t < steps[b]:
                groups[len(jobs[b].batches[t])].append(b)
        for size, members in groups.items():
            everyone = len(members) == nclients
            sel = None if everyone else torch.tensor(members, device=device)
            pick = (lambda d: d) if everyone else (lambda d, sel=sel: {n: v[sel] for n, v in d.items()})
            p, bufs = pick(params), pick(buffers)  # a gathered copy for a subset
            c = pick(centre) if centre is not None else None
            idx = torch.stack([jobs[b].batches[t] for b in members])  # (G, size)
            (grads, (_, ce)) = step_fn(p, bufs, c, x[idx], y[idx])
            with torch.no_grad():
                for n in names:  # torch.optim.SGD's single-tensor rule, for all clients at once
                    d = grads[n]
                    if weight_decay != 0:
                        d = d.add(p[n], alpha=weight_decay)
                    if moment is not None:
                        if t == 0:  # every client's first step: the buffer is the gradient
                            buf = d.detach().clone()
                        else:
                            buf = moment[n] if everyone else moment[n][sel]
                            buf.mul_(momentum).add_(d, alpha=1)
                        if everyone:
                            moment[n] = buf
                        else:
                            moment[n][sel] = buf
                        d = buf
                    p[n].add_(d, alpha=-lr)
                    if not everyone:
                        params[n][sel] = p[n]
                if not everyone:  # BatchNorm updated the gathered copy in place
                    for n, v in bufs.items():
                        buffers[n][sel] = v
                if everyone:
                    loss_sum += ce.detach().double() * size
                else:
                    loss_sum[sel] += ce.detach().double() * size
            for b in members:
                seen[b] += size
    totals = loss_sum.tolist()
    return [
        TrainedUpdate(
            params={n: params[n][b] for n in names},
            buffers={n: v[b] for n, v in buffers.items()},
            loss=totals[b] / max(seen[b], 1),
            seen=seen[b],
            prox_mu=prox_mu,
            rows=jobs[b].rows,
            steps=len(jobs[b].batches),
        )
        for b in range(nclients)
    ]
