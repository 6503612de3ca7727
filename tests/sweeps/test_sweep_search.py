"""Sweep search algorithms (Optuna through Ray Tune), repeats over paired seeds with
per-configuration intervals, scheduler budgets in simulated units, their validation, the example
specs and the statistics behind them (hypervolume, t-intervals)."""
import math
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers.sweeps import BASE, EXAMPLES, InterruptAfterFirstTrial, direct_rounds, spec  # the same tiny experiment
from scipy import stats as scipy_stats

from algorithms import ALGORITHMS
from hetsim.cli import main
from sweeps import SweepSpecError, resolve
from sweeps.search import TRIAL_INDEX
from sweeps.stats import hypervolume_2d, pareto_mask, t_half_width

FEDAVG = {**BASE, "algorithm": {"name": "fedavg"}}
TWO_OBJECTIVES = [{"name": "global_acc", "mode": "max"}, {"name": "total_bytes_up", "mode": "min"}]


def optuna_spec(**kw):
    kw = {"search": {"algorithm": "optuna", "seed": 3}, **kw}
    return spec(base=FEDAVG, space={"train.lr": {"loguniform": [0.01, 0.3]},
                                    "clients.participation": {"grid": [0.3, 0.6]}}, **kw)


# ---------------------------------------------------------------- validation (no Ray)


@pytest.mark.parametrize("bad, pattern", [
    ({"search": {"algorithm": "hyperopt"}},
     r"search\.algorithm = 'hyperopt': Input should be 'grid', 'random' or 'optuna'"),
    ({"search": {"algorithm": "optuna", "sampler": "smac"}},
     r"search\.sampler = 'smac': not an Optuna sampler.*allowed: tpe, nsga2, nsga3, gp, qmc, random, cmaes"),
    ({"search": {"algorithm": "random", "sampler": "tpe"}},
     r"search\.sampler = 'tpe': only search\.algorithm 'optuna' has a sampler \(algorithm is 'random'\)"),
    ({"search": {"algorithm": "optuna", "sampler_options": {"n_startup": 3}}},
     r"search\.sampler_options\.n_startup: not an option of TPESampler.*allowed: .*n_startup_trials"),
    ({"search": {"algorithm": "optuna", "sampler_options": {"seed": 3}}}, r"\(the seed is search\.seed\)"),
    ({"search": {"algorithm": "optuna", "sampler": "cmaes"}},
     r"search\.sampler = 'cmaes': Optuna's CmaEsSampler needs the package cmaes.*pip install cmaes"),
    ({"search": {"algorithm": "optuna"}, "scheduler": {"name": "pbt"}},
     r"scheduler\.name = 'pbt' with search\.algorithm = 'optuna': Tune's Population Based Training"),
    ({"search": {"algorithm": "grid"}, "space": {"train.lr": {"uniform": [0.01, 0.1]}}},
     r"space\.train\.lr = \{uniform: \.\.\.\}: search\.algorithm 'grid' takes grid, named and cases dimensions only"),
    ({"search": {"algorithm": "optuna"}, "space": {"clients.profiles": {"grid": [{}, {"availability": 0.5}]}}},
     r"space\.clients\.profiles\.grid: value \{\}: Optuna's categorical choices.*\{named: \{name: value\}\}"),
    ({"search": {"algorithm": "optuna", "seed": -1}}, r"search\.seed = -1: Input should be greater than or equal to 0"),
    ({"search": {"algorithm": "optuna", "budget": 3}}, r"search\.budget = 3: unknown key; allowed keys: algorithm, "
                                                       r"sampler, seed, sampler_options"),
    ({"objectives": [{"name": "global_acc"}]}, r"objectives\.0\.mode: required; give mode"),
    ({"repeats": 0}, r"repeats = 0: Input should be greater than or equal to 1"),
    ({"repeats": 2, "space": {"seed": {"grid": [0, 1]}}}, r"repeats = 2: the space sweeps seed itself"),
    ({"repeats": 2, "scheduler": {"name": "pbt"}}, r"repeats = 2 with scheduler 'pbt'.*allowed: repeats: 1"),
    ({"scheduler": {"name": "asha", "time_attr": "wall_s"}},
     r"scheduler\.time_attr = 'wall_s': Input should be 'rounds', 'sim_time_s' or 'bytes_up'"),
    ({"scheduler": {"name": "fifo", "time_attr": "sim_time_s"}},
     r"scheduler\.time_attr = 'sim_time_s': only the asha and pbt schedulers count a budget"),
    ({"scheduler": {"name": "asha", "time_attr": "sim_time_s"}},
     r"scheduler\.max_t = None: with time_attr 'sim_time_s' ASHA needs its budget in simulated seconds"),
    ({"scheduler": {"name": "asha", "time_attr": "sim_time_s", "grace_period": 2.0, "max_t": 1.5}},
     r"scheduler\.grace_period = 2\.0: must be < max_t \(1\.5 simulated seconds\)"),
    ({"scheduler": {"name": "asha", "time_attr": "bytes_up", "grace_period": 1, "max_t": 5.0e6}},
     r"scheduler\.grace_period = 1: with time_attr 'bytes_up' it counts cumulative upload bytes; give at least 1000"),
    ({"scheduler": {"name": "asha", "grace_period": 1.5}},
     r"scheduler\.grace_period = 1\.5: with time_attr 'rounds' it counts rounds; give a whole number"),
    ({"scheduler": {"name": "asha", "grace_period": 0}},
     r"scheduler\.grace_period = 0: Input should be greater than 0"),
])
def test_bad_search_settings_are_refused_naming_field_value_and_allowed(bad, pattern):
    with pytest.raises(SweepSpecError, match=pattern) as info:
        resolve(spec(**bad))
    assert str(info.value).startswith("invalid sweep spec")


