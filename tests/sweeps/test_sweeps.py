"""Ray Tune sweeps: spec validation (no Ray), results equal to direct runs, failures, resume,
the Ray executor inside trials and the CLI (multi-node clusters: test_cluster.py)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import one_torch_thread
from helpers.sweeps import BASE, EXAMPLES, InterruptAfterFirstTrial, direct_rounds, spec

from algorithms import ALGORITHMS
from engine.config.schema import load_config
from engine.results.manifest import write_manifest
from engine.results.tables import ROUND_COLUMNS, WALL_COLUMNS, load_run
from engine.run.api import run_experiment
from hetsim.cli import main
from sweeps import SweepSpecError, load_sweep, resolve
from sweeps.spec import param_column_names

# ---------------------------------------------------------------- specs (no Ray)


@pytest.mark.parametrize(
    "bad, pattern",
    [
        ({"space": {"train.learning_rate": {"grid": [0.1]}}},
         r"space\.train\.learning_rate.*train\.learning_rate = 0\.1: unknown key; allowed keys: .*\blr\b"),
        ({"space": {"train.lr": {"uniform": [-1, 0.1]}}},
         r"space\.train\.lr\.uniform = \[-1\.0, 0\.1\]: value -1\.0 .*"
         r"train\.lr = -1\.0: Input should be greater than 0"),
        ({"space": {"train.lr": {"loguniform": [0, 0.1]}}}, r"space\.train\.lr\.loguniform.*bounds must be > 0"),
        ({"space": {"clients.participation": {"grid": [0.5, 1.5]}}},
         r"value 1\.5 .*clients\.participation = 1\.5: Input should be less than or equal to 1"),
        ({"space": {"train.lr": {"normal": [0, 1]}}},
         r"space\.train\.lr = \{'normal': \[0, 1\]\}: must be one of \{grid: \.\.\.\}, \{choice: \.\.\.\}, "
         r"\{uniform: \.\.\.\}, \{loguniform: \.\.\.\}, \{randint: \.\.\.\}"),
        ({"space": {"train.lr": {"grid": []}}}, r"space\.train\.lr\.grid = \[\]: must be a non-empty list"),
        ({"space": {"train.lr": {"uniform": [0.1, 0.01]}}}, r"low < high"),
        ({"space": {"train.local_epochs": {"randint": [1, 1]}}}, r"randint = \[1, 1\].*high is exclusive"),
        ({"scheduler": {"name": "asha", "metric": "accuracy"}},
         r"scheduler\.metric = 'accuracy': not a rounds\.parquet column; allowed: round, .*global_acc"),
        ({"metric": "acc"}, r"metric = 'acc': not a rounds\.parquet column"),
        ({"mode": "maximize"}, r"mode = 'maximize': Input should be 'max' or 'min'"),
        # the field as written: `scheduler: hyperband` is the short form of scheduler.name
        ({"scheduler": "hyperband"}, r"  scheduler = 'hyperband': Input should be 'fifo', 'asha' or 'pbt'"),
        ({"scheduler": {"name": "asha", "max_t": 5}},
         r"scheduler\.max_t = 5: must be <= the experiment's rounds \(2\)"),
        ({"samples": 3}, r"samples = 3: unknown key; did you mean 'num_samples'\? allowed keys: name, base, "
         r"overrides, space, num_samples"),
        ({"num_samples": 0}, r"num_samples = 0: Input should be greater than or equal to 1"),
        ({"space": {"algorithm.pack_size": {"grid": [256]}}},
         r"algorithm\.pack_size = 256: unknown key.*the base's algorithm 'fedprox' has keys: mu"),
        ({"space": {"output.dir": {"grid": ["a"]}}}, r"space\.output\.dir: output is fixed for the whole sweep"),
        ({"space": {}}, r"space = \{\}: give at least one"),
        ({"base": {**BASE, "rounds": 0}}, r"base: rounds = 0: Input should be greater than or equal to 1"),
        ({"overrides": ["executor.kind=ray"]}, r"executor\.num_actors"),
        ({"rank_by": "time_to_target"}, r"rank_by = 'time_to_target' needs a target"),
        ({"target": float("nan")}, r"target = nan: give a finite value"),
        ({"rank_by": "fastest"}, r"rank_by = 'fastest': Input should be 'best', 'final' or 'time_to_target'"),
    ],
)
def test_bad_specs_are_errors_naming_field_value_and_allowed(bad, pattern):
    with pytest.raises(SweepSpecError, match=pattern) as info:
        resolve(spec(**bad))
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("invalid sweep spec")


def test_spec_resolution_counts_trials_names_columns_and_reads_yaml_floats(tmp_path):
    base_file = tmp_path / "exp.yaml"
    base_file.write_text(yaml.safe_dump(BASE))
    spec_file = tmp_path / "my_sweep.yaml"
    spec_file.write_text(
        "base: exp.yaml\n"
        "overrides: [rounds=3]\n"
        "space:\n"
        "  train.lr: {loguniform: [1e-3, 1e-1]}\n"  # PyYAML reads 1e-3 as a string
        "  algorithm.mu: {grid: [0, 1e-2]}\n"
        "num_samples: 3\n"
    )
    r = resolve(spec_file)
    assert r.name == "my_sweep"
    assert r.storage == str((Path.cwd() / "sweeps_out" / "my_sweep").resolve())
    assert r.spec.space["train.lr"] == {"loguniform": [0.001, 0.1]}
    assert r.spec.space["algorithm.mu"] == {"grid": [0, 0.01]}
    assert r.num_trials == 2 * 3
    assert r.rounds == 3 and r.base_raw["rounds"] == 3
    assert r.param_columns == {"train.lr": "lr", "algorithm.mu": "mu"}
    # two keys with the same last component keep their full dotted names
    assert param_column_names(["train.batch_size", "evaluation.batch_size", "algorithm.k"]) == {
        "train.batch_size": "train.batch_size", "evaluation.batch_size": "evaluation.batch_size",
        "algorithm.k": "k"}


def test_example_specs_validate():
    r = resolve(EXAMPLES / "fedavg_lr.yaml")
    assert r.num_trials == 6 and set(r.param_columns.values()) == {"lr", "participation"}
    r = resolve(EXAMPLES / "fedprox_lr_mu.yaml")
    assert r.num_trials == 6 and r.param_columns == {"train.lr": "lr", "algorithm.mu": "mu"}
    if "ascend" in ALGORITHMS:
        r = resolve(EXAMPLES / "ascend_eps_gamma.yaml")
        assert r.num_trials == 6
        assert r.param_columns == {"algorithm.epsilon": "epsilon", "algorithm.gamma": "gamma"}
        assert r.spec.scheduler.name == "fifo" and r.rounds == 30


@pytest.mark.skipif("fedcspack" not in ALGORITHMS, reason="FedCSPACK is not registered")
def test_fedcspack_example_spec_validates_and_checks_its_keys():
    r = resolve(EXAMPLES / "fedcspack_pack_k.yaml")
    assert r.num_trials == 27
    assert r.param_columns == {"algorithm.pack_size": "pack_size", "algorithm.k": "k",
                               "algorithm.weighting": "weighting"}
    assert r.spec.space["algorithm.k"] == {"grid": [0.1, 0.3, "all"]}
    assert r.spec.metric == "pers_acc"
    raw = yaml.safe_load((EXAMPLES / "fedcspack_pack_k.yaml").read_text())
    for key, dist, pattern in [
        ("algorithm.pack_size", {"grid": [256, 0]}, r"value 0 .*algorithm\.pack_size = 0"),
        ("algorithm.weighting", {"choice": ["cskd", "cos"]}, r"value 'cos' .*algorithm\.weighting"),
        ("algorithm.k", {"grid": [0.1, "most"]}, r"value 'most' .*algorithm\.k"),
    ]:
        with pytest.raises(SweepSpecError, match=pattern):
            resolve({**raw, "space": {**raw["space"], key: dist}})


def test_cli_reports_a_bad_spec_before_starting_anything(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec(space={"train.lr": {"uniform": [-1, 0.1]}})))
    assert main(["sweep", str(bad), "--storage", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "hetsim: invalid sweep spec" in err and "train.lr = -1.0" in err
    assert not (tmp_path / "out").exists()
    assert main(["sweep"]) == 2  # neither a spec nor --resume


def test_tables_are_rebuilt_from_run_folders_with_errors_and_mixed_value_types(tmp_path):
    """load_sweep(refresh=True) without any Tune state: a finished trial, an errored one and a
    hyperparameter whose values mix numbers and strings (like FedCSPACK's k: 0.5 | "all")."""
    from engine.results.tables import RunWriter
    from sweeps.trainable import _write_info

    storage = tmp_path / "sw"
    r = resolve(spec(space={"train.lr": {"grid": [0.05]}, "train.momentum": {"grid": [0.0]}}), storage=storage)
    sweep_dict = r.to_dict()
    sweep_dict["param_columns"] = {"train.lr": "lr", "algorithm.k": "k"}
    storage.mkdir(parents=True)
    (storage / "sweep.yaml").write_text(yaml.safe_dump(sweep_dict, sort_keys=False))
    with one_torch_thread():
        ok = run_experiment(load_config(BASE), storage / "runs" / "t_00000")
    _write_info(ok, {"trial_id": "t_00000", "params": {"train.lr": 0.05, "algorithm.k": 0.5},
                     "node_id": "n1", "status": "finished"})
    bad = storage / "runs" / "t_00001"
    RunWriter(bad)  # creates the folder
    write_manifest(bad, {"status": "failed", "error": "ValueError: boom"})
    _write_info(bad, {"trial_id": "t_00001", "params": {"train.lr": 0.1, "algorithm.k": "all"},
                      "node_id": "n1", "status": "error", "error": "ValueError: boom"})
    s = load_sweep(storage, refresh=True)
    t = s.trials.set_index("trial_id")
    assert t.loc["t_00000", "status"] == "finished" and t.loc["t_00000", "rounds_done"] == 2
    assert t.loc["t_00001", "status"] == "error" and t.loc["t_00001", "error"] == "ValueError: boom"
    assert t["k"].tolist() == ["0.5", "all"] and t["lr"].tolist() == [0.05, 0.1]
    assert t.loc["t_00000", "final_global_acc"] == load_run(ok).rounds["global_acc"].iloc[-1]
    assert list(s.rounds["trial_id"].unique()) == ["t_00000"] and list(s.rounds.columns[:3]) == ["trial_id", "lr", "k"]
    assert s.num_trials == 1 and s.complete


# ---------------------------------------------------------------- sweeps on Ray


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


OBJECTIVES = [{"name": "global_acc", "mode": "max"}, {"name": "total_sim_time_s", "mode": "min"}]
HOME_RESULTS = Path.home() / "ray_results"  # where Tune writes by default


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory, local_ray):
    """The plain grid sweep (no trackers) and whether ~/ray_results existed before it: read by
    the grid test and the no-trackers test (each Tune run starts its own trial process)."""
    from sweeps import run_sweep

    had_home_results = HOME_RESULTS.exists()
    # one trial at a time: one trial process (a few CPU seconds to start) runs all four
    sweep = run_sweep(spec(target=0.2, rank_by="time_to_target", objectives=OBJECTIVES, max_concurrent_trials=1),
                      storage=tmp_path_factory.mktemp("grid") / "sw", quiet=True)
    return sweep, had_home_results


