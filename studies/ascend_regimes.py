"""Where ASCEND's premise can hold: the per-round time of each arm from the virtual clock's model.

ASCEND chooses a compressor per client because the arms' *time* may differ by client and by link
state (selection cost on slow devices, index bytes on slow uplinks). The v3 study found that time
term inert at LeNet size. This script asks the clock's own formulas (:mod:`hardware_profiles.clock`,
the catalog's tiers and per-tier selection costs) where it is not: per device tier x link x model
size x K/d x local work, the round time of each arm

    T(arm) = download (the dense model, 4·d bytes) + training (samples x FLOPs per sample / GFLOP/s)
             + selection (clock.select_seconds) + upload (the arm's payload bytes), latencies included

(ASCEND's probe forwards are left out: the same for every arm, and not in the reward's T), the
selection's share of Top-K's T, and the ratios T(topk)/T(randomk), T(topk)/T(periodick).

    PYTHONPATH=. python studies/ascend_regimes.py              # the condensed table (a second)
    PYTHONPATH=. python studies/ascend_regimes.py --csv runs/regimes/arm_times.csv   # every row

Payload bytes are the compressors' own (``algorithms/compressors.py``): Top-K 4K values + 4K
int32 indices, Random-K 4K + an 8-byte seed, Periodic-K 4K + a 4-byte offset (tested against
the compressors' ``nbytes``; the per-arm seconds are tested against ``clock.client_times``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from hardware_profiles import clock  # noqa: E402
from hardware_profiles.catalog import load_catalog  # noqa: E402

ARMS = ("topk", "randomk", "periodick")
TIERS = ("phone_low", "rpi4", "phone_mid", "phone_high", "laptop_cpu", "edge_gpu")
# name: (parameters d, training FLOPs per sample: engine.models.flops.training_flops_per_sample)
MODELS = {
    "lenet5 (62k)": (61_706, 2_263_920),
    "cifar_cnn (586k)": (586_250, 49_182_720),
    "resnet18 (11.2M)": (11_173_962, 3_328_997_376),
}
# name: (catalog network tier whose latency is used, down Mbps, up Mbps). The last two are the
# states of a link whose down and up switch between 5 and 500 Mbps independently.
LINKS = {
    "5/5": ("5mbps", 5.0, 5.0),
    "50/50": ("50mbps", 50.0, 50.0),
    "500/500": ("500mbps", 500.0, 500.0),
    "down500/up5": ("500mbps", 500.0, 5.0),
    "down5/up500": ("500mbps", 5.0, 500.0),
}
RATIOS = (0.001, 0.01, 0.1)
LOCAL_SAMPLES = (16, 160, 640)  # 1 and 10 SGD steps of batch 16, one epoch of a 640-sample client
VALUE_BYTES = 4


def payload_bytes(arm: str, k: int) -> int:
    """Bytes of one upload of ``arm`` at K coordinates (the compressors' ``nbytes``)."""
    return {"topk": 8 * k, "randomk": VALUE_BYTES * k + 8, "periodick": VALUE_BYTES * k + 4}[arm]


def profile_for(tier: str, link: str, catalog=None):
    """The catalog's profile of ``tier`` on ``link`` (the link's rates in each direction)."""
    catalog = catalog or load_catalog()
    net, down, up = LINKS[link]
    return catalog.profile(tier, net).model_copy(update={"down_mbps": down, "up_mbps": up, "net_tier": link})


def arm_phases(arm: str, d: int, flops_per_sample: float, ratio: float, samples: int, profile) -> dict[str, float]:
    """The clock's phase seconds of one round of ``arm`` (download, train, select, upload, total)."""
    k = max(1, round(ratio * d))
    down = float(clock.transfer_seconds(VALUE_BYTES * d, profile.down_mbps, profile.latency_s))
    train = float(clock.compute_seconds(samples * flops_per_sample, profile.gflops))
    select = clock.select_seconds(arm, d, k, profile)
    up = float(clock.transfer_seconds(payload_bytes(arm, k), profile.up_mbps, profile.latency_s))
    return {"download_s": down, "train_s": train, "select_s": select, "upload_s": up,
            "total_s": down + train + select + up}


def arm_table(tiers=TIERS, models=MODELS, links=LINKS, ratios=RATIOS, local_samples=LOCAL_SAMPLES) -> pd.DataFrame:
    """One row per (tier, model, link, K/d, local samples): each arm's T and the ratios."""
    catalog = load_catalog()
    rows = []
    for tier in tiers:
        for link in links:
            prof = profile_for(tier, link, catalog)
            for model, (d, fps) in models.items():
                for ratio in ratios:
                    for n in local_samples:
                        ph = {a: arm_phases(a, d, fps, ratio, n, prof) for a in ARMS}
                        top = ph["topk"]
                        rows.append({
                            "tier": tier, "link": link, "model": model, "d": d, "k_ratio": ratio,
                            "local_samples": n,
                            **{f"T_{a}": ph[a]["total_s"] for a in ARMS},
                            "topk_select_share": top["select_s"] / top["total_s"],
                            "topk_upload_share": top["upload_s"] / top["total_s"],
                            "download_share": top["download_s"] / top["total_s"],
                            "topk_over_randomk": top["total_s"] / ph["randomk"]["total_s"],
                            "topk_over_periodick": top["total_s"] / ph["periodick"]["total_s"],
                        })
    return pd.DataFrame(rows)


def condensed(table: pd.DataFrame) -> pd.DataFrame:
    """Per (model, link, K/d, local samples): the largest T(topk)/T(randomk) over the tiers (and
    which tier), the smallest, and the largest selection share of Top-K's T."""
    keys = ["model", "link", "k_ratio", "local_samples"]
    rows = []
    for key, g in table.groupby(keys, sort=False):
        hi = g.loc[g["topk_over_randomk"].idxmax()]
        sel = g.loc[g["topk_select_share"].idxmax()]
        rows.append(dict(zip(keys, key)) | {
            "max T_topk/T_randomk": hi["topk_over_randomk"], "on": hi["tier"],
            "min T_topk/T_randomk": g["topk_over_randomk"].min(),
            "max select share": sel["topk_select_share"], "sel on": sel["tier"],
            "T_topk on that tier (s)": hi["T_topk"]})
    return pd.DataFrame(rows)


def write_cifar_like(path: str | Path, *, n_train: int = 2400, n_test: int = 500, amplitude: float = 1.0,
                     shift: int = 4, seed: int = 0) -> Path:
    """A CIFAR-10-shaped synthetic task as a Parquet table (``dataset: parquet``, ``shape: [3, 32, 32]``,
    ``split_column: split``): 10 classes, each a smooth random colour template (3x8x8 Gaussian,
    upsampled to 32x32), a sample = ``amplitude`` x its class template rolled by up to ``shift``
    pixels each way + N(0, 1) noise per pixel. Deterministic given ``seed``; written once."""
    import numpy as np

    path = Path(path)
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    templates = rng.standard_normal((10, 3, 8, 8)).repeat(4, axis=2).repeat(4, axis=3)
    n = n_train + n_test
    y = rng.integers(0, 10, n)
    dx, dy = rng.integers(-shift, shift + 1, (2, n))
    x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
    for i in range(n):
        x[i] += amplitude * np.roll(templates[y[i]], (dx[i], dy[i]), axis=(1, 2))
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"x": list(x.reshape(n, -1)), "label": y,
                  "split": ["train"] * n_train + ["test"] * n_test}).to_parquet(path, index=False)
    return path