def test_a_missing_optuna_or_sampler_package_is_named_with_its_install_command(monkeypatch):
    import sweeps.search

    monkeypatch.setattr(sweeps.search, "installed", lambda package: package != "optuna")
    with pytest.raises(SweepSpecError, match=r"search\.algorithm = 'optuna': the package optuna is not installed; "
                                             r"pip install 'hetsim\[search\]' \(or pip install optuna\)"):
        resolve(optuna_spec())
    # a single-objective sampler with two objectives (cmaes "installed" here to get past its package)
    monkeypatch.setattr(sweeps.search, "installed", lambda package: True)
    with pytest.raises(SweepSpecError, match=r"search\.sampler = 'cmaes': CmaEsSampler optimises one objective but "
                                             r"the spec has 2 \(objectives\); multi-objective samplers: tpe, nsga2"):
        resolve(optuna_spec(objectives=TWO_OBJECTIVES) | {"search": {"algorithm": "optuna", "sampler": "cmaes"}})


def test_trial_counts_seeds_and_param_space_of_repeats_and_searchers():
    from sweeps.searchers import param_space, tune_num_samples

    r = resolve(spec(repeats=3, num_samples=2))  # 2 x 2 grid x 2 samples x 3 repeats
    assert r.num_trials == 24 and tune_num_samples(r) == 2
    space = param_space(r)
    assert space[TRIAL_INDEX] == {"grid_search": [0, 1, 2]}
    assert TRIAL_INDEX == __import__("ray.tune.search.repeater", fromlist=["TRIAL_INDEX"]).TRIAL_INDEX
    raw = r.trial_raw({"train.lr": 0.1, "algorithm.mu": 0.0, TRIAL_INDEX: 2})
    assert raw["seed"] == BASE["seed"] + 2 and raw["train"]["lr"] == 0.1
    assert r.trial_raw({"train.lr": 0.1, "algorithm.mu": 0.0, TRIAL_INDEX: 0})["seed"] == BASE["seed"]
    o = resolve(optuna_spec(num_samples=5, repeats=2))  # a searcher: suggestions x repeats, grid drawn as choice
    assert o.num_trials == 10 and tune_num_samples(o) == 10
    assert TRIAL_INDEX not in param_space(o)
    assert param_space(o)["clients.participation"].categories == [0.3, 0.6]
    assert "search: optuna (tpe), 5 suggestion(s)" in __import__("sweeps.runner", fromlist=["x"]).dry_run_text(
        optuna_spec(num_samples=5, repeats=2))


def _drive(resolved, n, value):
    """Ask the sweep's searcher for n configurations, telling it value(config) after each."""
    from sweeps.searchers import param_space, search_alg

    searcher = search_alg(resolved)
    searcher.set_search_properties(None, None, param_space(resolved))
    configs = []
    for i in range(n):
        config = searcher.suggest(f"t{i}")
        configs.append(config)
        searcher.on_trial_complete(f"t{i}", result=value(config))
    return configs


