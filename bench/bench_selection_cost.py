"""Calibrate the selection-cost constants of a device tier (ASCEND, selection cost v3).

Measures, on the machine it runs on, with ONE torch thread (an FL client trains and compresses
on one core of a small device; use ``--threads`` to change), the median over repeats of:

* Top-K (``torch.topk(|a|, K, sorted=False)``, as ``algorithms/compressors.py``; K = ``--ratio``
  of d) in ns per element of d, at an in-cache size (4·d bytes = ``--in-cache-frac`` of the
  cache) and an out-of-cache size (4·d = ``--out-of-cache-mult`` × the cache);
* Random-K (K indices drawn from a seeded generator + gather) in ns per kept element;
* Periodic-K (one contiguous slice copied) in ns per kept element;
* 8-bit stochastic quantisation (this repository's ``qsgd8``) in ns per element of d;

and prints a catalog snippet (``catalog.yaml`` schema, ``devices:`` section) with the command
as its source. ``cache_bytes`` is the last-level cache the OS reports (``/sys``; ``--cache-bytes``
to give it, e.g. the L2 of a core whose last level is shared with many others).

    python bench/bench_selection_cost.py                      # defaults; prints the snippet
    python bench/bench_selection_cost.py --tier rpi4 --repeats 9 --clock cpu   # on a loaded host
    python bench/bench_selection_cost.py --quick              # small sizes, a few seconds

On a real device (e.g. a Raspberry Pi with the repository and torch installed) run it there and
paste the snippet into a catalog file given as ``clients.profiles.catalog`` (docs/ascend.md).
"""
from __future__ import annotations

import argparse
import glob
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from algorithms.compressors import compress  # noqa: E402

DEFAULT_CACHE_BYTES = 2 * 1024 * 1024  # if the OS reports none


def last_level_cache_bytes() -> int:
    """The largest data/unified cache of cpu0 reported in /sys (Linux), else the default."""
    sizes = []
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            kind = Path(d, "type").read_text().strip()
            text = Path(d, "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1], 1)
        sizes.append(int(text.rstrip("KMG")) * mult)
    return max(sizes) if sizes else DEFAULT_CACHE_BYTES


def timed(fn, repeats: int, clock) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls (one warm-up call first)."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return statistics.median(out)


def measure(d_in: int, d_out: int, ratio: float, repeats: int, clock) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    a_in, a_out = torch.randn(d_in, generator=g), torch.randn(d_out, generator=g)
    k_in, k_out = max(1, int(ratio * d_in)), max(1, int(ratio * d_out))
    topk_in = timed(lambda: torch.topk(a_in.abs(), k_in, sorted=False), repeats, clock)
    topk_out = timed(lambda: torch.topk(a_out.abs(), k_out, sorted=False), repeats, clock)
    rg = torch.Generator()

    def randomk():  # O(K): K draws + gather (no de-duplication: a device would use a hash set)
        rg.manual_seed(1)
        return a_out[torch.randint(d_out, (k_out,), generator=rg)]

    rand = timed(randomk, repeats, clock)
    off = d_out // 3
    per = timed(lambda: a_out[off : off + k_out].clone(), repeats, clock)
    quant = timed(lambda: compress("qsgd8", a_in, None, seed=3), repeats, clock)
    return {
        "topk_ns_in_cache": 1e9 * topk_in / d_in,
        "topk_ns_out_of_cache": 1e9 * topk_out / d_out,
        "randomk_ns_per_kept": 1e9 * rand / k_out,
        "periodick_ns_per_kept": 1e9 * per / k_out,
        "quant_ns_per_elem": 1e9 * quant / d_in,
    }


def snippet(tier: str, cache: int, ns: dict[str, float], command: str) -> str:
    lines = ["devices:", f"  {tier}:", f"    cache_bytes: {cache}"]
    lines += [f"    {k}: {v:.3g}" for k, v in ns.items()]
    lines.append(f'    select_source: "measured: {command} (torch {torch.__version__}, 1 thread, median)"')
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", default="my_device", help="tier name of the printed snippet")
    ap.add_argument("--cache-bytes", type=int, default=None, help="default: the last-level cache in /sys")
    ap.add_argument("--in-cache-frac", type=float, default=0.25, help="4·d of the in-cache size / cache")
    ap.add_argument("--out-of-cache-mult", type=float, default=8.0, help="4·d of the out-of-cache size / cache")
    ap.add_argument("--max-d", type=int, default=32_000_000, help="cap of the out-of-cache size (memory)")
    ap.add_argument("--ratio", type=float, default=0.01, help="K / d")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: process CPU time (a host loaded by other work)")
    ap.add_argument("--quick", action="store_true", help="small sizes (d <= 1e6), 3 repeats")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cache = args.cache_bytes or last_level_cache_bytes()
    d_in = max(1024, int(args.in_cache_frac * cache / 4))
    d_out = min(args.max_d, max(4 * d_in, int(args.out_of_cache_mult * cache / 4)))
    repeats = args.repeats
    if args.quick:
        d_in, d_out, repeats = min(d_in, 65_536), min(d_out, 1_000_000), 3
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    ns = measure(d_in, d_out, args.ratio, repeats, clock)
    print(f"# d in cache = {d_in:,} ({4 * d_in / 2**20:.2f} MiB), out of cache = {d_out:,} "
          f"({4 * d_out / 2**20:.1f} MiB), cache_bytes = {cache:,}, K/d = {args.ratio}, "
          f"threads = {args.threads}, {args.clock} clock")
    if 4 * d_out <= cache:
        print("# warning: the 'out-of-cache' size fits the cache (raise --max-d or give --cache-bytes)")
    command = "python bench/bench_selection_cost.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(snippet(args.tier, cache, ns, command.strip()))
    return ns


if __name__ == "__main__":
    main()
