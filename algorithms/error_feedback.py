"""Error feedback: a residual around any compressor, so that what one upload leaves out is sent
later instead of vanishing (``a = e + delta``; send ``C(a)``; keep ``e = a - sent``), and what a
lost upload sent is put back (:meth:`ErrorFeedback.restore`)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from algorithms.compressors import Compressed, Compressor, _flat


class ErrorFeedback:
    """Residual accumulation around a compressor: ``a = e + delta``; send ``C(a)``; keep
    ``e = a - sent``. For sparsifiers ``decode(c) + e == a`` holds bit for bit (sent positions:
    ``v + (a_i - v) = v + 0``; others: ``0 + a_i``)."""

    def __init__(self, compressor: Compressor):
        self.compressor = compressor

    def compress(self, residual: torch.Tensor | np.ndarray | None, delta: torch.Tensor, k: int | float,
                 **kwargs: Any) -> tuple[Compressed, torch.Tensor]:
        """``(C(e + delta), new residual)``."""
        a = self.accumulate(residual, delta)
        c = self.compressor.compress(a, k, **kwargs)
        return c, self.update_residual(a, c)

    def restore(self, residual: np.ndarray, c: Compressed) -> np.ndarray:
        """The residual with what ``c`` sent put back (a lost upload); a writable copy if needed."""
        if c.numel != residual.size:
            raise ValueError(f"sent record of length {c.numel} for a residual of length {residual.size}")
        if not residual.flags.writeable:
            residual = residual.copy()
        self.compressor.restore(residual, c)
        return residual

    @staticmethod
    def accumulate(residual: torch.Tensor | np.ndarray | None, delta: torch.Tensor) -> torch.Tensor:
        delta = _flat(delta)
        if residual is None:
            return delta.clone()
        residual = _flat(residual).to(delta.device)
        if residual.numel() != delta.numel():
            raise ValueError(f"residual has {residual.numel()} elements but the delta {delta.numel()}")
        return residual + delta

    @staticmethod
    def update_residual(a: torch.Tensor, c: Compressed) -> torch.Tensor:
        a = _flat(a)
        if a.numel() != c.numel:
            raise ValueError(f"payload is for a vector of length {c.numel}, not {a.numel()}")
        idx = c.index_tensor().to(a.device)
        e = a.clone()
        e[idx] = a[idx] - c.values
        return e