UNIFORM_ARMS = ("topk", "randomk", "periodick")


def _clients(run_dir: str) -> pd.DataFrame:
    from engine.results.tables import load_run  # the analysis of finished cells only: the table needs no engine

    return load_run(run_dir).clients


def state_times(summary: pd.DataFrame) -> pd.DataFrame:
    """H1: per device tier and uplink state (``up_state`` when the upload started), the mean
    seconds the clock charged a client's round without the probe forwards (``sim_total_s −
    sim_T_measure``: download + training + selection + upload at the rates during each phase; ASCEND's
    own ``sim_T`` prices the round-start profile instead) of each uniform arm, and Top-K's ratio to
    the others."""
    parts = []
    for row in summary[summary["variant"].isin(UNIFORM_ARMS)].itertuples():
        c = _clients(row.run_dir)
        parts.append(c[["tier", "up_state"]].assign(T=c["sim_total_s"] - c["sim_T_measure"], variant=row.variant,
                                                    seed=row.seed, k=row.k))
    c = pd.concat(parts)
    t = c.pivot_table(index=["k", "tier", "up_state"], columns="variant", values="T", aggfunc="mean")
    for other in ("randomk", "periodick"):
        if other in t and "topk" in t:
            t[f"topk/{other}"] = t["topk"] / t[other]
    t["rows"] = c.groupby(["k", "tier", "up_state"]).size() // max(1, c["variant"].nunique())
    return t.reset_index()


