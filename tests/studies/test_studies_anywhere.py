"""Every shipped study (``studies/*.py``) runs from a folder outside the repository at its
smallest setting and writes real results under that folder.

The scripts run as a user starts them (``python /path/to/studies/X.py --smoke``, the working
folder a fresh temporary one), two at a time: together they are a few seconds of CPU each.
The what-if study runs a Ray Tune sweep; it runs in this process on the suite's shared Ray
(starting a private Ray in a subprocess costs ~30 s of waiting), from the same kind of folder.
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from helpers import REPO

from engine.results import load_run
from studies import ascend_regimes

# the scripts (a study's helper module, e.g. its report, is run through its script)
STUDIES = sorted(p.stem for p in REPO.glob("studies/*.py") if 'if __name__ == "__main__"' in p.read_text())
IN_THIS_PROCESS = {"whatif_bandwidth"}  # a Ray Tune sweep: on the shared Ray (module docstring)
# each study's smallest setting, output paths relative to the working folder
SMOKE_ARGS = {
    "ascend_regimes": ["--csv", "arm_times.csv"],  # already a second
    "ascend_study": ["--smoke", "--runner", "pool", "--seeds", "0", "--rounds", "2", "--distill-steps", "1",
                     "--out", "ascend"],
    "async_methods_vs_sync": ["--smoke"],
    "async_vs_sync": ["--smoke", "--png", "async.png"],
    "energy_methods": ["--smoke"],
    "fedcspack_study": ["--smoke"],
    "fedcspack_table1": ["--smoke"],
    "heterogeneity": ["--smoke", "--figure", "heterogeneity.png", "--csv", "heterogeneity.csv"],
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(name: str, folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(REPO / "studies" / f"{name}.py"), *SMOKE_ARGS[name]], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Every subprocess study once, two at a time: name -> (its working folder, the finished process)."""
    root = tmp_path_factory.mktemp("outside")
    names = [n for n in STUDIES if n in SMOKE_ARGS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda n: _run(n, root / n), names))
    return {n: (root / n, d) for n, d in zip(names, done)}


def _finished(path: Path):
    run = load_run(path)
    assert run.manifest["status"] == "finished", path
    return run


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5_000


def test_every_study_has_a_smallest_setting_here():
    missing = [n for n in STUDIES if n not in SMOKE_ARGS and n not in IN_THIS_PROCESS]
    assert not missing, f"give {missing} a --smoke setting and an entry in SMOKE_ARGS"


def _ok(smoke_runs, name: str) -> tuple[Path, str]:
    folder, done = smoke_runs[name]
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, done.stdout


def test_ascend_regimes_writes_every_row_of_its_grid(smoke_runs):
    folder, out = _ok(smoke_runs, "ascend_regimes")
    table = pd.read_csv(folder / "arm_times.csv")
    r = ascend_regimes
    assert len(table) == len(r.TIERS) * len(r.LINKS) * len(r.MODELS) * len(r.RATIOS) * len(r.LOCAL_SAMPLES)
    assert (table[["T_topk", "T_randomk", "T_periodick"]] > 0).all().all()
    assert "max T_topk/T_randomk" in out.splitlines()[0]


def test_ascend_study_smoke_summarises_its_three_variants(smoke_runs):
    folder, out = _ok(smoke_runs, "ascend_study")
    summary = pd.read_parquet(folder / "ascend" / "summary.parquet")
    assert sorted(summary["variant"]) == ["ascend", "randomk", "topk"]
    assert (summary["rounds_run"] == 2).all() and summary["auc"].between(0, 1).all()
    for run_dir in summary["run_dir"]:
        assert Path(run_dir).parts[0] == "ascend"  # relative: under the working folder
        _finished(folder / run_dir)
    paired = pd.read_parquet(folder / "ascend" / "paired.parquet")
    assert sorted(paired["vs"]) == ["randomk", "topk"]
    assert (folder / "ascend" / "results.md").read_text() in out


@pytest.mark.parametrize("name, folder, runs", [
    ("async_vs_sync", "runs/async_vs_sync", ["fedavg-s0", "fedbuff-s0", "fedasync-s0"]),
    ("async_methods_vs_sync", "runs/async_methods",
     ["fedcspack-sync-s0", "fedcspack-fedbuff-s0", "ascend-sync-s0", "ascend-fedbuff-s0"]),
])
def test_async_studies_smoke_runs_two_rounds_or_steps_of_four_clients(smoke_runs, name, folder, runs):
    where, out = _ok(smoke_runs, name)
    for run_name in runs:
        run = _finished(where / folder / run_name)
        assert len(run.profiles) == 4 and run.rounds["round"].max() == 1  # 2 rounds (or server steps)
        asynchronous = run.config.get("asynchronous")
        assert asynchronous is None or asynchronous["concurrency"] == 2
    lines = out.splitlines()
    assert len([line for line in lines if " 0 " in line]) >= len(runs)  # one table row per run (seed 0)
    if name == "async_vs_sync":
        assert _is_png(where / "async.png") and "figure: async.png" in out


