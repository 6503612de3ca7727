"""FedAvg with compressed uploads: the "uniform compressor" baselines (Top-K, Random-K, Periodic-K,
and any other registered compressor, e.g. 8-bit stochastic quantisation ``qsgd8``).

Every client uses the same compressor every round. Round t, client n:

1. receive the dense global state ``w^t`` (parameters + floating buffers, as FedAvg);
2. local SGD -> ``delta = w_trained - w^t`` (parameters only);
3. error feedback: ``a = e + delta`` (``e`` = ``ctx.state["residual"]``, float32, persistent);
4. compress ``a`` (K coordinates, or all of them quantised); ``e <- a - sent`` (``ErrorFeedback``);
5. upload the compressed arrays (values + int32 indices / 64-bit seed / 32-bit offset; int8
   values + per-bucket scales for qsgd8).

Lost uploads: step 4 runs before the engine knows whether the upload arrives. The client keeps
a copy of what it sent (``ctx.state["sent"]``: the round and the same compact arrays as the
upload - for a sparsifier K float32 values plus the int32 indices / seed / offset, never a dense
vector); when the engine reports the upload lost (deadline, over-selection:
:meth:`Client.on_dropped`), what was sent goes back into the residual, so ``e`` equals the whole
accumulated ``a`` again (bit for bit for sparsifiers) and is sent later instead of vanishing.

The server decodes each upload (Random-K re-draws its indices from the seed, Periodic-K
rebuilds them from the offset) and adds the sample-weighted mean of the sparse deltas to each
architecture's global parameters: ``w_P <- w_P + sum_n (m_n / sum m) delta_hat_n``.

Floating buffers (BatchNorm running statistics) are not deltas: with ``buffers="dense"``
(default) they travel uncompressed next to the payload (counted in the bytes; nothing for
models without BatchNorm, e.g. LeNet5) and are averaged like FedAvg; with ``"local"`` each
client keeps its own and the server's stay at their initial values.

The helpers :func:`compressed_payload` / :func:`decode_upload` are the wire format for compressed
deltas, and :func:`apply_compressed_updates` the per-architecture aggregation; ASCEND reuses them.
"""
from __future__ import annotations

from typing import Any

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
    TimingPayload,
    TimingUnsupported,
)
from algorithms.compressors import (
    Compressed,
    OpCosts,
    decode,
    get_compressor,
    resolve_k,
    scatter_add_,
)
from algorithms.error_feedback import ErrorFeedback
from algorithms.fedavg import state_payload
from algorithms.params import (  # noqa: F401 (re-exported: the params live there, importable without torch)
    CompressedFedAvgParams,
    CompressionOptions,
    validate_compressor,
    validate_k,
    validate_op_costs,
)
from algorithms.toolkit import group_by_arch, sample_weighted_mean, sample_weights
from algorithms.training import (
    flat_buffers,
    flat_params,
    flat_state,
    load_flat_buffers,
    load_flat_params,
    load_flat_state,
    local_sgd,
)


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
    return Payload(arrays=arrays, nbytes=nbytes, meta={"compressor": c.compressor, "numel": c.numel, "k": c.k, **meta})


def decode_upload(payload: Payload) -> Compressed:
    """The compressed delta of an upload (its positions and values; ``.dense()`` for the vector)."""
    return decode(payload.meta["compressor"], payload.arrays, payload.meta["numel"])


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
        self.costs = OpCosts(**params.op_costs)

    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        load_flat_state(ctx.model, broadcast.arrays["state"])
        if self.params.buffers == "local" and "buffers" in ctx.state:
            load_flat_buffers(ctx.model, ctx.state["buffers"])

    def compress_delta(self, ctx: ClientContext, delta: torch.Tensor, name: str,
                       k: int | float | None = None) -> tuple[Compressed, float]:
        """Error feedback + compression of ``delta`` to ``k`` (default: the ``k`` option);
        updates ``ctx.state["residual"]`` and records what was sent in ``ctx.state["sent"]``
        (for :meth:`on_dropped`).

        Returns the compressed payload and the norm of the new residual.
        """
        p = self.params
        k = p.k if k is None else k
        compressor = get_compressor(name, self.costs)
        seed = int(ctx.rng.integers(0, 2**63)) if compressor.needs_seed else None
        kwargs = dict(seed=seed, round=ctx.round, clamp=p.clamp_k)
        if not p.error_feedback:
            ctx.state.pop("sent", None)
            return compressor.compress(delta, k, **kwargs), 0.0
        residual = ctx.state.get("residual")
        c, e = ErrorFeedback(compressor).compress(
            None if residual is None else torch.from_numpy(residual), delta, k, **kwargs)
        ctx.state["residual"] = e.cpu().numpy().astype(np.float32, copy=False)  # host memory
        # what was sent, for on_dropped; overwritten every round (the payload's arrays)
        ctx.state["sent"] = {"round": ctx.round, "compressor": c.compressor, "numel": c.numel,
                             "arrays": c.to_arrays()}
        return c, float(torch.linalg.vector_norm(e))

    def on_dropped(self, state: dict[str, Any], round: int) -> None:
        """The upload of ``round`` was lost: put what it sent back into the residual.

        After ``compress_delta`` the residual is ``a - sent``; the compressor's ``restore``
        makes it ``a`` again - bit for bit for the sparsifiers (they send ``a[idx]`` unscaled;
        also for -0.0 and infinities), up to one rounding per value for a quantiser. This is
        valid because the residual has not changed since that fit: the record is tagged with its
        round and the engine reports a lost upload before the client's next round. A record of
        another round (or none: no error feedback) is left alone; the record is consumed.
        """
        sent = state.get("sent")
        if sent is None or sent["round"] != round:
            return
        del state["sent"]
        residual = state.get("residual")
        if residual is None:
            return
        c = decode(sent["compressor"], sent["arrays"], sent["numel"])
        state["residual"] = ErrorFeedback(get_compressor(c.compressor, self.costs)).restore(residual, c)

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        p = self.params
        start = flat_params(ctx.model)
        loss, seen = local_sgd(ctx, loss=self.loss_of(ctx))
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
            metrics={"train_loss": loss, "compressor": c.compressor, "k": c.k, "residual_norm": res_norm},
        )


