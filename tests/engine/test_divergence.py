"""train.on_nonfinite: a run whose uploads or global model turn NaN/inf ends as `diverged`
(stop), drops those uploads (skip_client) or carries on (ignore); sweeps record such trials as
diverged with their metrics missing."""
import math

import numpy as np
import pytest
import yaml

from engine.config.schema import load_config
from engine.results.tables import load_run
from engine.run.api import run_experiment
from hetsim.cli import main

METHODS = {
    "fedavg": [],
    "fedprox": ["algorithm.mu=0.1"],
    "fedavg_compressed": ["algorithm.k=0.1"],
    "fedcspack": ["algorithm.pack_size=256"],
    "ascend": ["partition.public_fraction=0.2", "algorithm.distill_steps=2"],
}
BASE = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=4", "clients.participation=1.0",
        "rounds=3", "train.lr=1e30"]


def _cfg(tmp_path, method, *extra):
    return load_config(None, [*BASE, f"algorithm.name={method}", *METHODS[method],
                              f"output.dir={tmp_path}", *extra])


@pytest.mark.parametrize("method", list(METHODS))
def test_stop_ends_the_run_as_diverged_naming_round_and_clients(tmp_path, method):
    run = load_run(run_experiment(_cfg(tmp_path, method)))
    m = run.manifest
    assert m["status"] == "diverged"
    assert m["error"].startswith("round 0: client(s) [") and "non-finite values" in m["error"]
    assert len(run.rounds) == 1  # the diverged round is recorded, then the run stops
    row = run.rounds.iloc[0]
    bad = run.clients[run.clients["drop_reason"] == "nonfinite"]
    assert row["num_nonfinite"] == len(bad) >= 1
    assert str(sorted(bad["client_id"].tolist())[:10]) in m["error"]
    assert not bad["made_deadline"].any()
    # the rejected uploads never reached the global model
    assert math.isfinite(row["global_loss"]) and math.isfinite(row["global_acc"])


@pytest.mark.parametrize("method", list(METHODS))
def test_skip_client_drops_nonfinite_uploads_and_keeps_going(tmp_path, method):
    run = load_run(run_experiment(_cfg(tmp_path, method, "train.on_nonfinite=skip_client")))
    assert run.manifest["status"] == "finished" and len(run.rounds) == 3
    ran = run.clients[run.clients["drop_reason"].isin(["", "nonfinite"])]
    assert (ran["drop_reason"] == "nonfinite").all()  # lr 1e30: every trained upload is NaN/inf
    assert (run.rounds["num_nonfinite"] == run.rounds["num_run"]).all()
    assert (run.rounds["num_arrived"] == 0).all()
    assert run.rounds["global_loss"].map(math.isfinite).all()
    assert run.rounds["global_acc"].nunique() == 1  # nothing was aggregated


def test_ignore_keeps_the_old_behaviour(tmp_path):
    run = load_run(run_experiment(_cfg(tmp_path, "fedavg", "train.on_nonfinite=ignore")))
    assert run.manifest["status"] == "finished" and len(run.rounds) == 3
    assert (run.rounds["num_nonfinite"] > 0).all()
    assert (run.clients["drop_reason"] != "nonfinite").all()
    assert run.rounds["global_loss"].isna().all()  # NaN weights were aggregated


def test_skip_client_drops_only_the_poisoned_client(tmp_path, monkeypatch):
    from algorithms.fedavg import FedAvgClient

    fit = FedAvgClient.fit

    def poisoned(self, ctx, broadcast):
        result = fit(self, ctx, broadcast)
        if ctx.client_id == 2:
            result.upload.arrays["state"][5] = np.nan
        return result

    monkeypatch.setattr(FedAvgClient, "fit", poisoned)
    cfg = _cfg(tmp_path, "fedavg", "train.lr=0.05", "train.on_nonfinite=skip_client")
    run = load_run(run_experiment(cfg))
    assert run.manifest["status"] == "finished"
    ran = run.clients[run.clients["drop_reason"].isin(["", "nonfinite"])]
    assert set(ran.loc[ran["drop_reason"] == "nonfinite", "client_id"]) == {2}
    assert (run.rounds["num_arrived"] == run.rounds["num_run"] - (run.rounds["num_nonfinite"])).all()
    assert run.rounds["global_loss"].map(math.isfinite).all()
    assert run.rounds["global_loss"].nunique() == 3  # the other clients' uploads were aggregated
    # the same run stopped at the first poisoned upload
    stopped = load_run(run_experiment(_cfg(tmp_path, "fedavg", "train.lr=0.05")))
    first = int(run.clients.loc[run.clients["drop_reason"] == "nonfinite", "round"].min())
    assert stopped.manifest["status"] == "diverged"
    assert stopped.manifest["error"].startswith(f"round {first}: client(s) [2]")


def test_cli_exit_status_3_and_the_message(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["run", "-q", "-o", "r", *(a for s in [*BASE, "algorithm.name=fedavg"] for a in ("--set", s))])
    err = capsys.readouterr().err
    assert code == 3
    assert "hetsim: the run diverged: round 0: client(s) [" in err and "Traceback" not in err


@pytest.mark.ray
def test_a_sweep_records_diverged_trials_with_missing_metrics(tmp_path, ray_session):
    from sweeps import run_sweep

    spec = {
        "name": "div",
        "base": {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "rounds": 2,
                 "clients": {"num_clients": 4, "participation": 1.0}},
        "space": {"train.lr": {"grid": [0.05, 1e30]}},
        "storage": str(tmp_path / "sw"),
        "ray": {"num_cpus": 2},
        "max_concurrent_trials": 1,  # one trial process runs both
    }
    sweep = run_sweep(spec, quiet=True)
    t = sweep.trials.set_index("lr")
    assert t.loc[0.05, "status"] == "finished" and t.loc[1e30, "status"] == "diverged"
    assert "non-finite" in t.loc[1e30, "error"]
    assert math.isnan(t.loc[1e30, "best_global_acc"]) and math.isnan(t.loc[1e30, "final_global_acc"])
    assert not math.isnan(t.loc[0.05, "best_global_acc"])
    assert sweep.best(2)["lr"].tolist() == [0.05]  # a diverged trial is never ranked
    assert yaml.safe_load((tmp_path / "sw" / "sweep.yaml").read_text())
