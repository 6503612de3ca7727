"""Global evaluation reuses the figures of a state it evaluated last (a model a rollback restored)."""
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn

import engine.loop.evaluation as ev
from algorithms.training import evaluate


def setup(monkeypatch):
    torch.manual_seed(0)
    g = np.random.default_rng(0)
    x, y = g.normal(size=(50, 4)).astype(np.float32), g.integers(0, 3, 50)
    models = {"a": nn.Linear(4, 3), "b": nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))}
    cfg = SimpleNamespace(evaluation=SimpleNamespace(batch_size=16, metrics=[]))
    data = SimpleNamespace(global_test_arrays=lambda: (x, y))
    callback = ev.GlobalEvaluation(cfg, data, SimpleNamespace(global_models=lambda: models), torch.device("cpu"))
    calls = []

    def counted(model, *a, **kw):
        calls.append(model)
        return evaluate(model, *a, **kw)

    monkeypatch.setattr(ev, "evaluate", counted)
    return callback, models, calls, (torch.from_numpy(x), torch.from_numpy(y))


def test_an_unchanged_model_is_not_evaluated_again(monkeypatch):
    callback, models, calls, (x, y) = setup(monkeypatch)
    first = callback.evaluate()
    assert len(calls) == 2 and callback.evaluate() == first and len(calls) == 2
    with torch.no_grad():
        models["a"].weight[0, 0] += 0.5
    changed = callback.evaluate()
    assert calls[2:] == [models["a"]]  # only the changed one ran again, with its own figures
    loss, correct, n = evaluate(models["a"], x, y, 16)
    assert changed["global_acc_a"] == correct / n
    assert changed["global_acc_b"] == first["global_acc_b"]
    assert changed["global_loss"] == np.mean([loss / n, evaluate(models["b"], x, y, 16)[0] / n])


def test_other_bits_are_evaluated_again(monkeypatch):
    """-0.0 and 0.0 are equal numbers but not the same state: evaluated again."""
    callback, models, calls, _ = setup(monkeypatch)
    with torch.no_grad():
        models["a"].bias[0] = 0.0
    callback.evaluate()
    with torch.no_grad():
        models["a"].bias[0] = -0.0
    callback.evaluate()
    assert len(calls) == 3 and calls[2] is models["a"]
