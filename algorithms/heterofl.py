"""HeteroFL (Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient Federated
Learning for Heterogeneous Clients", ICLR 2021): width-scaled sub-models for slow devices.

Each device tier trains its own architecture (``model.zoo``), the same model at a smaller width
(``model.arch_params.<arch>.width``, e.g. 0.5: every hidden layer keeps the first half of its
units). The widest architecture is the *global* model; an architecture's parameters are its
leading blocks, tensor by tensor (``W[:out', :in']``; after a flatten, the first channels' features,
which a channel-major flatten lays first), and each architecture's model is that slice of the
global one. The server averages each global parameter over the clients whose sub-model holds it
(eq. 1 of the paper: uniformly; ``weighting: samples`` weighs them by their training samples, as
FedAvg) and keeps a parameter no client holds this round. A client of a narrow tier downloads,
trains and uploads only its sub-model, so its bytes and FLOPs are its architecture's, which the
clock charges per tier (the engine counts each architecture's FLOPs). The zoo's ``width`` models
divide a hidden layer's output by the width while training (the paper's scaler).

Every architecture must be nested in the widest (same parameter and buffer names, no dimension
larger): a :class:`~hardware_profiles.errors.UserError` names the first that is not. Asynchronous
steps are the same rule per parameter: FedBuff averages each parameter's delta over the buffered
updates that hold it, FedAsync mixes an update into the parameters it holds. Timing-only runs take
FedAvg's wire format per architecture.
"""
from __future__ import annotations

import numpy as np
import torch

from algorithms.base import AlgorithmSpec, ArchShape, ClientResult, Server, ServerContext, TimingPayload
from algorithms.baseline_params import HeteroFLParams
from algorithms.fedavg import FedAvgClient, FedAvgServer, state_payload
from algorithms.training import flat_state, load_flat_state
from hardware_profiles.errors import UserError


def state_tensors(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the tensors of :func:`~algorithms.training.flat_state`, in its order."""
    return ([(n, tuple(p.shape)) for n, p in model.named_parameters()]
            + [(n, tuple(b.shape)) for n, b in model.named_buffers() if b.is_floating_point()])


def nested_positions(outer: torch.nn.Module, inner: torch.nn.Module) -> np.ndarray:
    """Where each value of ``inner``'s flat state sits in ``outer``'s: every tensor of ``inner`` the
    leading block of ``outer``'s tensor of the same name. Raises ValueError naming the first tensor
    that is not."""
    big, small = state_tensors(outer), state_tensors(inner)
    if [n for n, _ in big] != [n for n, _ in small]:
        missing = sorted({n for n, _ in small} ^ {n for n, _ in big})
        raise ValueError(f"their tensors differ ({', '.join(missing[:4])}): not the same model at two widths")
    out, offset = [], 0
    for (name, shape), (_, sub) in zip(big, small):
        if len(shape) != len(sub) or any(s > b for s, b in zip(sub, shape)):
            raise ValueError(f"its tensor {name} has shape {sub}, which is not a leading block of {shape}")
        index = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        out.append(index[tuple(slice(0, s) for s in sub)].reshape(-1) + offset)
        offset += index.size
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


class HeteroFLServer(Server):
    params: HeteroFLParams

    def __init__(self, params: HeteroFLParams, models: dict[str, torch.nn.Module], seed: int,
                 context: ServerContext | None = None):
        super().__init__(params, models, seed, context)
        sizes = {arch: sum(p.numel() for p in m.parameters()) for arch, m in models.items()}
        self.widest = max(sorted(models), key=lambda a: sizes[a])
        self.positions: dict[str, np.ndarray] = {}
        for arch, model in models.items():
            try:
                self.positions[arch] = nested_positions(models[self.widest], model)
            except ValueError as err:
                raise UserError(f"algorithm.name = 'heterofl': architecture {arch!r} is not a narrower copy of the "
                                f"widest, {self.widest!r}: {err}; give model.zoo archs of one model at several widths "
                                "(model: <the model>, model.arch_params.<arch>.width)") from None
        self._slice(flat_state(models[self.widest]).numpy())

    def _slice(self, widest: np.ndarray) -> None:
        """Every architecture's model: its block of the widest's flat state."""
        for arch, model in self.models.items():
            if arch != self.widest:
                load_flat_state(model, widest[self.positions[arch]])

    def _weight(self, result: ClientResult) -> float:
        return float(result.num_samples) if self.params.weighting == "samples" else 1.0

    def broadcast(self, round: int):
        return {arch: state_payload(flat_state(m)) for arch, m in self.models.items()}

    @classmethod
    def timing_payload(cls, params: HeteroFLParams, shapes: dict[str, ArchShape]) -> TimingPayload:
        """Each architecture's full state (float32) down and up, as FedAvg's."""
        return FedAvgServer.timing_payload(params, shapes)

    def aggregate(self, round: int, results: list[ClientResult]) -> dict:
        """Each parameter of the widest model: the (weighted) mean over the uploads that hold it."""
        if not results:
            return {}
        widest = flat_state(self.models[self.widest]).double().numpy()
        total, weight = np.zeros_like(widest), np.zeros_like(widest)
        for res in results:
            pos, w = self.positions[res.arch], self._weight(res)
            total[pos] += w * np.asarray(res.upload.arrays["state"], dtype=np.float64)
            weight[pos] += w
        held = weight > 0
        widest[held] = total[held] / weight[held]
        load_flat_state(self.models[self.widest], widest.astype(np.float32))
        self._slice(flat_state(self.models[self.widest]).numpy())
        return {}

    def async_step(self, step: int, updates: list, rule) -> dict:
        """FedBuff: each parameter moves by ``server_lr`` times the mean, over the buffered updates
        that hold it (weighted as ``weighting`` says), of ``s(tau) (w_i - b_i)``; FedAsync: the
        update's parameters are mixed in with ``alpha = mixing s(tau)``, the others stay."""
        widest = flat_state(self.models[self.widest]).double().numpy()
        if rule.mode == "fedasync":
            u = updates[0]
            pos, alpha = self.positions[u.result.arch], rule.scale(u.weight)
            state = np.asarray(u.result.upload.arrays["state"], dtype=np.float64)
            widest[pos] = (1.0 - alpha) * widest[pos] + alpha * state
        else:
            total, weight = np.zeros_like(widest), np.zeros_like(widest)
            for u in updates:
                pos, w = self.positions[u.result.arch], self._weight(u.result)
                delta = np.asarray(u.result.upload.arrays["state"], dtype=np.float64) - u.base
                total[pos] += w * u.weight * delta
                weight[pos] += w
            held = weight > 0
            widest[held] += rule.server_lr * total[held] / weight[held]
        load_flat_state(self.models[self.widest], widest.astype(np.float32))
        self._slice(flat_state(self.models[self.widest]).numpy())
        return {}


SPEC = AlgorithmSpec("heterofl", HeteroFLParams, FedAvgClient, HeteroFLServer,
                     "HeteroFL: width-scaled sub-models per device tier (model.zoo)")
