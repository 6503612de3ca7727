"""Benchmark: FedCSPACK pack selection, vectorised vs a per-pack Python loop.

Times ``pack_scores + select_packs`` (algorithms/fedcspack.py) on a ResNet-18-sized flat vector
(11,220,132 trainable parameters: ResNet-18 for CIFAR-100) against a loop written like the
reference code (NigeloYang/FedCSPACK, clientCSPack.get_pack_model): zero-pad, reshape to packs,
then per pack ``torch.cosine_similarity`` and ``F.kl_div(softmax(L).log(), softmax(G))``, and a
second Python loop applying the threshold and the cskd weight with ``.item()``.

Both sides do one client's whole selection: the per-pack scores against the global vector,
the threshold and the mask weights. The vectorised side's per-pack sums are one compiled,
SIMD-vectorised, single-threaded pass (algorithms/pack_kernel.py); ``--threads`` sets torch's
threads, which the loop and the vectorised side's few J-sized torch operations use. The first
call compiles the kernel (or loads it from numba's cache); it is not timed.

The loop can be slow for big models; ``--loop-packs M`` times it on the first M packs only and
extrapolates linearly to all J packs (the output says so).

    python bench/bench_pack_selection.py --threads 2     # defaults: n = 11,220,132, P = 1024
    python bench/bench_pack_selection.py --loop-packs 2000 --repeats 5
    python bench/bench_pack_selection.py --threads 1 --clock cpu   # on a machine loaded by others
"""
from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from algorithms.fedcspack import pack_scores, select_packs  # noqa: E402

RESNET18_CIFAR100_PARAMS = 11_220_132


def reference_loop(local: torch.Tensor, glob: torch.Tensor, pack_size: int, limit: int | None):
    """Per-pack selection written like the reference code; ``limit``: only the first packs."""
    n = local.numel()
    j = math.ceil(n / pack_size)
    pad = torch.zeros(j * pack_size - n)
    lm = torch.cat((local, pad)).reshape(j, pack_size)
    gm = torch.cat((glob, pad)).reshape(j, pack_size)
    theta_a = torch.cosine_similarity(local, glob, dim=0)
    cos, kl = [], []
    for i, (l_pack, g_pack) in enumerate(zip(lm, gm)):
        if limit is not None and i >= limit:
            break
        cos.append(torch.cosine_similarity(l_pack, g_pack, dim=0))
        kl.append(F.kl_div(l_pack.softmax(dim=-1).log(), g_pack.softmax(dim=-1), reduction="sum"))
    mask = [0.0] * len(cos)
    for i, c in enumerate(cos):
        if c.item() < theta_a.item():
            mask[i] = abs(kl[i].item() + c.item())
    return mask, theta_a.item(), [c.item() for c in cos]


