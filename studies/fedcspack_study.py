"""FedCSPACK reproduction study: FedCSPACK vs FedAvg vs FedProx, the cs/kd/cskd ablation and a
pack-size sweep, in the reference setting of the paper's code.

    .venv/bin/python studies/fedcspack_study.py --quick            # mnist5k, minutes on 2 cores
    .venv/bin/python studies/fedcspack_study.py --dataset fashion_mnist --rounds 50
    .venv/bin/python studies/fedcspack_study.py --quick --parts main --seeds 0,1,2
    .venv/bin/python studies/fedcspack_study.py --dataset fashion_mnist --parts main,cap --seeds 0,1,2
    .venv/bin/python studies/fedcspack_study.py --smoke            # seconds: the pipeline only

Setting (the paper's; docs/fedcspack.md): Dirichlet(0.3), 20 clients, participation 0.3, 3 local epochs,
batch 16, lr 0.05, pack size 1024, ``cnn`` (the reference's MNIST CNN; on Fashion-MNIST the
reference trains a larger one: docs/fedcspack.md). Personalized accuracy is each selected
client's model (after its personalization rule) on its own test split, as in the paper; the
global accuracy is the global model on the held-out test set. Accuracies are averaged over the
last `--last` evaluated rounds to smooth round-to-round noise.

FedCSPACK's outcome is sensitive to rounding (docs/fedcspack.md), so compare over several
`--seeds`: each seed changes the partition, the profiles, the initial model and the client draws.
Runs go through the sweep engine (``--runner sweep``, the default): every (seed, configuration) is
a case of one sweep (:func:`sweeps.cases.run_cases`), with ``--jobs`` runs at a time in warm trial
processes, folders under <out>/sweeps/<n>/runs/; a later call runs only what no call finished.
``--runner loop`` runs them one by one in this process into <out>/seed<S>/<group>-<config>.
Writes <out>/summary.parquet (one row per seed and configuration, with each seed's differences to
FedAvg of the same seed) and <out>/summary.md (with several seeds, first the mean over seeds with
the min and max of the personalized accuracy).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from engine.config.schema import load_config
from engine.results.tables import load_run
from engine.run.api import run_experiment

REFERENCE = [
    "partition.scheme=dirichlet",
    "partition.alpha=0.3",
    "clients.num_clients=20",
    "clients.participation=0.3",
    "clients.profiles={devices: {phone_mid: 0.5, laptop_cpu: 0.5}, network: {5mbps: 0.5, 50mbps: 0.5}, "
    "availability: 1.0, dropout: 0.0}",
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
# --smoke: mnist5k, the main part, 2 rounds of 4 clients (2 a round, one epoch), seed 0, in this process
SMOKE = ["clients.num_clients=4", "clients.participation=0.5", "train.local_epochs=1"]
# the paper's Top-K cap (the reference code shares every candidate): 5% of the packs
CAP = {"k=0.05": ["algorithm.name=fedcspack", "algorithm.pack_size=1024", "algorithm.k=0.05"]}


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
        "wall_s_per_round": run.rounds["wall_s"].median(),  # median: the first round also warms up
        "wall_s": run.manifest.get("wall_s"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="mnist5k, 20 rounds (built-in, offline)")
    p.add_argument("--dataset", default="fashion_mnist")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--last", type=int, default=5, help="average accuracies over the last N rounds")
    p.add_argument("--parts", default="main,ablation,packsize", help="any of main, ablation, packsize, cap")
    p.add_argument("--out", default="runs/fedcspack_study")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--rerun", action="store_true",
                   help="--runner loop: run configurations whose folder already has results")
    p.add_argument("--pack-sizes", default=",".join(map(str, PACK_SIZES)), help="pack sizes of the packsize part")
    p.add_argument("--skip", default="", help="comma-separated configurations to leave out, e.g. fedprox")
    p.add_argument("--runner", choices=["sweep", "loop"], default="sweep",
                   help="sweep: one hetsim sweep, warm trial processes (default); loop: one run after another here")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (--runner sweep)")
    p.add_argument("--smoke", action="store_true", help="2 rounds of 4 clients, main part, seed 0, --runner loop: "
                                                         "checks the pipeline in seconds")
    args = p.parse_args()
    if args.quick:
        args.dataset, args.rounds = "mnist5k", min(args.rounds, 20)
    if args.smoke:
        args.dataset, args.rounds, args.parts, args.seeds, args.runner = "mnist5k", 2, "main", "0", "loop"
        args.overrides = [*SMOKE, *args.overrides]
    out = Path(args.out)
    seeds = [int(v) for v in args.seeds.split(",")]
    base = [*REFERENCE, f"dataset.name={args.dataset}", f"rounds={args.rounds}",
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
                 for ps in map(int, args.pack_sizes.split(",")) if ps != 1024 or "main" not in parts]
    if "cap" in parts:
        plan += [("cap", name, extra) for name, extra in CAP.items()]
    plan = [entry for entry in plan if entry[1] not in args.skip.split(",")]
    rows = []
    if args.runner == "sweep":
        rows = run_plan_as_sweep(plan, seeds, base, args, out)
    for seed in seeds if args.runner == "loop" else []:
        for group, name, extra in plan:
            t0 = time.perf_counter()
            cfg = load_config(None, [*base, f"seed={seed}", *extra, *args.overrides])
            path = out / f"seed{seed}" / f"{group}-{name}"
            if args.rerun or not _finished(path):  # resumable: finished runs are kept
                path = run_experiment(cfg, path)
            rows.append({"seed": seed, **summarise(name, group, path, args.last)})
            r = rows[-1]
            print(f"seed {seed} {group:>9} {name:<10} pers {r['pers_acc']:.4f} "
                  f"global {r['global_acc']:.4f} up {r['upload_MB']:.1f} MB  "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    table = with_reference_rows(pd.DataFrame(rows), parts)
    out.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out / "summary.parquet", index=False)
    tables = [table] if len(seeds) == 1 else [mean_over_seeds(table), table]
    md = "\n\n".join(_format(t) for t in tables)
    (out / "summary.md").write_text(md + "\n")
    print(md)


def case_name(seed: int, group: str, name: str) -> str:
    return f"s{seed}.{group}.{name.replace('=', '-')}"  # a case name has no '='


def run_plan_as_sweep(plan, seeds: list[int], base: list[str], args, out: Path) -> list[dict]:
    """Every (seed, configuration) a case of one sweep; summary rows of those that finished."""
    from engine.config.schema import parse_override
    from sweeps.cases import run_cases

    cases = {case_name(seed, group, name): {".".join(k): v for k, v in map(parse_override, [f"seed={seed}", *extra])}
             for seed in seeds for group, name, extra in plan}
    shared = [o for o in base if not o.startswith("output.")] + list(args.overrides)  # the sweep places folders
    done = run_cases(cases, out, overrides=shared, name="fedcspack_study", jobs=args.jobs,
                     command=["studies/fedcspack_study.py"])
    rows = []
    for seed in seeds:
        for group, name, _ in plan:
            path = done.get(case_name(seed, group, name))
            if path is None:
                print(f"seed {seed} {group} {name}: did not finish; left out (run the study again)", flush=True)
                continue
            rows.append({"seed": seed, **summarise(name, group, path, args.last)})
    return rows


def _finished(path: Path) -> bool:
    try:
        return load_run(path).manifest.get("status") == "finished"
    except Exception:  # noqa: BLE001 - no run folder yet, or an unreadable one
        return False


def with_reference_rows(table: pd.DataFrame, parts: list[str]) -> pd.DataFrame:
    """Add the reference configuration (cskd, P=1024) to the ablation and pack-size groups it
    belongs to, and each row's differences to FedAvg of the same seed."""
    ref = table[(table["group"] == "main") & (table["config"] == "fedcspack")]
    extra_rows = []
    if len(ref) and "ablation" in parts:
        extra_rows.append(ref.assign(group="ablation", config="cskd"))
    if len(ref) and "packsize" in parts:
        extra_rows.append(ref.assign(group="pack_size", config="P=1024"))
    table = pd.concat([table, *extra_rows], ignore_index=True)
    fedavg = table[(table["group"] == "main") & (table["config"] == "fedavg")]
    if len(fedavg):
        fa = fedavg.set_index("seed")
        table["upload_vs_fedavg"] = 1 - table["upload_MB"] / table["seed"].map(fa["upload_MB"])
        table["pers_acc_vs_fedavg"] = table["pers_acc"] - table["seed"].map(fa["pers_acc"])
    return table.sort_values("seed", kind="stable", ignore_index=True)


def mean_over_seeds(table: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds per configuration, with the spread of the personalized accuracy."""
    keys = ["group", "config"]
    numeric = [c for c in table.columns if c not in (*keys, "seed")]
    grouped = table.groupby(keys, sort=False)
    mean = grouped[numeric].mean()
    mean.insert(1, "pers_acc_min", grouped["pers_acc"].min())
    mean.insert(2, "pers_acc_max", grouped["pers_acc"].max())
    mean.insert(0, "seeds", grouped["seed"].count())
    return mean.reset_index()


def _format(table: pd.DataFrame) -> str:
    if _has_tabulate():
        return table.to_markdown(index=False, floatfmt=".4f")
    return table.to_string(index=False)


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    main()
