"""End-to-end behaviour of the in-process engine: learning, determinism, results, failures."""
import json

import numpy as np
import pandas as pd
import pytest
from helpers import REPO

from engine.clients.host import ClientFailure
from engine.config.schema import load_config
from engine.results.tables import (
    CLIENT_COLUMNS,
    PROFILE_COLUMNS,
    ROUND_COLUMNS,
    WALL_COLUMNS,
    load_run,
)
from engine.run.api import run_experiment
from hetsim.cli import main

DIGITS = [
    "dataset.name=digits",
    "model.name=mlp",
    "clients.num_clients=10",
    "clients.participation=0.5",
    "clients.profiles={}",
    "train.local_epochs=2",
]


def digits_cfg(tmp_path, *extra):
    return load_config(None, [*DIGITS, f"output.dir={tmp_path}", *extra])


def test_fedavg_on_digits_reaches_85_percent_in_20_rounds(tmp_path):
    path = run_experiment(digits_cfg(tmp_path, "rounds=20"), tmp_path / "run")
    rounds = load_run(path).rounds
    assert len(rounds) == 20
    assert rounds["global_acc"].max() >= 0.85
    assert rounds["global_acc"].iloc[-1] >= 0.80
    # the model learns: accuracy after round 1 is far below the final one
    assert rounds["global_acc"].iloc[0] < 0.5


def test_same_seed_gives_identical_metrics_and_other_seed_differs(tmp_path):
    runs = [
        load_run(run_experiment(digits_cfg(tmp_path, "rounds=4", f"seed={s}"), tmp_path / f"r{i}"))
        for i, s in enumerate([3, 3, 4])
    ]

    def metrics(run):
        return (
            run.rounds.drop(columns=list(WALL_COLUMNS), errors="ignore"),
            run.clients.drop(columns=list(WALL_COLUMNS), errors="ignore"),
        )

    (r0, c0), (r1, c1), (r2, _) = map(metrics, runs)
    pd.testing.assert_frame_equal(r0, r1)
    pd.testing.assert_frame_equal(c0, c1)
    assert not np.allclose(r0["global_acc"], r2["global_acc"])


def test_run_folder_has_documented_tables_and_columns(tmp_path):
    path = run_experiment(digits_cfg(tmp_path, "rounds=2"), tmp_path / "run")
    for name in ("config.yaml", "manifest.json", "rounds.parquet", "clients.parquet", "profiles.parquet"):
        assert (path / name).is_file(), name
    assert not (path / "_parts").exists()
    run = load_run(path)
    assert set(ROUND_COLUMNS) <= set(run.rounds.columns)
    assert set(CLIENT_COLUMNS) <= set(run.clients.columns)
    assert list(run.profiles.columns) == list(PROFILE_COLUMNS)
    assert len(run.profiles) == 10
    # one row per round x selected client
    assert len(run.clients) == 2 * 5
    assert run.manifest["status"] == "finished"
    assert run.manifest["versions"]["torch"]
    # bytes: FedAvg moves the whole model each way, exactly
    n_params = 64 * 64 + 64 + 64 * 10 + 10
    arrived = run.clients[run.clients["made_deadline"]]
    assert (arrived["bytes_up"] == 4 * n_params).all()
    assert (arrived["bytes_down"] == 4 * n_params).all()
    assert run.config["train"]["local_epochs"] == 2


def test_docs_list_every_core_column():

    doc = (REPO / "docs" / "results.md").read_text()
    for col in {*ROUND_COLUMNS, *CLIENT_COLUMNS, *PROFILE_COLUMNS}:
        assert f"`{col}`" in doc, col