def plain_rounds(run_dir: str) -> pd.DataFrame:
    """Per round: the clock's duration (the slowest arrived client's ``sim_total_s``) and the
    "plain" one, without ASCEND's probe forwards (``sim_total_s − sim_T_measure``), cumulated;
    with the round's global accuracy and whether its slowest client's uplink was slow."""
    from engine.results.tables import load_run  # as in _clients

    run = load_run(run_dir)
    c = run.clients
    c = c[c["drop_reason"].fillna("") == ""].assign(plain=lambda x: x["sim_total_s"] - x["sim_T_measure"])
    g = c.groupby("round")
    slowest = c.loc[g["sim_total_s"].idxmax()].set_index("round")
    out = pd.DataFrame({"dur": g["sim_total_s"].max(), "dur_plain": g["plain"].max(),
                        "straggler_up": slowest["up_state"]})
    r = run.rounds.set_index("round")
    out["global_acc"] = r["global_acc"]
    out["t"], out["t_plain"] = out["dur"].cumsum(), out["dur_plain"].cumsum()
    out["t_clock"] = r["sim_time_s"]
    return out.reset_index()


def auc_on(t, acc, budget: float) -> float:
    """Mean accuracy over [0, budget] (a step function, 0.1 before the first round), as
    ``studies/ascend_report.curve_metrics``."""
    import numpy as np

    t, acc = np.asarray(t), np.asarray(acc)
    ok = t <= budget + 1e-9
    edges = np.concatenate([[0.0], t[ok], [budget]])
    return float(np.sum(np.diff(edges) * np.concatenate([[0.1], acc[ok]])) / budget)


def plain_auc(summary: pd.DataFrame) -> pd.DataFrame:
    """The uniform arms' AUC on the plain clock (no probe forwards), budget = the shortest plain
    run of the cell and seed; with the mean round durations of both clocks."""
    rows = []
    uni = summary[summary["variant"].isin(UNIFORM_ARMS)]
    curves = {r.run_dir: plain_rounds(r.run_dir) for r in uni.itertuples()}
    for (exp, k, seed), cell in uni.groupby(["experiment", "k", "seed"]):
        budget = min(curves[d]["t_plain"].iloc[-1] for d in cell["run_dir"])
        for r in cell.itertuples():
            cur = curves[r.run_dir]
            rows.append({"experiment": exp, "k": k, "seed": seed, "variant": r.variant,
                         "auc_plain": auc_on(cur["t_plain"], cur["global_acc"], budget),
                         "round_s": cur["dur"].mean(), "round_s_plain": cur["dur_plain"].mean(),
                         "straggler_slow_up": float((cur["straggler_up"] == "slow").mean()),
                         "clock_check": float((cur["t"] - cur["t_clock"]).abs().max())})
    return pd.DataFrame(rows)


