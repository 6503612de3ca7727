"""FedCSPACK reproduction study: FedCSPACK vs FedAvg vs FedProx, the cs/kd/cskd ablation and a
pack-size sweep, in the reference setting of the paper's code.

    .venv/bin/python studies/fedcspack_study.py --quick            # mnist5k, minutes on 2 cores
    .venv/bin/python studies/fedcspack_study.py --dataset fashion_mnist --rounds 50

Setting (specs/fedcspack.md): Dirichlet(0.3), 20 clients, participation 0.3, 3 local epochs,
batch 16, lr 0.05, pack size 1024, reference CNN. Personalized accuracy is each selected
client's model (after its personalization rule) on its own test split, as in the paper; the
global accuracy is the global model on the held-out test set. Accuracies are averaged over the
last `--last` evaluated rounds to smooth round-to-round noise.
Writes <out>/summary.parquet and <out>/summary.md, and one run folder per configuration.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from engine.config import load_config
from engine.results import load_run
from engine.run import run_experiment

REFERENCE = [
    "partition.scheme=dirichlet",
    "partition.alpha=0.3",
    "clients.num_clients=20",
    "clients.participation=0.3",
    "clients.profiles={devices: {phone_mid: 0.5, laptop_cpu: 0.5}, network: {5mbps: 0.5, 50mbps: 0.5}, availability: 1.0, dropout: 0.0}",
    "train.local_epochs=3",
    "train.batch_size=16",
    "train.lr=0.05",
    "model.name=cnn",
]

METHODS = {
    "fedavg": ["algorithm.name=fedavg"],
    "fedprox": ["algorithm.name=fedprox", "algorithm.mu=0.01"],
    "fedcspack": ["algorithm.name=fedcspack", "algorithm.pack_size=1024", "algorithm.weighting=cskd"],
}
ABLATION = {w: ["algorithm.name=fedcspack", "algorithm.pack_size=1024", f"algorithm.weighting={w}"]
            for w in ("cs", "kd", "cskd")}
PACK_SIZES = (256, 512, 1024, 2048, 4096)


def summarise(name: str, group: str, path: Path, last: int) -> dict:
    run = load_run(path)
    r = run.rounds.dropna(subset=["global_acc"])
    tail = r.tail(last)
    return {
        "group": group,
        "config": name,
        "pers_acc": tail["pers_acc"].mean(),
        "pers_acc_weighted": tail["pers_acc_weighted"].mean(),
        "pers_acc_worst": tail["pers_acc_worst"].mean(),
        "global_acc": tail["global_acc"].mean(),
        "upload_MB": run.rounds["bytes_up"].sum() / 1e6,
        "download_MB": run.rounds["bytes_down"].sum() / 1e6,
        "sim_s_per_round": run.rounds["sim_round_s"].mean(),
        "wall_s": run.manifest.get("wall_s"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="mnist5k, 20 rounds (built-in, offline)")
    p.add_argument("--dataset", default="fashion_mnist")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--last", type=int, default=5, help="average accuracies over the last N rounds")
    p.add_argument("--parts", default="main,ablation,packsize")
    p.add_argument("--out", default="runs/fedcspack_study")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args()
    if args.quick:
        args.dataset, args.rounds = "mnist5k", min(args.rounds, 20)
    out = Path(args.out)
    base = [*REFERENCE, f"dataset.name={args.dataset}", f"rounds={args.rounds}", f"seed={args.seed}",
            "output.overwrite=true"]
    plan: list[tuple[str, str, list[str]]] = []
    parts = args.parts.split(",")
    if "main" in parts:
        plan += [("main", name, extra) for name, extra in METHODS.items()]
    if "ablation" in parts:
        plan += [("ablation", name, extra) for name, extra in ABLATION.items() if name != "cskd"
                 or "main" not in parts]
    if "packsize" in parts:
        plan += [("pack_size", f"P={ps}", ["algorithm.name=fedcspack", f"algorithm.pack_size={ps}"])
                 for ps in PACK_SIZES if ps != 1024 or "main" not in parts]
    rows = []
    for group, name, extra in plan:
        t0 = time.perf_counter()
        cfg = load_config(None, [*base, *extra, *args.overrides])
        path = run_experiment(cfg, out / f"{group}-{name}")
        rows.append(summarise(name, group, path, args.last))
        print(f"{group:>9} {name:<10} pers {rows[-1]['pers_acc']:.4f} global {rows[-1]['global_acc']:.4f} "
              f"up {rows[-1]['upload_MB']:.1f} MB  ({time.perf_counter() - t0:.0f} s)", flush=True)
    # the reference configuration (cskd, P=1024) belongs to all three groups
    table = pd.DataFrame(rows)
    ref = table[(table["group"] == "main") & (table["config"] == "fedcspack")]
    if len(ref):
        extra_rows = []
        if "ablation" in parts:
            extra_rows.append(ref.assign(group="ablation", config="cskd"))
        if "packsize" in parts:
            extra_rows.append(ref.assign(group="pack_size", config="P=1024"))
        table = pd.concat([table, *extra_rows], ignore_index=True)
    fedavg = table[(table["group"] == "main") & (table["config"] == "fedavg")]
    if len(fedavg):
        table["upload_vs_fedavg"] = 1 - table["upload_MB"] / fedavg["upload_MB"].iloc[0]
    out.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out / "summary.parquet", index=False)
    md = table.to_markdown(index=False, floatfmt=".4f") if _has_tabulate() else table.to_string(index=False)
    (out / "summary.md").write_text(md + "\n")
    print(md)


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    main()
