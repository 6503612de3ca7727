"""What the methods whose local loss looks at other models share: frozen copies of the workspace
model, a model's representation, and the FLOPs of their extra forward passes.

**A model's representation** (MOON's contrastive term) is the input of its *output layer*, the
layer that maps it to the logits. A model names its output layer with a ``head`` attribute or
property (the zoo's models do); without one, its last ``nn.Linear`` submodule (``modules()``
order) is taken, which is the output layer of every feed-forward classifier. The representation
and the logits come from one forward pass (a hook reads the head's input), flattened to
``(batch, features)``.

**Extra forwards** are charged as training FLOPs: a forward pass costs ``FORWARD_FRACTION`` of a
sample's training FLOPs (forward + backward ~ 3 forwards), so ``k`` frozen models evaluated on every
trained sample cost ``per_sample * samples * (1 + k * FORWARD_FRACTION)``
(:func:`with_forwards`; the timing-only rule is the same function, :class:`ForwardsTiming`).

Plain torch: no Ray, no I/O.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from algorithms.base import FLOAT32_BYTES, ArchShape, ClientContext, TimingPayload
from algorithms.training import load_flat_state

FORWARD_FRACTION = 1.0 / 3.0  # a forward pass ~ 1/3 of a training step (forward + backward)


def with_forwards(per_sample, samples, forwards: int):
    """Training FLOPs of ``samples`` trained samples plus ``forwards`` frozen forward passes of each
    (python floats or numpy arrays: the same arithmetic, so a timing-only run charges the same bits)."""
    return per_sample * samples * (1.0 + forwards * FORWARD_FRACTION)


class ForwardsTiming(TimingPayload):
    """The full state (float32) down and up, as FedAvg's, with ``forwards`` frozen forwards per
    trained sample on the clock (:func:`with_forwards`)."""

    def __init__(self, shapes: dict[str, ArchShape], forwards: int):
        full = {arch: FLOAT32_BYTES * shape.state for arch, shape in shapes.items()}
        super().__init__(full, full)
        self.forwards = forwards

    def train_flops(self, per_sample: np.ndarray, samples: np.ndarray) -> np.ndarray:
        return with_forwards(per_sample, samples, self.forwards)


def output_layer(model: torch.nn.Module) -> torch.nn.Module:
    """The layer whose input is the model's representation: its ``head``, else its last ``nn.Linear``."""
    head = getattr(model, "head", None)
    if isinstance(head, torch.nn.Module):
        return head
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linear:
        raise ValueError(f"model {type(model).__name__} has no output layer to take its representation from: "
                         "give it a head attribute (the module that maps the representation to the logits) or an "
                         "nn.Linear output layer")
    return linear[-1]


def representation(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z, logits)`` of ``model`` on ``x`` in one forward pass: ``z`` the input of its output layer
    (:func:`output_layer`), flattened to ``(batch, features)``."""
    seen: list[torch.Tensor] = []
    hook = output_layer(model).register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        logits = model(x)
    finally:
        hook.remove()
    if len(seen) != 1:
        raise ValueError(f"the output layer of model {type(model).__name__} ran {len(seen)} times in one forward "
                         "pass; its representation is the input of a layer that runs once (name it head)")
    return seen[0].reshape(len(x), -1), logits


class FrozenCopies:
    """Per architecture and role ("global", "previous"), a copy of the workspace model that never
    trains (evaluation mode, no gradients), loaded with a flat state when a client starts."""

    def __init__(self):
        self.copies: dict[tuple[str, str], torch.nn.Module] = {}

    def load(self, ctx: ClientContext, role: str, flat) -> torch.nn.Module:
        key = (ctx.arch, role)
        model = self.copies.get(key)
        if model is None:
            model = self.copies[key] = copy.deepcopy(ctx.model)
            model.requires_grad_(False)
        load_flat_state(model, flat)
        return model.eval()

    def get(self, ctx: ClientContext, role: str) -> torch.nn.Module:
        return self.copies[(ctx.arch, role)]