def rounds_to(summary: pd.DataFrame, targets=(0.3, 0.5, 0.7)) -> pd.DataFrame:
    """Per run: the first round (1-based) whose global accuracy reaches each target (NaN: never).
    Random-K beats Top-K on accuracy against time only if Top-K's rounds are longer by more than
    the ratio of these counts."""
    import numpy as np

    from engine.results.tables import load_run  # as in _clients

    rows = []
    for row in summary.itertuples():
        acc = load_run(row.run_dir).rounds["global_acc"].to_numpy()
        rec = {"experiment": row.experiment, "k": row.k, "variant": row.variant, "seed": row.seed}
        for t in targets:
            hit = np.nonzero(acc >= t)[0]
            rec[f"rounds_to_{t:g}"] = float(hit[0] + 1) if len(hit) else float("nan")
        rows.append(rec)
    return pd.DataFrame(rows)


def exploit_by_state(summary: pd.DataFrame) -> pd.DataFrame:
    """H6: per adaptive run and uplink state, the share of each arm among the policy's exploit
    choices (the state the upload started in)."""
    rows = []
    for row in summary[summary["variant"].str.startswith("ascend")].itertuples():
        c = _clients(row.run_dir)
        ex = c[c["arm_reason"] == "exploit"]
        for state, g in ex.groupby("up_state"):
            rows.append({"experiment": row.experiment, "k": row.k, "variant": row.variant, "seed": row.seed,
                         "up_state": state, "n": len(g),
                         **{f"exploit_{a}": float((g["arm"] == a).mean()) for a in UNIFORM_ARMS}})
    return pd.DataFrame(rows)


def analyse_cells(out: Path) -> pd.DataFrame:
    """Print (and write as ``regimes_*.csv`` beside it) the v4 design's extra tables: H1's times by
    uplink state, the uniform arms' paired differences on both clocks, and exploit shares by state."""
    from studies.ascend_report import paired_differences  # the same bootstrap as the study's tables

    summary = pd.read_parquet(out / "summary.parquet")
    st = state_times(summary)
    plain = plain_auc(summary)
    both = summary.merge(plain, on=["experiment", "k", "seed", "variant"], how="left")
    uni = both[both["variant"].isin(UNIFORM_ARMS)]
    gt = pd.concat([paired_differences(uni, m, ref="topk")
                    .rename(columns={f"d_{m}": "d_auc_topk_minus"}).assign(clock=c)
                    for m, c in (("auc", "with probes"), ("auc_plain", "plain"))])
    ex = exploit_by_state(summary)
    tables = {"state_times": st, "plain": plain, "truth_paired": gt, "exploit_by_state": ex,
              "rounds_to": rounds_to(summary)}
    with pd.option_context("display.max_rows", None, "display.width", 220, "display.float_format", "{:.4g}".format):
        for name, df in tables.items():
            df.to_csv(out / f"regimes_{name}.csv", index=False)
            print(f"== {name}\n{df.to_string(index=False)}\n")
        rt = tables["rounds_to"]
        print(rt.groupby(["k", "variant"])[[c for c in rt if c.startswith("rounds_to")]].agg(["mean", "count"])
              .to_string(), "\n")
        if len(ex):
            print(ex.groupby(["k", "variant", "up_state"])[[c for c in ex if c.startswith("exploit_")] + ["n"]]
                  .mean().to_string())
    return summary


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", help="write every row here")
    ap.add_argument("--min-ratio", type=float, default=0.0, help="print only rows whose max ratio is at least this")
    ap.add_argument("--cells", help="instead: analyse the finished regime cells of this ascend_study --design v4 "
                                    "output folder (its summary.parquet)")
    args = ap.parse_args(argv)
    if args.cells:
        return analyse_cells(Path(args.cells))
    table = arm_table()
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.csv, index=False)
    short = condensed(table)
    short = short[short["max T_topk/T_randomk"] >= args.min_ratio]
    with pd.option_context("display.max_rows", None, "display.width", 200, "display.float_format", "{:.4g}".format):
        print(short.to_string(index=False))
    return table


if __name__ == "__main__":
    main()
