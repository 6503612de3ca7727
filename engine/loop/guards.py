"""``train.on_nonfinite``: uploads with NaN or inf are rejected, and a run whose model turns
non-finite stops as ``diverged``."""
from __future__ import annotations

import numpy as np
import torch

from algorithms.base import ClientResult


def nonfinite_results(results: list[ClientResult]) -> np.ndarray:
    """True where a client's upload (any float array) or training loss is NaN or inf."""
    bad = np.zeros(len(results), dtype=bool)
    for i, res in enumerate(results):
        loss = res.metrics.get("train_loss")
        if loss is not None and not np.isfinite(loss):
            bad[i] = True
            continue
        for a in res.upload.arrays.values():
            a = np.asarray(a)
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                bad[i] = True
                break
    return bad


def reject_nonfinite(results: list[ClientResult], outcome, guard: str) -> np.ndarray:
    """Mark non-finite uploads as not arrived (drop reason ``nonfinite``) unless the guard is
    ``ignore``; returns which results were non-finite."""
    nonfinite = nonfinite_results(results)
    if guard != "ignore" and nonfinite.any():
        # the server received these uploads and rejects them (they are not aggregated)
        outcome.made_deadline &= ~nonfinite
        outcome.drop_reason[nonfinite] = "nonfinite"
    return nonfinite


def divergence(round: int, results: list[ClientResult], nonfinite: np.ndarray, global_models,
               guard: str) -> str | None:
    """Why the run must stop after this round (None: it goes on)."""
    if guard == "ignore":
        return None
    bad_ids = [res.client_id for res, bad in zip(results, nonfinite) if bad]
    if bad_ids and guard == "stop":
        return (f"round {round}: client(s) {bad_ids[:10]} uploaded non-finite values "
                "(NaN or inf); train.on_nonfinite is 'stop' ('skip_client' drops such "
                "uploads, 'ignore' keeps them); lower train.lr?")
    if not all(_finite_model(m) for m in global_models.values()):
        return (f"round {round}: the global model has non-finite weights after "
                "aggregation; lower train.lr?")
    return None


def _finite_model(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in (*model.parameters(), *model.buffers())
               if t.is_floating_point())
