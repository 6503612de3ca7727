"""FedCSPACK: double-weight sparse packs (AAAI 2026, arXiv 2601.01840).

The method's reference: docs/fedcspack.md. In short: after local training a client cuts its
flat trainable-parameter vector into packs of ``pack_size`` values, shares only the packs whose
cosine to the pre-round global model is below the whole-model cosine ``theta_a`` (optionally
capped to the K most-drifted ones), each with a double weight ``|cos + KL|``; the server
averages every pack position over the clients that shared it, weighted by those mask weights.
Packs a client did not share stay local (personalization).

Layout of this module
---------------------
* pure, vectorised tensor functions (no Python loop over packs or parameters):
  :func:`pad_to_packs`, :func:`pack_scores` (its per-pack sums are one compiled, SIMD-vectorised
  pass: :mod:`algorithms.pack_kernel`), :func:`select_packs`, :func:`aggregate_packs`, the byte
  accounting :func:`upload_nbytes` / :func:`download_nbytes` and the op-count model
  :func:`selection_ops`;
* :class:`FedCSPACKParams`, :class:`FedCSPACKClient`, :class:`FedCSPACKServer` and ``SPEC``.

Deliberately not here: the pack kernel (:mod:`algorithms.pack_kernel`, its GPU twin
:mod:`algorithms.pack_stats_torch`), the hyperparameters' validation (:mod:`algorithms.params`),
Ray and file I/O. The choices where the spec leaves room (padding and the KL term, numerics,
Top-K, lost uploads, ...) are in docs/fedcspack.md, "Design notes".

Over 400 lines because it is one method, both halves and the pack statistics they share, in
the order of the spec; the fused pack kernel is a module of its own.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.base import (
    FLOAT32_BYTES,
    INDEX_BYTES,
    AlgorithmParams,
    AlgorithmSpec,
    ArchShape,
    Broadcast,
    Client,
    ClientContext,
    ClientResult,
    Payload,
    Server,
    ServerContext,
    TimingPayload,
    TimingUnsupported,
)
from algorithms.pack_stats_torch import pack_sums_on_device
from algorithms.params import FedCSPACKParams
from algorithms.toolkit import ALL, check_k, group_by_arch
from algorithms.training import flat_params, load_flat_params, local_sgd

# --------------------------------------------------------------------------------------------
# Operation-count model of the client's selection work (for the engine's virtual clock).
# One "op" is one elementary floating-point operation on one value (add, multiply, compare,
# exp, log each count 1). Counted on the zero-padded vector of J*P values, for the textbook
# computation the spec describes (not for this module's fused implementation).
#
#   cosines      : L*G, L*L, G*G, each a multiply and an add                           -> 6
#   log_softmax  : of G and of L: max-compare, subtract, exp, add to sum, subtract LSE -> 10
#   KL           : exp(log p_G), log p_G - log p_L, multiply, add                      -> 4
#   delta        : D = W_i - W_prev                                                    -> 1
SELECTION_OPS_PER_PARAM = 21
# Per pack: cosine divide + 2 sqrt + multiply, 2 logs of the partition sums, KL finish,
# compare with theta_a, the mask weight (add + abs) -> about 12.
SELECTION_OPS_PER_PACK = 12
# Top-K over the m candidates: a comparison sort, m * log2(m) comparisons (only when a cap
# actually removes candidates; "all" needs no sort).
SORT_OPS_PER_COMPARISON = 1
# --------------------------------------------------------------------------------------------

Weighting = Literal["cskd", "cs", "kd"]
KSpec = Union[int, float, str]


# ------------------------------------------------------------------------- pure functions ---


def num_packs(n: int, pack_size: int) -> int:
    """``J = ceil(n / P)``."""
    return -(-int(n) // int(pack_size))


def _as_flat32(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().float().reshape(-1)
    if not (isinstance(x, np.ndarray) and x.flags.writeable):
        x = np.array(x, dtype=np.float32)  # torch warns on read-only arrays (e.g. from Ray)
    return torch.as_tensor(x, dtype=torch.float32).reshape(-1)


def _as_index(x: Any) -> torch.Tensor:
    """Pack indices (tensor, array or list) as a 1-D int64 tensor."""
    if isinstance(x, torch.Tensor):
        return x.detach().long().reshape(-1)
    return torch.from_numpy(np.array(x, dtype=np.int64).reshape(-1))  # a copy: never read-only


def pad_to_packs(flat: torch.Tensor, pack_size: int) -> torch.Tensor:
    """The flat vector zero-padded to ``J * P`` values, as a ``(J, P)`` tensor (a copy)."""
    flat = _as_flat32(flat)
    j = num_packs(flat.numel(), pack_size)
    return F.pad(flat, (0, j * pack_size - flat.numel())).view(j, pack_size)


def _safe_cos(dot: torch.Tensor, n2a: torch.Tensor, n2b: torch.Tensor) -> torch.Tensor:
    """Cosine from a dot product and two squared norms; 0 where either norm is 0 (no NaN)."""
    denom = n2a.sqrt() * n2b.sqrt()
    return torch.where(denom > 0, dot / denom.clamp_min(torch.finfo(denom.dtype).tiny),
                       torch.zeros_like(dot))


def _kl_stable(local: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """Row-wise KL(softmax(G) || softmax(L)) with log_softmax (max-shifted), in float64."""
    lg = torch.log_softmax(glob.double(), dim=1)
    ll = torch.log_softmax(local.double(), dim=1)
    return (lg.exp() * (lg - ll)).sum(dim=1)


@torch.no_grad()
def _row_stats(local: torch.Tensor, glob: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-row (dot, |L|^2, |G|^2, beta) of two (R, C) float32 views, as float64 tensors.

    One compiled pass per row (:func:`pack_sums`) with float64 accumulation and a
    cancellation-free beta; rows it cannot do exactly (huge weights, NaN) are recomputed here
    with the max-shifted float64 ``log_softmax`` form.
    """
    dot, nl2, ng2, beta = pack_sums_on_device(local, glob)  # GPU: torch, float64
    if local.shape[1] == 1:  # softmax of one value is 1: KL = 0 exactly (the kernel agrees)
        beta.zero_()
    bad = torch.isnan(beta)
    if bool(bad.any()):
        rows = bad.nonzero().squeeze(1)
        beta[rows] = _kl_stable(local[rows], glob[rows]).clamp_min(0.0)
    return dot, nl2, ng2, beta


