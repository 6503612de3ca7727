"""Asynchronous aggregation (FedBuff, FedAsync): staleness weights and the server steps.

Plain numpy (torch only inside :func:`client_state`, to decode a compressed upload), so config
validation can import the method table without torch. The event loop that decides *when* an
update arrives and how stale it is lives in :mod:`engine.loop.asynchronous`; docs/async.md.

Every update is turned into the full flat state ``w_i`` (parameters, then floating buffers) of
the client's trained model and compared with ``b_i``, the global state of the version it
trained from (its *base*). With ``s(tau)`` the staleness weight and ``m_i`` the sample counts:

* FedBuff (Nguyen et al., 2022): ``w <- w + server_lr * sum_i (m_i / sum m) s(tau_i) (w_i - b_i)``
  over the buffer (not renormalised: stale updates shrink the step);
* FedAsync (Xie et al., 2019): ``w <- (1 - alpha_i) w + alpha_i w_i``, ``alpha_i = mixing s(tau_i)``.

These two are :func:`apply_states`, the step of a server without its own
:meth:`algorithms.base.Server.async_step`. A method
whose server step is more than an average of states has its own ``async_step`` (FedCSPACK: the
staleness-weighted mask aggregation of packs; ASCEND: the FedBuff step of its compressed deltas,
then distillation and its rollback guard); each gets one :class:`AsyncUpdate` per update of the
step and the :class:`StepRule`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.plugins import METHODS, method_params
from hardware_profiles.errors import PluginError

if TYPE_CHECKING:  # annotations only: config validation imports this module without torch
    import torch

    from algorithms.base import ClientResult

STALENESS_KINDS = ("constant", "polynomial", "hinge")


def synchronous_only(name: str) -> str | None:
    """Why method ``name`` cannot run asynchronously, or None (its params class says:
    :attr:`~algorithms.base.AlgorithmParams.synchronous_only`)."""
    return method_params(name).synchronous_only


def async_methods() -> list[str]:
    """The registered methods that can run asynchronously."""
    return [name for name in METHODS.names() if synchronous_only(name) is None]


def async_option_problems(name: str, params: Any) -> list[str]:
    """The method's options that an asynchronous run refuses (field, value, why, what is allowed):
    its params class's :attr:`~algorithms.base.AlgorithmParams.async_refused_options`."""
    out = []
    for option, (refused, why) in type(params).async_refused_options.items():
        value = getattr(params, option, None)
        if value in refused:
            allowed = [v for v in type(params).model_fields[option].annotation.__args__ if v not in refused]
            out.append(f"algorithm.{option} = {value!r} cannot run asynchronously: {why}; "
                       f"allowed with asynchronous: {', '.join(map(str, allowed))}")
    return out


@dataclass(frozen=True)
class StepRule:
    """The asynchronous section's server-step settings (engine/config/schema.py ``AsyncConfig``)."""

    mode: str  # fedbuff | fedasync
    server_lr: float = 1.0  # fedbuff
    mixing: float = 0.5  # fedasync

    def scale(self, weight: float) -> float:
        """What multiplies an update's delta: FedBuff ``server_lr s(tau)`` (times its share of
        the buffer, which the method computes), FedAsync ``alpha = mixing s(tau)``."""
        return (self.server_lr if self.mode == "fedbuff" else self.mixing) * float(weight)


@dataclass
class AsyncUpdate:
    """One update of a server step, as the method's ``async_step`` sees it."""

    result: ClientResult
    # the global flat state (float64, parameters then buffers) of the version it trained from;
    # None in a clock.mode: timing_only run, which keeps no models
    base: np.ndarray | None
    base_version: int
    staleness: int
    weight: float  # s(tau)
    wave: int  # its dispatch wave (the client's ``ctx.round``)