def timed(fn, repeats: int, clock=time.perf_counter) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=RESNET18_CIFAR100_PARAMS, help="parameters")
    ap.add_argument("--pack-size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=15, help="timed runs of the vectorised path")
    ap.add_argument("--loop-repeats", type=int, default=5, help="timed runs of the loop")
    ap.add_argument("--loop-packs", type=int, default=0,
                    help="time the loop on the first M packs and extrapolate (0: all packs)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall: elapsed time; cpu: this process's CPU time (all its threads), which "
                    "other load on the machine hardly changes - use it with --threads 1, since idle "
                    "spinning torch worker threads would count too")
    args = ap.parse_args(argv)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(args.seed)
    n, p = args.n, args.pack_size
    j = math.ceil(n / p)
    glob = torch.randn(n, generator=gen) * 0.05  # a "global model"
    # after local training: a drift whose size varies from pack to pack (log-normal), so the
    # pack cosines spread out around the whole-model cosine as they do for a trained network
    drift = (0.01 * torch.exp(0.5 * torch.randn(j, generator=gen))).repeat_interleave(p)[:n]
    local = glob + torch.randn(n, generator=gen) * drift

    def vectorised():
        theta_a, theta, beta = pack_scores(local, glob, p)
        return select_packs(theta, theta_a, beta, "all", "cskd")

    t0 = time.perf_counter()
    idx, w = vectorised()  # compiles the kernel, or loads it from numba's cache
    first_call = time.perf_counter() - t0
    vec = timed(vectorised, args.repeats, clock)

    limit = args.loop_packs if 0 < args.loop_packs < j else None
    packs_timed = limit or j
    mask, loop_theta_a, loop_cos = reference_loop(local, glob, p, limit)  # warm-up + check
    loop = [t * j / packs_timed for t in timed(lambda: reference_loop(local, glob, p, limit),
                                                args.loop_repeats, clock)]

    # agreement on the packs the loop covered. The loop's whole-vector cosine is a float32
    # reduction over all n values and can be off in the 4th digit, which flips the packs near
    # the threshold; so also compare with the loop's pack cosines against the float64 theta_a.
    l64, g64 = local.double(), glob.double()
    theta_a64 = float(l64 @ g64 / (l64.norm() * g64.norm()))
    theta_a = pack_scores(local, glob, p)[0]
    ref_sel = {i for i, m in enumerate(mask) if m > 0}
    ref_sel_exact = {i for i, c in enumerate(loop_cos) if c < theta_a64}
    vec_sel = {i for i in idx.tolist() if i < packs_timed}
    wmap = dict(zip(idx.tolist(), w.tolist()))
    max_w_err = max((abs(wmap[i] - mask[i]) for i in ref_sel & vec_sel), default=0.0)

    # the mask weights against an independent float64 computation (log_softmax form)
    lp = torch.nn.functional.pad(l64, (0, j * p - n)).view(j, p)
    gp = torch.nn.functional.pad(g64, (0, j * p - n)).view(j, p)
    lg, ll = torch.log_softmax(gp, 1), torch.log_softmax(lp, 1)
    beta64 = (lg.exp() * (lg - ll)).sum(1)
    theta64 = (lp * gp).sum(1) / (lp.norm(dim=1) * gp.norm(dim=1))
    _, theta, beta = pack_scores(local, glob, p)
    rel_kd = float(((beta - beta64).abs() / beta64.abs()).max())
    rel_cskd = float((((theta + beta) - (theta64 + beta64)).abs() / (theta64 + beta64).abs()).max())
    del lp, gp, lg, ll

    print(f"command: {shlex.join([sys.executable] + sys.argv)}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.repeats} (vectorised) / {args.loop_repeats} (loop) timed runs after a warm-up; "
          f"min = least disturbed by other load on the machine")
    if limit:
        print(f"loop timed on the first {limit} of {j} packs and extrapolated x{j / limit:.2f}")
    print()
    print(f"n = {n:,}, P = {p}, J = {j}; all times ({args.clock} clock) in ms for one client's pack selection")
    print(f"{'stat':>6} {'loop':>9} {'vectorised':>11} {'speed-up':>9}")
    for name, stat in (("median", statistics.median), ("min", min)):
        loop_ms, v = stat(loop) * 1e3, stat(vec) * 1e3
        print(f"{name:>6} {loop_ms:>9.1f} {v:>11.2f} {loop_ms / v:>8.1f}x")
    print(f"first vectorised call (kernel compile or cache load, untimed above): "
          f"{first_call:.2f} s")
    print(f"packs shared: {len(idx)} of {j}")
    print(f"theta_a: vectorised {theta_a:.9f}, loop (float32) {loop_theta_a:.9f}, "
          f"float64 {theta_a64:.9f}")
    print(f"selection differs from the loop on {len(ref_sel ^ vec_sel)} of {packs_timed} packs "
          f"with the loop's own theta_a, on {len(ref_sel_exact ^ vec_sel)} with the float64 "
          f"theta_a; max |weight difference| on common packs {max_w_err:.2e}")
    print(f"against float64 (all {j} packs): kd weights |beta| from {float(beta64.min()):.1e} to "
          f"{float(beta64.max()):.1e}, max relative error {rel_kd:.1e}; cskd weights {rel_cskd:.1e}")


if __name__ == "__main__":
    main()