def _check_kl_padding(kl_padding: str) -> None:
    if kl_padding not in ("include", "exclude"):
        raise ValueError(f"kl_padding must be 'include' or 'exclude', got {kl_padding!r}")


def _check_pack_size(pack_size: int) -> int:
    if int(pack_size) < 1:
        raise ValueError(f"pack_size must be >= 1, got {pack_size}")
    return int(pack_size)


def _part_views(flat: torch.Tensor, p: int, kl_padding: str) -> list[torch.Tensor]:
    """The (full, P) view of the whole packs and the (1, P or r) last partial pack."""
    n = flat.numel()
    full, rest = divmod(n, p)
    parts = []
    if full:  # the whole packs: a (full, P) view, no copy
        parts.append(flat[: full * p].view(full, p))
    if rest:  # the last, partial pack
        last = flat[full * p :].view(1, rest)
        parts.append(F.pad(last, (0, p - rest)) if kl_padding == "include" else last)
    return parts


@torch.no_grad()
def pack_scores(
    local_flat: torch.Tensor,
    global_flat: torch.Tensor,
    pack_size: int,
    kl_padding: Literal["include", "exclude"] = "include",
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Scores of every pack: ``(theta_a, theta, beta)``.

    * ``theta_a`` (float): cosine of the whole local and global weight vectors.
    * ``theta`` (float64, J): per-pack cosine ``cos(L_j, G_j)``; 0 for a pack where either side
      is all zeros (never NaN).
    * ``beta`` (float64, J): per-pack ``KL(softmax(G_j) || softmax(L_j))``.

    ``kl_padding``: whether the last pack's zero padding takes part in its softmax (see the
    module docstring); the cosine is unaffected by padding either way.
    """
    _check_kl_padding(kl_padding)
    lf, gf = _as_flat32(local_flat), _as_flat32(global_flat)
    if lf.numel() != gf.numel():
        raise ValueError(f"local ({lf.numel()}) and global ({gf.numel()}) sizes differ")
    p = _check_pack_size(pack_size)
    lparts, gparts = _part_views(lf, p, kl_padding), _part_views(gf, p, kl_padding)
    if not lparts:
        empty = torch.zeros(0, dtype=torch.float64)
        return 0.0, empty, empty.clone()
    parts = [_row_stats(lt, gt) for lt, gt in zip(lparts, gparts)]
    dot, nl2, ng2, beta = (torch.cat(cols) for cols in zip(*parts))
    theta = _safe_cos(dot, nl2, ng2)
    theta_a = float(_safe_cos(dot.sum(), nl2.sum(), ng2.sum()))
    return theta_a, theta, beta


def pack_budget(k: KSpec, num_packs_total: int) -> int | None:
    """The Top-K cap K for ``J`` packs, or None for "all" (every candidate)."""
    k = check_k(k, what="packs", allow_all=True, one_is_ambiguous=True)
    if k == ALL:
        return None
    if isinstance(k, int):
        return k
    return max(1, math.floor(k * num_packs_total + 1e-9))


def mask_weights(theta: torch.Tensor, beta: torch.Tensor, weighting: Weighting) -> torch.Tensor:
    """``M_ij`` per ``weighting``: cskd ``|theta + beta|``, cs ``|theta|``, kd ``|beta|``."""
    if weighting == "cskd":
        return (theta + beta).abs()
    if weighting == "cs":
        return theta.abs()
    if weighting == "kd":
        return beta.abs()
    raise ValueError(f"weighting must be one of 'cskd', 'cs', 'kd', got {weighting!r}")


def select_packs(
    theta: torch.Tensor,
    theta_a: float,
    beta: torch.Tensor,
    k: KSpec,
    weighting: Weighting,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packs to share and their mask weights.

    Candidates are the packs with ``theta_j < theta_a``; of those the ``K`` with the lowest
    ``theta`` are kept (ties: lower index first). Returns ``(indices, weights)``: int64
    indices sorted ascending and float32 weights ``M_ij`` in the same order.
    """
    cap = pack_budget(k, theta.numel())
    candidates = (theta < theta_a).nonzero().squeeze(1)
    if cap is not None and cap < candidates.numel():
        order = torch.sort(theta[candidates], stable=True).indices[:cap]
        candidates = torch.sort(candidates[order]).values
    weights = mask_weights(theta[candidates], beta[candidates], weighting)
    return candidates.long(), weights.float()


