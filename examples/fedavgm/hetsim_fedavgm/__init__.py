"""FedAvgM (Hsu, Qi and Brown, 2019, "Measuring the effects of non-identical data distribution for
federated visual classification"): FedAvg whose server takes a momentum step.

Each round the server averages the clients' models (weighted by their sample counts), takes the
pseudo-gradient ``g = w - avg`` and steps with momentum: ``v <- beta v + g``, ``w <- w - eta v``.
With ``beta = 0`` and ``eta = 1`` it is FedAvg. Clients train and upload their whole model, as in
FedAvg. The velocity is server state: it is saved in checkpoints (``checkpoint_fields``).
"""
from typing import ClassVar

import numpy as np
from pydantic import Field

from engine import plugins


class FedAvgMParams(plugins.AlgorithmParams):
    server_lr: float = Field(1.0, gt=0, description="the server's learning rate eta")
    beta: float = Field(0.9, ge=0, lt=1, description="the server's momentum")
    uploads_whole_model: ClassVar[bool] = True


def model_payload(model) -> plugins.Payload:
    state = plugins.flat_state(model).numpy().astype(np.float32)
    return plugins.Payload({"state": state}, nbytes=plugins.FLOAT32_BYTES * state.size)


class FedAvgMClient(plugins.Client):
    def receive(self, ctx, broadcast):
        plugins.load_flat_state(ctx.model, broadcast.arrays["state"])

    def fit(self, ctx, broadcast):
        loss, seen = plugins.local_sgd(ctx, loss=self.loss_of(ctx))
        return plugins.ClientResult(ctx.client_id, ctx.arch, model_payload(ctx.model), len(ctx.train_y),
                                    ctx.flops_per_sample * seen, metrics={"train_loss": loss})


@plugins.register_method("fedavgm", params=FedAvgMParams, client=FedAvgMClient,
                         description="FedAvgM: FedAvg with server momentum (Hsu et al. 2019)")
class FedAvgMServer(plugins.Server):
    checkpoint_fields = ("velocity",)

    def __init__(self, params, models, seed, context=None):
        super().__init__(params, models, seed, context)
        self.velocity: dict[str, np.ndarray] = {}

    def broadcast(self, round):
        return {arch: model_payload(m) for arch, m in self.models.items()}

    def aggregate(self, round, results):
        norms = []
        for arch, model in self.models.items():
            mine = [r for r in results if r.arch == arch]
            if not mine:
                continue
            avg = np.average([r.upload.arrays["state"] for r in mine], axis=0,
                             weights=[r.num_samples for r in mine])
            w = plugins.flat_state(model).double().numpy()
            v = self.params.beta * self.velocity.get(arch, 0.0) + (w - avg)
            self.velocity[arch] = v
            plugins.load_flat_state(model, w - self.params.server_lr * v)
            norms.append(float(np.linalg.norm(v)))
        return {"velocity_norm": max(norms, default=0.0)}
