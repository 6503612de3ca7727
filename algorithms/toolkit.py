"""Steps that several methods share, in one place: K options, grouping uploads by
architecture, and the sample-weighted mean.

* :func:`check_k` - the one validator of a "how many" option (``k``): an int count >= 1, a
  float fraction, and optionally ``"all"``. Compressors read a float as a ratio of the model
  size in (0, 1] (1.0 = every coordinate); FedCSPACK reads it as a fraction of the packs in
  (0, 1) and rejects 1.0 as ambiguous (``one_is_ambiguous``).
* :func:`group_by_arch` - the round's uploads per model architecture.
* :func:`sample_weights`, :func:`weighted_mean` - ``sum_n (m_n / sum m) x_n`` accumulated in
  float64 (FedAvg, compressed FedAvg, ASCEND).

Plain torch / numpy: no Ray, no I/O.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from algorithms.base import ClientResult

ALL = "all"


def check_k(
    value: Any,
    *,
    field: str = "k",
    what: str = "coordinates",
    allow_all: bool = False,
    one_is_ambiguous: bool = False,
) -> int | float | str:
    """A K option as given in a config: an int count >= 1, a float fraction, or ``"all"``.

    A float is a fraction in (0, 1]; with ``one_is_ambiguous`` in (0, 1) and ``1.0`` is rejected
    with a message saying so (one or all?). Numeric strings (YAML 1.1 reads ``1e-2`` as a
    string; CLI overrides may too) are parsed. Raises ``ValueError`` naming the field, the value
    and what is allowed.
    """
    upper = "1)" if one_is_ambiguous else "1]"
    allowed = (f"an int count >= 1 of {what}, a float fraction in (0, {upper}"
               + (" or 'all'" if allow_all else ""))
    if isinstance(value, str):
        text = value.strip()
        if allow_all and text == ALL:
            return ALL
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{field}={value!r} is not allowed: must be {allowed}") from None
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{field}={value!r} is not allowed: must be {allowed}")
    if isinstance(value, (int, np.integer)):
        if value < 1:
            raise ValueError(f"{field}={value} is not allowed: must be {allowed}")
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if one_is_ambiguous and value == 1.0:
            raise ValueError(
                f"{field}=1.0 is ambiguous (one of the {what} or all of them?): write {field}: 1 for one"
                + (f" or {field}: all for all" if allow_all else "")
            )
        ok = 0.0 < value < 1.0 if one_is_ambiguous else 0.0 < value <= 1.0
        if not (math.isfinite(value) and ok):
            raise ValueError(f"{field}={value!r} is not allowed: must be {allowed}")
        return value
    raise ValueError(f"{field}={value!r} is not allowed: must be {allowed}")


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


def weighted_mean(weights: torch.Tensor, vectors: Sequence[torch.Tensor | np.ndarray]) -> torch.Tensor:
    """``sum_n weights_n x_n`` of equal-length vectors, accumulated in float64, as float32."""
    stacked = torch.stack([torch.as_tensor(np.asarray(v) if not isinstance(v, torch.Tensor) else v)
                           .double().reshape(-1) for v in vectors])
    return (weights.double() @ stacked).float()


def sample_weighted_mean(results: Sequence[ClientResult], key: str) -> torch.Tensor:
    """The sample-weighted mean of each upload's dense array ``key``."""
    return weighted_mean(sample_weights(results), [r.upload.arrays[key] for r in results])
