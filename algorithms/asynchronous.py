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
"""
from __future__ import annotations

import numpy as np

STALENESS_KINDS = ("constant", "polynomial", "hinge")

# methods whose server step is one function of every upload of a round together
SYNCHRONOUS_ONLY = {
    "fedcspack": "its server averages each pack position over the clients that shared it in one round, "
                 "weighted by their mask weights (mask aggregation is round-synchronous); a buffer of packs "
                 "cut against different global models has no common reference",
    "ascend": "its server distils the architectures' models into each other on the public split from one "
              "round's uploads together, and its bandit rewards close per round (round-synchronous)",
}
ASYNC_METHODS = ("fedavg", "fedprox", "fedavg_compressed")


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