def test_failure_names_client_and_round_and_keeps_finished_rounds(tmp_path, monkeypatch):
    from algorithms.fedavg import FedAvgClient

    original = FedAvgClient.fit

    def flaky(self, ctx, broadcast):
        if ctx.round == 2:
            raise RuntimeError("boom")
        return original(self, ctx, broadcast)

    monkeypatch.setattr(FedAvgClient, "fit", flaky)
    with pytest.raises(ClientFailure, match=r"client \d+ failed in round 2: RuntimeError: boom"):
        run_experiment(digits_cfg(tmp_path, "rounds=5"), tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert list(run.rounds["round"]) == [0, 1]
    assert run.manifest["status"] == "failed" and "boom" in run.manifest["error"]


def test_fedprox_differs_from_fedavg_and_mu_zero_equals_fedavg(tmp_path):
    def final(*extra):
        path = run_experiment(digits_cfg(tmp_path, "rounds=2", *extra), tmp_path / "_".join(extra))
        return load_run(path).rounds["global_loss"].to_numpy()

    fedavg = final("algorithm.name=fedavg")
    assert np.array_equal(fedavg, final("algorithm.name=fedprox", "algorithm.mu=0.0"))
    assert not np.array_equal(fedavg, final("algorithm.name=fedprox", "algorithm.mu=1.0"))


def test_cli_run_writes_folder_and_prints_summary(tmp_path, capsys):
    out = tmp_path / "cli-run"
    code = main(["run", "-q", "-o", str(out), *sum((["--set", s] for s in DIGITS), []), "--set", "rounds=2"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "global accuracy (final)" in printed and str(out) in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"][:2] != [] and manifest["status"] == "finished"


def test_cli_reports_config_errors_with_exit_code_2(capsys):
    assert main(["run", "--set", "train.lr=-1"]) == 2
    err = capsys.readouterr().err
    assert "train.lr = -1" in err and "greater than 0" in err


def test_existing_named_run_folder_is_not_overwritten(tmp_path):
    cfg = digits_cfg(tmp_path, "rounds=1", "output.name=fixed")
    run_experiment(cfg)
    with pytest.raises(FileExistsError, match="output.overwrite"):
        run_experiment(cfg)


def test_heterogeneous_architectures_by_profile_rule_and_pin(tmp_path):
    cfg = load_config(None, [
        "dataset.name=mnist5k", "model.name=lenet5", "clients.num_clients=8", "rounds=1",
        "clients.participation=1.0",
        "clients.profiles={devices: {rpi4: 0.5, laptop_cpu: 0.5}, availability: 1.0, dropout: 0.0}",
        "model.zoo=[{arch: lenet5_half, max_gflops: 10}]", "model.per_client={0: lenet5}",
        f"output.dir={tmp_path}",
    ])
    run = load_run(run_experiment(cfg, tmp_path / "het"))
    c = run.clients.merge(run.profiles[["client_id"]], on="client_id")
    expected = np.where(c["tier"] == "rpi4", "lenet5_half", "lenet5")
    expected[c["client_id"] == 0] = "lenet5"
    assert list(c["arch"]) == list(expected)
    # each client downloads and uploads its own architecture's model
    sizes = {"lenet5": 4 * 61_706, "lenet5_half": 4 * 15_738}
    assert (c["bytes_up"] == c["arch"].map(sizes)).all()
    assert {"global_acc_lenet5", "global_acc_lenet5_half"} <= set(run.rounds.columns)


def test_deadline_and_over_selection_through_the_round_loop(tmp_path):
    cfg = digits_cfg(
        tmp_path, "rounds=3", "clients.participation=0.4",
        "clients.profiles={network: {5mbps: 0.2, 500mbps: 0.8}, availability: 1.0, dropout: 0.0}",
        "clock.deadline_s=0.08", "clock.over_selection=1.5",
    )
    run = load_run(run_experiment(cfg, tmp_path / "deadline"))
    c, r = run.clients, run.rounds
    assert (r["num_selected"] == 6).all()  # ceil(4 x 1.5)
    late = c["sim_total_s"] > 0.08
    assert late.any() and (~late).any()  # the 5 Mbps clients miss it, the 500 Mbps ones don't
    assert (c.loc[late, "drop_reason"] == "deadline").all()
    assert (c["drop_reason"] == "over_selected").any()
    on_time = c[~late]
    # of the on-time clients, the fastest 4 are kept, the rest dropped as over-selected
    for _, g in on_time.groupby("round"):
        kept = g[g["made_deadline"]]
        assert len(kept) == min(4, len(g))
        assert (g.loc[~g["made_deadline"], "drop_reason"] == "over_selected").all()
        if len(kept) < len(g):
            assert kept["sim_total_s"].max() <= g.loc[~g["made_deadline"], "sim_total_s"].min()
    # the round lasts as long as its slowest kept client, unless fewer than the 4 wanted arrived
    # and a late client left the server waiting until the deadline
    kept_max = c[c["made_deadline"]].groupby("round")["sim_total_s"].max()
    arrived = c.groupby("round")["made_deadline"].sum()
    expected = np.where(arrived < 4, 0.08, kept_max.reindex(arrived.index))
    assert np.allclose(r.set_index("round")["sim_round_s"].loc[arrived.index], expected)
    assert np.allclose(r["sim_time_s"], r["sim_round_s"].cumsum())
    assert (r["num_arrived"] == c.groupby("round")["made_deadline"].sum().to_numpy()).all()


def test_unavailable_and_dropout_are_seeded_and_recorded(tmp_path):
    extra = ["rounds=3", "clients.participation=1.0",
             "clients.profiles={availability: 0.6, dropout: 0.2}"]
    a = load_run(run_experiment(digits_cfg(tmp_path, *extra), tmp_path / "a")).clients
    b = load_run(run_experiment(digits_cfg(tmp_path, *extra), tmp_path / "b")).clients
    assert list(a["drop_reason"]) == list(b["drop_reason"])
    reasons = set(a["drop_reason"])
    assert {"unavailable", "dropout", ""} <= reasons
    assert a.loc[a["drop_reason"] == "unavailable", "bytes_up"].isna().all()


def test_a_late_client_makes_the_server_wait_until_the_deadline(tmp_path):
    cfg = digits_cfg(
        tmp_path, "rounds=3", "clients.participation=0.4",
        "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}, availability: 1.0, dropout: 0.0}",
        "clock.deadline_s=0.08",
    )
    run = load_run(run_experiment(cfg, tmp_path / "wait"))
    late_rounds = run.clients.groupby("round")["drop_reason"].apply(lambda d: (d == "deadline").any())
    assert late_rounds.any()
    r = run.rounds.set_index("round")["sim_round_s"]
    assert (r[late_rounds] == 0.08).all()
    kept_max = run.clients[run.clients["made_deadline"]].groupby("round")["sim_total_s"].max()
    on_time = late_rounds[~late_rounds].index
    assert np.allclose(r.loc[on_time], kept_max.loc[on_time])


def test_in_process_run_restores_the_callers_torch_threads(tmp_path):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_experiment(digits_cfg(tmp_path, "rounds=1", "executor.threads_per_actor=1"), tmp_path / "t")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("setting, expected", [((), 1), (("executor.threads_per_actor=3",), 3)])
def test_a_simulation_without_an_executor_trains_with_the_threads_a_run_would(tmp_path, setting, expected):
    """`Simulation(cfg)` built its own in-process executor with the caller's threads (2 here):
    ~10x slower than `hetsim run` on two busy cores, and other rounding than the run's."""
    import torch

    from engine.loop.simulation import Simulation

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        during = []
        Simulation(digits_cfg(tmp_path, "rounds=2", *setting)).run(
            callbacks=[lambda record: during.append(torch.get_num_threads())])
        assert during == [expected, expected]
        assert torch.get_num_threads() == 2  # given back
    finally:
        torch.set_num_threads(before)
