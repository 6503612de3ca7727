"""The tables of docs/studies/heterogeneity.md, from the runs of the sweep ``studies/heterogeneity.yaml``.

    nice -n 10 hetsim sweep studies/heterogeneity.yaml -q --storage runs/heterogeneity
    python studies/heterogeneity.py runs/heterogeneity [--target 0.85] [--figure heterogeneity.png]
    python studies/heterogeneity.py --smoke       # every cell on both fleets once, 2 rounds of 6 clients

For every run (a fleet, a cell, a seed): the final global accuracy (mean of the last 3 rounds), the
best accuracy reached by 10 s and by 20 s of simulated time, the simulated time until the global
accuracy first reaches ``--target`` (and whether it does), the fleet's energy over the run and until
the target, the share of it spent on work that was never aggregated, the updates aggregated a
round, and participation fairness: Jain's index over every client of the number of its updates that
were aggregated, and the share of clients never aggregated. Then per fleet and cell their mean with
its 95 % t-interval over the seeds, and per seed the difference to ``fedavg_drop`` of the same seed
(same partition, fleet and initial model) with its interval: a cell *wins* a measure where that
interval excludes 0 on the better side, *loses* where it excludes 0 on the worse side.
Prints Markdown; ``--figure`` also draws accuracy against simulated time (means over the seeds).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from engine.results import load_run
from sweeps.results import load_sweep
from sweeps.stats import t_half_width

SPEC = Path(__file__).resolve().parent / "heterogeneity.yaml"
CELLS = ("fedavg_drop", "partial", "fednova", "scaffold", "fedprox", "pow_d", "oort", "available_first")
FLEETS = ("phones_fading", "diurnal")
BASELINE = "fedavg_drop"
# measure -> (heading, better when, format)
MEASURES = {
    "final_acc": ("final accuracy", "max", "{:.3f}"),
    "acc_10s": ("accuracy by 10 s", "max", "{:.3f}"),
    "acc_20s": ("accuracy by 20 s", "max", "{:.3f}"),
    "time_to_target_s": ("time to target (s)", "min", "{:.1f}"),
    "energy_kj": ("energy (kJ)", "min", "{:.2f}"),
    "energy_to_target_kj": ("energy to target (kJ)", "min", "{:.2f}"),
    "wasted_pct": ("energy wasted (%)", "min", "{:.1f}"),
    "arrived": ("aggregated a round", "max", "{:.2f}"),
    "jain": ("Jain's index", "max", "{:.3f}"),
    "never_pct": ("never aggregated (%)", "min", "{:.0f}"),
}


def run_measures(path: Path, target: float) -> dict[str, float]:
    """The measures of one run folder."""
    run = load_run(path)
    r, c = run.rounds.sort_values("round"), run.clients
    acc, t = r["global_acc"].to_numpy(dtype=float), r["sim_time_s"].to_numpy(dtype=float)
    energy = r["energy_j"].to_numpy(dtype=float)
    hit = np.flatnonzero(acc >= target)
    n = len(run.profiles)
    counts = np.bincount(c.loc[c["made_deadline"].astype(bool), "client_id"].to_numpy(dtype=np.int64), minlength=n)
    return {
        "final_acc": float(np.mean(acc[-3:])),
        "acc_10s": float(acc[t <= 10].max()) if (t <= 10).any() else np.nan,
        "acc_20s": float(acc[t <= 20].max()) if (t <= 20).any() else np.nan,
        "reached": float(len(hit) > 0),
        "time_to_target_s": float(t[hit[0]]) if len(hit) else np.nan,
        "energy_kj": float(energy.sum() / 1e3),
        "energy_to_target_kj": float(energy[:hit[0] + 1].sum() / 1e3) if len(hit) else np.nan,
        "wasted_pct": float(100 * r["energy_wasted_j"].sum() / energy.sum()),
        "arrived": float(r["num_arrived"].mean()),
        "jain": float(counts.sum() ** 2 / (n * (counts ** 2).sum())) if counts.any() else np.nan,
        "never_pct": float(100 * (counts == 0).mean()),
        "sim_time_s": float(t[-1]),
    }


def sweep_runs(folder: Path) -> list[tuple[str, str, int, Path]]:
    """(fleet, cell, seed, run folder) of every finished trial of the sweep in ``folder``."""
    sweep = load_sweep(folder, refresh=True)
    trials = sweep.trials[sweep.trials["status"] == "finished"]
    return [(t.fleet, t.cell, int(t.seed), Path(sweep.path) / "runs" / t.trial_id) for t in trials.itertuples()]


def smoke_runs(out: Path) -> list[tuple[str, str, int, Path]]:
    """Every cell on both fleets once (seed 0), 2 rounds of 6 clients, in this process: the
    study's pipeline in seconds (studies/heterogeneity.yaml's base and cases)."""
    import yaml  # reason: only the smoke setting reads the spec itself

    from engine.config.schema import load_config  # reason: as above
    from engine.run.api import run_experiment  # reason: as above

    spec = yaml.safe_load(SPEC.read_text())
    small = {"rounds": 2, "clients.num_clients": 6, "clients.participation": 0.5, "train.local_steps": 5}
    done = []
    for fleet, fleet_keys in spec["space"]["fleet"]["cases"].items():
        for cell, cell_keys in spec["space"]["cell"]["cases"].items():
            path = out / f"{fleet}-{cell}"
            if not (path / "manifest.json").exists():
                cfg = load_config(load_config(spec["base"], {**fleet_keys, **cell_keys}).to_dict(), small)
                run_experiment(cfg, path, command=[])
            done.append((fleet, cell, 0, path))
    return done


def collect(runs: list[tuple[str, str, int, Path]], target: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row of measures per run, with its fleet, cell and seed; and every run's (simulated
    time, global accuracy) per round, for the figure."""
    rows, curves = [], []
    for fleet, cell, seed, path in runs:
        rows.append({"fleet": fleet, "cell": cell, "seed": seed, **run_measures(path, target)})
        r = load_run(path).rounds
        curves.append(pd.DataFrame({"fleet": fleet, "cell": cell, "seed": seed, "sim_time_s": r["sim_time_s"],
                                    "global_acc": r["global_acc"]}))
    return pd.DataFrame(rows), pd.concat(curves, ignore_index=True) if curves else pd.DataFrame()


