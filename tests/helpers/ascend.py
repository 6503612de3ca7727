"""ASCEND on a tiny model and hand-built contexts (no engine): a server and a client's context,
shared by the spec-version tests."""
import numpy as np
import torch
import torch.nn as nn

from algorithms.ascend import AscendServer
from algorithms.base import ClientContext, ServerContext, TrainSettings
from hardware_profiles.catalog import default_catalog

RPI4 = default_catalog().profile("rpi4", "5mbps")  # a tier with the selection-cost constants


def tiny(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))  # 83 parameters


def data(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def server_for(params, n_public=96):
    x, y = data(7, n_public)
    ctx = ServerContext(public_x=x, public_y=y, num_clients=4, client_arch=np.array(["a"] * 4, dtype=object))
    return AscendServer(params, {"a": tiny()}, seed=0, context=ctx)


def ctx_for(cid, rnd, state, n=40, profile=RPI4, lr=0.1, model_seed=99):
    x, y = data(100 + cid, n)
    return ClientContext(
        client_id=cid, round=rnd, arch="a", model=tiny(model_seed), state=state, train_x=x, train_y=y,
        rng=np.random.default_rng([0, rnd, cid]), train=TrainSettings(batch_size=8, lr=lr),
        flops_per_sample=1e6, profile=profile,
    )

