"""GPU benchmarks and checks, one short script for a GPU machine.

    python bench/bench_gpu.py                  # everything this machine can run (~3-5 min on a GPU)
    python bench/bench_gpu.py --json out.json  # also write every figure as JSON
    python bench/bench_gpu.py --quick          # 1 timed round, smaller checks (smoke test)

Data: CIFAR-10-shaped synthetic images (3x32x32, 10 classes; each class a fixed random pattern
plus noise, so a model can learn it), 20 clients, IID, ``--samples`` per client (75% local train).

(a) throughput: the small CNN (``cifar_cnn``, 0.59M parameters) and ResNet-18 (11.2M), all 20
    clients every round, 1 local epoch of batch 32, FedAvg, no evaluation; sequential clients vs
    ``executor.batch_clients`` (torch.func); rounds per second after one warm-up round and the
    peak GPU memory of the round loop. On the CPU only the small CNN (``--cpu-resnet`` adds
    ResNet-18, slow). Also the agreement of batched and sequential training: each client's
    first local training from one start, batched and sequential in float32 and sequential in
    float64 (the reference), as relative differences of the updates (median / max over clients);
    and batched in float64 against the reference (the algorithm itself: ~1e-15 when exact).
(b) CPU vs GPU: a short FedAvg run (small CNN, 10 of 20 clients per round, global evaluation every
    round) on the CPU and on the GPU: accuracy/loss per round and their largest difference;
    the GPU run repeated (deterministic algorithms on): bit-identical or not; the same run batched.
    FedCSPACK and Top-K compressed FedAvg for 3 rounds on both: the pack selection and Top-K
    paths on the GPU, the bytes each uploads (equal on both devices) and the metric difference.
(c) Ray: 4 client actors with ``gpus_per_actor: 0.25`` on one GPU; where they trained and the
    seconds per round (``--no-ray`` skips it).
Without CUDA it prints "no CUDA: skipping GPU cases" and runs the CPU variants of (a) and (b).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time

import numpy as np
import torch

MODELS = ("cifar_cnn", "resnet18")
NUM_CLASSES = 10


def synthetic_cifar(num_clients: int, samples: int, seed: int = 0, test: int = 1000):
    """FederatedData of CIFAR-10 shape: ``samples`` per client (IID) + a global test split."""
    from engine.data.datasets import ArrayDataset
    from engine.data.partition import build_federated_data

    rng = np.random.default_rng(seed)
    n = num_clients * samples + test
    templates = rng.normal(0, 1, (NUM_CLASSES, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, NUM_CLASSES, n).astype(np.int64)
    x = (templates[y] + rng.normal(0, 1, (n, 3, 32, 32)).astype(np.float32)).astype(np.float32)
    ds = ArrayDataset("synthetic_cifar10", x, y, NUM_CLASSES)
    return build_federated_data(ds, num_clients=num_clients, scheme="iid", seed=seed,
                                global_test_fraction=test / n, min_samples=1)


def config(model: str, device: str, batched: bool, rounds: int, clients: int, extra=()):
    from engine.config.schema import load_config

    return load_config(None, [
        "dataset.name=digits",  # unused: the data is passed in
        f"model.name={model}", f"clients.num_clients={clients}", "clients.participation=1.0",
        "clients.profiles={availability: 1.0, dropout: 0.0}", "train.batch_size=32",
        "train.local_epochs=1", "train.lr=0.05", f"rounds={rounds}",
        "evaluation.personalized=false", "evaluation.global_model=false",
        f"executor.device={device}", f"executor.batch_clients={batched}", *extra,
    ])


def simulation(cfg, data, executor=None):
    from engine.execution.inprocess import InProcessExecutor
    from engine.loop.simulation import Simulation

    return Simulation(cfg, executor or InProcessExecutor(threads=torch.get_num_threads()), data=data)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------- (a) throughput


def throughput(model: str, device: str, batched: bool, rounds: int, data) -> dict:
    cfg = config(model, device, batched, rounds + 1, data.num_clients)
    sim = simulation(cfg, data)
    sim.start()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sim.run_round(0)  # warm-up: allocations, cuDNN / oneDNN kernel choice
    sync(device)
    t0 = time.perf_counter()
    for r in range(1, rounds + 1):
        sim.run_round(r)
    sync(device)
    wall = time.perf_counter() - t0
    out = {"model": model, "device": device, "batched": batched, "rounds": rounds,
           "s_per_round": wall / rounds, "rounds_per_s": rounds / wall}
    if device == "cuda":
        out["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    sim.executor.close()
    return out


def agreement(model: str, device: str, data, lr: float = 0.05) -> dict:
    """Each client's first local training (1 epoch, batch 32) from the same start: sequential
    float32, batched float32 and sequential float64 (the reference). Relative differences of
    the updates: batched vs sequential, and each vs float64."""
    import copy

    from algorithms.base import ClientContext, TrainSettings
    from algorithms.batched_training import BatchJob, draw_batches, train_batched
    from algorithms.training import local_sgd
    from engine.models.zoo import build_model

    dev = torch.device(device)
    x, y = torch.from_numpy(data.x).to(dev), torch.from_numpy(data.y).to(dev)
    torch.manual_seed(0)
    start = build_model(model, data.input_shape, NUM_CLASSES).to(dev)
    settings = TrainSettings(batch_size=32, lr=lr)

    def flat(params) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).double() for p in params])

    seq, ref, jobs = [], [], []
    for c in range(data.num_clients):
        ids = torch.from_numpy(data.train_indices(c)).to(dev)
        for dtype, store in ((torch.float32, seq), (torch.float64, ref)):
            m = copy.deepcopy(start).to(dtype)
            ctx = ClientContext(client_id=c, round=0, arch="", model=m, state={}, train_x=x[ids].to(dtype),
                                train_y=y[ids], rng=np.random.default_rng(c), train=settings, flops_per_sample=1.0)
            local_sgd(ctx)
            store.append(flat(m.parameters()))
        jobs.append(BatchJob({n: p.detach().clone() for n, p in start.named_parameters()},
                             {n: b.detach().clone() for n, b in start.named_buffers()},
                             draw_batches(np.random.default_rng(c), ids, 32, 1)))
    updates = train_batched(copy.deepcopy(start), jobs, x, y, lr=lr)
    bat = [flat(u.params[n] for n, _ in start.named_parameters()) for u in updates]
    jobs64 = [BatchJob({n: p.double() for n, p in j.params.items()},
                       {n: b.double() if b.is_floating_point() else b for n, b in j.buffers.items()},
                       j.batches) for j in jobs]
    bat64 = [flat(u.params[n] for n, _ in start.named_parameters())
             for u in train_batched(copy.deepcopy(start).double(), jobs64, x.double(), y, lr=lr)]
    w0 = flat(start.parameters())
    out = {"model": model, "device": device}
    for name, a, b in (("batched_vs_sequential", bat, seq), ("sequential_vs_float64", seq, ref),
                       ("batched_vs_float64", bat, ref), ("batched_float64_vs_float64", bat64, ref)):
        rel = [float((u - v).norm() / (r - w0).norm()) for u, v, r in zip(a, b, ref)]
        out[name] = {"median": float(np.median(rel)), "max": float(np.max(rel))}
    return out


# ---------------------------------------------------------------- (b) CPU vs GPU


def run_rows(cfg, data) -> list[dict]:
    rows = []
    sim = simulation(cfg, data)
    sim.run([lambda rec: rows.append(rec.row)])
    return rows


def short_run(device: str, rounds: int, data, batched=False, algorithm="{name: fedavg}") -> list[dict]:
    cfg = config("cifar_cnn", device, batched, rounds, data.num_clients, extra=[
        "clients.participation=0.5", "evaluation.global_model=true", f"algorithm={algorithm}"])
    return run_rows(cfg, data)


def max_diff(a: list[dict], b: list[dict], col: str) -> float:
    return float(max(abs(x[col] - y[col]) for x, y in zip(a, b)))


def cpu_vs_gpu(rounds: int, data, has_cuda: bool) -> dict:
    out: dict = {"rounds": rounds}
    cpu = short_run("cpu", rounds, data)
    out["cpu_global_acc"] = [r["global_acc"] for r in cpu]
    if not has_cuda:
        cpu_b = short_run("cpu", rounds, data, batched=True)
        out["cpu_batched_vs_sequential_max_acc_diff"] = max_diff(cpu, cpu_b, "global_acc")
        return out
    gpu = short_run("cuda", rounds, data)
    gpu2 = short_run("cuda", rounds, data)
    gpu_b = short_run("cuda", rounds, data, batched=True)
    out.update(
        gpu_global_acc=[r["global_acc"] for r in gpu],
        max_acc_diff=max_diff(cpu, gpu, "global_acc"),
        max_loss_diff=max_diff(cpu, gpu, "global_loss"),
        max_train_loss_diff=max_diff(cpu, gpu, "train_loss"),
        gpu_repeat_bit_identical=all(
            x[c] == y[c] or (math.isnan(x[c]) and math.isnan(y[c]))
            for x, y in zip(gpu, gpu2) for c in ("global_acc", "global_loss", "train_loss")),
        gpu_batched_max_acc_diff=max_diff(gpu, gpu_b, "global_acc"),
        gpu_batched_max_loss_diff=max_diff(gpu, gpu_b, "global_loss"),
    )
    methods = {
        "fedcspack": "{name: fedcspack, pack_size: 1024, k: 0.1}",
        "topk": "{name: fedavg_compressed, compressor: topk, k: 0.01}",
    }
    for name, algorithm in methods.items():
        c = short_run("cpu", 3, data, algorithm=algorithm)
        g = short_run("cuda", 3, data, algorithm=algorithm)
        out[name] = {
            "bytes_up_cpu": [r["bytes_up"] for r in c], "bytes_up_gpu": [r["bytes_up"] for r in g],
            "max_acc_diff": max_diff(c, g, "global_acc"), "max_loss_diff": max_diff(c, g, "global_loss"),
        }
    return out


# ---------------------------------------------------------------- (c) Ray, fractional GPUs


def ray_fractional(rounds: int, data) -> dict:
    from engine.ray.cluster import init_ray
    from engine.ray.executor import RayExecutor

    ray = init_ray()
    try:
        cfg = config("cifar_cnn", "auto", False, rounds + 1, data.num_clients, extra=[
            "executor.kind=ray", "executor.num_actors=4", "executor.cpus_per_actor=1",
            "executor.gpus_per_actor=0.25"])
        ex = RayExecutor(cfg)
        sim = simulation(cfg, data, executor=ex)
        sim.start()
        sim.run_round(0)
        t0 = time.perf_counter()
        for r in range(1, rounds + 1):
            sim.run_round(r)
        wall = time.perf_counter() - t0
        info = ex.describe()
        ex.close()
        return {"executor": info, "s_per_round": wall / rounds}
    finally:
        ray.shutdown()


# ---------------------------------------------------------------- main


def environment(has_cuda: bool) -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
           "cpu_threads": torch.get_num_threads()}
    if has_cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   gpus=torch.cuda.device_count())
    return env


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per throughput case")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--samples", type=int, help="samples per client, 75%% train (default: 160 with a "
                   "GPU, 48 on a CPU-only machine)")
    p.add_argument("--quick", action="store_true", help="1 timed round, short runs")
    p.add_argument("--cpu-resnet", action="store_true", help="also time ResNet-18 on the CPU")
    p.add_argument("--no-ray", action="store_true", help="skip (c)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    has_cuda = torch.cuda.is_available()
    results: dict = {"environment": environment(has_cuda), "throughput": [], "agreement": []}
    print(json.dumps(results["environment"]))
    if not has_cuda:
        print("no CUDA: skipping GPU cases (running the CPU variants)")
    samples = args.samples or (160 if has_cuda else 48)
    data = synthetic_cifar(args.clients, samples)

    print(f"(a) throughput: {args.clients} clients x {int(samples * 0.75)} train samples, "
          f"1 epoch, batch 32, FedAvg, {rounds} timed round(s)")
    cases = [(m, "cuda") for m in MODELS] if has_cuda else []
    cases += [(m, "cpu") for m in MODELS if m == "cifar_cnn" or args.cpu_resnet]
    for model, device in cases:
        pair = [throughput(model, device, batched, rounds, data) for batched in (False, True)]
        results["throughput"] += pair
        seq, bat = pair
        mem = "".join(f" | peak GPU {x['peak_gpu_mib']:8.1f} MiB" for x in pair if "peak_gpu_mib" in x)
        print(f"    {model:9s} {device:4s} sequential {seq['rounds_per_s']:7.3f} rounds/s | batched "
              f"{bat['rounds_per_s']:7.3f} rounds/s | x{bat['rounds_per_s'] / seq['rounds_per_s']:.2f}{mem}")
        agree = agreement(model, device, data)
        results["agreement"].append(agree)
        print("              relative update difference (median / max over clients): " + ", ".join(
            f"{k.replace('_', ' ')} {v['median']:.1e} / {v['max']:.1e}"
            for k, v in agree.items() if isinstance(v, dict)))

    short = 2 if args.quick or not has_cuda else 5
    print(f"(b) CPU vs GPU: FedAvg, small CNN, {short} rounds, 10 of {args.clients} clients per round")
    b = results["cpu_vs_gpu"] = cpu_vs_gpu(short, data, has_cuda)
    print(f"    cpu accuracy per round {np.round(b['cpu_global_acc'], 4).tolist()}")
    if has_cuda:
        print(f"    gpu accuracy per round {np.round(b['gpu_global_acc'], 4).tolist()}")
        print(f"    max |acc cpu - gpu| {b['max_acc_diff']:.2e}, max |loss cpu - gpu| {b['max_loss_diff']:.2e}, "
              f"max |train loss| {b['max_train_loss_diff']:.2e}")
        print(f"    gpu run repeated, deterministic algorithms: bit-identical = {b['gpu_repeat_bit_identical']}")
        print(f"    gpu batched vs sequential: max |acc| {b['gpu_batched_max_acc_diff']:.2e}, "
              f"max |loss| {b['gpu_batched_max_loss_diff']:.2e}")
        for name in ("fedcspack", "topk"):
            m = b[name]
            print(f"    {name}: bytes up cpu {m['bytes_up_cpu']} gpu {m['bytes_up_gpu']}; "
                  f"max |acc| {m['max_acc_diff']:.2e}, max |loss| {m['max_loss_diff']:.2e}")
    else:
        print(f"    cpu batched vs sequential: max |acc| {b['cpu_batched_vs_sequential_max_acc_diff']:.2e}")

    if has_cuda and not args.no_ray:
        c = results["ray"] = ray_fractional(rounds, data)
        print(f"(c) Ray, 4 actors x 0.25 GPU: {c['executor']}, {c['s_per_round']:.2f} s/round")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return results


if __name__ == "__main__":
    main()
