"""How much two processes slow each other on this machine, with no engine at all.

    .venv/bin/python bench/bench_cores.py            # ~15 s

Runs the same work alone (a pool of 1 process) and twice at once (a pool of 2), three times
each: a pure-Python loop (the cores themselves) and 600 training steps of the reference job's
CNN (batch 16 of 1x28x28, one torch thread: caches and memory bandwidth too). Prints each
process's time and the speed-up two processes get, which bounds any engine's speed-up from two
actors (``bench_startup.py ray``).
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def python_loop(_: int) -> float:
    t0 = time.perf_counter()
    total = 0
    for i in range(15_000_000):
        total += i
    return time.perf_counter() - t0


def cnn_steps(_: int) -> float:
    sys.path.insert(0, str(REPO))
    import torch

    from engine.models.zoo import build_model

    torch.set_num_threads(1)
    model = build_model("cnn", (1, 28, 28), 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(20):  # warm-up
        step()
    t0 = time.perf_counter()
    for _ in range(600):
        step()
    return time.perf_counter() - t0


def main() -> None:
    ctx = mp.get_context("spawn")
    for name, work in (("pure-Python loop", python_loop), ("CNN training steps", cnn_steps)):
        for _ in range(3):
            with ctx.Pool(1) as pool:
                alone = pool.map(work, [0])[0]
            with ctx.Pool(2) as pool:
                both = pool.map(work, [0, 1])
            print(f"{name:20s} alone {alone:.3f} s, two at once {both[0]:.3f} / {both[1]:.3f} s: "
                  f"each {max(both) / alone - 1:+.1%}, two processes {2 * alone / max(both):.2f}x one")


if __name__ == "__main__":
    main()