def mean_ci(values: pd.Series) -> tuple[float, float, int]:
    v = values.dropna().to_numpy(dtype=float)
    if len(v) == 0:
        return np.nan, np.nan, 0
    half = float(t_half_width(np.std(v, ddof=1) if len(v) > 1 else np.nan, len(v)))
    return float(v.mean()), half, len(v)


def cell_text(values: pd.Series, fmt: str, n_all: int) -> str:
    mean, half, n = mean_ci(values)
    if n == 0:
        return "–"
    text = fmt.format(mean) + (f" ± {fmt.format(half)}" if np.isfinite(half) else "")
    return text + (f" ({n}/{n_all})" if n < n_all else "")


def verdict(diff: pd.Series, better: str) -> tuple[str, str]:
    """The paired difference's mean ± half width, and win (▲), loss (▼) or within noise (=)."""
    mean, half, n = mean_ci(diff)
    if n < 2 or not np.isfinite(half):
        return ("–" if n == 0 else f"{mean:+.3g}"), ""
    sign = 1 if better == "max" else -1
    if sign * (mean - half) > 0 and sign * (mean + half) > 0:
        mark = "▲"
    elif sign * (mean + half) < 0 and sign * (mean - half) < 0:
        mark = "▼"
    else:
        mark = "="
    return f"{mean:+.3g} ± {half:.2g}", mark


