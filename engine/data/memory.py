"""The memory an eager dataset will take, estimated before it is built.

An eager ``synthetic`` dataset generates every client's rows up front: a million clients hold
~63M rows and peak at ~32 GiB while they are generated and partitioned. Validation estimates that
peak from the dataset's params and ``clients.num_clients`` and refuses a run that would not fit
in the memory this machine has available, naming ``dataset.params.lazy: true`` (rows built per
client when it takes part, :mod:`engine.data.ondemand`), instead of letting it grow until the
kernel kills it. Refusing, not switching to ``lazy`` silently: the lazy rows are a different
version of the data (other values for the same seed), which a user must choose knowingly.

The estimate replays the eager generator's own size draw (:func:`engine.data.datasets.
load_synthetic`), so its row count is exact; the bytes per row and per client are the peak that
``tracemalloc`` measured while :func:`engine.data.build.build_data` ran (within 2 % at 1k-200k
clients, ``tests/engine/data/test_data_memory.py``).
"""
from __future__ import annotations

import inspect
import os

import numpy as np

from engine.config.schema import ExperimentConfig

# Refuse when the estimate exceeds this share of the memory available now (the rest: the
# interpreter, torch, the models, the run's tables).
MEMORY_SHARE = 0.75
# Python objects per client at the peak (per-client index arrays and lists), bytes: measured.
PER_CLIENT_BYTES = 640
# At most this many client sizes are drawn to estimate the rows (their mean scales to the fleet).
MAX_SIZE_DRAWS = 2_000_000
GiB = 2**30


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation now (Linux ``MemAvailable``), else the
    machine's physical memory, or None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def synthetic_rows(params: dict, seed: int) -> int:
    """The rows the eager ``synthetic`` generator draws for ``params`` (its defaults filled in)."""
    k = int(params["num_clients"])
    draws = min(k, MAX_SIZE_DRAWS)
    rng = np.random.default_rng(seed)  # the generator's first draw: the client sizes
    sizes = params["min_samples"] + np.floor(rng.lognormal(params["samples_mu"], params["samples_sigma"], draws))
    sizes = np.minimum(sizes, params["max_samples"])
    return int(sizes.sum()) if draws == k else int(round(float(sizes.mean()) * k))


def eager_synthetic_bytes(cfg: ExperimentConfig) -> tuple[int, int] | None:
    """(peak bytes, rows) of building ``cfg``'s eager ``synthetic`` data; None for another
    dataset, a lazy one, or params the dataset itself will refuse."""
    from engine.data.datasets import load_synthetic  # numpy only; here to keep this module's imports light

    ds = cfg.dataset
    if ds.name != "synthetic" or ds.params.get("lazy"):
        return None
    defaults = {k: v.default for k, v in inspect.signature(load_synthetic).parameters.items()
                if v.default is not inspect.Parameter.empty}
    p = {**defaults, "num_clients": cfg.clients.num_clients or defaults["num_clients"], **ds.params}
    try:
        k, f, c = int(p["num_clients"]), int(p["num_features"]), int(p["num_classes"])
        rows = synthetic_rows(p, cfg.seed)
    except (TypeError, ValueError):  # the dataset's own checks name the bad param
        return None
    per_client = f * 4 + (0 if p.get("iid") else f * c * 4) + PER_CLIENT_BYTES  # v_k, W_k, lists
    return 2 * rows * (f * 4 + 8) + k * per_client, rows  # x and labels, twice at the peak


def memory_problems(cfg: ExperimentConfig, available: int | None = None) -> list[str]:
    """One problem line when the eager data would not fit in ``available`` bytes (default: what
    :func:`available_memory` reads), else none."""
    estimate = eager_synthetic_bytes(cfg)
    available = available_memory() if available is None else available
    if estimate is None or available is None:
        return []
    need, rows = estimate
    if need <= MEMORY_SHARE * available:
        return []
    field = "dataset.params.num_clients" if "num_clients" in cfg.dataset.params else "clients.num_clients"
    k = cfg.dataset.params.get("num_clients") or cfg.clients.num_clients
    natural = "" if cfg.partition.scheme == "natural" else " with partition.scheme: natural"
    return [f"  {field} = {k} with dataset 'synthetic' (eager): generating its {rows:,} rows "
            f"needs about {need / GiB:.1f} GiB, more than {MEMORY_SHARE:.0%} of the {available / GiB:.1f} GiB "
            f"of memory available; set dataset.params.lazy: true{natural} to build each client's rows when "
            "it takes part (docs/datasets.md, 'A million clients'), or use fewer clients or features"]