def test_optuna_is_seeded_same_seed_same_configurations():
    def value(c):
        return {"trial_best_global_acc": -abs(math.log(c["train.lr"] / 0.1)) + c["clients.participation"]}

    sampler = {"sampler": "tpe", "sampler_options": {"n_startup_trials": 2}}
    one = _drive(resolve(optuna_spec(search={"algorithm": "optuna", "seed": 3, **sampler})), 6, value)
    two = _drive(resolve(optuna_spec(search={"algorithm": "optuna", "seed": 3, **sampler})), 6, value)
    other = _drive(resolve(optuna_spec(search={"algorithm": "optuna", "seed": 4, **sampler})), 6, value)
    assert one == two
    assert one != other
    assert all(0.01 <= c["train.lr"] <= 0.3 and c["clients.participation"] in (0.3, 0.6) for c in one)
    # the seed defaults to the spec's search_seed
    default = _drive(resolve(optuna_spec(search={"algorithm": "optuna", **sampler}, search_seed=3)), 6, value)
    assert default == one


def test_multi_objective_repeats_tell_optuna_each_objective_mean():
    """MeanRepeater: each suggestion runs `repeats` times with the repeat index set; Optuna is
    told each objective's mean over them (Tune's own Repeater takes one metric only)."""
    r = resolve(optuna_spec(repeats=2, objectives=TWO_OBJECTIVES,
                            search={"algorithm": "optuna", "sampler": "nsga2", "seed": 0}))
    values = iter([(0.5, 100.0), (0.7, 300.0), (0.2, 50.0), (0.4, 70.0)])

    def value(config):
        acc, up = next(values)
        return {"trial_objective_global_acc": acc, "trial_total_bytes_up": up}

    configs = _drive(r, 4, value)
    assert [c[TRIAL_INDEX] for c in configs] == [0, 1, 0, 1]
    assert {k: v for k, v in configs[0].items() if k != TRIAL_INDEX} == \
        {k: v for k, v in configs[1].items() if k != TRIAL_INDEX}
    from sweeps.searchers import search_alg  # the study behind the repeater got two trials, the means
    searcher = search_alg(r)
    searcher.set_search_properties(None, None, __import__("sweeps.searchers", fromlist=["x"]).param_space(r))
    values = iter([(0.5, 100.0), (0.7, 300.0), (0.2, 50.0), (0.4, 70.0)])
    for i in range(4):
        searcher.suggest(f"t{i}")
        searcher.on_trial_complete(f"t{i}", result=value(None))
    study = searcher.searcher._ot_study
    assert [t.values for t in study.trials] == [[pytest.approx(0.6), 200.0], [pytest.approx(0.3), 60.0]]


# ---------------------------------------------------------------- statistics (no Ray)


def test_hypervolume_2d_of_a_hand_computed_front():
    # maximise x, minimise y; reference (0, 10). Points (4, 2), (2, 1), (1, 5 dominated by (2, 1)),
    # (5, 12 worse than the reference in y: adds nothing). As minimisation of (-x, y): boxes
    # [-4, 0] x [2, 10] and [-2, 0] x [1, 10]: 4*8 + 2*1 = 34
    pts = np.array([[4, 2], [2, 1], [1, 5], [5, 12]], dtype=float)
    assert hypervolume_2d(pts, (0, 10), ("max", "min")) == pytest.approx(34.0)
    assert hypervolume_2d(pts[:1], (0, 10), ("max", "min")) == pytest.approx(32.0)
    assert hypervolume_2d(np.empty((0, 2)), (0, 10), ("max", "min")) == 0.0
    assert hypervolume_2d(np.array([[1.0, 1.0], [np.nan, 0.0]]), (2, 2), ("min", "min")) == pytest.approx(1.0)
    # both minimised: the union of three boxes
    three = np.array([[1, 3], [2, 2], [3, 1]], dtype=float)
    assert hypervolume_2d(three, (4, 4), ("min", "min")) == pytest.approx(3 + 2 + 1)
    assert pareto_mask(pts, ["max", "min"]).tolist() == [True, True, False, True]


def test_t_half_width_is_scipys_t_interval():
    x = np.array([0.3, 0.5, 0.4, 0.7])
    low, high = scipy_stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=scipy_stats.sem(x))
    half = t_half_width(np.array([x.std(ddof=1)]), np.array([len(x)]))[0]
    assert half == pytest.approx((high - low) / 2)
    assert math.isnan(t_half_width(np.array([0.0]), np.array([1]))[0])


# ---------------------------------------------------------------- example specs (no Ray)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_spec_resolves_and_dry_runs(path, capsys):
    raw = yaml.safe_load(path.read_text())
    algo = (raw.get("base") or {}).get("algorithm", {}).get("name") if isinstance(raw.get("base"), dict) else None
    if algo is None and isinstance(raw.get("base"), str):
        algo = yaml.safe_load((path.parent / raw["base"]).read_text())["algorithm"]["name"]
    if algo and algo not in ALGORITHMS:
        pytest.skip(f"{algo} is not registered")
    r = resolve(path)
    assert r.num_trials >= 1
    assert main(["sweep", str(path), "--dry-run"]) == 0
    assert f"sweep {r.name}: {r.num_trials} trial(s)" in capsys.readouterr().out