@torch.no_grad()
def aggregate_packs(
    global_flat: torch.Tensor,
    pack_size: int,
    uploads: Sequence[tuple[Any, Any, Any]],
    scales: Sequence[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask-weighted pack averaging of the clients' deltas.

    ``uploads``: one ``(indices, weights, delta_packs)`` per client, with ``k_i`` pack indices,
    ``k_i`` weights ``M_ij`` and a ``(k_i, P)`` array of the delta packs ``D_ij``.
    Per pack ``M_j = sum_i M_ij``; where ``M_j > 0``: ``W_j += sum_i (M_ij / M_j) c_i D_ij``; other
    packs are unchanged. ``scales``: ``c_i`` per client (None: 1, the synchronous server; an
    asynchronous step's staleness weight times ``server_lr``, docs/async.md), outside the
    normalisation: ``M_j`` and the returned mask weights are the plain ``M_ij`` sums.
    Returns ``(new_global_flat (n,), mask_indices (int64, ascending), mask_weights (float32,
    M_j))``, the global mask being the packs with ``M_j > 0``.
    """
    if scales is not None and len(scales) != len(uploads):
        raise ValueError(f"scales: {len(scales)} values for {len(uploads)} uploads")
    gf = _as_flat32(global_flat)
    n, p = gf.numel(), int(pack_size)
    j = num_packs(n, p)
    idx_parts, w_parts, d_parts, c_parts = [], [], [], []
    for i, (idx, w, delta) in enumerate(uploads):  # a loop over clients, to concatenate
        idx = _as_index(idx)
        w = (w.detach().double().reshape(-1) if isinstance(w, torch.Tensor)
             else torch.from_numpy(np.array(w, dtype=np.float64).reshape(-1)))
        delta = _as_flat32(delta).view(-1, p) if idx.numel() else torch.zeros(0, p)
        if not (idx.numel() == w.numel() == delta.shape[0]):
            raise ValueError(f"upload {i}: {idx.numel()} indices, {w.numel()} weights, "
                             f"{delta.shape[0]} delta packs")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= j):
            raise ValueError(f"upload {i}: pack index out of range [0, {j})")
        idx_parts.append(idx)
        w_parts.append(w)
        d_parts.append(delta)
        c_parts.append(torch.full((idx.numel(),), 1.0 if scales is None else float(scales[i]), dtype=torch.float64))
    if not idx_parts or sum(t.numel() for t in idx_parts) == 0:
        return gf.clone(), torch.zeros(0, dtype=torch.long), torch.zeros(0)
    idx, w, delta = torch.cat(idx_parts), torch.cat(w_parts), torch.cat(d_parts)
    total = torch.zeros(j, dtype=torch.float64).index_add_(0, idx, w)  # M_j
    at = total[idx]
    coef = torch.where(at > 0, w / at.where(at > 0, torch.ones_like(at)), torch.zeros_like(w))
    if scales is not None:
        coef = coef * torch.cat(c_parts)
    update = torch.zeros(j, p).index_add_(0, idx, delta * coef.float().unsqueeze(1))
    new = pad_to_packs(gf, p)
    new += update  # packs with M_j == 0 get +0 exactly
    mask = (total > 0).nonzero().squeeze(1)
    return new.reshape(-1)[:n].clone(), mask, total[mask].float()


def bitmap_nbytes(num_packs_total: int) -> int:
    """A J-bit bitmap, in bytes."""
    return -(-int(num_packs_total) // 8)


def mask_index_nbytes(k: int, num_packs_total: int) -> int:
    """Indices of k packs: 4 bytes each, or the J-bit bitmap if that is smaller."""
    return min(INDEX_BYTES * int(k), bitmap_nbytes(num_packs_total))


def upload_nbytes(k: int, num_packs_total: int, pack_size: int) -> int:
    """Client upload: ``4*P*k`` delta values + the k pack indices + ``4*k`` mask weights."""
    return (FLOAT32_BYTES * int(pack_size) * int(k) + mask_index_nbytes(k, num_packs_total)
            + FLOAT32_BYTES * int(k))


def download_nbytes(n: int, num_packs_total: int, global_mask_size: int) -> int:
    """Broadcast: the full model ``4*n`` + the global mask (J-bit bitmap + its weights)."""
    return (FLOAT32_BYTES * int(n) + bitmap_nbytes(num_packs_total)
            + FLOAT32_BYTES * int(global_mask_size))


def selection_ops(n: int, pack_size: int, num_sorted: int = 0) -> float:
    """Op count of one client's selection work (see the constants at the top of the module).

    ``num_sorted``: candidates that went through the Top-K sort (0 when no cap applied).
    """
    j = num_packs(n, pack_size)
    ops = SELECTION_OPS_PER_PARAM * j * int(pack_size) + SELECTION_OPS_PER_PACK * j
    if num_sorted > 1:
        ops += SORT_OPS_PER_COMPARISON * num_sorted * math.log2(num_sorted)
    return float(ops)


# ------------------------------------------------------------------------ client/server ---

_PERSONAL = "fedcspack.personal"  # the client's full local parameter vector after training
_SHARED = "fedcspack.shared_packs"  # pack indices it shared in its last participation
_SHARED_ROUND = "fedcspack.shared_round"  # the round of that upload (for on_dropped)
_BUFFERS = "fedcspack.buffers"  # its buffers (BatchNorm statistics), never shared


@torch.no_grad()
def overwrite_packs(base: torch.Tensor, source: torch.Tensor, pack_size: int,
                    packs: Any) -> torch.Tensor:
    """``base`` with the given packs replaced by those of ``source`` (a new vector)."""
    base, source = _as_flat32(base), _as_flat32(source)
    n = base.numel()
    idx = _as_index(packs)
    out = pad_to_packs(base, pack_size)
    if idx.numel():
        out[idx] = pad_to_packs(source, pack_size)[idx]
    return out.reshape(-1)[:n].clone()


def _nan_stats(w: torch.Tensor) -> tuple[float, float, float]:
    if w.numel() == 0:
        return float("nan"), float("nan"), float("nan")
    return float(w.double().mean()), float(w.min()), float(w.max())


class FedCSPACKClient(Client):
    params: FedCSPACKParams

    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        p = self.params
        glob = _as_flat32(broadcast.arrays["params"])
        personal = ctx.state.get(_PERSONAL)
        if p.personalization == "none" or personal is None:
            weights = glob.clone()  # first participation (or no personalization): take all
        elif p.personalization == "own_mask":
            shared = ctx.state.get(_SHARED)
            weights = (glob.clone() if shared is None
                       else overwrite_packs(personal, glob, p.pack_size, shared))
        else:  # global_mask
            weights = overwrite_packs(personal, glob, p.pack_size, broadcast.arrays["mask_idx"])
        load_flat_params(ctx.model, weights)
        buffers = ctx.state.get(_BUFFERS)
        if buffers:
            with torch.no_grad():
                for name, buf in ctx.model.named_buffers():
                    if name in buffers:
                        buf.copy_(buffers[name])

    def on_dropped(self, state: dict[str, Any], round: int) -> None:
        """The upload of ``round`` was lost (deadline, over-selection): none of its packs was
        aggregated, so none counts as shared. Under ``own_mask`` the client's next ``receive``
        then overwrites no pack: the whole model it trained stays personal (spec, decisions
        version 2). A record of another round is left alone."""
        if state.get(_SHARED_ROUND) == round and _SHARED in state:
            state[_SHARED] = torch.zeros(0, dtype=torch.long)

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        p = self.params
        loss, seen = local_sgd(ctx, loss=self.loss_of(ctx))
        local = flat_params(ctx.model)  # on the model's device: the scores are computed there
        prev = _as_flat32(broadcast.arrays["params"]).to(local.device)  # W_prev: pre-round global
        n = local.numel()
        j = num_packs(n, p.pack_size)
        theta_a, theta, beta = pack_scores(local, prev, p.pack_size)
        below = int((theta < theta_a).sum())
        if p.sharing == "full":
            idx, w = torch.arange(j, device=local.device), torch.ones(j, device=local.device)
            ops = 0.0  # no selection work (the scores above only feed the trace)
        else:
            idx, w = select_packs(theta, theta_a, beta, p.k, p.weighting)
            cap = pack_budget(p.k, j)
            ops = selection_ops(n, p.pack_size, below if cap is not None and cap < below else 0)
        delta = pad_to_packs(local - prev, p.pack_size)[idx]
        idx, w = idx.cpu(), w.cpu()  # the upload leaves the device: numpy, the same bytes
        upload = Payload(
            arrays={
                "idx": idx.numpy().astype(np.int32),
                "w": w.numpy().astype(np.float32),
                "delta": delta.cpu().numpy().astype(np.float32, copy=False),
            },
            nbytes=upload_nbytes(idx.numel(), j, p.pack_size),
        )
        # persistent per-client state: overwritten every participation, never accumulated;
        # kept in host memory, so device memory does not grow with the number of clients
        if p.personalization == "none":
            ctx.state.pop(_PERSONAL, None)
        else:
            ctx.state[_PERSONAL] = local.cpu()
        if p.personalization == "own_mask":
            ctx.state[_SHARED] = idx.clone()
            ctx.state[_SHARED_ROUND] = int(ctx.round)
        else:
            ctx.state.pop(_SHARED, None)
            ctx.state.pop(_SHARED_ROUND, None)
        ctx.state[_BUFFERS] = {name: b.detach().to("cpu", copy=True)
                               for name, b in ctx.model.named_buffers()}
        w_mean, w_min, w_max = _nan_stats(w)
        metrics: dict[str, Any] = {
            "train_loss": loss,
            "packs_total": j,
            "packs_below_threshold": below,
            "packs_shared": int(idx.numel()),
            "mask_w_mean": w_mean,
            "mask_w_min": w_min,
            "mask_w_max": w_max,
            "theta_a": theta_a,
        }
        return ClientResult(
            client_id=ctx.client_id,
            arch=ctx.arch,
            upload=upload,
            num_samples=len(ctx.train_y),
            train_flops=ctx.flops_per_sample * seen,
            compress_ops=ops,
            metrics=metrics,
        )


class SharedPacksPayload(TimingPayload):
    """``sharing: full``'s wire format: every client uploads all J packs (weights 1, no selection
    work); the broadcast carries the model and the global mask, which holds every pack of an
    architecture once a step aggregated one of its uploads (a round without one empties it; an
    asynchronous step without one keeps it)."""

    def __init__(self, shapes: dict[str, ArchShape], pack_size: int):
        self.n = {arch: shape.parameters for arch, shape in shapes.items()}
        self.j = {arch: num_packs(n, pack_size) for arch, n in self.n.items()}
        super().__init__({}, {arch: upload_nbytes(j, j, pack_size) for arch, j in self.j.items()})
        self.mask = {arch: 0 for arch in shapes}  # global mask size (packs) per architecture

    def download_bytes(self, arch: str) -> int:
        return download_nbytes(self.n[arch], self.j[arch], self.mask[arch])

    def stepped(self, updated: set[str], synchronous: bool) -> None:
        for arch in self.mask:
            if arch in updated:
                self.mask[arch] = self.j[arch]
            elif synchronous:
                self.mask[arch] = 0

    def state(self) -> dict[str, int]:
        return dict(self.mask)

    def restore(self, state: dict[str, int]) -> None:
        self.mask = {arch: int(state[arch]) for arch in self.mask}


class FedCSPACKServer(Server):
    params: FedCSPACKParams
    checkpoint_fields = ("masks",)

    def __init__(
        self,
        params: AlgorithmParams,
        models: dict[str, torch.nn.Module],
        seed: int,
        context: ServerContext | None = None,
    ):
        super().__init__(params, models, seed, context)
        # the global mask broadcast with the model: (pack indices, M_j), empty before round 1
        self.masks: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
            arch: (torch.zeros(0, dtype=torch.long), torch.zeros(0)) for arch in models
        }
        self._tables: dict[str, list[dict[str, np.ndarray]]] = {"packs": [], "global_mask": []}

    def broadcast(self, round: int) -> Broadcast:
        out: Broadcast = {}
        for arch, model in self.models.items():
            flat = flat_params(model)  # trainable parameters only, a fresh copy
            idx, w = self.masks[arch]
            out[arch] = Payload(
                arrays={
                    "params": flat.numpy().astype(np.float32, copy=False),
                    "mask_idx": idx.numpy().astype(np.int32),
                    "mask_w": w.numpy().astype(np.float32),
                },
                nbytes=download_nbytes(flat.numel(), num_packs(flat.numel(), self.params.pack_size),
                                       idx.numel()),
            )
        return out

    @classmethod
    def timing_payload(cls, params: FedCSPACKParams, shapes: dict[str, ArchShape]) -> TimingPayload:
        """``sharing: full`` only (:class:`SharedPacksPayload`): with ``sharing: packs`` a client
        shares the packs whose cosine fell below the whole model's after training, so how many
        it uploads, its selection work and the next broadcast's mask depend on training."""
        if params.sharing != "full":
            raise TimingUnsupported(
                "with algorithm.sharing = 'packs' a client shares the packs whose cosine fell below the whole "
                "model's after training (k only caps them), so its upload, its selection ops and the next "
                "broadcast's global mask depend on training; sharing: full has a fixed payload")
        return SharedPacksPayload(shapes, params.pack_size)

    def aggregate(self, round: int, results: list[ClientResult]) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        groups = group_by_arch(results, self.models)
        for arch, model in self.models.items():
            mine = groups.get(arch, [])
            uploads = [(r.upload.arrays["idx"], r.upload.arrays["w"], r.upload.arrays["delta"])
                       for r in mine]
            flat = flat_params(model)
            new, idx, w = aggregate_packs(flat, self.params.pack_size, uploads)
            if mine:
                load_flat_params(model, new)
            self.masks[arch] = (idx, w)
            metrics.update(self._step_metrics(arch, flat.numel(), idx, len(mine)))
            if self.params.record_packs:
                self._record_packs(round, arch, mine, idx, w)
        return metrics

    def async_step(self, step: int, updates: list, rule) -> dict[str, Any]:
        """One asynchronous step (docs/async.md, "FedCSPACK"): per architecture, every pack
        position over the step's updates that shared it, ``W_j += sum_i (M_ij / M_j) c_i D_ij``
        with ``c_i = server_lr s(tau_i)`` (FedBuff) or ``mixing s(tau_i)`` (FedAsync, one update)
        and ``M_j = sum_i M_ij``, applied to the current global model; each ``D_ij`` is a delta
        against the version the client downloaded, its packs selected against that version. The
        global mask becomes the step's packs (``M_j > 0``); an architecture without updates keeps
        its model and mask."""
        metrics: dict[str, Any] = {}
        for arch, model in self.models.items():
            mine = [u for u in updates if u.result.arch == arch]
            flat = flat_params(model)
            if mine:
                uploads = [(u.result.upload.arrays["idx"], u.result.upload.arrays["w"], u.result.upload.arrays["delta"])
                           for u in mine]
                new, idx, w = aggregate_packs(flat, self.params.pack_size, uploads,
                                              [rule.scale(u.weight) for u in mine])
                load_flat_params(model, new)
                self.masks[arch] = (idx, w)
            idx, w = self.masks[arch]
            metrics.update(self._step_metrics(arch, flat.numel(), idx, len(mine)))
            if self.params.record_packs:
                self._record_packs(step, arch, [u.result for u in mine], idx, w)
        return metrics

    def _step_metrics(self, arch: str, n: int, mask_idx: torch.Tensor, aggregated: int) -> dict[str, Any]:
        sfx = f"[{arch}]" if arch else ""
        return {f"global_mask_packs{sfx}": int(mask_idx.numel()),
                f"packs_total{sfx}": num_packs(n, self.params.pack_size), f"aggregated_clients{sfx}": aggregated}

    def _record_packs(self, round, arch, results, mask_idx, mask_w) -> None:
        """Columnar pack-level rows: who shared which pack with which weight, and the mask."""
        if results:
            sizes = [len(r.upload.arrays["idx"]) for r in results]
            self._tables["packs"].append({
                "round": np.full(sum(sizes), round, dtype=np.int64),
                "client_id": np.repeat([r.client_id for r in results], sizes),
                "arch": np.full(sum(sizes), arch, dtype=object),
                "pack": np.concatenate([r.upload.arrays["idx"] for r in results]).astype(np.int64),
                "weight": np.concatenate([r.upload.arrays["w"] for r in results]),
            })
        self._tables["global_mask"].append({
            "round": np.full(mask_idx.numel(), round, dtype=np.int64),
            "arch": np.full(mask_idx.numel(), arch, dtype=object),
            "pack": mask_idx.numpy(),
            "weight": w_numpy(mask_w),
        })

    def drain_tables(self) -> dict[str, Any]:
        out = {}
        for name, chunks in self._tables.items():
            if chunks:
                out[name] = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
        self._tables = {name: [] for name in self._tables}
        return out


def w_numpy(w: torch.Tensor) -> np.ndarray:
    return w.detach().numpy().astype(np.float32, copy=False)


SPEC = AlgorithmSpec(
    "fedcspack",
    FedCSPACKParams,
    FedCSPACKClient,
    FedCSPACKServer,
    "FedCSPACK: share drifted packs (cos < whole-model cos) with |cos+KL| mask weights",
)