# ------------------------------------------------------------------------------------------------
# server
# ------------------------------------------------------------------------------------------------
def aggregate_sparse(results: list[ClientResult], d: int) -> torch.Tensor:
    """``sum_n (m_n / sum m) delta_hat_n`` over ``results`` (float64 accumulation, float32 out)."""
    acc = torch.zeros(d, dtype=torch.float64)
    for r, w in zip(results, sample_weights(results).tolist()):
        c = decode_upload(r.upload)
        if c.numel != d:
            raise ValueError(f"client {r.client_id} sent a delta of length {c.numel} for a model of {d} parameters")
        scatter_add_(acc, c, w)
    return acc.float()


def apply_compressed_updates(models: dict[str, torch.nn.Module], results: list[ClientResult],
                             buffers: str) -> dict[str, torch.Tensor]:
    """Every architecture's ``w_P += sum_n (m_n / sum m) delta_hat_n`` over its uploads, and its
    floating buffers = the sample-weighted mean of the uploaded ones (``buffers="dense"``).
    Returns each updated architecture's aggregated update (float32)."""
    updates = {}
    for arch, mine in group_by_arch(results, models).items():
        model = models[arch]
        base = flat_params(model)
        update = aggregate_sparse(mine, base.numel())
        load_flat_params(model, base + update.to(base.device))
        if buffers == "dense" and all("buffers" in r.upload.arrays for r in mine):
            load_flat_buffers(model, sample_weighted_mean(mine, "buffers"))
        updates[arch] = update
    return updates


def compressed_upload(compressor: str, k, clamp: bool, op_costs: dict[str, float], shape: ArchShape,
                      buffers: str) -> tuple[int, float]:
    """(bytes, compression ops) of one compressed upload of a model of ``shape``, as
    :meth:`CompressedFedAvgClient.fit` builds it: the compressor's payload of the parameter
    delta (:meth:`~algorithms.compressors.Compressor.wire_nbytes`, :meth:`~algorithms.compressors.Compressor.ops`)
    and, with ``buffers="dense"``, the floating buffers (float32)."""
    c = get_compressor(compressor, OpCosts(**op_costs))
    d = shape.parameters
    kk = resolve_k(k, d, clamp=clamp) if c.uses_k else d
    try:
        nbytes = type(c).wire_nbytes(d, kk)
    except NotImplementedError as err:
        raise TimingUnsupported(str(err)) from None
    extra = FLOAT32_BYTES * shape.buffers if buffers == "dense" else 0
    return nbytes + extra, float(c.ops(d, kk))


class CompressedFedAvgServer(Server):
    params: CompressedFedAvgParams

    def broadcast(self, round: int) -> Broadcast:
        return {arch: state_payload(flat_state(m)) for arch, m in self.models.items()}

    @classmethod
    def timing_payload(cls, params: CompressedFedAvgParams, shapes: dict[str, ArchShape]) -> TimingPayload:
        """The full state down; up: every client the same compressor and K (:func:`compressed_upload`)."""
        up = {arch: compressed_upload(params.compressor, params.k, params.clamp_k, params.op_costs, shape,
                                      params.buffers) for arch, shape in shapes.items()}
        return TimingPayload({arch: FLOAT32_BYTES * shape.state for arch, shape in shapes.items()},
                             {arch: b for arch, (b, _) in up.items()}, {arch: ops for arch, (_, ops) in up.items()})

    def aggregate(self, round: int, results: list[ClientResult]) -> dict:
        updates = apply_compressed_updates(self.models, results, self.params.buffers)
        sq = sum(float(torch.sum(u.double() ** 2)) for u in updates.values())
        return {"num_aggregated": len(results), "update_norm": sq**0.5}


SPEC = AlgorithmSpec(
    "fedavg_compressed",
    CompressedFedAvgParams,
    CompressedFedAvgClient,
    CompressedFedAvgServer,
    "FedAvg with one compressor for every client (Top-K / Random-K / Periodic-K / qsgd8) and error feedback",
)

__all__ = [
    "SPEC",
    "CompressedFedAvgClient",
    "CompressedFedAvgParams",
    "CompressedFedAvgServer",
    "CompressionOptions",
    "aggregate_sparse",
    "apply_compressed_updates",
    "compressed_payload",
    "decode_upload",
    "validate_compressor",
    "validate_k",
    "validate_op_costs",
]
