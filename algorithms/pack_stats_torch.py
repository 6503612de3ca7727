"""FedCSPACK's per-pack sums with torch ops, for tensors on a GPU (or any non-CPU device).

:func:`pack_sums_torch` returns the same six per-row sums as the CPU kernel
(:func:`algorithms.pack_kernel.pack_sums`, rows named in :data:`algorithms.pack_kernel.SUMS`)::

    L.G   |L|^2   |G|^2   S_G = sum exp(G)   S_L = sum exp(L)   sum exp(G) * (G - L)

but computes and accumulates every one of them in float64, on the tensors' own device, so a
model trained on a GPU is scored there without a copy to the host. float64 throughout is what
the spec's numerics section asks of the accumulation (every mask weight within 1e-5 relative of
a float64 reference); on a GPU this pass is memory-bound, so float64 costs little even where
float64 arithmetic is slow (about 10 flops per value, 11M values for ResNet-18).

Rows are processed in chunks of at most :data:`CHUNK_VALUES` values so the float64 temporaries
stay bounded (32 MiB each). ``exp`` overflows float64 only beyond 709 and underflows below
-745; the caller (``fedcspack._row_stats``) checks the partition sums and recomputes packs
outside ``[1e-30, 1e30]`` with the max-shifted form, on the same device.

Device-agnostic code: on CPU tensors it gives the same numbers (the tests run it there against
float64 numpy); the engine uses the numba kernel on the CPU because it is faster there.
"""
from __future__ import annotations

import torch

from algorithms.pack_kernel import SUMS

CHUNK_VALUES = 1 << 22  # values per chunk: four float64 temporaries of 32 MiB


@torch.no_grad()
def pack_sums_torch(local: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """The six per-row sums of two ``(R, C)`` tensors as a ``(6, R)`` float64 tensor on their
    device (float64 products, exponentials and accumulation)."""
    if local.shape != glob.shape or local.dim() != 2:
        raise ValueError(f"need two (R, C) tensors of one shape, got {tuple(local.shape)} "
                         f"and {tuple(glob.shape)}")
    rows, cols = local.shape
    out = torch.empty((len(SUMS), rows), dtype=torch.float64, device=local.device)
    step = max(1, CHUNK_VALUES // max(cols, 1))
    for start in range(0, rows, step):  # a few chunks of many packs each, not a loop over packs
        lo = local[start : start + step].double()
        gl = glob[start : start + step].double()
        eg = torch.exp(gl)
        part = out[:, start : start + step]
        torch.sum(lo * gl, dim=1, out=part[0])
        torch.sum(lo * lo, dim=1, out=part[1])
        torch.sum(gl * gl, dim=1, out=part[2])
        torch.sum(eg, dim=1, out=part[3])
        torch.sum(torch.exp(lo), dim=1, out=part[4])
        torch.sum(eg * (gl - lo), dim=1, out=part[5])
    return out


def pack_sums_on_device(local: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """The per-pack sums where the tensors are: the compiled kernel on the CPU, torch elsewhere."""
    if local.device.type == "cpu":
        from algorithms.pack_kernel import pack_sums

        return pack_sums(local, glob)
    return pack_sums_torch(local, glob)
