"""The fused per-pack sums behind FedCSPACK's pack scores, compiled with numba.

:func:`pack_sums` reads a local and a global ``(R, C)`` float32 view (one pack per row) once
and returns, per row, the six sums that :func:`algorithms.fedcspack.pack_scores` needs::

    L.G   |L|^2   |G|^2   S_G = sum exp(G)   S_L = sum exp(L)   sum exp(G) * (G - L)

Why a compiled kernel: with torch, each sum was its own pass over the 11M values with a
temporary per step (the two ``exp`` passes alone took 6.3 ms on 2 threads) and a client's whole
selection 15 ms, 25-31x faster than the reference code's per-pack loop instead of the 50x asked
for. Here the whole computation is one pass, SIMD-vectorised by LLVM across the values of a row
(16 float32 lanes with AVX-512); nothing is allocated but the ``(6, R)`` result.

``exp`` is written out (:func:`exp32`: Cody-Waite range reduction, Cephes' polynomial and the
exponent bits) because numba's ``math.exp`` is a scalar libm call that stops the loop from
vectorising. Its relative error is <= 2e-7 on [-87, 88] (about 1 ulp of float32, the same as
torch's float32 ``exp``); arguments outside that range are clamped to it, which the caller
detects from the partition sums and recomputes (``pack_scores``'s max-shifted path).

One thread, on purpose: the simulator's parallelism is across clients (one per actor CPU), and
a second thread pool here would compete with torch's OpenMP workers, which spin for a while
after every torch operation: on 2 cores a 2-thread version took 6.0 ms after a torch op instead
of 3.3 ms in isolation, no better than this single thread (5.5-6.4 ms, 11.2M values).
The kernel is compiled once per machine on first use (about 1-2 s; numba's on-disk cache
keeps it, later processes load it in ~0.3 s; on a read-only install without a writable home
the cache is a private temporary folder, see :func:`_njit_cached`), for that CPU's vector
width: like torch's, its sums are bit-identical run to run on one kind of CPU, but may differ in
the last bits on another.
"""
from __future__ import annotations

import os
import stat
import tempfile

import numba
import numpy as np
import torch

# reassociation lets LLVM vectorise the sums; no "nnan"/"ninf", so NaN and inf in the
# weights still reach the sums (the caller checks them)
_FASTMATH = {"reassoc", "contract", "arcp", "nsz", "afn"}

SUMS = ("dot", "local_sq", "global_sq", "global_exp", "local_exp", "global_exp_diff")


def _private_cache_dir() -> str | None:
    """A cache folder only this user can write: ``<tmp>/hetsim-numba-<uid>`` (reused by later
    processes) if it is ours and private, else a fresh temporary one; None if none can be made.
    (Numba's cache files are pickles: a folder another user can write must not be used.)"""
    uid = os.getuid() if hasattr(os, "getuid") else None
    path = os.path.join(tempfile.gettempdir(), f"hetsim-numba-{uid}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode) and (uid is None or info.st_uid == uid) and not info.st_mode & 0o077:
        return path
    try:
        return tempfile.mkdtemp(prefix="hetsim-numba-")
    except OSError:
        return None


def _njit_cached(**options):
    """``numba.njit(cache=True)``, also on read-only installs: numba caches next to the source
    or in the home folder, and refuses to compile (at import) if it can write to neither; then
    the cache goes to a private temporary folder, or, failing that, there is none (the kernel
    is compiled in every process, ~1-2 s)."""

    def decorate(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            pass
        cache_dir = _private_cache_dir()
        if cache_dir is not None:
            saved = numba.config.CACHE_DIR
            numba.config.CACHE_DIR = cache_dir  # read when the cache is set up, just below
            try:
                return numba.njit(cache=True, **options)(fn)
            except RuntimeError:
                pass
            finally:
                numba.config.CACHE_DIR = saved
        return numba.njit(**options)(fn)

    return decorate


@numba.njit(fastmath=_FASTMATH, inline="always")
def exp32(x):
    """float32 ``exp(x)``, vectorisable inside a loop; x is clamped to [-87, 88] so that the
    scale ``2^n`` stays a normal float32."""
    x = min(max(x, np.float32(-87.0)), np.float32(88.0))
    n = np.rint(x * np.float32(1.4426950408889634))  # x = n ln2 + f, |f| <= ln2 / 2
    f = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)  # ln2 in two parts
    p = np.float32(1.9875691500e-4)  # exp(f) - 1 - f, Cephes' expf minimax coefficients
    p = p * f + np.float32(1.3981999507e-3)
    p = p * f + np.float32(8.3334519073e-3)
    p = p * f + np.float32(4.1665795894e-2)
    p = p * f + np.float32(1.6666665459e-1)
    p = p * f + np.float32(5.0000001201e-1)
    p = p * f * f + f + np.float32(1.0)
    two_n = np.int32((np.int32(n) + np.int32(127)) << np.int32(23)).view(np.float32)
    return p * two_n


@_njit_cached(fastmath=_FASTMATH)
def _pack_sums(local, glob, out):
    for r in range(local.shape[0]):
        dot = np.float32(0.0)
        local_sq = np.float32(0.0)
        global_sq = np.float32(0.0)
        global_exp = np.float32(0.0)
        local_exp = np.float32(0.0)
        global_exp_diff = np.float32(0.0)
        for c in range(local.shape[1]):
            lv = local[r, c]
            gv = glob[r, c]
            eg = exp32(gv)
            dot += lv * gv
            local_sq += lv * lv
            global_sq += gv * gv
            global_exp += eg
            local_exp += exp32(lv)
            global_exp_diff += eg * (gv - lv)
        out[0, r] = dot
        out[1, r] = local_sq
        out[2, r] = global_sq
        out[3, r] = global_exp
        out[4, r] = local_exp
        out[5, r] = global_exp_diff


@_njit_cached(fastmath=_FASTMATH)
def _exp32_array(x, out):
    for i in range(x.size):
        out[i] = exp32(x[i])


def exp32_array(x: np.ndarray) -> np.ndarray:
    """:func:`exp32` element-wise over a 1-D float32 array (for tests and inspection)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _exp32_array(x, out)
    return out


def pack_sums(local: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """The six per-row sums (rows of :data:`SUMS`) of two ``(R, C)`` float32 tensors, as a
    ``(6, R)`` float32 tensor, each row summed in float32 with SIMD partial sums."""
    if local.shape != glob.shape or local.dim() != 2:
        raise ValueError(f"need two (R, C) tensors of one shape, got {tuple(local.shape)} "
                         f"and {tuple(glob.shape)}")
    lo = np.ascontiguousarray(local.detach().numpy(), dtype=np.float32)
    gl = np.ascontiguousarray(glob.detach().numpy(), dtype=np.float32)
    out = np.empty((len(SUMS), lo.shape[0]), dtype=np.float32)
    if lo.shape[0]:
        _pack_sums(lo, gl, out)
    return torch.from_numpy(out)
