"""Global evaluation: the server's models on the held-out global test set, as a callback.

:func:`is_evaluation_round` is the schedule (every ``evaluation.eval_every`` rounds and the
last one) that personalized evaluation on the clients follows too. :class:`GlobalEvaluation`
fills the ``global_*`` columns the round's row reserves (:mod:`engine.loop.rows`); the round
loop installs it first, so every other callback sees the round evaluated.
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

from algorithms.metrics import metric_values
from algorithms.plugins import METRICS
from algorithms.training import evaluate, flat_state, same_bits
from engine.config.schema import ExperimentConfig
from engine.loop.callbacks import RoundRecord, RunCallback, RunContext


def is_evaluation_round(cfg: ExperimentConfig, r: int) -> bool:
    return (r + 1) % cfg.evaluation.eval_every == 0 or r == cfg.rounds - 1


def global_columns(cfg: ExperimentConfig, architectures: list[str], r: int) -> list[str]:
    """The ``global_*`` columns of round ``r``: per-architecture accuracies (heterogeneous
    models) in evaluation rounds, then the mean accuracy and loss (NaN when not evaluated)."""
    evaluated = cfg.evaluation.global_model and is_evaluation_round(cfg, r)
    per_arch = [f"global_acc_{a}" for a in architectures if a] if evaluated else []
    return [*per_arch, "global_acc", "global_loss", *(f"global_{m}" for m in cfg.evaluation.metrics)]


class GlobalEvaluation(RunCallback):
    """Evaluates the global model(s) after the rounds :func:`is_evaluation_round` names; the
    seconds it takes count in the round's ``wall_s``.

    On the CPU the server's own models are evaluated; on a GPU (a process that holds one) a
    mirror of each, refreshed every time, so aggregation stays on the CPU where uploads arrive.
    """

    adds_metrics = True

    def __init__(self, cfg: ExperimentConfig, data, server, device: torch.device):
        self.cfg, self.data, self.server, self.device = cfg, data, server, device
        self._test: tuple[torch.Tensor, torch.Tensor] | None = None
        self._mirrors: dict[str, torch.nn.Module] = {}
        # per architecture, the state last evaluated and its figures: a model a rollback restored
        # is the one evaluated the round before, not evaluated again
        self._last: dict[str, tuple[torch.Tensor, tuple[float, int, int, dict[str, float]]]] = {}
        self.metrics = {m: METRICS.get(m) for m in cfg.evaluation.metrics}  # evaluation.metrics

    def on_round_end(self, run: RunContext, record: RoundRecord) -> None:
        if not (self.cfg.evaluation.global_model and is_evaluation_round(self.cfg, record.round)):
            return
        t0 = time.perf_counter()
        metrics = self.evaluate()
        if "wall_s" in record.row:
            metrics["wall_s"] = record.row["wall_s"] + time.perf_counter() - t0
        record.add_metrics(metrics)

    def evaluate(self) -> dict[str, float]:
        x, y = self._global_test()
        out: dict[str, float] = {}
        accs, losses, extra = [], [], {m: [] for m in self.metrics}
        for arch, model in self.server.global_models().items():
            state, last = flat_state(model), self._last.get(arch)
            if last is not None and same_bits(last[0], state):
                loss_sum, correct, n, values = last[1]
            else:
                res = evaluate(self._on_device(arch, model), x, y, self.cfg.evaluation.batch_size,
                               outputs=bool(self.metrics))
                loss_sum, correct, n = res[:3]
                values = metric_values(self.metrics, res[3], y, "the global model") if self.metrics else {}
                self._last[arch] = (state, (loss_sum, correct, n, values))
            accs.append(correct / n)
            losses.append(loss_sum / n)
            for m, v in values.items():
                extra[m].append(v)
            if arch:
                out[f"global_acc_{arch}"] = correct / n
        out["global_acc"] = float(np.mean(accs))
        out["global_loss"] = float(np.mean(losses))
        out.update({f"global_{m}": float(np.mean(v)) for m, v in extra.items()})
        return out

    def _global_test(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._test is None:
            x, y = self.data.global_test_arrays()
            self._test = (torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device))
        return self._test

    def _on_device(self, arch: str, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` itself on the CPU; else a copy on the evaluation device, refreshed."""
        if self.device.type == "cpu":
            return model
        mirror = self._mirrors.get(arch)
        if mirror is None:
            mirror = self._mirrors[arch] = copy.deepcopy(model).to(self.device)
        mirror.load_state_dict(model.state_dict())
        return mirror
