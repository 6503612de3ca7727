"""Write a federated Parquet table of 1,000,000 clients (the on-disk case of bench_scale.py).

    .venv/bin/python bench/make_million_table.py /tmp/hetsim-million/table [--clients N]

One file per 100,000 clients in ``OUT`` (plus ``_done`` when complete), rows grouped by client:
``client`` (int64), ``label`` (int64, 10 classes) and ``features`` (a fixed-size list of 20
float32). Each client has Synthetic(1, 1)-style data (its own input mean and linear labelling,
as in :class:`engine.data.ondemand.SyntheticSource`) and 10 + floor(lognormal(2.5, 1)) rows,
at most 200 (mean ~29, so ~29M rows, ~2.5 GB). Generated in blocks of 10,000 clients with
vectorised numpy, seeded: the same table every time (~1-2 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

CLIENTS = 1_000_000
FEATURES, CLASSES = 20, 10
_BLOCK, _FILE = 10_000, 100_000


def _block(rng: np.random.Generator, first: int, count: int):
    sizes = np.minimum(10 + np.floor(rng.lognormal(2.5, 1.0, count)), 200).astype(np.int64)
    owner = np.repeat(np.arange(count), sizes)
    u = rng.normal(0.0, 1.0, count).astype(np.float32)
    w = rng.standard_normal((count, FEATURES, CLASSES), dtype=np.float32) + u[:, None, None]
    v = rng.standard_normal((count, FEATURES), dtype=np.float32) + rng.normal(0.0, 1.0, count)[:, None].astype(
        np.float32)
    sd = (np.arange(1, FEATURES + 1, dtype=np.float32) ** -1.2) ** 0.5
    x = rng.standard_normal((len(owner), FEATURES), dtype=np.float32) * sd + v[owner]
    y = np.argmax(np.einsum("nf,nfc->nc", x, w[owner]), axis=1)
    return first + owner, y, x


def write_table(out: str, clients: int = CLIENTS, seed: int = 0) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    writer, rows = None, 0
    for first in range(0, clients, _BLOCK):
        if first % _FILE == 0:
            if writer is not None:
                writer.close()
            writer = pq.ParquetWriter(os.path.join(out, f"part-{first // _FILE:03d}.parquet"), pa.schema([
                ("client", pa.int64()), ("label", pa.int64()), ("features", pa.list_(pa.float32(), FEATURES))]))
        owner, y, x = _block(rng, first, min(_BLOCK, clients - first))
        writer.write_table(pa.table({
            "client": pa.array(owner), "label": pa.array(y),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES)}))
        rows += len(y)
    writer.close()
    with open(os.path.join(out, "_done"), "w") as f:
        f.write(f"{clients} clients, {rows} rows\n")
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--clients", type=int, default=CLIENTS)
    a = p.parse_args()
    print(open(os.path.join(write_table(a.out, a.clients), "_done")).read().strip())