@pytest.mark.ray
def test_grid_sweep_writes_parquet_and_matches_direct_runs(tmp_path, grid_sweep):
    from sweeps import run_sweep

    sweep, had_home_results = grid_sweep
    home_results, objectives = HOME_RESULTS, OBJECTIVES
    trials, rounds = sweep.trials, sweep.rounds

    assert len(trials) == 4 and trials["trial_id"].is_unique
    assert (trials["status"] == "finished").all() and (trials["error"] == "").all()
    assert sorted(zip(trials["lr"], trials["mu"])) == [(0.05, 0.0), (0.05, 0.1), (0.1, 0.0), (0.1, 0.1)]
    for col in ("trial_id", "lr", "mu", "status", "error", "run_dir", "rounds_done", "final_global_acc",
                "best_global_acc", "final_pers_acc", "best_pers_acc", "total_sim_time_s",
                "total_bytes_up", "total_bytes_down"):
        assert col in trials.columns, col
    assert (trials["rounds_done"] == 2).all()
    assert list(rounds.columns[:3]) == ["trial_id", "lr", "mu"]
    assert set(ROUND_COLUMNS) <= set(rounds.columns)
    assert len(rounds) == 4 * 2
    assert rounds.groupby(["lr", "mu"]).ngroups == 4

    # every trial equals the same config run directly (the engine is deterministic per seed)
    for t in trials.itertuples():
        direct = direct_rounds(tmp_path, {"train.lr": t.lr, "algorithm.mu": t.mu}, t.trial_id)
        mine = rounds[rounds["trial_id"] == t.trial_id].reset_index(drop=True)
        assert mine["global_acc"].tolist() == direct["global_acc"].tolist()
        pd.testing.assert_frame_equal(
            mine[list(direct.columns)].drop(columns=list(WALL_COLUMNS), errors="ignore"),
            direct.drop(columns=list(WALL_COLUMNS), errors="ignore"), check_dtype=False)
        assert t.final_global_acc == direct["global_acc"].iloc[-1]
        assert t.best_global_acc == direct["global_acc"].max()
        assert t.total_bytes_up == direct["bytes_up"].sum()
        assert t.total_energy_j == pytest.approx(direct["energy_j"].sum(), rel=1e-12) and t.total_energy_j > 0
        run = load_run(sweep.path / t.run_dir)
        assert run.manifest["status"] == "finished" and run.config["train"]["lr"] == t.lr

    # warm = cold: a trial run in a reused trial process (imports, dataset cache and models kept
    # from the trial before) equals its config run in a fresh process, table for table
    pids = {t.trial_id: json.loads((sweep.path / t.run_dir / "trial.json").read_text())["pid"]
            for t in trials.itertuples()}
    warm = [t for t in trials.itertuples() if list(pids.values()).count(pids[t.trial_id]) > 1]
    assert warm, f"Tune reused no trial process: {pids}"
    warm_dir = sweep.path / warm[-1].run_dir
    cold_dir = tmp_path / "cold"
    subprocess.run([sys.executable, "-m", "hetsim", "run", "-q", "-c", str(warm_dir / "config.yaml"),
                    "-o", str(cold_dir)], check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    cold, hot = load_run(cold_dir), load_run(warm_dir)
    for table in ("rounds", "clients"):
        pd.testing.assert_frame_equal(getattr(hot, table).drop(columns=list(WALL_COLUMNS), errors="ignore"),
                                      getattr(cold, table).drop(columns=list(WALL_COLUMNS), errors="ignore"))

    # time to the target: the first round at or above it, ranked fastest first
    for t in trials.itertuples():
        r = rounds[rounds["trial_id"] == t.trial_id]
        hit = r[r["global_acc"] >= 0.2]
        want = hit["sim_time_s"].iloc[0] if len(hit) else float("nan")
        assert trials.loc[trials["trial_id"] == t.trial_id, "time_to_global_acc_0.2"].item() == pytest.approx(
            want, nan_ok=True)
    assert sweep.rank_column == "time_to_global_acc_0.2"
    assert sweep.best(4)["time_to_global_acc_0.2"].dropna().is_monotonic_increasing
    from sweeps.runner import summary_table
    text = summary_table(sweep)
    assert "by time_to_global_acc_0.2 (min)" in text and " MB" in text
    from hetsim.results_cli import sweep_summary  # what `hetsim show <sweep folder>` prints
    assert text in sweep_summary(str(sweep.path))
    from hetsim.report import build_report  # two grids: the report's heat map of the pairs
    html = build_report(sweep.path, tmp_path / "sweep.html").read_text()
    assert 'id="fig-sweep-heatmap"' in html and (tmp_path / "sweep_figures" / "fig-sweep-heatmap.png").is_file()
    from sweeps.results import mark_pareto  # the marks, recomputed from the trials' rounds
    again = mark_pareto(trials.drop(columns=["pareto"]), rounds, objectives)
    assert trials["pareto"].tolist() == again["pareto"].tolist() and trials["pareto"].any()
    assert (trials["objective_global_acc"] == trials["best_global_acc"]).all()
    assert 'id="fig-sweep-pareto"' in html and 'id="table-sweep-pareto"' in html
    by_energy = sweep.best(4, by="total_energy_j")
    assert by_energy["total_energy_j"].is_monotonic_increasing and len(by_energy) == 4
    with pytest.raises(KeyError, match="no column 'energy'"):
        sweep.best(by="energy")

    # the folder: resolved spec, Parquet files, run folders, Tune state - and nothing in ~/ray_results
    loaded = load_sweep(sweep.path)
    pd.testing.assert_frame_equal(loaded.trials, trials)
    assert loaded.param_columns == {"train.lr": "lr", "algorithm.mu": "mu"}
    assert loaded.spec["base"]["algorithm"]["name"] == "fedprox"
    assert (sweep.path / "tune" / "tuner.pkl").is_file()
    assert home_results.exists() == had_home_results
    assert sweep.best(1, by="best_global_acc")["best_global_acc"].iloc[0] == trials["best_global_acc"].max()
    # the folder cannot be reused by accident
    with pytest.raises(FileExistsError, match="--resume"):
        run_sweep(spec(), storage=sweep.path, quiet=True)


@pytest.mark.ray
def test_without_trackers_no_tracker_files_are_written(grid_sweep):
    # the trackers themselves: test_sweep_trackers.py
    sweep, _ = grid_sweep
    storage = sweep.path
    assert sweep.complete
    files = [p.relative_to(storage).as_posix() for p in Path(storage).rglob("*") if p.is_file()]
    assert not [f for f in files if "tfevents" in f or "mlflow" in f or "mlartifacts" in f], files
    assert not (storage / "tensorboard").exists() and not (storage / "mlflow.db").exists()


@pytest.mark.ray
def test_run_cases_runs_a_studys_cases_once_and_a_later_call_only_what_is_left(tmp_path, local_ray):
    """sweeps.cases.run_cases: named runs as one sweep; each case's run equals its config run
    directly; a second call with one more case runs that case alone, in a second sweep."""
    from sweeps.cases import run_cases

    cases = {"a": {"train.lr": 0.05}, "b": {"train.lr": 0.1, "seed": 3}}
    with one_torch_thread():
        first = run_cases(cases, tmp_path, base=BASE, jobs=1, quiet=True)  # jobs=1: one trial process
        assert sorted(first) == ["a", "b"]
        second = run_cases({**cases, "c": {"algorithm.mu": 0.5}}, tmp_path, base=BASE, jobs=1, quiet=True)
    assert {k: second[k] for k in "ab"} == first
    assert sorted(p.name for p in (tmp_path / "sweeps").iterdir()) == ["0", "1"]
    assert second["c"].parent.parent.name == "1" and len(list((tmp_path / "sweeps" / "1" / "runs").iterdir())) == 1
    direct = direct_rounds(tmp_path, {"train.lr": 0.1, "seed": 3}, "b")
    pd.testing.assert_frame_equal(load_run(first["b"]).rounds.drop(columns=list(WALL_COLUMNS), errors="ignore"),
                                  direct.drop(columns=list(WALL_COLUMNS), errors="ignore"), check_dtype=False)


@pytest.mark.ray
def test_a_failing_trial_is_recorded_and_the_others_finish(tmp_path, local_ray, capsys):
    # a client that raises at run time (validation cannot see it coming) fails one trial
    fleet = {"num_clients": 10, "participation": 1.0, "profiles": {"availability": 1.0, "dropout": 0.0}}
    spec_file = tmp_path / "fail.yaml"
    spec_file.write_text(yaml.safe_dump(spec(
        base={**BASE, "clients": fleet},
        space={"executor.inject_failure": {"grid": [None, {"round": 1, "client": 3}]}},
        max_concurrent_trials=1,  # the failing trial runs in the first one's (reused) process
    )))
    assert main(["sweep", str(spec_file), "--storage", str(tmp_path / "sw"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "1 finished, 1 error" in out and "client 3 failed in round 1" in out
    trials = load_sweep(tmp_path / "sw").trials
    ok, failed = trials[trials["status"] == "finished"], trials[trials["status"] == "error"]
    assert len(ok) == len(failed) == 1
    assert (ok["rounds_done"] == 2).all() and (failed["rounds_done"] == 1).all()
    assert failed["error"].str.contains(
        "ClientFailure: client 3 failed in round 1: RuntimeError: failure injected").all()
    # the failed trial's own run folder says so too
    run = load_run(tmp_path / "sw" / failed["run_dir"].iloc[0])
    assert run.manifest["status"] == "failed"
    # retried, it keeps its identity: still one row per configuration, now with 2 attempts
    assert main(["sweep", "--resume", str(tmp_path / "sw"), "--retry-errored", "-q"]) == 0
    for again in (load_sweep(tmp_path / "sw"), load_sweep(tmp_path / "sw", refresh=True)):
        t = again.trials.set_index("trial_id")
        assert len(t) == 2
        assert t.loc[failed["trial_id"].iloc[0], "attempts"] == 2
        assert t.loc[failed["trial_id"].iloc[0], "status"] == "error"
        assert t.loc[ok["trial_id"].iloc[0], "attempts"] == 1
        assert t.loc[ok["trial_id"].iloc[0], "status"] == "finished"


def test_a_trial_value_the_data_cannot_take_is_refused_before_the_sweep_starts(tmp_path, capsys):
    # `mnist` is a valid name, but its files are not under dataset.root: the validation pass
    # (run on every value of the space) finds out before any trial runs
    spec_file = tmp_path / "fail.yaml"
    spec_file.write_text(yaml.safe_dump(spec(
        base={**BASE, "dataset": {"name": "digits", "root": str(tmp_path / "no-data")}},
        space={"dataset.name": {"grid": ["mnist", "digits"]}},
    )))
    assert main(["sweep", str(spec_file), "--storage", str(tmp_path / "sw"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "space.dataset.name.grid" in err and "value 'mnist'" in err and "missing 4 file(s)" in err
    assert not (tmp_path / "sw").exists()


@pytest.mark.ray
def test_asha_stops_worse_trials_early_and_keeps_their_rounds(tmp_path, local_ray):
    from sweeps import run_sweep

    # one at a time, best learning rate first: the later, worse ones fall below the first rung
    sweep = run_sweep(spec(base={**BASE, "rounds": 4, "algorithm": {"name": "fedavg"}},
                           space={"train.lr": {"grid": [0.2, 0.003, 0.001]}}, max_concurrent_trials=1,
                           scheduler={"name": "asha", "grace_period": 1, "reduction_factor": 2}),
                      storage=tmp_path / "sw", quiet=True)
    t = sweep.trials.set_index("lr")
    assert t.loc[0.2, "status"] == "finished" and t.loc[0.2, "rounds_done"] == 4
    stopped = t[t["status"] == "early_stopped"]
    assert len(stopped) == 2 and (stopped["rounds_done"] == 1).all()
    assert sweep.rounds.groupby("lr").size().to_dict() == t["rounds_done"].to_dict()
    manifest = sweep.run(stopped["trial_id"].iloc[0]).manifest
    assert manifest["status"] == "stopped" and "stopped by Tune after 1 round" in manifest["error"]


@pytest.mark.ray
def test_asha_compares_the_last_evaluated_value_when_rounds_are_not_all_evaluated(tmp_path, local_ray):
    from sweeps import run_sweep

    base = {**BASE, "rounds": 4, "algorithm": {"name": "fedavg"}, "evaluation": {"eval_every": 2}}
    asha = {"name": "asha", "grace_period": 1, "reduction_factor": 2}
    with pytest.raises(SweepSpecError, match=r"scheduler.grace_period = 1: ASHA's first decision comes after "
                                             r"1 round\(s\) but the experiment evaluates every 2 rounds"):
        resolve(spec(base=base, space={"train.lr": {"grid": [0.1]}}, scheduler=asha))
    # decisions after 2 rounds (an evaluated one): the later, worse trials are stopped there
    sweep = run_sweep(spec(base=base, space={"train.lr": {"grid": [0.2, 0.003, 0.001]}}, max_concurrent_trials=1,
                           scheduler={**asha, "grace_period": 2}), storage=tmp_path / "sw", quiet=True)
    t = sweep.trials.set_index("lr")
    assert t.loc[0.2, "status"] == "finished" and t.loc[0.2, "rounds_done"] == 4
    stopped = t[t["status"] == "early_stopped"]
    assert len(stopped) == 2 and (stopped["rounds_done"] == 2).all()
    # the unevaluated rounds stay NaN in the results
    assert sweep.rounds.loc[sweep.rounds["round"] % 2 == 0, "global_acc"].isna().all()


@pytest.mark.ray
def test_interrupted_sweep_resumes_without_rerunning_finished_trials(tmp_path, local_ray):
    from sweeps import resume_sweep, run_sweep
    from sweeps.runner import is_complete

    storage = tmp_path / "sw"
    first = run_sweep(spec(max_concurrent_trials=1), storage=storage, quiet=True,
                      callbacks=[InterruptAfterFirstTrial()])
    assert not is_complete(first)
    done_before = first.trials[first.trials["status"] == "finished"]
    # Tune creates trials lazily (one at a time here): the rest are not even known yet
    assert 1 <= len(done_before) < 4 and len(first.trials) < 4
    assert set(first.trials["status"]) <= {"finished", "unfinished"}

    def stamps():
        return {p.parent.name: p.stat().st_mtime_ns for p in (storage / "runs").glob("*/manifest.json")}

    before = stamps()
    resumed = resume_sweep(storage, quiet=True)
    assert is_complete(resumed) and (resumed.trials["status"] == "finished").all()
    assert len(resumed.trials) == 4
    after = stamps()
    for trial_id in done_before["trial_id"]:
        assert after[trial_id] == before[trial_id], f"finished trial {trial_id} was rerun"
    # results equal an uninterrupted sweep's: each trial equals the direct run of its config
    for t in resumed.trials.itertuples():
        direct = direct_rounds(tmp_path, {"train.lr": t.lr, "algorithm.mu": t.mu}, t.trial_id)
        assert t.final_global_acc == direct["global_acc"].iloc[-1]
    # resuming a complete sweep (here through the CLI) reruns nothing and rewrites identical tables
    trials_file = pd.read_parquet(storage / "trials.parquet")
    assert main(["sweep", "--resume", str(storage), "-q"]) == 0
    assert stamps() == after
    pd.testing.assert_frame_equal(pd.read_parquet(storage / "trials.parquet"), trials_file)
    pd.testing.assert_frame_equal(load_sweep(storage).rounds, resumed.rounds)


@pytest.mark.ray
def test_ray_executor_trials_run_their_actors_in_the_trial_placement_group(tmp_path, local_ray):
    from sweeps import run_sweep

    # one trial (each client actor is a new process importing torch: slow on 2 busy cores);
    # 0.01 + 2 x 0.45 CPUs per trial would let two such trials run at once on 2 CPUs
    ray_base = {**BASE, "executor": {"kind": "ray", "num_actors": 2, "cpus_per_actor": 0.45}}
    sweep = run_sweep(spec(base=ray_base, space={"train.lr": {"grid": [0.1]}}),
                      storage=tmp_path / "sw", quiet=True)
    assert len(sweep.trials) == 1
    assert (sweep.trials["status"] == "finished").all(), sweep.trials["error"].tolist()
    for t in sweep.trials.itertuples():
        run = sweep.run(t.trial_id)
        assert run.manifest["executor"]["kind"] == "ray"
        assert run.manifest["executor"]["actors"] == 2
        assert run.manifest["executor"]["placement_group"]
        direct = direct_rounds(tmp_path, {"train.lr": t.lr, "algorithm.mu": 0.01}, t.trial_id)
        assert run.rounds["global_acc"].tolist() == direct["global_acc"].tolist()


def test_named_dimension_and_column_names(tmp_path):
    """`named`: a grid over named values (Tune and the tables see the names, the trial applies
    the values); `columns` renames a hyperparameter column. What-if fleets are built on both."""
    fleets = {"fast": {"network": {"500mbps": 1.0}}, "slow": {"network": {"5mbps": 1.0}}}
    r = resolve(spec(space={"clients.profiles": {"named": fleets}, "train.lr": {"grid": [0.05, 0.1]}},
                     columns={"clients.profiles": "fleet"}))
    assert r.param_columns == {"clients.profiles": "fleet", "train.lr": "lr"}
    assert r.num_trials == 4
    raw = r.trial_raw({"clients.profiles": "slow", "train.lr": 0.1})
    assert raw["clients"]["profiles"] == fleets["slow"] and raw["train"]["lr"] == 0.1
    assert load_config(raw).clients.profiles.network == {"5mbps": 1.0}
    from sweeps.space import tune_param_space

    assert tune_param_space(r.spec.space)["clients.profiles"] == {"grid_search": ["fast", "slow"]}
    for bad, pattern in [
        ({"space": {"clients.profiles": {"named": {}}}}, r"named = \{\}: must be a non-empty mapping"),
        ({"space": {"clients.profiles": {"named": {"a b": {}}}}}, r"name 'a b' must be a string of letters"),
        ({"space": {"clients.profiles": {"named": {"x": {"availability": 2.0}}}}},
         r"named\.x: rejected by the experiment config: .*availability=2\.0 is not allowed"),
        ({"columns": {"train.momentum": "m"}}, r"columns\.train\.momentum: not a key of space"),
        ({"columns": {"train.lr": "round"}}, r"columns\.train\.lr = 'round': clashes with another column"),
    ]:
        with pytest.raises(SweepSpecError, match=pattern):
            resolve(spec(**bad))


def test_cases_dimension_applies_a_named_set_of_overrides_per_trial():
    """`cases`: a grid over named sets of overrides (a study's cells differ in several keys);
    Tune and the tables see the names, the trial applies the overrides; a case's seed is the
    seed its repeats count from."""
    cases = {"slow": {"train.lr": 0.01, "clients.profiles": {"network": {"5mbps": 1.0}}},
             "prox": {"algorithm": {"name": "fedprox", "mu": 0.5}, "seed": 7}}
    r = resolve(spec(space={"cell": {"cases": cases}, "train.batch_size": {"grid": [16, 32]}}, repeats=2))
    assert r.param_columns == {"cell": "cell", "train.batch_size": "batch_size"}
    assert r.num_trials == 2 * 2 * 2
    from sweeps.search import TRIAL_INDEX

    raw = r.trial_raw({"cell": "slow", "train.batch_size": 32, TRIAL_INDEX: 1})
    assert raw["train"]["lr"] == 0.01 and raw["train"]["batch_size"] == 32 and raw["seed"] == 1
    assert raw["clients"]["profiles"] == {"network": {"5mbps": 1.0}} and "cell" not in raw
    raw = r.trial_raw({"cell": "prox", "train.batch_size": 16, TRIAL_INDEX: 1})
    assert raw["algorithm"] == {"name": "fedprox", "mu": 0.5} and raw["seed"] == 8
    assert load_config(raw).algorithm.mu == 0.5
    from sweeps.space import tune_param_space

    assert tune_param_space(r.spec.space)["cell"] == {"grid_search": ["slow", "prox"]}
    for bad, pattern in [
        ({"cell": {"cases": {}}}, r"space\.cell\.cases = \{\}: must be a non-empty mapping"),
        ({"cell": {"cases": {"a": 0.1}}}, r"space\.cell\.cases\.a = 0\.1: must be a mapping \{dotted key"),
        ({"cell": {"cases": {"a": {"train lr": 1}}}}, r"cases\.a\.train lr: not a dotted config key"),
        ({"cell": {"cases": {"a": {"executor.kind": "ray"}}}}, r"cases\.a\.executor\.kind: executor\.kind is fixed"),
        ({"cell": {"cases": {"ok": {"train.lr": 0.1}, "a": {"train.lr": -1.0}}}},
         r"space\.cell\.cases\.a = \{'train\.lr': -1\.0\}: rejected by the experiment config: train\.lr"),
        ({"train": {"cases": {"a": {"train.lr": 0.1}}}}, r"space\.train: a cases dimension is named by a plain label"),
        ({"cell": {"cases": {"a": {"train.lr": 0.1}}}, "train.lr": {"grid": [0.2]}},
         r"space\.cell\.cases\.a\.train\.lr: also set by another dimension"),
    ]:
        with pytest.raises(SweepSpecError, match=pattern):
            resolve(spec(space=bad))
    with pytest.raises(SweepSpecError, match=r"cases dimension cannot be mutated by PBT"):
        resolve(spec(space={"cell": {"cases": cases}}, scheduler={"name": "pbt", "perturbation_interval": 1}))


def test_pareto_marks_a_front_known_by_construction():
    from sweeps.results import mark_pareto

    # accuracy (max) against upload bytes (min): a, b, c trade off; d is dominated by b; e is
    # diverged (never ranked); f ties b exactly (both on the front: neither is better in one)
    trials = pd.DataFrame({"trial_id": list("abcdef"), "status": ["finished"] * 4 + ["diverged", "finished"],
                           "total_bytes_up": [100, 200, 400, 300, 1, 200]})
    rounds = pd.DataFrame({"trial_id": list("aabbccddeeff"),
                           "pers_acc": [0.5, 0.6, 0.7, 0.8, 0.9, 0.85, 0.7, 0.75, 0.99, 0.99, 0.8, 0.7]})
    out = mark_pareto(trials, rounds, [{"name": "pers_acc", "mode": "max"}, {"name": "total_bytes_up", "mode": "min"}])
    assert out["objective_pers_acc"].tolist()[:4] == [0.6, 0.8, 0.9, 0.75]
    assert math.isnan(out["objective_pers_acc"].iloc[4])  # diverged: no value
    assert out.set_index("trial_id")["pareto"].to_dict() == {"a": True, "b": True, "c": True, "d": False,
                                                             "e": False, "f": True}
    one = mark_pareto(trials, rounds, [{"name": "total_bytes_up", "mode": "min"}])  # one objective: the best
    assert one.loc[one["pareto"], "trial_id"].tolist() == ["a"]


@pytest.mark.parametrize("objectives, pattern", [
    ([{"name": "accuracy", "mode": "max"}], r"objectives\[0\]\.name = 'accuracy': not a rounds\.parquet column.*"
                                            r"or a trials\.parquet total: total_sim_time_s"),
    ([{"name": "global_acc"}], r"objectives\.0\.mode"),
    ([{"name": "global_acc", "mode": "max"}, {"name": "global_acc", "mode": "min"}],
     r"objectives\[0\] and objectives\[1\] are both named 'global_acc'; give each its own name"),
    ([{"name": "time_to_global_acc_0.9", "mode": "min"}], r"time_to_<metric>_<target> of the spec's metric"),
])
def test_bad_objectives_are_refused(objectives, pattern):
    with pytest.raises(SweepSpecError, match=pattern):
        resolve(spec(objectives=objectives))
