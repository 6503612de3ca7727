"""Sweep trackers (`trackers: [tensorboard, mlflow]`): the spec's forms and errors (no Ray), and
a tiny real sweep, interrupted and resumed, read back with MLflow's own client and TensorBoard's
own reader: one run / one event folder per trial, one point per round equal to rounds.parquet,
the hyperparameters under the sweep's column names. That without trackers nothing of theirs is written
is checked on test_sweeps.py's grid sweep (a Tune run of its own here would start one more trial process)."""
import math
import os
import signal
import sys

import numpy as np
import pandas as pd
import pytest
from helpers.sweeps import BASE, GRID  # the same tiny experiment

from engine.results import WALL_COLUMNS
from sweeps import SweepSpecError, resolve
from sweeps.spec import ResolvedSweep
from sweeps.trackers import TrackersSpec, check_trackers


def spec(**kw):
    return {"name": "tr", "base": {**BASE, "rounds": 3}, "space": GRID, **kw}


TWO = {"train.lr": GRID["train.lr"], "algorithm.mu": {"grid": [0.1]}}  # 2 trials, 2 hyperparameter columns


# ---------------------------------------------------------------- specs (no Ray)


@pytest.mark.parametrize("form, names", [
    (["tensorboard", "mlflow"], ["tensorboard", "mlflow"]),
    ({"mlflow": {}, "tensorboard": {}}, ["tensorboard", "mlflow"]),
    ({"mlflow": {"experiment_name": "x"}, "tensorboard": None}, ["mlflow"]),
    ("mlflow", ["mlflow"]),
    (None, []),
])
def test_tracker_forms(form, names):
    assert TrackersSpec.model_validate(form).names == names


def test_trackers_resolve_and_survive_sweep_yaml(tmp_path):
    r = resolve(spec(trackers={"mlflow": {"tags": {"team": "fl"}}, "tensorboard": {}}), storage=tmp_path / "sw")
    assert r.spec.trackers.names == ["tensorboard", "mlflow"] and r.spec.trackers.mlflow.tags == {"team": "fl"}
    again = ResolvedSweep.from_dict(r.to_dict())  # what sweep.yaml holds and --resume rebuilds
    assert again.spec.trackers == r.spec.trackers


def test_no_trackers_by_default(tmp_path):
    r = resolve(spec(), storage=tmp_path / "sw")
    assert r.spec.trackers.names == []
    assert resolve(spec(trackers=[]), storage=tmp_path / "sw").spec.trackers.names == []


