"""Metrics beside accuracy: evaluating the registered ones, and the built-in ones.

Each metric is ``fn(outputs, targets) -> float`` over a whole test set (``evaluation.metrics``; the
built-ins are registered in :mod:`algorithms`); a user's has the same shape
(:func:`engine.plugins.register_metric`)."""
from __future__ import annotations

from typing import Callable

import torch

from hardware_profiles.errors import PluginError, user_frames


def metric_values(metrics: dict[str, Callable], outputs, targets, where: str) -> dict[str, float]:
    """Each registered metric of ``outputs`` against ``targets`` (a failing one names itself)."""
    out = {}
    for name, fn in metrics.items():
        try:
            out[name] = float(fn(outputs, targets))
        except Exception as err:  # noqa: BLE001 - the user's metric: said with its name
            frames = user_frames(err)
            raise MetricError(f"metric {name!r} failed on {where}: {type(err).__name__}: {err}"
                              + (f"\n{frames}" if frames else "")) from err
    return out


class MetricError(PluginError):
    """A registered metric raised; the message names the metric, what it evaluated and the user's frames."""


def _confusion(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """counts[true class, predicted class] over the classes of the outputs."""
    classes = outputs.shape[1]
    pred = outputs.argmax(1)
    return torch.bincount(targets.long() * classes + pred, minlength=classes * classes).reshape(classes, classes)


def macro_f1(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """The unweighted mean of per-class F1 over the classes that occur (as targets or predictions)."""
    c = _confusion(outputs, targets).double()
    tp, true, pred = c.diag(), c.sum(1), c.sum(0)
    seen = (true + pred) > 0
    f1 = 2 * tp[seen] / (true[seen] + pred[seen])
    return float(f1.mean()) if len(f1) else float("nan")


def balanced_accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """The unweighted mean of per-class recall over the classes the targets hold."""
    c = _confusion(outputs, targets).double()
    true = c.sum(1)
    present = true > 0
    return float((c.diag()[present] / true[present]).mean()) if present.any() else float("nan")


def top5_accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """The share of samples whose label is among the 5 highest outputs (all of them with <= 5 classes)."""
    if len(targets) == 0:
        return float("nan")
    k = min(5, outputs.shape[1])
    hit = (outputs.topk(k, dim=1).indices == targets.view(-1, 1)).any(1)
    return float(hit.double().mean())
