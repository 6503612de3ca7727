"""FedCSPACK against the paper's own comparisons, under PFLlib's data protocol, through the sweep engine.

    .venv/bin/python studies/fedcspack_table1.py --seeds 0,1,2,3,4                 # the full study
    .venv/bin/python studies/fedcspack_table1.py --parts table1 --methods fedavg,fedprox,moon,fedntd,fedspu,fedcspack
    .venv/bin/python studies/fedcspack_table1.py --seeds 0,1 --rounds 3 --parts table1,ablation   # a smoke run
    .venv/bin/python studies/fedcspack_table1.py --smoke          # seconds: mnist5k, every part, in this process

Base: ``configs/fedcspack_paper.yaml`` (Fashion-MNIST Dir(0.3) under PFLlib's protocol, the split
of FedCSPACK's reference; 20 clients, participation 0.3, 3 local epochs, batch 16, lr 0.05, P = 1024,
cskd, ``own_mask``). Fashion-MNIST comes from Debian's ``dataset-fashion-mnist`` package
(``apt-get install dataset-fashion-mnist``: the four idx files in /usr/share/datasets/fashion-mnist).
The model is the config's (``fmnist_cnn``, the reference's 100,816-parameter Fashion-MNIST CNN)
unless ``--model`` names another. Every (seed, part, configuration) is a case of one sweep
(``sweeps.cases.run_cases``: warm trial processes, resumable: a later call runs what is missing);
``--runner loop`` runs them one after another in this process. The seed varies the model's
initialisation, the client draws and training; the partition is PFLlib's, fixed by
``partition.pfllib.seed`` (``--set partition.pfllib.seed=null`` varies it with the seed too).

Parts and the hypotheses they test, each stated before running (the paper's claims):

* ``table1`` (Table 1, FMNIST Dir(0.3)): H1 FedCSPACK's personalised accuracy is above every other
  method's (paper: 88.13 against 84.39 FedAvg, 84.39 FedProx, 85.44 MOON, 84.35 FedNTD, 85.29 FedSPU).
  ``--methods`` lists the methods (registered ones, built-in or plugins: docs/baselines.md has
  MOON, FedNTD, FedSPU and HeteroFL); ``--method-set NAME:KEY=VALUE`` sets an option.
* ``ablation`` (Table 3): H2 cskd is above cs and above kd.
* ``personalization``: H3 ``own_mask`` (the paper) and ``none`` (the reference code) give the same
  personalised accuracy; H4 ``none`` gives the better global model.
* ``fleets`` (Table 2 and the "2-5x faster" summary, on heterogeneous fleets from the catalog:
  ``catalog`` a mix of every phone class, laptops and Raspberry Pis on 5 Mbps / 4G / Wi-Fi / 50 Mbps,
  ``slow_links`` laptops on 5 Mbps and 4G, ``slow_devices`` low-end phones and Pis on Wi-Fi):
  H5 FedCSPACK needs fewer bytes (up + down) to reach each ``--targets`` accuracy than
  ``--resource-methods`` (FedAvg and FedSPU, the resource-constrained baseline); H6 it reaches
  them in less simulated time, by 2-5x.
* ``packsize`` (Table 3, "insensitive to PACK"): H7 accuracy within a point of P = 1024 at every P;
  H8 simulated time per round falls as P grows.

Writes <out>/summary.parquet (one row per run), <out>/paired.parquet (paired differences with 95 %
t-intervals over seeds: reference minus other on the same seed; ratios as geometric means with
intervals on the log ratio) and <out>/results.md, also printed.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "fedcspack_paper.yaml"
PARTS = ("table1", "ablation", "personalization", "fleets", "packsize")
# each method's options beside its name (its paper's defaults where the method's own are not)
METHOD_SETTINGS = {"fedavg": [], "fedprox": ["algorithm.mu=0.01"], "fedcspack": []}
FLEETS = {
    "catalog": "{devices: {phone_low: 0.2, phone_mid: 0.2, phone_high: 0.2, laptop_cpu: 0.2, rpi4: 0.2}, "
               "network: {5mbps: 0.25, 4g: 0.35, wifi: 0.25, 50mbps: 0.15}, availability: 1.0, dropout: 0.0}",
    "slow_links": "{devices: {laptop_cpu: 1.0}, network: {5mbps: 0.5, 4g: 0.5}, availability: 1.0, dropout: 0.0}",
    "slow_devices": "{devices: {phone_low: 0.5, rpi4: 0.5}, network: {wifi: 1.0}, availability: 1.0, "
                    "dropout: 0.0}",
}
SMOKE = ["dataset.name=mnist5k", "model.name=cnn", "clients.num_clients=4", "clients.participation=0.5",
         "train.local_epochs=1"]
METRICS = ("pers_acc", "pers_acc_weighted", "pers_acc_worst", "global_acc")


def plan(args) -> list[tuple[str, str, list[str]]]:
    """(part, configuration, overrides) of every run of one seed; a configuration another part
    already runs is shared (cskd, own_mask and P = 1024 are table1's FedCSPACK)."""
    cspack = method_overrides("fedcspack", args)
    runs = []
    if "table1" in args.parts:
        runs += [("table1", m, method_overrides(m, args)) for m in args.methods]
    if "ablation" in args.parts:
        runs += [("ablation", w, [*cspack, f"algorithm.weighting={w}"]) for w in ("cs", "kd")]
    if "personalization" in args.parts:
        runs += [("personalization", "none", [*cspack, "algorithm.personalization=none"])]
    if "fleets" in args.parts:
        runs += [("fleets", f"{fleet}/{m}", [*method_overrides(m, args), f"clients.profiles={FLEETS[fleet]}"])
                 for fleet in args.fleets for m in args.resource_methods]
    if "packsize" in args.parts:
        runs += [("packsize", f"P={p}", [*cspack, f"algorithm.pack_size={p}"]) for p in args.pack_sizes if p != 1024]
    return runs


def method_overrides(method: str, args) -> list[str]:
    """The base config's method keeps the config's options; another replaces the algorithm section."""
    extra = [s.split(":", 1)[1] for s in args.method_set if s.split(":", 1)[0] == method]
    name = f"algorithm.name={method}" if method == args.base_method else f"algorithm={{name: {method}}}"
    return [name, *METHOD_SETTINGS.get(method, []), *extra]


def check_methods(methods: list[str]) -> None:
    from algorithms.plugins import METHODS  # the registry: the methods this checkout (and its plugins) has

    missing = [m for m in methods if m not in METHODS]
    if missing:
        raise SystemExit(f"--methods: {missing} not registered here (registered: {sorted(METHODS.names())}); "
                         "load your own as plugins with --set plugins=[...]")


def case_name(seed: int, part: str, name: str) -> str:
    return f"s{seed}.{part}.{name.replace('=', '-').replace('/', '.')}"  # a case name has no '=' or '/'


def summarise(path: Path, last: int, targets: list[float], target_metric: str) -> dict:
    """One run's figures: accuracies (mean of the last ``last`` evaluations), bytes, simulated time,
    and per target the bytes, simulated seconds and rounds until ``target_metric`` first reached it."""
    from engine.results.tables import load_run

    run = load_run(path)
    r, c = run.rounds, run.clients
    evaluated = r.dropna(subset=["global_acc"])
    out = {m: evaluated[m].tail(last).mean() for m in METRICS}
    up, down = r["bytes_up"].sum() / 1e6, r["bytes_down"].sum() / 1e6
    out |= {"upload_MB": up, "download_MB": down, "total_MB": up + down, "rounds_run": len(r),
            "sim_s": float(r["sim_time_s"].iloc[-1]), "sim_s_per_round": float(r["sim_round_s"].mean()),
            "wall_s": run.manifest.get("wall_s")}
    if "packs_shared" in c:
        ran = c[c["made_deadline"].astype(bool)]
        out["packs_shared_per_client_round"] = float(ran["packs_shared"].mean())
    for t in targets:
        out |= {f"{k}_to_{t:g}": v for k, v in cost_to_target(r, target_metric, t).items()}
    return out


def cost_to_target(r: pd.DataFrame, metric: str, target: float) -> dict[str, float]:
    """MB (up + down), simulated seconds and rounds until ``metric`` first reaches ``target``.
    Personalised accuracy is measured at a round's start, on the model the rounds before it made,
    so its cost is theirs; the global model's is measured after its round. NaN if never reached."""
    hit = np.flatnonzero(r[metric].to_numpy() >= target)
    if not len(hit):
        return {"MB": math.nan, "sim_s": math.nan, "rounds": math.nan}
    upto = int(hit[0]) + (0 if metric.startswith("pers_") else 1)  # rounds paid for
    spent = r.iloc[:upto]
    return {"MB": float((spent["bytes_up"].sum() + spent["bytes_down"].sum()) / 1e6),
            "sim_s": float(spent["sim_round_s"].sum()), "rounds": float(upto)}


def paired(summary: pd.DataFrame, cell: str, ref: str, metrics: list[str], ratio: bool = False) -> pd.DataFrame:
    """Per other configuration of ``cell`` and metric: ``ref`` minus it on the same seed (``ratio``:
    other / ref, their geometric mean), mean over seeds and its 95 % t-interval."""
    from sweeps.stats import t_half_width

    rows = []
    wide_all = summary[summary["cell"] == cell]
    for metric in metrics:
        wide = wide_all.pivot_table(index="seed", columns="config", values=metric)
        if ref not in wide:
            continue
        for other in [c for c in wide.columns if c != ref]:
            d = (np.log(wide[other] / wide[ref]) if ratio else wide[ref] - wide[other]).dropna()
            d = d[np.isfinite(d)]
            if not len(d):
                continue
            half = float(t_half_width(d.std(ddof=1), len(d))) if len(d) > 1 else math.nan
            mean, lo, hi = d.mean(), d.mean() - half, d.mean() + half
            if ratio:
                mean, lo, hi = math.exp(mean), math.exp(lo), math.exp(hi)
            rows.append({"cell": cell, "ref": ref, "vs": other, "metric": metric,
                         "form": f"{other}/{ref}" if ratio else f"{ref}-{other}", "seeds": len(d), "mean": mean,
                         "ci95_lo": lo, "ci95_hi": hi})
    return pd.DataFrame(rows)


def analyse(summary: pd.DataFrame, args) -> pd.DataFrame:
    acc = ["pers_acc", "pers_acc_worst", "global_acc"]
    tables = [paired(summary, "table1", "fedcspack", [*acc, "upload_MB"]),
              paired(summary, "ablation", "cskd", acc),
              paired(summary, "personalization", "own_mask", [*acc, "packs_shared_per_client_round"]),
              paired(summary, "packsize", "P=1024", ["pers_acc", "global_acc", "sim_s_per_round"])]
    to_target = [f"{k}_to_{t:g}" for t in args.targets for k in ("MB", "sim_s")]
    for fleet in args.fleets:
        tables.append(paired(summary, f"fleet={fleet}", "fedcspack", ["total_MB", "sim_s", *to_target], ratio=True))
    return pd.concat([t for t in tables if len(t)], ignore_index=True) if any(len(t) for t in tables) else \
        pd.DataFrame()


def with_shared_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """The cells each part compares: table1's FedCSPACK is also cskd, own_mask and P = 1024."""
    fleets = summary["part"] == "fleets"
    summary = summary.assign(cell=summary["part"].where(~fleets, "fleet=" + summary["config"].str.split("/").str[0]),
                             config=summary["config"].where(~fleets, summary["config"].str.split("/").str[1]))
    ref = summary[(summary["part"] == "table1") & (summary["config"] == "fedcspack")]
    extra = [ref.assign(part=p, cell=p, config=c) for p, c in
             (("ablation", "cskd"), ("personalization", "own_mask"), ("packsize", "P=1024"))
             if (summary["part"] == p).any()]
    return pd.concat([summary, *extra], ignore_index=True)


def markdown(table: pd.DataFrame) -> str:
    try:
        return table.to_markdown(index=False, floatfmt=".4g")
    except ImportError:  # tabulate is optional
        return table.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def report(summary: pd.DataFrame, pairs: pd.DataFrame, args) -> str:
    keys = ["cell", "config"]
    cols = [*METRICS, "upload_MB", "download_MB", "sim_s_per_round",
            *[c for c in summary.columns if c.startswith(("MB_to_", "sim_s_to_"))]]
    means = summary.groupby(keys, sort=False)[cols].mean().reset_index()
    means.insert(2, "seeds", summary.groupby(keys, sort=False)["seed"].count().to_numpy())
    lines = [f"# FedCSPACK, Table 1 and the resource claims ({args.dataset_note})", "",
             f"Seeds {args.seeds}, {args.rounds} rounds; accuracies: mean of the last {args.last} evaluations; "
             f"targets on {args.target_metric}: {args.targets}.", "", "## Means over seeds", "",
             markdown(means), "", "## Paired differences (95 % t-intervals over seeds)", "",
             "`ref-other`: the reference configuration minus the other on the same seed (above 0: the "
             "reference is higher); `other/ref`: the geometric mean of the other's value over the "
             "reference's (above 1: the reference needs less).", "",
             markdown(pairs) if len(pairs) else "(fewer than one pair: nothing to compare)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(CONFIG), help="the base experiment (default: the paper's)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"any of {', '.join(PARTS)}")
    p.add_argument("--methods", default="fedavg,fedprox,moon,fedntd,fedspu,fedcspack", help="table1's methods")
    p.add_argument("--method-set", action="append", default=[], metavar="NAME:KEY=VALUE",
                   help="an option of one method, e.g. fedspu:algorithm.p=0.5 (repeatable)")
    p.add_argument("--resource-methods", default="fedavg,fedspu,fedcspack", help="the fleets part's methods")
    p.add_argument("--fleets", default=",".join(FLEETS), help=f"any of {', '.join(FLEETS)}")
    p.add_argument("--pack-sizes", default="256,512,1024,2048,4096")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--model", default=None, help="model.name for every run (default: the config's)")
    p.add_argument("--targets", default="0.75,0.8", help="accuracies whose cost the fleets part measures")
    p.add_argument("--target-metric", default="pers_acc", choices=["pers_acc", "global_acc"])
    p.add_argument("--last", type=int, default=5, help="average accuracies over the last N evaluations")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="a config override (repeatable)")
    p.add_argument("--runner", choices=["sweep", "loop"], default="sweep")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (--runner sweep)")
    p.add_argument("--out", default="runs/fedcspack_table1")
    p.add_argument("--smoke", action="store_true", help="mnist5k, 4 clients, 2 rounds, 2 seeds, every part at one "
                   "setting, --runner loop: the pipeline in seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.rounds, args.seeds, args.runner, args.fleets = 2, "0,1", "loop", "slow_links"
        args.methods, args.pack_sizes, args.targets = "fedavg,fedcspack", "512,1024", "0.1"
        args.resource_methods = "fedavg,fedcspack"
        args.overrides = [*SMOKE, *args.overrides]
    args.parts = args.parts.split(",")
    args.methods, args.resource_methods = args.methods.split(","), args.resource_methods.split(",")
    args.fleets = [f for f in args.fleets.split(",") if f]
    args.pack_sizes = [int(v) for v in args.pack_sizes.split(",")]
    args.targets = [float(v) for v in args.targets.split(",")]
    unknown = sorted(set(args.parts) - set(PARTS)) + sorted(set(args.fleets) - set(FLEETS))
    if unknown:
        raise SystemExit(f"unknown part or fleet {unknown}; parts: {list(PARTS)}, fleets: {list(FLEETS)}")
    from engine.config.schema import load_config  # pydantic and the registries: after the arguments are checked

    base = load_config(args.config, [*args.overrides, *([f"model.name={args.model}"] if args.model else [])])
    args.base_method, args.dataset_note = base.algorithm.name, f"{base.dataset.name}, {base.model.name}"
    check_methods(sorted({*args.methods, *args.resource_methods}))  # after the config's plugins are loaded
    seeds = [int(v) for v in args.seeds.split(",")]
    shared = [f"rounds={args.rounds}", *([f"model.name={args.model}"] if args.model else []), *args.overrides]
    runs = plan(args)
    out = Path(args.out)
    folders = run_all(runs, seeds, shared, args, out)
    rows = [{"seed": s, "part": part, "config": name,
             **summarise(folders[case_name(s, part, name)], args.last, args.targets, args.target_metric)}
            for s in seeds for part, name, _ in runs if case_name(s, part, name) in folders]
    summary = with_shared_runs(pd.DataFrame(rows))
    pairs = analyse(summary, args)
    out.mkdir(parents=True, exist_ok=True)
    summary.to_parquet(out / "summary.parquet", index=False)
    pairs.to_parquet(out / "paired.parquet", index=False)
    text = report(summary, pairs, args)
    (out / "results.md").write_text(text)
    print(text)


def run_all(runs, seeds: list[int], shared: list[str], args, out: Path) -> dict[str, Path]:
    """Every (seed, run) once: as one sweep, or one after another here. Returns the folders of the
    runs that finished, by case name."""
    if args.runner == "sweep":
        from engine.config.schema import parse_override
        from sweeps.cases import run_cases

        cases = {case_name(s, part, name): {".".join(k): v for k, v in map(parse_override, [f"seed={s}", *extra])}
                 for s in seeds for part, name, extra in runs}
        done = run_cases(cases, out, base=args.config, overrides=shared, name="fedcspack_table1", jobs=args.jobs,
                         command=["studies/fedcspack_table1.py"])
        for name in sorted(set(cases) - set(done)):
            print(f"{name}: did not finish; left out (run the study again)", flush=True)
        return done
    from engine.config.schema import load_config
    from engine.run.api import run_experiment

    done = {}
    for s in seeds:
        for part, name, extra in runs:
            t0 = time.perf_counter()
            path = out / f"seed{s}" / case_name(s, part, name)
            cfg = load_config(args.config, [*shared, f"seed={s}", *extra, "output.overwrite=true"])
            done[case_name(s, part, name)] = run_experiment(cfg, path, command=[])
            print(f"seed {s} {part:>15} {name:<22} {time.perf_counter() - t0:6.1f} s", flush=True)
    return done


if __name__ == "__main__":
    main()