def test_energy_study_smoke_prints_who_pays_and_draws_its_figure(smoke_runs):
    folder, out = _ok(smoke_runs, "energy_methods")
    base = folder / "runs" / "energy_methods_lte_wifi"
    for method in ("fedavg", "fedcspack", "ascend"):
        run = _finished(base / method)
        assert len(run.profiles) == 8 and len(run.rounds) == 2 and run.rounds["energy_j"].sum() > 0
        assert f"  {method:10s} tiers {{" in out
    assert _is_png(base / "energy_methods.png")
    assert not list(base.glob("*/report.html"))  # --smoke leaves the per-run reports to `hetsim report`


def test_fedcspack_study_smoke_compares_each_method_with_fedavg(smoke_runs):
    folder, out = _ok(smoke_runs, "fedcspack_study")
    base = folder / "runs" / "fedcspack_study"
    table = pd.read_parquet(base / "summary.parquet").set_index("config")
    assert list(table.index) == ["fedavg", "fedprox", "fedcspack"]
    assert table.loc["fedavg", "pers_acc_vs_fedavg"] == 0.0
    assert table.loc["fedcspack", "upload_MB"] < table.loc["fedavg", "upload_MB"]  # packs: fewer bytes up
    for config in table.index:
        run = _finished(base / "seed0" / f"main-{config}")
        assert len(run.profiles) == 4 and len(run.rounds) == 2
    assert (base / "summary.md").read_text().strip() in out


def test_fedcspack_table1_smoke_pairs_every_part_over_two_seeds(smoke_runs):
    folder, out = _ok(smoke_runs, "fedcspack_table1")
    base = folder / "runs" / "fedcspack_table1"
    summary = pd.read_parquet(base / "summary.parquet")
    assert sorted(set(summary["cell"])) == ["ablation", "fleet=slow_links", "packsize", "personalization", "table1"]
    assert (summary.groupby(["cell", "config"])["seed"].count() == 2).all() and (summary["rounds_run"] == 2).all()
    t1 = summary[summary["cell"] == "table1"].set_index(["config", "seed"])
    assert (t1.loc["fedcspack", "upload_MB"] < t1.loc["fedavg", "upload_MB"]).all()  # packs: fewer bytes up
    # the fleet moves FedAvg's clock, not its training: the same accuracies as on the paper's fleet
    fleet = summary[summary["cell"] == "fleet=slow_links"].set_index(["config", "seed"])
    assert (fleet.loc["fedavg", "pers_acc"] == t1.loc["fedavg", "pers_acc"]).all()
    assert (fleet.loc["fedavg", "sim_s"] != t1.loc["fedavg", "sim_s"]).all()
    paired = pd.read_parquet(base / "paired.parquet")
    assert {"table1", "ablation", "personalization", "packsize", "fleet=slow_links"} == set(paired["cell"])
    assert (paired["seeds"] == 2).all() and (paired["ci95_lo"] <= paired["mean"]).all()
    ratio = paired[paired["cell"] == "fleet=slow_links"]
    assert set(ratio["form"]) == {"fedavg/fedcspack"} and (ratio["mean"] > 0).all()
    for case in ("s0.table1.fedavg", "s1.fleets.slow_links.fedcspack", "s1.packsize.P-512"):
        _finished(base / f"seed{case[1]}" / case)
    assert (base / "results.md").read_text().strip() in out


@pytest.mark.ray
def test_whatif_study_smoke_from_a_folder_outside_the_repository(ray_session, tmp_path, monkeypatch, capsys):
    from studies import whatif_bandwidth

    monkeypatch.chdir(tmp_path)
    whatif_bandwidth.main(["--smoke"])
    out = capsys.readouterr().out
    storage = tmp_path / "whatif_out" / "whatif_bandwidth"  # the spec's default, under the working folder
    trials = pd.read_parquet(storage / "trials.parquet")
    assert sorted(trials["fleet"]) == ["all_500mbps", "half_5mbps"] and (trials["status"] == "finished").all()
    rounds = pd.read_parquet(storage / "rounds.parquet")
    assert rounds.groupby("fleet")["round"].max().tolist() == [1, 1]
    per_round = rounds.groupby("fleet")["sim_round_s"].mean()
    assert per_round["half_5mbps"] > per_round["all_500mbps"]
    assert (storage / "compare.html").stat().st_size > 10_000
    assert "half the fleet on 5 Mbps: " in out


def test_heterogeneity_study_smoke_measures_every_cell_on_both_fleets(smoke_runs):
    folder, out = _ok(smoke_runs, "heterogeneity")
    table = pd.read_csv(folder / "heterogeneity.csv")
    assert len(table) == 16 and set(table["fleet"]) == {"phones_fading", "diurnal"}
    assert table["jain"].between(0, 1).all() and (table["energy_kj"] > 0).all()
    run = _finished(folder / "runs" / "heterogeneity_smoke" / "diurnal-partial")
    assert run.config["train"]["work"]["policy"] == "deadline" and "local_steps" in run.clients
    assert "### Fleet `phones_fading`" in out and "| `oort` |" in out
    assert _is_png(folder / "heterogeneity.png")
