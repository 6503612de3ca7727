"""FedCSPACK's per-pack statistics with torch ops, for tensors on a GPU (or any non-CPU device).

:func:`pack_sums_torch` returns the same four rows as the CPU kernel
(:func:`algorithms.pack_kernel.pack_sums`, rows named in :data:`algorithms.pack_kernel.SUMS`)::

    L.G   |L|^2   |G|^2   beta = KL(softmax(G) || softmax(L))

computed in float64 on the tensors' own device, so a model trained on a GPU is scored there
without a copy to the host. On a GPU this pass is memory-bound, so float64 costs little even
where float64 arithmetic is slow (a few tens of flops per value, 11M values for ResNet-18).

``beta`` takes the kernel's cancellation-free form (see :mod:`algorithms.pack_kernel`): with
``d = G - L``, ``w = exp(G)``, ``m`` the ``w``-weighted mean of ``d`` and ``u = d - m``::

    beta = A + ln(1 + A - B) - (A - B),   A = sum w phi(u) / sum w,   B = sum w u / sum w,
    phi(u) = e^-u - 1 + u >= 0

``phi`` is a Taylor polynomial for ``|u| < 1/2`` (no cancellation) and ``expm1(-u) + u``
beyond; ``ln(1 + x) - x`` a series for ``|x| < 1e-2``. Where the kernel redoes a row around
``m`` only when it must, this path always does (two passes over a chunk cost nothing extra on a
memory-bound device). Same conventions as the kernel, so both paths give the same mask
weights (within the kernel's ~2e-7 relative): ``beta = 0`` for packs of one value, ``beta >= 0``,
and ``beta = NaN`` for the rows the caller (``fedcspack._row_stats``) must recompute with the
max-shifted ``log_softmax`` form: ``sum exp(G)`` outside ``[e^-60, e^87)``, some ``|u| > 87``,
or non-finite values (which then also reach that row's dot products).

Rows are processed in chunks of at most :data:`CHUNK_VALUES` values so the float64 temporaries
stay bounded (32 MiB each). Device-agnostic code: on CPU tensors it gives the same numbers (the
tests run it there against float64 numpy); the engine uses the numba kernel on the CPU because
it is faster there.
"""
from __future__ import annotations

import math

import torch

from algorithms.pack_kernel import SUMS

CHUNK_VALUES = 1 << 22  # values per chunk: each float64 temporary is 32 MiB

_EXP_LIMIT = 87.0  # some |u| above: the caller's path (as the kernel, whose exp32 would clamp)
_MIN_SUM_W, _MAX_SUM_W = math.exp(-60.0), math.exp(87.0)  # sum exp(G) outside: caller's path
_PHI_SERIES_LIMIT = 0.5  # |u| below which phi(u) = u^2 * sum_j (-u)^j / (j+2)!, j <= 12
_PHI_COEFFS = tuple(1.0 / math.factorial(j + 2) for j in range(13))  # truncation < 2e-16 rel.
_LOG1P_SERIES_LIMIT = 1e-2  # |x| below which ln(1 + x) - x = x^2 (-1/2 + x/3 - ...), to x^9


def _phi(u: torch.Tensor) -> torch.Tensor:
    """``e^-u - 1 + u`` in float64 without cancellation."""
    v = -u
    h = torch.full_like(u, _PHI_COEFFS[-1])
    for c in reversed(_PHI_COEFFS[:-1]):  # Horner over 13 coefficients, not over values
        h = h * v + c
    series = u * u * h
    return torch.where(u.abs() < _PHI_SERIES_LIMIT, series, torch.expm1(v) + u)


def _log1p_minus_x(x: torch.Tensor) -> torch.Tensor:
    """``ln(1 + x) - x`` in float64 without cancellation near 0."""
    acc = torch.zeros_like(x)
    for k in range(9, 1, -1):
        acc = acc * x + (1.0 / k if k % 2 else -1.0 / k)
    return torch.where(x.abs() < _LOG1P_SERIES_LIMIT, acc * x * x, torch.log1p(x) - x)


@torch.no_grad()
def pack_sums_torch(local: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """The four per-row statistics of two ``(R, C)`` tensors as a ``(4, R)`` float64 tensor on
    their device; ``beta`` is NaN for rows the caller must recompute (module docstring)."""
    if local.shape != glob.shape or local.dim() != 2:
        raise ValueError(f"need two (R, C) tensors of one shape, got {tuple(local.shape)} "
                         f"and {tuple(glob.shape)}")
    rows, cols = local.shape
    out = torch.empty((len(SUMS), rows), dtype=torch.float64, device=local.device)
    step = max(1, CHUNK_VALUES // max(cols, 1))
    for start in range(0, rows, step):  # a few chunks of many packs each, not a loop over packs
        lo = local[start : start + step].double()
        gl = glob[start : start + step].double()
        part = out[:, start : start + step]
        torch.sum(lo * gl, dim=1, out=part[0])
        torch.sum(lo * lo, dim=1, out=part[1])
        torch.sum(gl * gl, dim=1, out=part[2])
        w = torch.exp(gl)
        d = gl - lo
        sum_w = w.sum(1)
        mean = (w * d).sum(1) / sum_w
        u = d - mean[:, None]
        a = (w * _phi(u)).sum(1) / sum_w
        b = (w * u).sum(1) / sum_w
        beta = (a + _log1p_minus_x(a - b)).clamp_min_(0.0)  # rounding below 0 clamped
        if cols == 1:  # softmax of one value is 1: KL = 0 exactly (as the kernel)
            beta.zero_()
        ok = ((sum_w >= _MIN_SUM_W) & (sum_w < _MAX_SUM_W) & torch.isfinite(mean) & torch.isfinite(a)
              & (u.abs() <= _EXP_LIMIT).all(1))
        part[3] = torch.where(ok, beta, torch.full_like(beta, math.nan))
    return out


def pack_sums_on_device(local: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """The per-pack statistics where the tensors are: the compiled kernel on the CPU, torch
    elsewhere; both a ``(4, R)`` float64 tensor (rows of :data:`~algorithms.pack_kernel.SUMS`)."""
    if local.device.type == "cpu":
        from algorithms.pack_kernel import pack_sums  # numba (~0.5 s to import): the CPU path only

        return pack_sums(local, glob)
    return pack_sums_torch(local, glob)
