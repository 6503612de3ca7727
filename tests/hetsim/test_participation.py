"""The participation and fairness section: numbers on hand-made tables (Gini, Jain, worst decile,
outcome grid and shares), the banner's warnings, and the section in a real run's report."""
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from helpers.reports import assert_figures, parse_page, small_run

from hetsim.report import PARTICIPATION_FIGURES, build_report
from hetsim.report_participation import (
    gini,
    jain,
    num_classes,
    participation_summary,
    run_warnings,
    worst_decile,
)


def test_gini_jain_and_worst_decile_on_hand_computed_examples():
    # [0, 0, 1, 3]: sum over ordered pairs of |xi - xj| = 20; Gini = 20 / (2 n² mean) = 20 / 32
    assert gini([3, 0, 1, 0]) == pytest.approx(0.625)
    assert jain([3, 0, 1, 0]) == pytest.approx(16 / (4 * 10))  # (Σx)² / (n Σx²)
    assert gini([2, 2, 2]) == pytest.approx(0.0) and jain([2, 2, 2]) == pytest.approx(1.0)
    assert gini([0, 0, 5]) == pytest.approx(2 / 3)  # one holds everything: (n - 1) / n
    assert math.isnan(gini([0, 0])) and math.isnan(jain([0, 0]))
    # the lowest tenth, at least one value; NaN ignored
    assert worst_decile([0.9, 0.2, np.nan, 0.5]) == pytest.approx(0.2)
    assert worst_decile(np.arange(20) / 20) == pytest.approx(np.mean([0.0, 0.05]))


def fleet_tables():
    """4 clients, 3 rounds: client 3 (5 Mbit/s) always misses the deadline, client 2 is never selected."""
    rows = [  # round, client, drop_reason, pers_acc
        (0, 0, "", 0.5), (0, 1, "", 0.4), (0, 3, "deadline", 0.1),
        (1, 0, "", 0.6), (1, 1, "dropout", np.nan), (1, 3, "deadline", 0.2),
        (2, 0, "", 0.7), (2, 1, "", 0.8), (2, 3, "unavailable", np.nan),
    ]
    c = pd.DataFrame(rows, columns=["round", "client_id", "drop_reason", "pers_acc"])
    tiers = {0: ("laptop_cpu", "500mbps"), 1: ("rpi4", "500mbps"), 2: ("rpi4", "500mbps"), 3: ("rpi4", "5mbps")}
    c["tier"] = c["client_id"].map(lambda i: tiers[i][0])
    c["net_tier"] = c["client_id"].map(lambda i: tiers[i][1])
    c["made_deadline"] = c["drop_reason"] == ""
    profiles = pd.DataFrame({"client_id": [0, 1, 2, 3], "tier": [t for t, _ in tiers.values()],
                             "net_tier": [n for _, n in tiers.values()], "gflops": [60.0, 3.0, 3.0, 3.0],
                             "down_mbps": [500.0, 500.0, 500.0, 5.0], "up_mbps": [500.0, 500.0, 500.0, 5.0]})
    rounds = pd.DataFrame({"round": [0, 1, 2], "num_arrived": [2, 1, 2], "sim_time_s": [1.0, 2.0, 3.0],
                           "bytes_up": [10, 5, 10], "global_acc": [0.3, 0.5, 0.6]})
    return {"clients": c, "rounds": rounds, "profiles": profiles}


