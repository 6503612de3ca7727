"""train.local_steps: a number of SGD steps per round instead of local_epochs."""
import numpy as np
import pytest
import torch
import torch.nn as nn

from algorithms.base import ClientContext, TrainSettings
from algorithms.batched_training import draw_batches
from algorithms.training import batch_schedule, flat_params, local_sgd


def ctx(steps=None, epochs=1, n=20):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return ClientContext(client_id=0, round=0, arch="", model=model, state={}, train_x=x,
                         train_y=(x[:, 0] > 0).long(), rng=np.random.default_rng(5),
                         train=TrainSettings(local_epochs=epochs, local_steps=steps, batch_size=8, lr=0.1),
                         flops_per_sample=1.0)


def test_steps_are_the_first_batches_of_the_epoch_stream():
    # n = 20, batch 8: batches of 8, 8, 4 per epoch
    sizes = [len(b) for b in batch_schedule(np.random.default_rng(0), 20, 8, epochs=1, steps=5)]
    assert sizes == [8, 8, 4, 8, 8]
    epochs2 = batch_schedule(np.random.default_rng(0), 20, 8, epochs=2)
    steps6 = batch_schedule(np.random.default_rng(0), 20, 8, epochs=1, steps=6)
    assert all(np.array_equal(a, b) for a, b in zip(epochs2, steps6)) and len(steps6) == 6
    assert batch_schedule(np.random.default_rng(0), 0, 8, 1, steps=3) == []


def test_local_sgd_with_steps_trains_that_many_steps_and_matches_epochs_bit_for_bit():
    a, b = ctx(steps=3), ctx(epochs=1)  # 3 steps = one epoch of 20 samples in batches of 8
    la, seen_a = local_sgd(a)
    lb, seen_b = local_sgd(b)
    assert seen_a == seen_b == 20 and la == lb and torch.equal(flat_params(a.model), flat_params(b.model))
    one = ctx(steps=1)
    _, seen = local_sgd(one)
    assert seen == 8
    # the batched-training path draws the same batches
    ids = torch.arange(100, 120)
    got = draw_batches(np.random.default_rng(5), ids, 8, 1, steps=4)
    want = batch_schedule(np.random.default_rng(5), 20, 8, 1, steps=4)
    assert [t.tolist() for t in got] == [(100 + w).tolist() for w in want]


def test_config_takes_local_steps_or_local_epochs_not_both():
    from engine.config.schema import load_config
    from engine.errors import ConfigError

    assert load_config({"train": {"local_steps": 2}}).train.local_steps == 2
    assert load_config({}).train.local_steps is None
    with pytest.raises(ConfigError, match="give one of the two"):
        load_config({"train": {"local_steps": 2, "local_epochs": 3}})
    with pytest.raises(ConfigError, match="local_steps"):
        load_config({"train": {"local_steps": 0}})
