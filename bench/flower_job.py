"""bench_startup's reference job as a Flower simulation, for the side-by-side figure.

    FLOWER_PY bench/flower_job.py --out result.json

Run by the Python of a separate environment with ``flwr[simulation]`` (Flower pins its own Ray,
2.55.1 for flwr 1.42, beside ours 2.60), which also sees torch; see docs/studies/benchmarks.md. The same
work as ``hetsim run`` of the reference job: FedAvg with Flower's own strategy, the engine's
CNN (``engine.models.zoo.CNN``), the 5,000 ``mnist5k`` images, 20 IID clients of 150 training
samples, 1 local epoch of batch 16 with plain SGD (lr 0.05), all clients every round, 5 rounds,
no evaluation, 2 Ray actors of 1 CPU each and 1 torch thread per actor. Writes to ``--out`` the
seconds of all rounds (Flower's ``strategy.start``, which starts the actors) and of rounds 2 to
5; the caller times the whole process.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

CLIENTS, SAMPLES, BATCH, LR, ROUNDS = 20, 150, 16, 0.05, 5
_data: tuple[torch.Tensor, torch.Tensor] | None = None


def model() -> torch.nn.Module:
    from engine.models.zoo import CNN

    return CNN((1, 28, 28), 10)


def client_data(pid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``pid``'s 150 normalised images, loaded once per process (as the engine's hosts)."""
    global _data
    if _data is None:
        from engine.data.datasets import load_dataset

        ds = load_dataset("mnist5k")
        _data = torch.from_numpy(ds.x), torch.from_numpy(ds.y)
    order = np.random.default_rng(0).permutation(len(_data[1]))[: CLIENTS * SAMPLES]
    idx = torch.from_numpy(order[pid * SAMPLES:(pid + 1) * SAMPLES])
    return _data[0][idx], _data[1][idx]


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    net = model()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = client_data(int(context.node_config["partition-id"]))
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    order = torch.from_numpy(np.random.default_rng(int(context.node_config["partition-id"])).permutation(len(y)))
    net.train()
    for s in range(0, len(y), BATCH):
        b = order[s:s + BATCH]
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x[b]), y[b]).backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=content, reply_to=msg)


class TimedFedAvg(FedAvg):
    """Flower's FedAvg, noting when each round's training is configured (its first step)."""

    round_starts: list[float] = []

    def configure_train(self, *args, **kwargs):
        self.round_starts.append(time.perf_counter())
        return super().configure_train(*args, **kwargs)


server_app = ServerApp()
timings: dict[str, float] = {}


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    strategy = TimedFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=CLIENTS,
                           min_available_nodes=CLIENTS)
    t0 = time.perf_counter()
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model().state_dict()), num_rounds=ROUNDS)
    end = time.perf_counter()
    # Flower starts its actors (and they import torch) inside the first round: rounds 2.. are
    # what compares with the engine's rounds, whose actors are up before round 0
    timings.update(rounds_s=end - t0, later_rounds_s=end - strategy.round_starts[1])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
    with open(args.out, "w") as f:
        json.dump(timings, f)
