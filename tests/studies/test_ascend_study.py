"""The ASCEND study's own arithmetic (studies/ascend_study.py): the v3 plan, its config changes,
paired differences with bootstrap intervals and the per-cell ground truth. No runs."""
import importlib.util

import numpy as np
import pandas as pd
import pytest
from helpers import REPO


def _study():
    path = REPO / "studies" / "ascend_study.py"
    spec = importlib.util.spec_from_file_location("ascend_study", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


study = _study()


def test_v3_plan_keeps_only_the_named_bandwidths_ratios_and_cells():
    args = study.parse_args(["--design", "v3", "--bandwidths", "500", "--ratios", "0.1",
                             "--experiments", "v3main", "v3slowtopk"])
    cells = study.plan_v3(args)
    assert {c[0] for c in cells} == {"v3main-500mbps", "v3slowtopk-500mbps"}
    assert {c[1] for c in cells} == {0.1}
    assert all(c[3]["network"] == "500mbps" for c in cells)
    assert [c[2] for c in cells if c[0] == "v3main-500mbps"] == ["ascend", "topk", "randomk", "periodick"]
    # every cell of the full design has ASCEND, so every paired difference has its reference
    full = study.plan_v3(study.parse_args(["--design", "v3"]))
    for exp in {c[0] for c in full}:
        for k in {c[1] for c in full if c[0] == exp}:
            assert "ascend" in [c[2] for c in full if c[0] == exp and c[1] == k], (exp, k)


def test_v3_cell_changes_reach_the_config():
    from engine.config.schema import load_config
    from hardware_profiles.catalog import load_catalog

    args = study.parse_args(["--design", "v3"])
    cfg = study.base_config(args, {"network": "500mbps", "local_steps": 2, "slow_topk": 100.0, "markov": True})
    prof = cfg["clients"]["profiles"]
    assert prof["network"] == {"500mbps": 1.0}
    assert cfg["train"]["local_steps"] == 2 and "local_epochs" not in cfg["train"]
    assert prof["conditions"]["sets"]["fading"] == {"down": "gilbert_elliott", "up": "gilbert_elliott"}
    built_in = load_catalog().devices
    for tier in ("rpi4", "laptop_cpu"):
        assert prof["catalog"]["devices"][tier]["topk_ns_in_cache"] == 100 * built_in[tier].topk_ns_in_cache
    only_rpi = study.base_config(args, {"slow_topk": 100.0, "slow_tiers": ("rpi4",)})["clients"]["profiles"]
    assert list(only_rpi["catalog"]["devices"]) == ["rpi4"]
    algo = study.variant_algorithm("ascend_mean", 0.1, args)
    assert algo["q_update"] == "mean" and algo["reward"] == "v3"
    load_config({**cfg, "algorithm": algo})  # the whole config validates
    for variant, time_model in (("ascend_v4", "profile"), ("ascend_v4m", "measured")):  # reward v4
        algo = study.variant_algorithm(variant, 0.1, args)
        assert algo["reward"] == "v4" and algo.get("time_model", "profile") == time_model
        load_config({**cfg, "algorithm": algo})


def test_the_study_as_one_sweep_gives_every_run_its_own_config(tmp_path):
    """--runner sweep: each planned run is a case of the sweep's `run` dimension; the trial's
    config (base + case) is the run's own config, for runs that differ in seed, method, fleet,
    links over time and training (a main cell and the Markov-link cell)."""
    from engine.config.schema import load_config
    from sweeps import resolve

    args = study.parse_args(["--design", "v3", "--experiments", "v3main", "v3markov", "--ratios", "0.1",
                             "--bandwidths", "5", "--seeds", "0", "1", "--rounds", "2", "--num-clients", "4"])
    jobs = [{"config": {**study.base_config(args, change), "seed": seed,
                        "algorithm": study.variant_algorithm(variant, k, args)},
             "experiment": exp, "k": k, "variant": variant, "seed": seed}
            for seed in args.seeds for exp, k, variant, change in study.plan_v3(args)]
    from sweeps.cases import cases_spec

    base = {**study.base_config(args, {}), "algorithm": jobs[0]["config"]["algorithm"]}
    cases = {study.case_name(j): study.case_overrides(j, base) for j in jobs}
    resolved = resolve(cases_spec(cases, tmp_path / "sweep", base=base, jobs=2))
    assert resolved.num_trials == len(jobs) == len({study.case_name(j) for j in jobs})
    for job in jobs:
        trial = load_config(resolved.trial_raw({"run": study.case_name(job)}))
        own = load_config(job["config"])
        assert trial.model_dump(exclude={"output"}) == own.model_dump(exclude={"output"}), study.case_name(job)


def _summary(diffs: dict[str, list[float]], base: list[float]) -> pd.DataFrame:
    rows = [{"experiment": "cell", "k": 0.01, "variant": "ascend", "seed": s, "auc": a} for s, a in enumerate(base)]
    for variant, d in diffs.items():
        rows += [{"experiment": "cell", "k": 0.01, "variant": variant, "seed": s, "auc": a - x}
                 for s, (a, x) in enumerate(zip(base, d))]
    return pd.DataFrame(rows)


def test_paired_differences_are_per_seed_with_a_bootstrap_interval_of_the_mean():
    base = [0.5, 0.6, 0.55, 0.7, 0.65]
    summary = _summary({"topk": [0.02, 0.03, 0.01, 0.04, 0.02], "randomk": [-0.1, 0.1, -0.05, 0.05, 0.0]}, base)
    out = study.paired_differences(summary).set_index("vs")
    assert out.loc["topk", "d_auc"] == pytest.approx(0.024)
    assert out.loc["topk", "seeds"] == 5
    # every resampled mean lies within the differences' range, so the interval does too
    assert 0.01 <= out.loc["topk", "ci95_lo"] <= 0.024 <= out.loc["topk", "ci95_hi"] <= 0.04
    assert out.loc["topk", "holds"] and not out.loc["topk", "fails"]
    assert out.loc["randomk", "d_auc"] == pytest.approx(0.0, abs=1e-12)
    assert not out.loc["randomk", "holds"] and not out.loc["randomk", "fails"]
    # the bootstrap is seeded: the same interval again
    again = study.paired_differences(summary).set_index("vs")
    assert again.loc["topk", "ci95_lo"] == out.loc["topk", "ci95_lo"]


def test_ground_truth_is_the_best_uniform_and_how_often_ascend_exploits_it():
    summary = pd.DataFrame([
        {"experiment": "c", "k": 0.1, "variant": v, "seed": s, "auc": a}
        for v, aucs in {"topk": [0.6, 0.7], "randomk": [0.65, 0.75], "ascend": [0.9, 0.9]}.items()
        for s, a in enumerate(aucs)])
    arms = pd.DataFrame([{"experiment": "c", "k": 0.1, "variant": "ascend", "seed": s, "by": "all",
                          "group": "all", "exploit_topk": 1 - x, "exploit_randomk": x}
                         for s, x in enumerate([0.6, 0.8])])
    truth = study.ground_truth(summary, arms).iloc[0]
    assert truth["best_uniform"] == "randomk"
    assert truth["auc_best"] == pytest.approx(0.7) and truth["auc_runner_up"] == pytest.approx(0.65)
    assert truth["ascend_exploits_best"] == pytest.approx(0.7)
    assert not np.isnan(truth["auc_best"])


def test_the_budget_of_a_cell_ignores_runs_that_diverged():
    summary = pd.DataFrame({"experiment": ["a"] * 3 + ["b"] * 2, "k": 0.1, "seed": 0,
                            "sim_time_s": [30.0, 12.0, 25.0, 5.0, 8.0],
                            "diverged": [False, True, False, True, True]})
    assert study.cell_budgets(summary).tolist() == [25.0, 25.0, 25.0, 5.0, 5.0]


def test_v4_design_plans_the_regime_cell_and_its_config_validates():
    from engine.config.schema import load_config

    args = study.parse_args(["--design", "v4"])
    cells = study.plan_v3(args)
    assert {c[0] for c in cells} == {"v4regime-500mbps"} and {c[1] for c in cells} == {0.1, 0.01}
    assert [c[2] for c in cells if c[1] == 0.1] == ["ascend", "ascend_v4", "topk", "randomk", "periodick"]
    cfg = study.base_config(args, cells[0][3])
    assert cfg["model"] == {"name": "cifar_cnn"}
    assert cfg["clients"]["profiles"]["devices"] == {"rpi4": 0.5, "phone_low": 0.5}
    assert cfg["clients"]["profiles"]["conditions"]["sets"]["uplink"]["up"]["states"] == {"fast": 500.0, "slow": 5.0}
    assert cfg["train"]["local_steps"] == 2 and "local_epochs" not in cfg["train"]
    algo = study.variant_algorithm("ascend_v4", 0.1, args)
    assert algo["reward"] == "v4" and algo["probe_batches"] == 1 and algo["psi_probe_size"] == 16

    corner = study.plan_v3(study.parse_args(["--design", "v4", "--experiments", "v4corner"]))
    assert [(c[1], c[2]) for c in corner] == [(0.1, "topk"), (0.1, "randomk"), (0.1, "ascend_v4")]
    corner_cfg = study.base_config(args, corner[0][3])
    assert corner_cfg["clients"]["profiles"]["devices"] == {"edge_gpu": 1.0}
    assert corner_cfg["train"]["local_steps"] == 1
    load_config(corner_cfg)
    assert study.variant_algorithm("topk", 0.1, args)["reward"] == "v3"
    load_config({**cfg, "algorithm": algo})  # the schema accepts it (the data file is read only at run time)
