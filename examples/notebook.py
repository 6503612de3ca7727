"""Your method and model defined where you work (a notebook cell, a script), run on our fleets.

Everything here lives in ``__main__``: nothing is installed and no file names a plugin. The
classes are registered in this process and travel to Ray's processes by value, so the same cell
runs in-process and on Ray, with identical tables. Run it: ``python examples/notebook.py``
(``--ray`` also runs it on Ray and compares the two).
"""
import sys
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field

import engine
from engine import plugins


class TinyNet(torch.nn.Module):
    """A one-hidden-layer net: your model, built for the data's input shape and classes."""

    def __init__(self, input_shape, num_classes, hidden: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(input_shape)), hidden),
                                       torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)


class ServerMomentumParams(plugins.AlgorithmParams):
    server_lr: float = Field(1.0, gt=0, description="server learning rate")
    beta: float = Field(0.9, ge=0, lt=1, description="server momentum")
    uploads_whole_model: ClassVar[bool] = True


def state_of(model) -> plugins.Payload:
    state = plugins.flat_state(model).numpy().astype(np.float32)
    return plugins.Payload({"state": state}, nbytes=4 * state.size)


class StateClient(plugins.Client):
    """Receives the global model, trains it locally, sends it back whole."""

    def receive(self, ctx, broadcast):
        plugins.load_flat_state(ctx.model, broadcast.arrays["state"])

    def fit(self, ctx, broadcast):
        loss, seen = plugins.local_sgd(ctx)
        return plugins.ClientResult(ctx.client_id, ctx.arch, state_of(ctx.model), len(ctx.train_y),
                                    ctx.flops_per_sample * seen, metrics={"train_loss": loss})


class ServerMomentum(plugins.Server):
    """FedAvgM: the server takes a momentum step on the average of the clients' models."""

    checkpoint_fields = ("velocity",)

    def __init__(self, params, models, seed, context=None):
        super().__init__(params, models, seed, context)
        self.velocity = {}

    def broadcast(self, round):
        return {arch: state_of(m) for arch, m in self.models.items()}

    def aggregate(self, round, results):
        for arch, model in self.models.items():
            mine = [r for r in results if r.arch == arch]
            if mine:
                avg = np.average([r.upload.arrays["state"] for r in mine], axis=0,
                                 weights=[r.num_samples for r in mine])
                now = plugins.flat_state(model).double().numpy()
                self.velocity[arch] = self.params.beta * self.velocity.get(arch, 0.0) + (now - avg)
                plugins.load_flat_state(model, now - self.params.server_lr * self.velocity[arch])
        return {}


METHOD = plugins.AlgorithmSpec("server_momentum", ServerMomentumParams, StateClient, ServerMomentum,
                               "FedAvg with server momentum")
SETTINGS = {"dataset.name": "digits", "clients.num_clients": 6, "rounds": 3, "clients.profiles": {},
            "algorithm.beta": 0.5}


def main(out: str = "runs", ray: bool = False):
    here = engine.simulate(None, SETTINGS, algorithm=METHOD, model=TinyNet, metrics=["macro_f1"],
                           run_dir=f"{out}/notebook-inprocess")
    print(here.rounds[["round", "global_acc", "global_macro_f1"]].to_string(index=False))
    if ray:
        there = engine.simulate(None, {**SETTINGS, "executor.kind": "ray", "executor.num_actors": 1},
                                algorithm=METHOD, model=TinyNet, metrics=["macro_f1"], run_dir=f"{out}/notebook-ray")
        same = [c for c in here.rounds.columns if not c.startswith("wall")]
        assert here.rounds[same].equals(there.rounds[same]), "in-process and Ray tables differ"
        print("Ray: the same tables")


if __name__ == "__main__":
    main(out=next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--out=")), "runs"), ray="--ray" in sys.argv)