def test_participation_summary_of_hand_made_tables():
    p = participation_summary(fleet_tables())
    assert p.outcomes.loc[3].tolist() == ["deadline", "deadline", "unavailable"]
    assert p.outcomes.loc[2].tolist() == ["not selected"] * 3
    assert p.outcomes.loc[1].tolist() == ["aggregated", "dropout", "aggregated"]
    per = p.clients.set_index("client_id")
    assert per["aggregated"].tolist() == [3, 2, 0, 0] and per["selected"].tolist() == [3, 3, 0, 3]
    assert per["participation"].tolist() == ["", "", "never selected", "never aggregated"]
    assert per.loc[3, "down_mbps"] == 5.0 and per.loc[3, "last_pers_acc"] == pytest.approx(0.2)
    f = p.fairness
    assert f["share_aggregated_once"] == pytest.approx(0.5)
    assert (f["never_aggregated"], f["never_selected"], f["rounds_without_arrival"]) == (1, 1, 0)
    assert f["gini_aggregations"] == pytest.approx(gini([3, 2, 0, 0]))
    assert f["jain_aggregations"] == pytest.approx(25 / (4 * 13))
    # last accuracies: 0.7, 0.8, 0.2 -> the lowest tenth is one client
    assert f["worst_decile_pers_acc"] == pytest.approx(0.2)
    assert p.fairness_frame().shape == (1, len(f))
    # shares per network tier: 5mbps = client 3's three selections
    net = p.shares["network tier"]
    assert net.loc["5mbps", "deadline"] == pytest.approx(2 / 3)
    assert net.loc["5mbps", "unavailable"] == pytest.approx(1 / 3)
    assert net.loc["500mbps", "aggregated"] == pytest.approx(5 / 6)
    assert net.loc["500mbps", "clients"] == 2 and list(net.index) == ["5mbps", "500mbps"]  # slowest first
    dev = p.shares["device tier"]
    assert dev.loc["rpi4", "selections"] == 6 and dev.loc["rpi4", "aggregated"] == pytest.approx(2 / 6)
    # accuracy per tier per evaluated round; a round without the tier's clients is a gap (NaN)
    acc = p.tier_accuracy.set_index(["grouping", "tier", "round"])
    assert acc.loc[("network tier", "5mbps", 0), "pers_acc"] == pytest.approx(0.1)
    assert np.isnan(acc.loc[("network tier", "5mbps", 2), "pers_acc"])
    assert acc.loc[("device tier", "rpi4", 0), "pers_acc"] == pytest.approx(0.25)
    assert acc.loc[("device tier", "rpi4", 0), "sim_time_s"] == 1.0


def fake_run(tables, config=None, manifest=None):
    return SimpleNamespace(config=config or {"dataset": {"name": "digits"}}, manifest=manifest or {},
                           **tables)


def test_warnings_name_rounds_without_arrival_left_out_clients_and_chance():
    t = fleet_tables()
    w = run_warnings(fake_run(t))
    assert len(w) == 1 and "1 of 4 clients" in w[0] and "client 3" in w[0] and "5mbps 1" in w[0]
    # no client ever arrives, accuracy at chance (10 classes: at most 15%)
    t["rounds"] = t["rounds"].assign(num_arrived=0, bytes_up=0, global_acc=[0.1, 0.11, 0.12])
    t["clients"] = t["clients"].assign(drop_reason=t["clients"]["drop_reason"].replace("", "deadline"))
    # the run's own end-of-run warnings are in the manifest too: said once, from the tables
    manifest = {"warnings": ["deadline is tight", "no update arrived"], "result_warnings": ["no update arrived"]}
    w = run_warnings(fake_run(t, manifest=manifest))
    assert "No client arrived in any of the 3 rounds (0 bytes uploaded)" in w[0] and "deadline" in w[0]
    assert "3 of 4 clients" in w[1]
    assert "near chance" in w[2] and "12.0%" in w[2] and "10 classes" in w[2]
    assert w[3:] == ["the run said: deadline is tight"]
    # every upload non-finite and skipped: the banner names that cause, not the deadline
    t["rounds"] = t["rounds"].assign(num_nonfinite=2)
    w = run_warnings(fake_run(t))
    assert "Every upload was non-finite and skipped (6 in all" in w[0] and "deadline" not in w[0]
    # some rounds only
    t = fleet_tables()
    t["rounds"] = t["rounds"].assign(num_arrived=[2, 0, 2])
    assert any("No client arrived in 1 of 3 rounds (round 1)" in x for x in run_warnings(fake_run(t)))


