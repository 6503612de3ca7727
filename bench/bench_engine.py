"""Engine benchmarks: overhead, Ray speed-up, memory at scale.

    .venv/bin/python bench/bench_engine.py            # all three, printed side by side
    .venv/bin/python bench/bench_engine.py overhead   # or one of: overhead, speedup, memory

Compute-bound rounds: 20 clients, all selected, 2 local epochs of the CNN on mnist5k.
(a) overhead: wall time of the in-process engine ÷ a bare single-process PyTorch loop that
    trains the same clients on the same batches (goal ≤ 1.05).
(b) speedup: Ray executor (2 actors × 1 CPU) over the in-process executor for compute-bound
    rounds on 2 cores (goal ≥ 1.7×).
(c) memory: peak RSS with 1,000 and 10,000 registered clients, 100 per round (FedAvg, MLP on
    `synthetic`), each case in a fresh process.
Each case runs in its own subprocess so that peak memory and thread settings do not leak.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

COMPUTE_BOUND = [
    "dataset.name=mnist5k",
    "model.name=cnn",
    "clients.num_clients=20",
    "clients.participation=1.0",
    "clients.profiles={availability: 1.0, dropout: 0.0}",
    "partition.scheme=iid",
    "train.local_epochs=2",
    "train.batch_size=32",
    "evaluation.personalized=false",
    "evaluation.global_model=false",
]


def _cfg(extra):
    from engine.config.schema import load_config

    return load_config(None, [*COMPUTE_BOUND, *extra])


def case_engine(rounds: int) -> dict:
    """In-process engine, including Parquet writing, for `rounds` rounds (after 1 warm-up)."""
    import tempfile

    from engine.execution.inprocess import InProcessExecutor
    from engine.loop.simulation import Simulation
    from engine.results.tables import RunWriter

    cfg = _cfg([f"rounds={rounds + 1}"])
    writer = RunWriter(tempfile.mkdtemp())
    sim = Simulation(cfg, executor=InProcessExecutor(threads=1))

    def round_and_record(r: int) -> None:
        rec = sim.run_round(r)
        writer.append("rounds", [rec.row])
        writer.append("clients", rec.client_rows)

    sim.start()
    round_and_record(0)  # warm-up: first-touch allocations, thread pools
    t0 = time.perf_counter()
    for r in range(1, rounds + 1):
        round_and_record(r)
    return {"wall_s": time.perf_counter() - t0}


class BareLoop:
    """The engine's clients, batches and aggregation as plain PyTorch in one loop."""

    def __init__(self, cfg, data=None):
        import torch

        from engine.data.build import build_data
        from engine.models.arch import build_arch_model

        self.cfg = cfg
        self.data = data if data is not None else build_data(cfg)
        self.x, self.y = torch.from_numpy(self.data.x), torch.from_numpy(self.data.y)
        shape, classes = self.data.input_shape, self.data.num_classes
        global_model = build_arch_model(cfg, "", shape, classes)
        self.model = build_arch_model(cfg, "", shape, classes)
        self.g = torch.nn.utils.parameters_to_vector(global_model.parameters()).detach().clone()

    def round(self, r: int) -> None:
        from engine.loop.selection import select_clients

        selected, _ = select_clients(self.cfg, self.data.num_clients, r)
        states, weights = self.train_clients(r, selected.tolist())
        self.aggregate(states, weights)

    def train_clients(self, r: int, client_ids: list[int]) -> tuple[list, list[int]]:
        """Each client's trained parameter vector (from the global ``self.g``) and sample count."""
        import torch
        import torch.nn.functional as F

        from engine.clients.host import client_rng

        cfg, data, model = self.cfg, self.data, self.model
        bs, lr = cfg.train.batch_size, cfg.train.lr
        states, weights = [], []
        for cid in client_ids:
            torch.nn.utils.vector_to_parameters(self.g.clone(), model.parameters())
            idx = torch.from_numpy(data.train_indices(cid))
            cx, cy = self.x[idx], self.y[idx]
            rng = client_rng(cfg.seed, r, cid)
            rng.integers(2**62)  # the engine draws a torch seed first; keep batches identical
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            for _ in range(cfg.train.local_epochs):
                order = torch.from_numpy(rng.permutation(len(cy)))
                for s in range(0, len(cy), bs):
                    b = order[s : s + bs]
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(cx[b]), cy[b]).backward()
                    opt.step()
            states.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
            weights.append(len(cy))
        return states, weights

    def aggregate(self, states: list, weights: list[int]) -> None:
        import torch

        w = torch.tensor(weights, dtype=torch.float32)
        self.g = (w / w.sum()) @ torch.stack(states)


