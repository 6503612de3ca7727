"""The FedOpt family (Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, 2021,
"Adaptive federated optimization", ICLR): FedAvg's clients, a server with its own optimiser.

The server treats the round's sample-weighted mean model delta as a pseudo-gradient,
``Delta = sum_i p_i (y_i - x)``, and steps with ``algorithm.server_optimizer`` (Reddi et al.'s
Algorithm 2, no bias correction; ``m`` starts at 0 and ``v`` at ``tau^2``):

* ``sgd``:      ``x <- x + eta Delta``  (eta = 1: FedAvg)
* ``momentum``: ``m <- beta1 m + Delta;  x <- x + eta m``  (FedAvgM, Hsu, Qi and Brown, 2019)
* ``adam``:     ``m <- beta1 m + (1 - beta1) Delta;  v <- beta2 v + (1 - beta2) Delta^2``
* ``yogi``:     ``m`` as adam;  ``v <- v - (1 - beta2) Delta^2 sign(v - Delta^2)``
* ``adagrad``:  ``m`` as adam;  ``v <- v + Delta^2``
* adam, yogi, adagrad: ``x <- x + eta m / (sqrt(v) + tau)``

on the parameters (float64; floating buffers, BatchNorm statistics, are averaged as FedAvg's).
``m`` and ``v`` are checkpointed. Asynchronously the pseudo-gradient is the step FedBuff or
FedAsync would take (``asynchronous.mode``, its staleness weights and ``asynchronous.server_lr``),
and the server optimiser steps with it: ``sgd`` with ``eta = 1`` is FedBuff / FedAsync.
"""
from __future__ import annotations

import numpy as np
import torch

from algorithms.asynchronous import client_state
from algorithms.base import AlgorithmSpec, ServerContext
from algorithms.fedavg import FedAvgClient, FedAvgServer
from algorithms.heterogeneity_params import FedOptParams
from algorithms.state_rules import params64, set_state, weighted_params
from algorithms.toolkit import group_by_arch, sample_weights
from algorithms.training import flat_state, load_flat_buffers, load_flat_params, num_params


def server_step(p: FedOptParams, x: np.ndarray, delta: np.ndarray, m: np.ndarray | None,
                v: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One step of the server optimiser on the pseudo-gradient ``delta`` (float64 arrays): the new
    ``x`` and moments ``m``, ``v`` (None before the first step)."""
    opt, eta, b1, b2, tau = p.server_optimizer, p.lr, p.beta1, p.beta2, p.tau
    if opt == "sgd":
        return x + eta * delta, np.zeros(0), None
    m = np.zeros_like(x) if m is None or m.size == 0 else m
    if opt == "momentum":
        m = b1 * m + delta
        return x + eta * m, m, None
    m = b1 * m + (1.0 - b1) * delta
    v = np.full_like(x, tau * tau) if v is None else v
    sq = delta * delta
    if opt == "adam":
        v = b2 * v + (1.0 - b2) * sq
    elif opt == "yogi":
        v = v - (1.0 - b2) * sq * np.sign(v - sq)
    else:  # adagrad
        v = v + sq
    return x + eta * m / (np.sqrt(v) + tau), m, v


class FedOptServer(FedAvgServer):
    """The round's mean model delta as a pseudo-gradient for the server's own optimiser."""

    checkpoint_fields = ("moment", "variance")

    def __init__(self, params: FedOptParams, models, seed: int, context: ServerContext | None = None):
        super().__init__(params, models, seed, context)
        self.moment: dict[str, np.ndarray] = {}  # m per architecture
        self.variance: dict[str, np.ndarray] = {}  # v per architecture (adam, yogi, adagrad)

    def _step(self, arch: str, x: np.ndarray, delta: np.ndarray) -> np.ndarray:
        new, m, v = server_step(self.params, x, delta, self.moment.get(arch), self.variance.get(arch))
        if m.size:
            self.moment[arch] = m
        if v is not None:
            self.variance[arch] = v
        return new

    def aggregate(self, round: int, results: list) -> dict:
        for arch, mine in group_by_arch(results, self.models).items():
            model = self.models[arch]
            x = params64(model)
            delta = weighted_params(sample_weights(mine), mine, "state", num_params(model)) - x
            set_state(model, torch.from_numpy(self._step(arch, x.numpy(), delta.numpy())), mine)
        return {}

    def async_step(self, step: int, updates: list, rule) -> dict:
        """The FedBuff / FedAsync step over the update(s) as the pseudo-gradient."""
        for arch, model in self.models.items():
            mine = [u for u in updates if u.result.arch == arch]
            if not mine:
                continue
            d = num_params(model)
            current = flat_state(model).double().cpu().numpy()
            states = [client_state(u.result.upload, u.base, d) for u in mine]
            if rule.mode == "fedasync":  # (1 - alpha) w + alpha w_i
                delta = rule.scale(mine[0].weight) * (states[0] - current)
            else:  # FedBuff: sum_i p_i s(tau_i) (w_i - b_i), times its server_lr
                m = np.array([u.result.num_samples for u in mine], dtype=np.float64)
                share = m / m.sum() if m.sum() > 0 else np.full(len(m), 1.0 / len(m))
                weights = rule.server_lr * share * np.array([u.weight for u in mine], dtype=np.float64)
                delta = sum(w * (s - u.base) for w, s, u in zip(weights, states, mine))
            load_flat_params(model, self._step(arch, current[:d], delta[:d]))
            if current.size > d:
                load_flat_buffers(model, current[d:] + delta[d:])
        return {}


SPEC = AlgorithmSpec("fedopt", FedOptParams, FedAvgClient, FedOptServer,
                     "FedOpt: a server optimiser on the mean delta (Reddi et al., 2021)")
