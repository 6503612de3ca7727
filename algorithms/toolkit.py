"""Steps that several methods share, in one place: K options, grouping uploads by
architecture, and the sample-weighted mean.

* :func:`check_k` - the one validator of a "how many" option (``k``): an int count >= 1, a
  float fraction, and optionally ``"all"``. Compressors read a float as a ratio of the model
  size in (0, 1] (1.0 = every coordinate); FedCSPACK reads it as a fraction of the packs in
  (0, 1) and rejects 1.0 as ambiguous (``one_is_ambiguous``). Defined in
  :mod:`algorithms.params` (config validation imports no torch), exported here.
* :func:`group_by_arch` - the round's uploads per model architecture.
* :func:`sample_weights`, :func:`weighted_mean` - ``sum_n (m_n / sum m) x_n`` accumulated in
  float64 (FedAvg, compressed FedAvg, ASCEND).

Plain torch / numpy: no Ray, no I/O.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch

from algorithms.base import ClientResult
from algorithms.params import ALL, check_k  # noqa: F401 (torch-free, for config validation; exported here)


def group_by_arch(results: Iterable[ClientResult], archs: Iterable[str]) -> dict[str, list[ClientResult]]:
    """The uploads of each architecture in ``archs`` that has any, in ``archs``' order.

    An upload for an architecture the server does not hold is an error (not silently dropped).
    """
    archs = list(archs)
    groups: dict[str, list[ClientResult]] = {a: [] for a in archs}
    for r in results:
        if r.arch not in groups:
            raise ValueError(f"client {r.client_id} uploaded for architecture {r.arch!r}; "
                             f"the server holds {archs}")
        groups[r.arch].append(r)
    return {a: rs for a, rs in groups.items() if rs}


def sample_weights(results: Sequence[ClientResult]) -> torch.Tensor:
    """``m_n / sum m`` as float64 (uniform when every client reports 0 samples)."""
    m = torch.tensor([float(r.num_samples) for r in results], dtype=torch.float64)
    total = float(m.sum())
    return m / total if total > 0 else torch.full_like(m, 1.0 / max(len(results), 1))


# float64 rows converted at a time by weighted_mean: its memory stays this, not n copies of the model
WEIGHTED_MEAN_BLOCK_BYTES = 256 * 2**20


def weighted_mean(weights: torch.Tensor, vectors: Sequence[torch.Tensor | np.ndarray],
                  float64: bool = False) -> torch.Tensor:
    """``sum_n weights_n x_n`` of equal-length vectors, accumulated in float64, as float32 (as
    float64 with ``float64``: a server rule that goes on computing with it).

    The vectors are converted to float64 a block of rows at a time (one copy each, into a
    reused buffer) and each block is one matrix-vector product added to the sum."""
    if len(vectors) == 0:
        raise ValueError("weighted_mean: no vectors to average")
    w = weights.double()
    first = vectors[0]
    d = first.numel() if isinstance(first, torch.Tensor) else np.asarray(first).size
    rows = max(1, min(len(vectors), WEIGHTED_MEAN_BLOCK_BYTES // max(8 * d, 1)))
    block = torch.empty((rows, d), dtype=torch.float64)
    total = None
    for start in range(0, len(vectors), rows):
        part = vectors[start:start + rows]
        for i, v in enumerate(part):
            if isinstance(v, torch.Tensor):
                block[i].copy_(v.reshape(-1))
            else:  # numpy converts while copying (an upload from Ray's object store is read-only)
                block[i].numpy()[:] = np.asarray(v).reshape(-1)
        partial = w[start:start + len(part)] @ block[:len(part)]
        total = partial if total is None else total.add_(partial)
    return total if float64 else total.float()


def sample_weighted_mean(results: Sequence[ClientResult], key: str) -> torch.Tensor:
    """The sample-weighted mean of each upload's dense array ``key``."""
    return weighted_mean(sample_weights(results), [r.upload.arrays[key] for r in results])