def _pool_worker(conn, cfg_args: list[str]) -> None:
    """One process of :class:`BarePool`: trains the clients it is sent, from the global it is sent."""
    import torch

    from engine.config.schema import load_config

    torch.set_num_threads(1)
    loop = BareLoop(load_config(None, cfg_args))
    conn.send("ready")
    while (job := conn.recv()) is not None:
        r, loop.g, client_ids = job
        conn.send(loop.train_clients(r, client_ids))


class BarePool:
    """BareLoop's rounds on a pool of worker processes, as a hand-written multiprocessing
    simulation would run them: each worker builds the data once and owns the clients ``id %
    workers`` (as the Ray executor's actors do); per round the parent sends the global vector,
    gathers every client's trained vector and aggregates. The same work as the Ray executor's
    rounds, without Ray: on a machine of ``workers`` cores, its speed-up over :class:`BareLoop`
    is what any 2-process engine can hope for."""

    def __init__(self, cfg_args: list[str], workers: int = 2):
        import multiprocessing as mp

        from engine.config.schema import load_config

        self.loop = BareLoop(load_config(None, cfg_args))  # the parent's data: client selection
        ctx = mp.get_context("spawn")  # a fresh interpreter per worker, as a Ray actor
        self.conns, self.procs = [], []
        for _ in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_pool_worker, args=(child, cfg_args), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            assert conn.recv() == "ready"

    def round(self, r: int) -> None:
        from engine.loop.selection import select_clients

        selected, _ = select_clients(self.loop.cfg, self.loop.data.num_clients, r)
        ids = selected.tolist()
        n = len(self.conns)
        for w, conn in enumerate(self.conns):
            conn.send((r, self.loop.g, [c for c in ids if c % n == w]))
        states, weights = [], []
        for conn in self.conns:
            s, w = conn.recv()
            states += s
            weights += w
        self.loop.aggregate(states, weights)

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            conn.send(None)
            proc.join(timeout=30)


def case_bare(rounds: int) -> dict:
    """The same clients, batches and aggregation as plain PyTorch in one loop."""
    import torch

    torch.set_num_threads(1)  # as the in-process engine (and each Ray actor) by default
    loop = BareLoop(_cfg([f"rounds={rounds + 1}"]))
    loop.round(0)
    t0 = time.perf_counter()
    for r in range(1, rounds + 1):
        loop.round(r)
    return {"wall_s": time.perf_counter() - t0}


def case_ray(rounds: int) -> dict:
    from engine.loop.simulation import Simulation
    from engine.ray.executor import RayExecutor

    cfg = _cfg([f"rounds={rounds + 1}", "executor.kind=ray", "ray.num_cpus=2"])
    ex = RayExecutor(cfg)
    sim = Simulation(cfg, executor=ex)
    sim.start()
    sim.run_round(0)
    t0 = time.perf_counter()
    for r in range(1, rounds + 1):
        sim.run_round(r)
    wall = time.perf_counter() - t0
    ex.close()
    return {"wall_s": wall, "actors": ex.num_actors}