def test_the_trade_off_examples_search_and_repeat_as_documented():
    if "fedcspack" in ALGORITHMS:
        f = resolve(EXAMPLES / "fedcspack_optuna.yaml")
        assert f.spec.search.algorithm == "optuna" and f.spec.search.sampler == "tpe"
        assert [(o.name, o.mode) for o in f.spec.objectives] == [("pers_acc", "max"), ("total_bytes_up", "min")]
        assert f.num_trials == 32 and f.rounds <= 8
    if "ascend" in ALGORITHMS:
        a = resolve(EXAMPLES / "ascend_repeats.yaml")
        assert a.spec.repeats == 3 and a.num_trials == 8 * 3
        assert set(a.param_columns.values()) == {"epsilon", "gamma", "k"}
        assert [(o.name, o.mode) for o in a.spec.objectives] == [("global_acc", "max"), ("total_sim_time_s", "min")]


# ---------------------------------------------------------------- sweeps on Ray


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


@pytest.mark.ray
def test_repeats_run_every_configuration_with_paired_seeds_and_intervals(tmp_path, local_ray):
    from sweeps import run_sweep
    from sweeps.runner import summary_table

    # a sampled lr and a grid: 2 samples x 2 grid points = 4 configurations x 3 seeds; one trial
    # at a time: one trial process (a few CPU seconds to start) runs all twelve
    s = run_sweep(spec(base=FEDAVG, space={"train.lr": {"uniform": [0.05, 0.2]},
                                           "clients.participation": {"grid": [0.3, 0.6]}},
                       num_samples=2, repeats=3, objectives=TWO_OBJECTIVES, max_concurrent_trials=1),
                  storage=tmp_path / "sw", quiet=True)
    t = s.trials
    assert len(t) == 12 and (t["status"] == "finished").all(), t["error"].tolist()
    assert s.num_trials == 12 and s.complete
    by_config = t.groupby("config_id")
    assert by_config.ngroups == 4 and (by_config.size() == 3).all()
    # every configuration has the same values in its repeats and the seeds 0, 1, 2 (paired)
    assert (by_config[["lr", "participation"]].nunique() == 1).all().all()
    assert (by_config["seed"].apply(sorted).map(tuple) == (0, 1, 2)).all()
    assert (t["seed"] == BASE["seed"] + t["repeat"]).all()
    for row in t.itertuples():  # the run itself used that seed
        assert s.run(row.trial_id).config["seed"] == row.seed
    one = t.iloc[0]  # and equals the direct run of its configuration with that seed
    direct = direct_rounds(tmp_path, {"train.lr": one.lr, "clients.participation": one.participation,
                                      "seed": int(one.seed), "algorithm.name": "fedavg"}, "d")
    assert one.final_global_acc == direct["global_acc"].iloc[-1]

    # configs.parquet against a pandas recomputation
    c = s.configs.set_index("config_id")
    assert (tmp_path / "sw" / "configs.parquet").is_file()
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "sw" / "configs.parquet"), s.configs)
    for col in ("best_global_acc", "objective_global_acc", "total_bytes_up", "total_sim_time_s", "total_energy_j"):
        g = t.groupby("config_id")[col]
        mean, std, n = g.mean(), g.std(ddof=1), g.count()
        half = scipy_stats.t.ppf(0.975, n - 1) * std / np.sqrt(n)
        np.testing.assert_allclose(c[f"{col}_mean"], mean[c.index], rtol=1e-12)
        np.testing.assert_allclose(c[f"{col}_std"], std[c.index], rtol=1e-12)
        np.testing.assert_allclose(c[f"{col}_ci_low"], (mean - half)[c.index], rtol=1e-9)
        np.testing.assert_allclose(c[f"{col}_ci_high"], (mean + half)[c.index], rtol=1e-9)
    assert (c["n"] == 3).all()
    # ranked by the mean; within noise = the interval overlaps the best's
    assert s.configs["best_global_acc_mean"].is_monotonic_decreasing
    best = c.iloc[0]
    overlap = (c["best_global_acc_ci_low"] <= best["best_global_acc_ci_high"]) & \
        (c["best_global_acc_ci_high"] >= best["best_global_acc_ci_low"])
    assert c["within_noise_of_best"].tolist() == overlap.tolist() and best["within_noise_of_best"]
    top = s.best(2)
    assert top["config_id"].tolist() == s.configs["config_id"].tolist()[:2]
    # Pareto membership of the means, marked on every trial of a Pareto-optimal configuration
    means = c[["objective_global_acc_mean", "total_bytes_up_mean"]].to_numpy()
    assert c["pareto"].tolist() == pareto_mask(means, ["max", "min"]).tolist()
    assert (t["pareto"] == t["config_id"].map(c["pareto"])).all()
    text = summary_table(s)
    assert "configurations (3 seeds each) by mean best_global_acc" in text and "within_noise_of_best" in text
    from hetsim.report import build_report
    html = build_report(s.path, tmp_path / "sweep.html").read_text()
    assert 'id="table-sweep-configs"' in html and "95 %" in html and 'id="fig-sweep-pareto"' in html
    for fig in ("fig-sweep-configs", "fig-sweep-pareto"):  # drawn, not omitted
        assert (tmp_path / "sweep_figures" / f"{fig}.png").is_file(), fig


