"""Local training and flat-vector helpers shared by every method (plain PyTorch)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.base import ClientContext


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """Trainable parameters as a new float32 vector (no aliasing), ``named_parameters()`` order."""
    params = list(model.parameters())
    if not params:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat([p.detach().reshape(-1) for p in params]).float()


@torch.no_grad()
def load_flat_params(model: torch.nn.Module, flat: torch.Tensor | np.ndarray) -> None:
    """Copy a flat vector into the model's parameters, in place (buffers untouched).

    Copies rather than rebinding ``param.data`` (as ``vector_to_parameters`` does): a rebound
    parameter would alias the broadcast array and training would write into it.
    """
    params = list(model.parameters())
    device = params[0].device if params else None  # one host-to-device copy, not one per tensor
    flat = torch.as_tensor(flat, dtype=torch.float32, device=device).reshape(-1)
    expected = sum(p.numel() for p in params)
    if flat.numel() != expected:
        raise ValueError(f"flat vector has {flat.numel()} elements; the model has {expected} parameters")
    chunks = torch.split(flat, [p.numel() for p in params])
    for p, chunk in zip(params, chunks):  # one vectorised copy per tensor
        p.copy_(chunk.view_as(p))


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flat_buffers(model: torch.nn.Module) -> torch.Tensor:
    """Floating-point buffers (BatchNorm statistics) as one float32 vector."""
    bufs = [b.detach().reshape(-1).float() for b in model.buffers() if b.is_floating_point()]
    return torch.cat(bufs) if bufs else torch.zeros(0)


@torch.no_grad()
def load_flat_buffers(model: torch.nn.Module, flat: torch.Tensor | np.ndarray) -> None:
    bufs = [b for b in model.buffers() if b.is_floating_point()]
    flat = torch.as_tensor(flat, dtype=torch.float32, device=bufs[0].device if bufs else None)
    offset = 0
    for b in bufs:
        b.copy_(flat[offset : offset + b.numel()].view_as(b))
        offset += b.numel()


def flat_state(model: torch.nn.Module) -> torch.Tensor:
    """Parameters followed by floating-point buffers: the full model state FedAvg shares."""
    return torch.cat([flat_params(model), flat_buffers(model)])


@torch.no_grad()
def load_flat_state(model: torch.nn.Module, flat: torch.Tensor | np.ndarray) -> None:
    first = next(model.parameters(), None)
    flat = torch.as_tensor(flat, dtype=torch.float32, device=None if first is None else first.device)
    n = num_params(model)
    load_flat_params(model, flat[:n])
    load_flat_buffers(model, flat[n:])  # the rest are buffers


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (unlike ``torch.equal``: -0.0 is not 0.0, NaN is NaN):
    a forward on the one gives what a forward on the other gives."""
    return (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def round_lr(ctx: ClientContext) -> float:
    return ctx.train.lr * (ctx.train.lr_decay ** ctx.round)


class SGD:
    """``torch.optim.SGD`` (no dampening, no Nesterov), the same update bit for bit, without
    ``torch.optim``: its first ``step`` imports ``torch._dynamo`` (about 1.3 s of CPU, as much as
    importing torch, in every process that trains) and every step pays its hooks and profiler
    bookkeeping, a few percent of a small model's step."""

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 masks: list[torch.Tensor | None] | None = None):
        """``masks``: per parameter, None or a 0/1 tensor of its shape that multiplies its step, so
        the entries it zeroes never change (frozen, whatever the momentum and weight decay)."""
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.momentum_buffers: list[torch.Tensor | None] = [None] * len(self.params)
        self.masks = masks if masks is not None else [None] * len(self.params)
        if len(self.masks) != len(self.params):
            raise ValueError(f"{len(self.masks)} update masks for {len(self.params)} parameters")

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):  # as torch.optim.sgd._single_tensor_sgd
            grad = p.grad
            if grad is None:
                continue
            if self.weight_decay != 0:
                grad = grad.add(p, alpha=self.weight_decay)
            if self.momentum != 0:
                buf = self.momentum_buffers[i]
                if buf is None:
                    buf = self.momentum_buffers[i] = grad.detach().clone()
                else:
                    buf.mul_(self.momentum).add_(grad, alpha=1)
                grad = buf
            mask = self.masks[i]
            p.add_(grad if mask is None else grad * mask, alpha=-self.lr)