def case_memory(num_clients: int, executor: str = "inprocess", rounds: int = 3) -> dict:
    from engine.config.schema import load_config
    from engine.loop.simulation import Simulation

    cfg = load_config(None, [
        "dataset.name=synthetic", "partition.scheme=natural", "model.name=mlp",
        "model.params={hidden: []}", f"clients.num_clients={num_clients}",
        f"clients.participation={100 / num_clients}", f"rounds={rounds}",
        "clients.profiles={bandwidth: {distribution: loguniform}}",
        "evaluation.global_model=true", f"executor.kind={executor}", "ray.num_cpus=2",
    ])
    from engine.run.body import make_executor

    t0 = time.perf_counter()
    sim = Simulation(cfg, executor=make_executor(cfg))
    sim.start()
    setup_s = time.perf_counter() - t0
    round_s = []
    for r in range(rounds):
        t = time.perf_counter()
        sim.run_round(r)
        round_s.append(time.perf_counter() - t)
    out = {
        "clients": num_clients,
        "per_round": 100,
        "setup_s": setup_s,
        "round_s": sum(round_s[1:]) / max(1, len(round_s) - 1),
        "dataset_mb": (sim.data.x.nbytes + sim.data.y.nbytes) / 1e6,
        "profiles_kb": sim.profiles.nbytes / 1e3,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
    }
    if executor == "ray":
        out["actors_rss_mb"] = sim.executor.rss_bytes() / 1e6
        sim.executor.close()
    return out


CASES = {"engine": case_engine, "bare": case_bare, "ray": case_ray, "memory": case_memory}


def run_case(name: str, *args) -> dict:
    """Run one case in a fresh interpreter and return its JSON result."""
    proc = subprocess.run(
        [sys.executable, __file__, "_case", name, *map(str, args)],
        capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"case {name}{args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_overhead(rounds: int) -> None:
    bare = min(run_case("bare", rounds)["wall_s"] for _ in range(2))
    engine = min(run_case("engine", rounds)["wall_s"] for _ in range(2))
    print(f"(a) overhead  {rounds} rounds x 20 clients x 2 epochs, CNN on mnist5k, in-process")
    print(f"    bare PyTorch loop {bare:7.2f} s | engine {engine:7.2f} s | ratio {engine / bare:.3f}  (goal <= 1.05)")


def bench_speedup(rounds: int) -> None:
    # best of two runs each, as for (a): the shared VM's noise is of the order of the effect
    local = min(run_case("engine", rounds)["wall_s"] for _ in range(2))
    ray = min((run_case("ray", rounds) for _ in range(2)), key=lambda r: r["wall_s"])
    print(f"(b) speed-up  {rounds} rounds x 20 clients x 2 epochs, CNN on mnist5k, 2 cores")
    print(f"    in-process {local:7.2f} s | Ray {ray['actors']} actors {ray['wall_s']:7.2f} s | "
          f"speed-up {local / ray['wall_s']:.2f}x  (goal >= 1.7x)")


def bench_memory() -> None:
    print("(c) memory    FedAvg, logistic regression on synthetic, 100 clients per round")
    print(f"    {'executor':<10} {'clients':>8} {'dataset MB':>10} {'profiles KB':>11} "
          f"{'peak RSS MB':>11} {'actors RSS MB':>13} {'s/round':>8}")
    for executor in ("inprocess", "ray"):
        for n in (1_000, 10_000):
            r = run_case("memory", n, executor)
            actors = f"{r['actors_rss_mb']:13.0f}" if "actors_rss_mb" in r else f"{'-':>13}"
            print(f"    {executor:<10} {n:>8} {r['dataset_mb']:>10.1f} {r['profiles_kb']:>11.0f} "
                  f"{r['peak_rss_mb']:>11.0f} {actors} {r['round_s']:>8.3f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_case":
        name, args = sys.argv[2], [int(a) if a.isdigit() else a for a in sys.argv[3:]]
        print(json.dumps(CASES[name](*args)))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", nargs="*", default=["overhead", "speedup", "memory"])
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    print(f"# {' '.join(sys.argv)}  (cpus: {os.cpu_count()})")
    for w in a.which:
        {"overhead": lambda: bench_overhead(a.rounds), "speedup": lambda: bench_speedup(a.rounds),
         "memory": bench_memory}[w]()


if __name__ == "__main__":
    main()
