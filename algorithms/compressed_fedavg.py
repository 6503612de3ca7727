"""FedAvg with compressed uploads: the "uniform compressor" baselines (Top-K, Random-K, Periodic-K).

Every client uses the same compressor every round. Round t, client n:

1. receive the dense global state ``w^t`` (parameters + floating buffers, as FedAvg);
2. local SGD -> ``delta = w_trained - w^t`` (parameters only);
3. error feedback: ``a = e + delta`` (``e`` = ``ctx.state["residual"]``, float32, persistent);
4. compress ``a`` to K coordinates; ``e <- a - sent`` (exactly, see ``ErrorFeedback``);
5. upload the compressed arrays (values + int32 indices / 64-bit seed / 32-bit offset).

Lost uploads: step 4 runs before the engine knows whether the upload arrives. The client keeps
a copy of what it sent (``ctx.state["sent"]``: the round and the same compact arrays as the
upload - K float32 values plus the int32 indices / seed / offset, never a dense vector); when the
engine reports the upload lost (deadline, over-selection: :meth:`Client.on_dropped`), the sent
values go back into the residual at their positions, so ``e`` equals the whole accumulated ``a``
again, bit for bit, and is sent later instead of vanishing.

The server decodes each upload (Random-K re-draws its indices from the seed, Periodic-K
rebuilds them from the offset) and adds the sample-weighted mean of the sparse deltas to each
architecture's global parameters: ``w_P <- w_P + sum_n (m_n / sum m) delta_hat_n``.

Floating buffers (BatchNorm running statistics) are not deltas: with ``buffers="dense"``
(default) they travel uncompressed next to the payload (counted in the bytes; nothing for
models without BatchNorm, e.g. LeNet5) and are averaged like FedAvg; with ``"local"`` each
client keeps its own and the server's stay at their initial values.

The helpers :func:`compressed_payload` / :func:`payload_to_compressed` / :func:`decode_upload`
are the wire format for compressed deltas and are meant to be reused by other methods (ASCEND).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from algorithms.base import (
    AlgorithmSpec,
    Broadcast,
    Client,
    ClientContext,
    ClientResult,
    Payload,
    Server,
)
from algorithms.compressors import Compressed, ErrorFeedback, compress, scatter_add_
from algorithms.fedavg import state_payload
from algorithms.params import CompressedFedAvgParams, OpCostParams, validate_k  # noqa: F401 (re-exported)
from algorithms.training import (
    flat_buffers,
    flat_params,
    flat_state,
    load_flat_buffers,
    load_flat_params,
    load_flat_state,
    local_sgd,
)

PAYLOAD_KEYS = ("values", "indices", "seed", "offset")


# ------------------------------------------------------------------------------------------------
# wire format
# ------------------------------------------------------------------------------------------------
def compressed_payload(c: Compressed, extra: dict[str, np.ndarray] | None = None, **meta: Any) -> Payload:
    """Payload carrying ``c`` (plus optional dense ``extra`` arrays); nbytes = every array's size."""
    arrays = c.to_arrays()
    if extra:
        clash = set(extra) & set(arrays)
        if clash:
            raise ValueError(f"extra arrays clash with the payload keys {sorted(clash)}")
        arrays.update(extra)
    nbytes = int(sum(a.nbytes for a in arrays.values()))
    return Payload(arrays=arrays, nbytes=nbytes, meta={"compressor": c.strategy, "numel": c.numel, "k": c.k, **meta})


def payload_to_compressed(payload: Payload) -> Compressed:
    arrays = {k: v for k, v in payload.arrays.items() if k in PAYLOAD_KEYS}
    return Compressed.from_arrays(payload.meta["compressor"], arrays, payload.meta["numel"])


def decode_upload(payload: Payload) -> torch.Tensor:
    """The dense delta a compressed upload stands for."""
    c = payload_to_compressed(payload)
    out = torch.zeros(c.numel, dtype=torch.float32)
    out[c.index_tensor()] = c.values
    return out


def buffer_upload(model: torch.nn.Module, mode: str, state: dict) -> dict[str, np.ndarray] | None:
    """Floating buffers (BatchNorm statistics): sent dense (``mode="dense"``, returned as extra
    upload arrays) or kept in the client's state (``"local"``); None for models without any."""
    bufs = flat_buffers(model)
    if not bufs.numel():
        return None
    array = bufs.cpu().numpy().astype(np.float32, copy=True)
    if mode == "dense":
        return {"buffers": array}
    state["buffers"] = array
    return None


