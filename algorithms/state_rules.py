"""What the server rules of FedNova, SCAFFOLD and FedOpt share: the global state split into its
parameters (what a rule steps, in float64) and its floating buffers (BatchNorm statistics, which no
gradient moves: their sample-weighted mean, as FedAvg's), and sums of the clients' uploads.

Plain torch / numpy: no Ray, no I/O.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from algorithms.base import FLOAT32_BYTES, ClientResult, Payload
from algorithms.toolkit import sample_weights, weighted_mean
from algorithms.training import flat_buffers, flat_params, load_flat_buffers, load_flat_params, num_params


def float32_payload(**arrays: torch.Tensor | np.ndarray) -> Payload:
    """The arrays as float32 numpy (what travels) and their bytes."""
    out = {k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)).astype(np.float32)
           for k, v in arrays.items()}
    return Payload(out, nbytes=FLOAT32_BYTES * sum(a.size for a in out.values()))


def params64(model: torch.nn.Module) -> torch.Tensor:
    """The model's parameters as one float64 vector (a rule's ``x``)."""
    return flat_params(model).double()


def weighted_params(weights: torch.Tensor, results: Sequence[ClientResult], key: str, d: int) -> torch.Tensor:
    """``sum_i weights_i u_i[:d]`` (float64) of the uploads' arrays ``key`` (their parameters)."""
    return weighted_mean(weights, [np.asarray(r.upload.arrays[key]).reshape(-1)[:d] for r in results], float64=True)


def set_state(model: torch.nn.Module, params: torch.Tensor, results: Sequence[ClientResult], key: str = "state",
              weights: torch.Tensor | None = None) -> None:
    """Load ``params`` into the model and, if it has floating buffers, the weighted mean of the
    uploads' buffers (default weights: the clients' samples)."""
    load_flat_params(model, params.float())
    d = num_params(model)
    if flat_buffers(model).numel():
        w = sample_weights(results) if weights is None else weights
        load_flat_buffers(model, weighted_mean(w, [np.asarray(r.upload.arrays[key]).reshape(-1)[d:] for r in results]))