def test_num_classes_from_the_config():
    assert num_classes({"dataset": {"name": "cifar100"}}) == 100
    assert num_classes({"dataset": {"name": "emnist", "params": {"split": "letters"}}}) == 26
    assert num_classes({"dataset": {"name": "synthetic", "params": {"num_classes": 5}}}) == 5
    assert num_classes({"dataset": {"name": "digits"}}, {"num_classes": 7}) == 7
    assert num_classes({"dataset": {"name": "unknown"}}) is None


def test_report_of_a_deadline_fleet_shows_who_was_left_out(tmp_path):
    # 5 Mbit/s clients cannot meet a 0.1 s deadline with their transfers, the 500 Mbit/s ones can
    run = small_run(tmp_path / "run", "clients.profiles={devices: {laptop_cpu: 1.0}, "
                    "network: {5mbps: 0.5, 500mbps: 0.5}, availability: 1.0, dropout: 0.0}",
                    "clock.deadline_s=0.1", "clients.participation=1.0")
    p = participation_summary(run)
    per = p.clients
    assert set(per.loc[per["participation"] == "never aggregated", "net_tier"]) == {"5mbps"}
    assert (per.loc[per["net_tier"] == "500mbps", "aggregated"] == 4).all()
    out = build_report(run, tmp_path / "report.html")
    page = parse_page(out)
    assert_figures(page, out, PARTICIPATION_FIGURES)
    text = out.read_text()
    assert 'id="warnings"' in text and "were selected but never aggregated" in text
    assert "by network tier: 5mbps 4" in text


def test_the_run_itself_warns_in_the_terminal_and_the_manifest(tmp_path, caplog, monkeypatch):
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    base = ["dataset.name=digits", "model.name=mlp", "rounds=3", "clients.num_clients=20",
            "clients.profiles={devices: {laptop_cpu: 1.0}, network: {5mbps: 0.5, 500mbps: 0.5}}"]
    # the 5 Mbit/s half cannot upload the MLP (17 KB) within 0.045 s: never aggregated
    run = load_run(run_experiment(load_config(None, [*base, "clock.deadline_s=0.045"]), tmp_path / "a"))
    (left_out,) = [w for w in run.manifest["warnings"] if "never aggregated" in w]
    worked = run.clients.loc[run.clients["sim_total_s"].notna(), "client_id"].nunique()
    never = worked - run.clients.loc[run.clients["made_deadline"], "client_id"].nunique()
    assert left_out.startswith(f"{never} of the {worked} clients that trained in 3 round(s)") and never >= 5
    assert run.manifest["num_classes"] == 10
    assert any("never aggregated" in r.getMessage() for r in caplog.records)
    # a run where every client is late (validation would refuse it: skip it, as a fleet whose
    # links fade can get there): no update ever arrived, accuracy at chance
    from engine.run.validate import Validated

    monkeypatch.setattr("engine.run.api.validate_for_run", lambda cfg, run_dir=None, **kw: Validated([], None))
    run = load_run(run_experiment(load_config(None, [*base, "clock.deadline_s=0.041",
                                                     "clients.profiles.network={5mbps: 1.0}"]), tmp_path / "b"))
    assert (run.rounds["num_arrived"] == 0).all() and run.manifest["num_arrived"] == 0
    texts = run.manifest["warnings"]
    assert any(t.startswith("no client's update arrived in any of the 3 round(s)") and "clock.deadline_s = 0.041"
               in t for t in texts)
    assert any("near chance (10 classes: chance 10.0 %; warned at or below 15.0 %)" in t for t in texts)
    banner = run_warnings(run)  # each fact once: the tables' version, no copy of the manifest's
    assert sum("arrived in any" in w for w in banner) == 1 and sum("chance" in w for w in banner) == 1
    # a healthy run warns of nothing
    run = load_run(run_experiment(load_config(None, [*base, "rounds=8", "clients.participation=1.0",
                                                     "clients.profiles.availability=1.0"]), tmp_path / "c"))
    assert not run.manifest["warnings"]