# ------------------------------------------------------------------------------------------------
# client
# ------------------------------------------------------------------------------------------------
class CompressedFedAvgClient(Client):
    params: CompressedFedAvgParams

    def __init__(self, params: CompressedFedAvgParams):
        super().__init__(params)
        self.costs = params.op_costs.costs()

    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        load_flat_state(ctx.model, broadcast.arrays["state"])
        if self.params.buffers == "local" and "buffers" in ctx.state:
            load_flat_buffers(ctx.model, ctx.state["buffers"])

    def compress_delta(self, ctx: ClientContext, delta: torch.Tensor, strategy: str) -> tuple[Compressed, float]:
        """Error feedback + compression of ``delta``; updates ``ctx.state["residual"]`` and
        records what was sent in ``ctx.state["sent"]`` (for :meth:`on_dropped`).

        Returns the compressed payload and the norm of the new residual.
        """
        p = self.params
        ef = p.error_feedback
        residual = ctx.state.get("residual") if ef else None
        a = ErrorFeedback.accumulate(None if residual is None else torch.from_numpy(residual), delta)
        seed = int(ctx.rng.integers(0, 2**63)) if strategy == "randomk" else None
        c = compress(strategy, a, p.k, seed=seed, round=ctx.round, costs=self.costs, clamp=p.clamp_k)
        if ef:
            e = ErrorFeedback.update_residual(a, c)
            ctx.state["residual"] = e.cpu().numpy().astype(np.float32, copy=False)  # host memory
            # what was sent, for on_dropped; overwritten every round (K values, not d)
            ctx.state["sent"] = {"round": ctx.round, "compressor": c.strategy, "numel": c.numel,
                                 "arrays": c.to_arrays()}
            return c, float(torch.linalg.vector_norm(e))
        ctx.state.pop("sent", None)
        return c, 0.0

    def on_dropped(self, state: dict[str, Any], round: int) -> None:
        """The upload of ``round`` was lost: put its sent values back into the residual.

        After ``compress_delta`` the residual equals ``a`` everywhere but at the sent positions,
        and the sent values *are* ``a`` there (every compressor sends ``a[idx]`` unscaled), so
        writing them back makes the residual ``a`` again, bit for bit (also for -0.0 and
        infinities, which ``residual[idx] += values`` would not restore: the residual there is
        ``a_i - a_i``, i.e. +0.0, or NaN for an infinite ``a_i``). This is valid because the
        residual has not changed since that fit: the record is tagged with its round and the
        engine reports a lost upload before the client's next round. A record of another round
        (or none: no error feedback) is left alone; the record is consumed.
        """
        sent = state.get("sent")
        if sent is None or sent["round"] != round:
            return
        del state["sent"]
        residual = state.get("residual")
        if residual is None:
            return
        c = Compressed.from_arrays(sent["compressor"], sent["arrays"], sent["numel"])
        if c.numel != residual.size:
            raise ValueError(f"sent record of length {c.numel} for a residual of length {residual.size}")
        if not residual.flags.writeable:
            residual = residual.copy()
        residual[c.index_tensor().numpy()] = c.values.numpy()
        state["residual"] = residual

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        p = self.params
        start = flat_params(ctx.model)
        loss, seen = local_sgd(ctx)
        delta = flat_params(ctx.model) - start
        c, res_norm = self.compress_delta(ctx, delta, p.compressor)
        extra = buffer_upload(ctx.model, p.buffers, ctx.state)
        return ClientResult(
            client_id=ctx.client_id,
            arch=ctx.arch,
            upload=compressed_payload(c, extra),
            num_samples=len(ctx.train_y),
            train_flops=ctx.flops_per_sample * seen,
            compress_ops=c.ops,
            metrics={"train_loss": loss, "compressor": c.strategy, "k": c.k, "residual_norm": res_norm},
        )


# ------------------------------------------------------------------------------------------------
# server
# ------------------------------------------------------------------------------------------------
def aggregate_sparse(results: list[ClientResult], d: int) -> torch.Tensor:
    """``sum_n (m_n / sum m) delta_hat_n`` over ``results`` (float64 accumulation, float32 out)."""
    total = float(sum(r.num_samples for r in results))
    acc = torch.zeros(d, dtype=torch.float64)
    for r in results:
        c = payload_to_compressed(r.upload)
        if c.numel != d:
            raise ValueError(f"client {r.client_id} sent a delta of length {c.numel} for a model of {d} parameters")
        w = r.num_samples / total if total > 0 else 1.0 / len(results)
        scatter_add_(acc, c, w)
    return acc.float()


class CompressedFedAvgServer(Server):
    params: CompressedFedAvgParams

    def broadcast(self, round: int) -> Broadcast:
        return {arch: state_payload(flat_state(m)) for arch, m in self.models.items()}

    def aggregate(self, round: int, results: list[ClientResult]) -> dict:
        n_agg, sq = 0, 0.0
        for arch, model in self.models.items():
            mine = [r for r in results if r.arch == arch]
            if not mine:
                continue
            update = aggregate_sparse(mine, flat_params(model).numel())
            load_flat_params(model, flat_params(model) + update)
            if self.params.buffers == "dense" and all("buffers" in r.upload.arrays for r in mine):
                weights = torch.tensor([r.num_samples for r in mine], dtype=torch.float64)
                stacked = torch.stack([torch.from_numpy(r.upload.arrays["buffers"]).double() for r in mine])
                load_flat_buffers(model, ((weights / weights.sum()) @ stacked).float())
            n_agg += len(mine)
            sq += float(torch.sum(update.double() ** 2))
        return {"num_aggregated": n_agg, "update_norm": sq**0.5}


SPEC = AlgorithmSpec(
    "fedavg_compressed",
    CompressedFedAvgParams,
    CompressedFedAvgClient,
    CompressedFedAvgServer,
    "FedAvg with one compressor for every client (Top-K / Random-K / Periodic-K) and error feedback",
)

__all__ = [
    "SPEC",
    "CompressedFedAvgClient",
    "CompressedFedAvgParams",
    "CompressedFedAvgServer",
    "OpCostParams",
    "aggregate_sparse",
    "compressed_payload",
    "decode_upload",
    "payload_to_compressed",
    "validate_k",
]