def tables(df: pd.DataFrame) -> str:
    out = []
    for fleet in FLEETS:
        sub = df[df["fleet"] == fleet]
        if sub.empty:
            continue
        seeds = sub["seed"].nunique()
        out += [f"### Fleet `{fleet}`: mean ± 95 % interval over {seeds} seed(s)", "",
                "| cell | " + " | ".join(m[0] for m in MEASURES.values()) + " |",
                "|---|" + "---|" * len(MEASURES)]
        for cell in CELLS:
            rows = sub[sub["cell"] == cell]
            if rows.empty:
                continue
            cols = [cell_text(rows[k], fmt, len(rows)) for k, (_, _, fmt) in MEASURES.items()]
            out.append(f"| `{cell}` | " + " | ".join(cols) + " |")
        out += ["", f"Time to target: mean over the seeds that reach it (how many, when not all). "
                    f"Paired with `{BASELINE}` seed by seed: difference (cell − {BASELINE}), its 95 % interval, "
                    "▲ better beyond noise, ▼ worse beyond noise, = within noise:", ""]
        keys = ["final_acc", "acc_20s", "time_to_target_s", "energy_kj", "arrived", "jain"]
        out += ["| cell | " + " | ".join(MEASURES[k][0] for k in keys) + " |", "|---|" + "---|" * len(keys)]
        base = sub[sub["cell"] == BASELINE].set_index("seed")
        for cell in CELLS:
            if cell == BASELINE:
                continue
            rows = sub[sub["cell"] == cell].set_index("seed")
            if rows.empty:
                continue
            cols = []
            for k in keys:
                text, mark = verdict(rows[k] - base[k].reindex(rows.index), MEASURES[k][1])
                cols.append(f"{text} {mark}".strip())
            out.append(f"| `{cell}` | " + " | ".join(cols) + " |")
        out.append("")
    return "\n".join(out)


def figure(curves: pd.DataFrame, path: Path) -> None:
    """Global accuracy against simulated time, per fleet: each cell's mean over the seeds, each
    seed's curve stepped onto a common time grid (the best accuracy reached so far)."""
    import matplotlib  # reason: only the figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # reason: as above

    fig, axes = plt.subplots(1, len(FLEETS), figsize=(11, 4), sharey=True)
    for ax, fleet in zip(np.atleast_1d(axes), FLEETS):
        sub = curves[curves["fleet"] == fleet]
        grid = np.linspace(0, sub["sim_time_s"].max(), 200)
        for cell in CELLS:
            runs = [g.sort_values("sim_time_s") for _, g in sub[sub["cell"] == cell].groupby("seed")]
            if not runs:
                continue
            ys = []
            for g in runs:
                best = np.maximum.accumulate(g["global_acc"].to_numpy(dtype=float))
                idx = np.searchsorted(g["sim_time_s"].to_numpy(), grid, side="right") - 1
                ys.append(np.where(idx >= 0, best[np.clip(idx, 0, None)], np.nan))
            ys = np.array(ys)
            seen = np.isfinite(ys).all(axis=0)  # from when every seed has finished a round
            mean = np.full(len(grid), np.nan)
            mean[seen] = np.nanmean(ys[:, seen], axis=0)
            ax.plot(grid, mean, label=cell, lw=1.4)
        ax.set_title(fleet)
        ax.set_xlabel("simulated time (s)")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("best global accuracy so far")
    np.atleast_1d(axes)[-1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", nargs="*", help="the sweep folder (hetsim sweep studies/heterogeneity.yaml --storage ...); "
                   "several: a later one's runs replace an earlier one's of the same fleet, cell and seed (a cell "
                   "run again with --grid cell=...)")
    p.add_argument("--smoke", action="store_true", help="every cell on both fleets once, 2 rounds of 6 clients, in "
                   "this process (under runs/heterogeneity_smoke), instead of a sweep's runs")
    p.add_argument("--target", type=float, default=0.85, help="global accuracy of the time to target")
    p.add_argument("--figure", default=None, help="also draw accuracy against simulated time into this PNG")
    p.add_argument("--csv", default=None, help="also write every run's measures to this CSV")
    args = p.parse_args()
    if not args.smoke and not args.sweep:
        p.error("give the sweep folder, or --smoke")
    if args.smoke:
        runs = smoke_runs(Path("runs/heterogeneity_smoke"))
    else:
        latest = {(fleet, cell, seed): path for folder in args.sweep
                  for fleet, cell, seed, path in sweep_runs(Path(folder))}
        runs = [(*key, path) for key, path in latest.items()]
    df, curves = collect(runs, args.target)
    if df.empty:
        raise SystemExit(f"{args.sweep}: no finished runs yet")
    if args.csv:
        df.to_csv(args.csv, index=False)
    print(tables(df))
    if args.figure:
        figure(curves, Path(args.figure))


if __name__ == "__main__":
    main()
