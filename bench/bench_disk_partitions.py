"""On-disk Parquet tables split iid / dirichlet / shards: set-up and a round's reads.

    .venv/bin/python bench/bench_disk_partitions.py                   # 1M rows x 16 features, 1,000 clients
    .venv/bin/python bench/bench_disk_partitions.py --rows 200000 --clients 100 --selected 10

Writes a table of ``--rows`` rows (``--features`` float32 features in one list column, 10 labels,
no client column) to a temporary folder, then per scheme: ``build_data`` (the first also builds
the row cache; each builds and saves the split's row index), and one round's read, ``gather`` of
``--selected`` clients' training and test rows, with its ``pread`` calls counted. Last, the same
table loaded in memory and split ``iid``, for comparison. Wall times of one run each (no
repetitions): read them as orders of magnitude.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--selected", type=int, default=10)
    args = ap.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engine.config.schema import load_config
    from engine.data import disk_table
    from engine.data.build import build_data

    tmp = Path(tempfile.mkdtemp(prefix="hetsim-bench-"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows, args.features)).astype(np.float32)
    table = pa.table({"label": rng.integers(0, 10, args.rows),
                      "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), args.features)})
    pq.write_table(table, tmp / "t.parquet", row_group_size=65536)
    del x, table
    calls = [0]
    real = disk_table._read

    def counting(*a):
        calls[0] += 1
        return real(*a)

    disk_table._read = counting  # counts the pread calls of a round

    def cfg(scheme: str, on_disk: bool):
        params = f"{{path: {tmp / 't.parquet'}, on_disk: {on_disk}, cache_dir: {tmp / 'cache'}}}"
        return load_config(None, ["dataset.name=parquet", f"dataset.params={params}", f"partition.scheme={scheme}",
                                  f"clients.num_clients={args.clients}", "model.name=mlp"])

    print(f"{args.rows:,} rows x {args.features} features, {args.clients:,} clients, {args.selected} selected")
    for scheme in ("iid", "dirichlet", "shards"):
        t = time.perf_counter()
        data = build_data(cfg(scheme, True))
        built = time.perf_counter() - t
        selected = np.random.default_rng(1).choice(args.clients, args.selected, replace=False)
        calls[0] = 0
        t = time.perf_counter()
        _, y, _ = data.gather(selected, with_test=True)
        read = time.perf_counter() - t
        print(f"{scheme:>9}: build_data {built:6.2f} s; a round's read: {len(y):,} rows in {calls[0]} preads, "
              f"{read * 1e3:.1f} ms")
    t = time.perf_counter()
    build_data(cfg("iid", False))
    print(f"in memory (iid): build_data {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main()