class Adam:
    """``torch.optim.Adam`` with its defaults (no weight decay, no AMSGrad) and the same update
    bit for bit as its single-tensor rule (the one it takes on the CPU), without ``torch.optim``
    for the reason given at :class:`SGD`: ASCEND's server distils with Adam every round, and a
    process that runs ASCEND paid ``torch._dynamo``'s import (1.5-3 s of CPU) for it."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params = list(params)
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.steps = [0] * len(self.params)
        self.exp_avgs: list[torch.Tensor | None] = [None] * len(self.params)
        self.exp_avg_sqs: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):  # as torch.optim.adam._single_tensor_adam
            grad = p.grad
            if grad is None:
                continue
            if self.exp_avgs[i] is None:
                self.exp_avgs[i] = torch.zeros_like(p, memory_format=torch.preserve_format)
                self.exp_avg_sqs[i] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avg, exp_avg_sq = self.exp_avgs[i], self.exp_avg_sqs[i]
            self.steps[i] += 1
            exp_avg.lerp_(grad, 1 - self.beta1)
            exp_avg_sq.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            # torch keeps the step count in a float32 tensor and reads it back as a float
            step = float(self.steps[i])
            step_size = self.lr / (1 - self.beta1**step)
            bias_correction2_sqrt = (1 - self.beta2**step) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)


def batch_schedule(rng: np.random.Generator, n: int, batch_size: int, epochs: int,
                   steps: int | None = None) -> list[np.ndarray]:
    """The mini-batches of one round of local training, as index arrays into the client's n
    samples: one permutation of them per epoch from ``rng``, cut into batches (the last one of
    an epoch may be smaller). With ``steps`` the first ``steps`` batches of that same stream
    (as many permutations as they need), so ``steps = epochs * ceil(n / batch_size)`` is
    exactly ``epochs`` epochs."""
    if n == 0:
        return []
    per_epoch = -(-n // batch_size)
    epochs_needed = epochs if steps is None else -(-steps // per_epoch)
    out: list[np.ndarray] = []
    for _ in range(epochs_needed):
        order = rng.permutation(n)
        out.extend(order[start : start + batch_size] for start in range(0, n, batch_size))
    return out if steps is None else out[:steps]


def local_samples(n, batch_size: int, epochs: int, steps: int | None = None) -> np.ndarray:
    """Samples :func:`local_sgd` processes in a round, per client with ``n`` training rows
    (vectorised; what :func:`batch_schedule`'s batches hold): ``epochs * n``, or with ``steps``
    the whole epochs they cover times ``n`` plus the full batches of the next one."""
    n = np.asarray(n, dtype=np.int64)
    if steps is None:
        return epochs * n
    per_epoch = -(-n // batch_size)
    whole, rest = np.divmod(steps, np.maximum(per_epoch, 1))
    return np.where(n > 0, whole * n + rest * batch_size, 0)


def local_sgd(
    ctx: ClientContext,
    prox_center: torch.Tensor | None = None,
    prox_mu: float = 0.0,
    loss: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    update_mask: list[torch.Tensor | None] | None = None,
) -> tuple[float, int]:
    """Run ``local_epochs`` (or ``local_steps`` steps) of mini-batch SGD on the client's data,
    in place on ``ctx.model`` (batches: :func:`batch_schedule`).

    Batches come from ``ctx.rng`` so training is identical on every executor.
    With ``prox_center`` the FedProx term ``mu/2 ||w - center||^2`` is added.
    ``loss(model, x, y)``: the objective of one batch (default: cross-entropy of ``model(x)``), e.g.
    a method's :meth:`~algorithms.base.Client.batch_loss` bound to ``ctx``.
    ``update_mask``: per parameter (``model.parameters()`` order) None or a 0/1 tensor of its shape;
    the entries it zeroes are frozen (FedSPU; :class:`SGD`'s ``masks``).
    Returns (mean training loss, samples processed); the steps taken are added to ``ctx.steps_done``.
    With ``ctx.pretrained`` (``executor.batch_clients``) the training was already done for many
    clients at once (:mod:`algorithms.batched_training`): its result is loaded instead.
    """
    if ctx.pretrained is not None:
        if loss is not None:
            raise RuntimeError("batch_clients trained this client with cross-entropy, but fit asks for its own loss")
        if update_mask is not None:
            raise RuntimeError("batch_clients trained every parameter of this client, but fit asks for an update "
                               "mask (Client.unbatched_reason must say why it cannot be batched)")
        return ctx.pretrained.apply(ctx, prox_center, prox_mu)
    model, s = ctx.model, ctx.train
    model.train()
    opt = SGD(model.parameters(), lr=round_lr(ctx), momentum=s.momentum, weight_decay=s.weight_decay,
              masks=update_mask)
    n = len(ctx.train_y)
    params = list(model.parameters())
    device = ctx.train_x.device
    # float64 sum of (float32 batch loss x batch size), in step order: the same numbers as a
    # Python float sum of loss.item() * size, without a device sync per step
    total_loss = torch.zeros((), dtype=torch.float64, device=device)
    seen = 0
    for batch in batch_schedule(ctx.rng, n, s.batch_size, s.local_epochs, s.local_steps):
        ctx.steps_done += 1
        idx = torch.from_numpy(batch).to(device)
        xb, yb = ctx.train_x[idx], ctx.train_y[idx]
        opt.zero_grad()
        value = F.cross_entropy(model(xb), yb) if loss is None else loss(model, xb, yb)
        total_loss += value.detach().double() * len(idx)
        if prox_center is not None and prox_mu > 0:
            w = torch.nn.utils.parameters_to_vector(params)
            value = value + 0.5 * prox_mu * torch.sum((w - prox_center) ** 2)
        value.backward()
        opt.step()
        seen += len(idx)
    return float(total_loss) / max(seen, 1), seen


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024,
             outputs: bool = False):
    """Returns (summed loss, number correct, number of samples), and with ``outputs`` the model's
    outputs on all of ``x`` (one tensor, for the registered metrics) as a fourth value."""
    model.eval()
    loss_sum, correct, kept = 0.0, 0, []
    for start in range(0, len(y), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        logits = model(xb)
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
        correct += int((logits.argmax(1) == yb).sum())
        if outputs:
            kept.append(logits)
    if not outputs:
        return loss_sum, correct, len(y)
    return loss_sum, correct, len(y), (torch.cat(kept) if kept else torch.zeros(0))