def staleness_weight(kind: str, staleness, a: float = 0.5, b: float = 4.0) -> np.ndarray:
    """``s(tau)`` per update (float64): ``constant`` 1; ``polynomial`` ``(1 + tau)^-a``;
    ``hinge`` 1 for ``tau <= b``, else ``1 / (a (tau - b) + 1)``."""
    tau = np.asarray(staleness, dtype=np.float64)
    if np.any(tau < 0):
        raise ValueError(f"staleness must be >= 0; got {tau.min()!r}")
    if kind == "constant":
        return np.ones_like(tau)
    if kind == "polynomial":
        return (1.0 + tau) ** -a
    if kind == "hinge":
        return 1.0 / (a * np.maximum(tau - b, 0.0) + 1.0)
    raise ValueError(f"staleness kind {kind!r} is not allowed; allowed: {', '.join(STALENESS_KINDS)}")


def client_state(upload, base: np.ndarray, num_params: int) -> np.ndarray:
    """The flat state (float64) of the model an upload stands for, trained from ``base``:
    FedAvg/FedProx send it (``state``); compressed FedAvg sends a delta of the parameters
    (decoded, added to the base's) and, with ``buffers: dense``, its floating buffers (else the
    base's stay, as in the synchronous aggregate)."""
    if "state" in upload.arrays:
        return np.asarray(upload.arrays["state"], dtype=np.float64).reshape(-1)
    if "compressor" not in upload.meta or "numel" not in upload.meta:
        raise PluginError(
            f"an asynchronous step over full states got an upload with arrays {sorted(upload.arrays)}: neither a "
            "'state' array (the whole model) nor a compressed delta (meta 'compressor' and 'numel'). A method whose "
            "uploads are something else defines Server.async_step, or refuses asynchronous runs "
            "(synchronous_only on its params class); docs/plugins.md")
    from algorithms.compressed_fedavg import decode_upload  # torch: only once a compressed update arrives
    out = np.asarray(base, dtype=np.float64).copy()
    out[:num_params] += decode_upload(upload).dense().cpu().numpy()
    if "buffers" in upload.arrays:
        out[num_params:] = upload.arrays["buffers"]
    return out


def fedbuff_step(current: np.ndarray, states: np.ndarray, bases: np.ndarray, num_samples, weights,
                 server_lr: float) -> np.ndarray:
    """One FedBuff server step; ``states``/``bases``: (M, d) float64; returns float32."""
    m = np.asarray(num_samples, dtype=np.float64)
    p = m / m.sum() if m.sum() > 0 else np.full(len(m), 1.0 / len(m))
    step = (p * np.asarray(weights, dtype=np.float64)) @ (states - bases)
    return (np.asarray(current, dtype=np.float64) + server_lr * step).astype(np.float32)


def fedasync_step(current: np.ndarray, state: np.ndarray, alpha: float) -> np.ndarray:
    """One FedAsync server step: ``(1 - alpha) w + alpha w_i`` (float64, returned as float32)."""
    return ((1.0 - alpha) * np.asarray(current, dtype=np.float64) + alpha * state).astype(np.float32)


def apply_states(models: dict[str, torch.nn.Module], updates: list[AsyncUpdate], rule: StepRule) -> None:
    """The FedBuff or FedAsync step over full states, per architecture (an architecture with no
    update in the step stays as it was): the step of a server without its own ``async_step``."""
    from algorithms.training import flat_state, load_flat_state, num_params  # torch: only once a step is taken

    for arch, model in models.items():
        mine = [u for u in updates if u.result.arch == arch]
        if not mine:
            continue
        current = flat_state(model).cpu().numpy()
        d = num_params(model)
        bases = np.stack([u.base for u in mine])
        states = np.stack([client_state(u.result.upload, u.base, d) for u in mine])
        if rule.mode == "fedasync":
            new = fedasync_step(current, states[0], rule.scale(mine[0].weight))
        else:
            new = fedbuff_step(current, states, bases, [u.result.num_samples for u in mine],
                               [u.weight for u in mine], rule.server_lr)
        load_flat_state(model, new)