@pytest.mark.parametrize("trackers, pattern", [
    (["tensorboard", "wandb"], r"trackers\.wandb = \{\}: unknown key; allowed keys: tensorboard, mlflow"),
    ({"mlflow": {"uri": "sqlite:///x.db"}},
     r"trackers\.mlflow\.uri = 'sqlite:///x\.db': unknown key; allowed keys: tracking_uri, experiment_name, tags"),
    ([3], r"tracker 3 must be a name; allowed: tensorboard, mlflow"),
    ({"mlflow": {"tracking_uri": "ftp://host/x"}},
     r"trackers\.mlflow\.tracking_uri = 'ftp://host/x': unknown scheme 'ftp'; allowed: sqlite://, http://"),
    ({"mlflow": {"tracking_uri": "/tmp/mlflow.db"}},
     r"tracking_uri = '/tmp/mlflow\.db': unknown scheme '\(none\)'.*sqlite:////absolute/path/mlflow\.db"),
    ({"mlflow": {"tracking_uri": "file:///tmp/mlruns"}}, r"MLFLOW_ALLOW_FILE_STORE=true"),
])
def test_bad_trackers_are_errors_naming_field_value_and_allowed(trackers, pattern, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(SweepSpecError, match=pattern):
        resolve(spec(trackers=trackers), storage=tmp_path / "sw")


def test_good_tracking_uris_pass(tmp_path, monkeypatch):
    for uri in ("sqlite:////tmp/x.db", "http://127.0.0.1:5000", "postgresql+psycopg2://u@h/db", "databricks"):
        check_trackers(TrackersSpec.model_validate({"mlflow": {"tracking_uri": uri}}), str(tmp_path))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    check_trackers(TrackersSpec.model_validate({"mlflow": {"tracking_uri": "file:///tmp/m"}}), str(tmp_path))


def test_mlflow_default_store_needs_a_local_sweep_folder():
    with pytest.raises(ValueError, match=r"trackers\.mlflow\.tracking_uri = None: .*storage = 's3://b/sw' is a URI"):
        check_trackers(TrackersSpec.model_validate(["mlflow"]), "s3://b/sw")
    check_trackers(TrackersSpec.model_validate({"mlflow": {"tracking_uri": "http://h:5000"}}), "s3://b/sw")
    check_trackers(TrackersSpec.model_validate(["tensorboard"]), "s3://b/sw")  # uploaded, see docs


@pytest.mark.parametrize("tracker, module, dist", [("mlflow", "mlflow", "mlflow-skinny"),
                                                    ("tensorboard", "tensorboardX", "tensorboardX")])
def test_a_missing_tracker_package_names_it_and_the_install_command(tracker, module, dist, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # importlib.util.find_spec then reports it missing
    with pytest.raises(SweepSpecError, match=rf"trackers\.{tracker}: needs the package {dist} .*"
                                             r"pip install 'hetsim\[trackers\]'"):
        resolve(spec(trackers=[tracker]), storage=tmp_path / "sw")


# ---------------------------------------------------------------- a real sweep


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


def numeric_columns(rounds: pd.DataFrame, params: list[str]) -> list[str]:
    skip = {"trial_id", "restored_from", *params}
    return [c for c in rounds.columns if c not in skip and pd.api.types.is_numeric_dtype(rounds[c])
            and not pd.api.types.is_bool_dtype(rounds[c])]


class InterruptMidTrial:
    """SIGUSR1 (Tune's Ctrl+C) once the first trial has reported its first round: that trial is
    left unfinished with round 0 logged, and the resume restarts it from round 0."""

    def __init__(self):
        self.sent = False

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.sent and result.get("round") == 0:
            self.sent = True
            os.kill(os.getpid(), signal.SIGUSR1)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, local_ray):
    """2 trials x 3 rounds, one at a time, interrupted in the first trial and resumed."""
    from sweeps import resume_sweep, run_sweep

    storage = tmp_path_factory.mktemp("trackers") / "sw"
    first = run_sweep(spec(space=TWO, trackers=["tensorboard", "mlflow"], max_concurrent_trials=1,
                           columns={"train.lr": "learning_rate"}),
                      storage=storage, quiet=True, callbacks=[InterruptMidTrial()])
    assert not first.complete
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{storage}/mlflow.db")
    exp = client.get_experiment_by_name("tr")
    statuses = {r.data.tags["trial_id"]: r.info.status for r in client.search_runs([exp.experiment_id])}
    sweep = resume_sweep(storage, quiet=True)
    assert sweep.complete and (sweep.trials["status"] == "finished").all() and len(sweep.trials) == 2
    return sweep, storage, statuses


@pytest.mark.ray
def test_mlflow_has_one_run_per_trial_with_its_params_and_every_round(tracked):
    from mlflow.tracking import MlflowClient

    sweep, storage, before_resume = tracked
    assert list(before_resume.values()) == ["KILLED"]  # the first fit closed its interrupted trial's run
    (interrupted,) = before_resume
    assert sweep.trials.set_index("trial_id").loc[interrupted, "attempts"] == 2
    client = MlflowClient(tracking_uri=f"sqlite:///{storage}/mlflow.db")
    exp = client.get_experiment_by_name("tr")
    assert exp.artifact_location.startswith(str(storage))  # nothing in the current directory
    runs = client.search_runs([exp.experiment_id])
    by_trial = {r.data.tags["trial_id"]: r for r in runs}
    assert len(runs) == len(by_trial) == 2  # the resume continued the runs, it made no new ones
    assert set(by_trial) == set(sweep.trials["trial_id"])
    params = list(sweep.param_columns.values())
    assert params == ["learning_rate", "mu"]
    cols = numeric_columns(sweep.rounds, params)
    assert {"global_acc", "global_loss", "round", "sim_time_s"} <= set(cols)
    for t in sweep.trials.itertuples():
        run = by_trial[t.trial_id]
        assert run.info.status == "FINISHED" and run.info.run_name == t.trial_id
        assert run.data.params == {p: str(getattr(t, p)) for p in params}
        assert run.data.tags["sweep"] == "tr" and run.data.tags["sweep_storage"] == str(storage)
        rows = sweep.rounds[sweep.rounds["trial_id"] == t.trial_id].sort_values("round")
        for col in cols:
            history = sorted(client.get_metric_history(run.info.run_id, col), key=lambda m: m.step)
            assert [m.step for m in history] == list(range(3)), (t.trial_id, col)
            if col in WALL_COLUMNS:  # host time: the recomputed round's differs, the first start's is kept
                continue
            got, want = [m.value for m in history], rows[col].astype(float).tolist()
            assert all(g == w or (math.isnan(g) and math.isnan(w)) for g, w in zip(got, want)), (col, got, want)


@pytest.mark.ray
def test_tensorboard_has_one_event_folder_per_trial_with_every_round(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    sweep, storage, before_resume = tracked
    logdir = storage / "tensorboard"
    assert sorted(p.name for p in logdir.iterdir()) == sorted(sweep.trials["trial_id"])
    (interrupted,) = before_resume
    assert len(list((logdir / interrupted).glob("events.out.tfevents.*"))) == 2  # one per start
    params = list(sweep.param_columns.values())
    cols = numeric_columns(sweep.rounds, params)
    for t in sweep.trials.itertuples():
        acc = EventAccumulator(str(logdir / t.trial_id), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        rows = sweep.rounds[sweep.rounds["trial_id"] == t.trial_id].sort_values("round")
        for col in cols:
            want = [(int(r), float(v)) for r, v in zip(rows["round"], rows[col]) if not math.isnan(v)]
            if not want:
                continue  # NaN is not logged (as Tune's own logger)
            got = [(e.step, e.value) for e in acc.Scalars(col)]
            assert [s for s, _ in got] == [s for s, _ in want], (t.trial_id, col)  # each round once
            np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6)  # float32
        meta = acc.SummaryMetadata("_hparams_/session_start_info")
        info = plugin_data_pb2.HParamsPluginData.FromString(meta.plugin_data.content).session_start_info
        assert {k: v.number_value for k, v in info.hparams.items()} == {p: getattr(t, p) for p in params}


class FakeTrial:  # what the logger reads of Tune's Trial (hashable, like Trial)
    def __init__(self, trial_id, config):
        self.trial_id, self.config = trial_id, config


def test_tensorboard_on_object_storage_uploads_and_a_restart_shows_each_round_once(tmp_path):
    """Remote storage (a pyarrow filesystem that is not this disk): files are staged and
    uploaded; a later fit fetches them, and its restart from round 1 replaces rounds 1-2."""
    import pyarrow.fs as pafs
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from engine.results import Storage
    from sweeps.tracker_tensorboard import SweepTensorBoard

    (tmp_path / "bucket").mkdir()
    folder = Storage(pafs.SubTreeFileSystem(str(tmp_path / "bucket"), pafs.LocalFileSystem()),
                     "sw/tensorboard", "s3://bucket/sw/tensorboard")
    remote = tmp_path / "bucket" / "sw" / "tensorboard" / "t_00000"
    trial = FakeTrial("t_00000", {"train.lr": 0.1})

    def report(tb, rounds, offset):
        tb.log_trial_start(trial)
        for r in rounds:
            tb.log_trial_result(r + 1, trial, {"round": r, "global_acc": offset + r / 2, "pers_acc": math.nan,
                                               "done": False, "last_global_acc": 0.0, "training_iteration": r + 1})

    tb = SweepTensorBoard(folder, {"train.lr": "lr"})
    assert tb.mirror is not None and folder.local_path() is None
    report(tb, range(3), 0.0)
    tb.close()  # an interrupted fit: the open file is closed and uploaded
    assert len(list(remote.glob("events.out.tfevents.*"))) == 1 and not tb.logdir.exists()
    tb = SweepTensorBoard(folder, {"train.lr": "lr"})  # --resume
    report(tb, range(1, 4), 10.0)
    tb.log_trial_end(trial)
    tb.close()
    assert len(list(remote.glob("events.out.tfevents.*"))) == 2
    acc = EventAccumulator(str(remote))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["global_acc", "round"]  # no NaN, no Tune bookkeeping
    assert [(e.step, e.value) for e in acc.Scalars("global_acc")] == [(0, 0.0), (1, 10.5), (2, 11.0), (3, 11.5)]