def _searcher_study(storage: Path):
    states = sorted((storage / "tune").glob("searcher-state-*.pkl"))
    assert states, "Tune saved no searcher state"
    with open(states[-1], "rb") as f:
        return pickle.load(f)["_ot_study"]


@pytest.mark.ray
def test_an_interrupted_optuna_sweep_resumes_its_search(tmp_path, local_ray):
    from sweeps import resume_sweep, run_sweep

    storage = tmp_path / "sw"
    search = {"algorithm": "optuna", "sampler": "tpe", "seed": 1, "sampler_options": {"n_startup_trials": 2}}
    s = optuna_spec(num_samples=4, max_concurrent_trials=1, objectives=TWO_OBJECTIVES, search=search)
    first = run_sweep(s, storage=storage, quiet=True, callbacks=[InterruptAfterFirstTrial()])
    done = first.trials[first.trials["status"] == "finished"]
    assert 1 <= len(done) < 4 and len(first.trials) < 4
    told = [t for t in _searcher_study(storage).trials if t.state.name == "COMPLETE"]
    assert len(told) == len(done)
    stamps = {p.parent.name: p.stat().st_mtime_ns for p in (storage / "runs").glob("*/manifest.json")}

    resumed = resume_sweep(storage, quiet=True)
    t = resumed.trials
    assert len(t) == 4 and (t["status"] == "finished").all() and resumed.complete
    for trial_id in done["trial_id"]:  # not rerun
        assert (storage / "runs" / trial_id / "manifest.json").stat().st_mtime_ns == stamps[trial_id]
    # one study went on: 4 trials in all, the first ones the trials before the interruption, and
    # Optuna was told each trial's values as trials.parquet computes them
    study = _searcher_study(storage)
    assert len(study.trials) == 4 and all(x.state.name == "COMPLETE" for x in study.trials)
    assert [x.params for x in study.trials[:len(told)]] == [x.params for x in told]
    got = sorted(tuple(x.values) for x in study.trials)
    want = sorted(zip(t["objective_global_acc"], t["total_bytes_up"].astype(float)))
    assert got == [pytest.approx(w) for w in want]
    assert sorted(x.params["train.lr"] for x in study.trials) == pytest.approx(sorted(t["lr"]))


@pytest.mark.ray
def test_asha_with_time_attr_sim_time_s_stops_trials_by_simulated_seconds(tmp_path, local_ray):
    from sweeps import run_sweep

    base = {**FEDAVG, "rounds": 4}
    direct = direct_rounds(tmp_path, {"rounds": 4, "algorithm.name": "fedavg", "train.lr": 0.1}, "d")
    sim = direct["sim_time_s"].to_numpy()  # cumulative simulated seconds at the end of each round
    budget = float((sim[1] + sim[2]) / 2)  # between the ends of rounds 2 and 3
    s = run_sweep(spec(base=base, space={"train.lr": {"grid": [0.1]}},
                       scheduler={"name": "asha", "time_attr": "sim_time_s", "grace_period": float(sim[0] / 2),
                                  "max_t": budget}), storage=tmp_path / "sw", quiet=True)
    t = s.trials.iloc[0]
    # the first result at or past the budget (round 3) is the last: stopped by simulated seconds
    assert t["status"] == "early_stopped" and t["rounds_done"] == 3
    assert t["total_sim_time_s"] == pytest.approx(sim[2]) and t["total_sim_time_s"] >= budget > sim[1]
    results = pd.read_json(next((tmp_path / "sw" / "tune").glob("*/result.json")), lines=True)
    assert results["total_sim_time_s"].tolist() == pytest.approx(sim[:3].tolist())
    assert results["total_bytes_up"].tolist() == direct["bytes_up"].cumsum().iloc[:3].tolist()
