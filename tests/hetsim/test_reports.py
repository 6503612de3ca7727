"""`hetsim report`, `hetsim compare` and `hetsim whatif`: the HTML has every listed figure and no
external URL, compare's numbers equal pandas computed here, what-if fleets differ only where
they can."""
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from helpers.reports import BROWSERS, assert_figures, parse_page, screenshot, small_run

from engine.config.schema import load_config
from engine.results.tables import load_run
from engine.run.api import run_experiment
from hetsim.cli import main
from hetsim.report import ASCEND_FIGURES, FEDCSPACK_FIGURES, RUN_FIGURES, build_report

# ---------------------------------------------------------------- run reports


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    # a deadline, availability and dropout: every outcome kind, sampled bandwidths (binned)
    return small_run(tmp_path_factory.mktemp("fedavg") / "run",
                     "clients.profiles={devices: {rpi4: 0.5, laptop_cpu: 0.5}, "
                     "bandwidth: {distribution: loguniform, low: 5, high: 500}, availability: 0.8, dropout: 0.1}",
                     "clock.deadline_s=0.06", "clock.over_selection=1.3")


def test_run_report_has_every_run_figure_and_no_external_urls(fedavg_run, tmp_path):
    # the default place: inside the run folder (a page at a given path: the other tests)
    out = build_report(fedavg_run)
    assert out == fedavg_run / "report.html" and (fedavg_run / "report_figures" / "fig-bytes.png").is_file()
    page = parse_page(out)
    assert_figures(page, out, RUN_FIGURES)
    assert "table-run-summary" in page.tables
    # no method panels for FedAvg, and nothing left out for lack of data
    assert not set(page.figures) & set(ASCEND_FIGURES + FEDCSPACK_FIGURES)
    assert not page.omitted
    # the run has the outcomes the participation figure shows
    reasons = set(load_run(fedavg_run).clients["drop_reason"])
    assert {"", "deadline", "unavailable"} <= reasons


def test_network_tiers_of_sampled_bandwidths_are_decades_ordered_by_speed(fedavg_run):
    from hetsim.plots import network_groups

    run = load_run(fedavg_run)
    groups, order = network_groups(run.clients, run.profiles)
    mbps = run.clients["client_id"].map(run.profiles.set_index("client_id")["down_mbps"])
    assert set(order) <= {"<10 Mbps", "10–100 Mbps", "100–1000 Mbps"} and len(order) >= 2
    assert order == sorted(order, key=lambda g: mbps[groups == g].median())
    assert (mbps[groups == "10–100 Mbps"].between(10, 100)).all()


def test_ascend_report_has_the_method_panels_and_the_rollback_table(tmp_path):
    # rollback_loss: kl with gamma 0 rolls back often on this tiny setting (the table is drawn);
    # without forced rounds the accepted rounds still feed rewards to the policy (Q panel)
    run = small_run(tmp_path / "asc", "rounds=6", "clients.participation=1.0", "partition.public_fraction=0.1",
                    "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}, availability: 1.0, dropout: 0.0}",
                    "algorithm.name=ascend", "algorithm.k=0.1", "algorithm.distill_steps=5",
                    "algorithm.warmup=1", "algorithm.gamma=0.0", "algorithm.rollback_loss=kl",
                    "algorithm.forced_rounds=0")
    assert load_run(run).table("rollbacks") is not None
    out = build_report(run, tmp_path / "asc.html")
    page = parse_page(out)
    assert_figures(page, out, RUN_FIGURES + ASCEND_FIGURES)
    assert "table-ascend-rollbacks" in page.tables and not page.omitted


def test_fedcspack_report_with_and_without_recorded_packs(tmp_path):
    fcs = ["clients.profiles={availability: 1.0, dropout: 0.0}", "algorithm.name=fedcspack",
           "algorithm.pack_size=256"]
    run = small_run(tmp_path / "fcs", *fcs, "algorithm.record_packs=true")
    out = build_report(run, tmp_path / "fcs.html")
    page = parse_page(out)
    assert_figures(page, out, RUN_FIGURES + FEDCSPACK_FIGURES)
    assert not page.omitted

    run = small_run(tmp_path / "fcs_nopacks", *fcs)
    page = parse_page(build_report(run, tmp_path / "fcs2.html"))
    assert set(FEDCSPACK_FIGURES) - set(page.figures) == {"fig-fedcspack-packs"}
    assert page.omitted == {"fig-fedcspack-packs"}
    assert "record_packs: true" in (tmp_path / "fcs2.html").read_text()


def test_missing_data_leaves_panels_out_with_a_note(fedavg_run, tmp_path):
    # a method run whose trace columns are gone (an older run, or a method that logs less)
    run = tmp_path / "stripped"
    shutil.copytree(fedavg_run, run)
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["algorithm"] = {"name": "ascend"}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    rounds = pd.read_parquet(run / "rounds.parquet")
    rounds.assign(global_acc=np.nan, pers_acc=np.nan, pers_acc_worst=np.nan).to_parquet(run / "rounds.parquet")
    page = parse_page(build_report(run, tmp_path / "stripped.html"))
    assert {"fig-accuracy-round", "fig-accuracy-time", *ASCEND_FIGURES} <= page.omitted
    assert {"fig-bytes", "fig-participation", "fig-time-device-tier"} <= set(page.figures)

    # a run that crashed before its first round: a page with notes, no error
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(fedavg_run / "manifest.json", empty / "manifest.json")
    page = parse_page(build_report(empty))
    assert set(RUN_FIGURES) <= page.omitted and not page.figures


def test_a_panel_that_fails_becomes_a_note_and_the_page_goes_on(fedavg_run, tmp_path, monkeypatch, capsys):
    import hetsim.report as report

    def broken(page, run):
        page.row()  # a half-drawn panel: the row it opened is closed again
        raise ValueError("boom")

    monkeypatch.setattr(report, "accuracy_figures", broken)
    out = build_report(fedavg_run, tmp_path / "rep" / "r.html")  # a folder not made yet
    page = parse_page(out)
    assert page.omitted == {"fig-accuracy-round", "fig-accuracy-time"}
    assert set(RUN_FIGURES) - page.omitted <= set(page.figures)
    text = out.read_text()
    assert "could not be drawn from this data (ValueError: boom)" in text
    assert text.count('<div class="row">') >= 1 and text.count('<div ') == text.count("</div>")  # balanced
    assert "ValueError: boom" in capsys.readouterr().err


def test_report_cli_errors_name_the_path(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "nope is not a folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "neither a run folder (no manifest.json) nor a sweep folder" in capsys.readouterr().err


# ---------------------------------------------------------------- compare


def test_compare_two_runs_gives_pandas_numbers_in_text_and_html(fedavg_run, tmp_path, capsys):
    from hetsim.compare import COMPARE_FIGURES, compare_table, load_entries

    other = small_run(tmp_path / "lr02", "train.lr=0.2", "clients.profiles={network: {5mbps: 1.0}}")
    entries = load_entries([fedavg_run, other])
    assert [e.label for e in entries] == ["run", "lr02"]
    table, target = compare_table(entries, target=0.3)
    assert target == 0.3
    for row, path in zip(table.itertuples(), (fedavg_run, other)):
        r = pd.read_parquet(path / "rounds.parquet")
        acc = r["global_acc"].dropna()
        assert row.final_global_acc == acc.iloc[-1] and row.best_global_acc == acc.max()
        assert row.final_pers_acc == r["pers_acc"].dropna().iloc[-1]
        assert row.best_pers_acc == r["pers_acc"].max()
        hit = r.loc[r["global_acc"] >= 0.3]
        assert len(hit), "the target must be reached for this check to mean something"
        assert row.time_to_target_s == hit["sim_time_s"].min()
        assert row.rounds_to_target == hit["round"].min() + 1
        assert row.sim_time_s == r["sim_time_s"].iloc[-1] and row.rounds == len(r)
        assert row.bytes_up == r["bytes_up"].sum() and row.bytes_down == r["bytes_down"].sum()
    # a target nobody reaches
    table, _ = compare_table(entries, target=1.01)
    assert table["time_to_target_s"].isna().all()
    # default target: the best accuracy every run reaches, floored to 0.01, above every start
    _, target = compare_table(entries)
    accs = [pd.read_parquet(p / "rounds.parquet")["global_acc"].dropna() for p in (fedavg_run, other)]
    start = max(a.iloc[0] for a in accs)
    above = [a.max() for a in accs if a.max() > start]
    floored = math.floor(min(above) * 100) / 100
    assert target == (floored if floored > start else min(above)) and target > start

    out = tmp_path / "cmp" / "compare.html"
    assert main(["compare", str(fedavg_run), str(other), "--target", "0.3", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    first = compare_table(entries, target=0.3)[0].iloc[0]
    assert f"{100 * first.final_global_acc:.2f}%" in text and f"{first.time_to_target_s:.2f}" in text
    assert "global_acc >= 0.3" in text
    page = parse_page(out)
    assert_figures(page, out, COMPARE_FIGURES)
    html_text = out.read_text()
    # what differs: the keys (and only those) and both fleets side by side
    assert "train.lr" in html_text and "clients.profiles.network.5mbps" in html_text
    assert "rounds</td>" not in html_text.split('id="table-config-diff"')[1].split("</table>")[0]
    assert "# drawn: 8 clients" in html_text


def fake_entry(label, accs, config=None):
    """A compare entry from an accuracy curve (one client per round, aggregated)."""
    from hetsim.compare import Entry

    n = len(accs)
    rounds = pd.DataFrame({"round": range(n), "global_acc": accs, "sim_time_s": np.arange(1.0, n + 1),
                           "sim_round_s": 1.0, "bytes_up": 10, "bytes_down": 20, "num_arrived": 1})
    clients = pd.DataFrame({"round": range(n), "client_id": 0, "drop_reason": "", "tier": "rpi4",
                            "net_tier": "5mbps", "made_deadline": True})
    run = SimpleNamespace(rounds=rounds, clients=clients, profiles=None, path=Path(label), manifest={},
                          config=config or {"dataset": {"name": "digits"}})
    return Entry(label, run)


def test_compare_never_picks_a_target_at_or_below_the_starting_accuracy():
    from hetsim.compare import compare_table, default_target, text_table

    good, flat = fake_entry("good", [0.3, 0.45, 0.6]), fake_entry("flat", [0.1, 0.1, 0.1])
    # the old rule (lowest best, 0.1) is the flat run's start: every run "reached" it in round 1
    assert default_target([good, flat], "global_acc") == 0.6
    table, target = compare_table([good, flat])
    assert target == 0.6 and table.loc[0, "rounds_to_target"] == 3 and np.isnan(table.loc[1, "time_to_target_s"])
    text = text_table(table, "global_acc", target)
    assert "flat: not reached (global_acc best 10.00% < target 60.00%)" in text
    assert text.count("not reached") >= 3  # time, rounds, energy columns and the note
    # floored to 0.01 unless that falls to a start: then the best itself
    assert default_target([fake_entry("a", [0.2, 0.8137]), fake_entry("b", [0.3, 0.55])], "global_acc") == 0.55
    assert default_target([fake_entry("a", [0.5, 0.503]), fake_entry("b", [0.1, 0.2])], "global_acc") == 0.503
    # nobody rose above the starts: no target, said plainly
    table, target = compare_table([flat, fake_entry("flat2", [0.12, 0.11])])
    assert np.isnan(target) and "no target: no run's global_acc rose above the highest starting value (12.00%)" \
        in text_table(table, "global_acc", target)
    # a given target at or below a start is kept, with a note
    table, _ = compare_table([good, flat], target=0.2)
    assert any("at or below the starting global_acc of good" in n for n in table.attrs["notes"])
    # fairness columns per run
    assert table["aggregated_once"].tolist() == [1.0, 1.0]


def test_config_diff_and_fleets_side_by_side():
    from hetsim.compare import config_diff, fleet_text

    a = fake_entry("a", [0.1], {"seed": 0, "train": {"lr": 0.1, "batch_size": 16},
                                "clients": {"profiles": {"network": {"5mbps": 1.0}, "table": None}}})
    b = fake_entry("b", [0.1], {"seed": 0, "train": {"lr": 0.2, "batch_size": 16},
                                "clients": {"profiles": {"network": {"500mbps": 1.0}, "table": None}}})
    diff = config_diff([a, b])
    assert diff.to_dict("records") == [
        {"key": "clients.profiles.network.500mbps", "a": "", "b": "1.0"},
        {"key": "clients.profiles.network.5mbps", "a": "1.0", "b": ""},
        {"key": "train.lr", "a": "0.1", "b": "0.2"},
    ]
    assert config_diff([a, a]).empty
    b.run.profiles = pd.DataFrame({"client_id": [0, 1], "tier": ["rpi4", "rpi4"], "net_tier": ["500mbps"] * 2,
                                   "gflops": [3.0, 5.0], "down_mbps": [500.0, 500.0], "up_mbps": [500.0, 500.0]})
    text = fleet_text(b.run)
    assert text.startswith("network: {500mbps: 1.0}") and "table" not in text  # resolved nulls left out
    assert "#   device: rpi4 2" in text and "median: GFLOP/s 4, down Mbit/s 500" in text


def test_whatif_run_folders_are_linked_by_fleet_name(tmp_path):
    from sweeps.whatif import link_fleet_folders

    for trial in ("t_0", "t_1"):
        (tmp_path / "runs" / trial).mkdir(parents=True)
    sweep = SimpleNamespace(path=tmp_path, trials=pd.DataFrame({"trial_id": ["t_0", "t_1"],
                                                                "fleet": ["fast", "slow"]}))
    links = link_fleet_folders(sweep)
    assert sorted(links) == ["fast", "slow"]
    assert (tmp_path / "fleets" / "slow").resolve() == (tmp_path / "runs" / "t_1").resolve()
    assert link_fleet_folders(sweep) == links  # again (a resumed what-if): relinked


def test_compare_cli_errors(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "missing")]) == 2
    assert "missing is neither a run folder" in capsys.readouterr().err


# ---------------------------------------------------------------- sweeps and what-if (Ray Tune)


@pytest.fixture(scope="module")
def local_ray(ray_session):
    return ray_session  # the suite's shared 2-CPU Ray (tests/conftest.py)


SWEEP_BASE = {
    "seed": 0, "rounds": 3, "dataset": {"name": "digits"}, "model": {"name": "mlp"},
    "clients": {"num_clients": 8, "participation": 0.5, "profiles": {}}, "algorithm": {"name": "fedprox"},
}


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory, local_ray):
    from sweeps import run_sweep

    # two trials (one sample of each mu): both hyperparameters still vary, half the trials to start;
    # one at a time: one trial process (a few CPU seconds to start) runs both
    return run_sweep({"name": "rep", "base": SWEEP_BASE, "num_samples": 1, "max_concurrent_trials": 1,
                      "space": {"train.lr": {"loguniform": [0.01, 0.3]}, "algorithm.mu": {"grid": [0.0, 0.1]}}},
                     storage=tmp_path_factory.mktemp("sweep") / "sw", quiet=True)


@pytest.mark.ray
def test_sweep_report_has_a_figure_per_hyperparameter_the_best_table_and_curves(small_sweep, tmp_path):
    from hetsim.report import SWEEP_FIGURES, sweep_param_figure_id

    sweep = small_sweep
    assert (sweep.trials["status"] == "finished").all() and len(sweep.trials) == 2
    assert [sweep.trials[c].nunique() for c in sweep.param_columns.values()] == [2, 2]  # lr and mu both vary
    out = tmp_path / "sweep_report.html"
    assert main(["report", str(sweep.path), "-o", str(out)]) == 0
    page = parse_page(out)
    ids = [*SWEEP_FIGURES, sweep_param_figure_id("lr"), sweep_param_figure_id("mu")]
    assert ids[-2:] == ["fig-sweep-param-lr", "fig-sweep-param-mu"]
    assert_figures(page, out, ids)
    assert not page.omitted
    # the best-configurations table lists the trials best first
    text = out.read_text()
    table = text[text.index('id="table-sweep-best"'):]
    order = sorted(sweep.trials["trial_id"], key=table.index)
    assert order == sweep.best(10)["trial_id"].tolist()


ACC_COLUMNS = ["global_acc", "global_loss", "pers_acc", "pers_acc_weighted", "pers_acc_worst",
               "pers_acc_std", "pers_loss", "train_loss", "bytes_up", "bytes_down", "num_arrived"]
FAST = {"devices": {"laptop_cpu": 1.0}, "network": {"500mbps": 1.0}, "availability": 1.0, "dropout": 0.0}
SLOW = {"devices": {"rpi4": 0.5, "laptop_cpu": 0.5}, "network": {"5mbps": 0.5, "500mbps": 0.5},
        "availability": 1.0, "dropout": 0.0}


def write_yaml(path: Path, obj) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(obj, sort_keys=False))
    return path


def fleet_rounds(sweep) -> dict[str, pd.DataFrame]:
    r = sweep.rounds
    return {f: g.sort_values("round").reset_index(drop=True) for f, g in r.groupby("fleet")}


@pytest.mark.ray
def test_whatif_without_deadline_moves_only_time(tmp_path, local_ray, capsys, monkeypatch):
    import functools

    import sweeps
    from hetsim.compare import COMPARE_FIGURES
    from sweeps import whatif

    # the fleets one at a time: one trial process (a few CPU seconds to start) runs both; the
    # command line form (-c, --fleet) has no setting for it
    monkeypatch.setattr(whatif, "run_whatif", functools.partial(whatif.run_whatif, max_concurrent_trials=1))
    exp = write_yaml(tmp_path / "exp.yaml", SWEEP_BASE | {"algorithm": {"name": "fedavg"}})
    write_yaml(tmp_path / "fast.yaml", FAST)
    write_yaml(tmp_path / "slow.yaml", {"clients": {"profiles": SLOW}})  # the wrapped form
    storage = tmp_path / "wi"
    assert main(["whatif", "-c", str(exp), "--fleet", f"fast={tmp_path / 'fast.yaml'}",
                 "--fleet", f"slow={tmp_path / 'slow.yaml'}", "--storage", str(storage), "-q"]) == 0
    out = capsys.readouterr().out
    assert "slow vs fast: the same accuracy, the same arrivals" in out

    s = sweeps.load_sweep(storage)
    assert sorted(s.trials["fleet"]) == ["fast", "slow"] and list(s.param_columns.values()) == ["fleet"]
    assert "fleet" in s.rounds.columns
    by = fleet_rounds(s)
    fast, slow = by["fast"], by["slow"]
    pd.testing.assert_frame_equal(fast[ACC_COLUMNS], slow[ACC_COLUMNS])  # same draws, same models
    assert (slow["sim_round_s"] > fast["sim_round_s"]).all()  # only time moves
    assert slow["sim_time_s"].iloc[-1] > 5 * fast["sim_time_s"].iloc[-1]
    # each trial ran its own fleet: the profiles differ, the selections do not
    runs = {row.fleet: s.run(row.trial_id) for row in s.trials.itertuples()}
    assert set(runs["fast"].profiles["net_tier"]) == {"500mbps"}
    assert set(runs["slow"].profiles["net_tier"]) == {"5mbps", "500mbps"}
    key = ["round", "client_id"]
    pd.testing.assert_frame_equal(runs["fast"].clients[key], runs["slow"].clients[key])
    assert not np.allclose(runs["fast"].clients["sim_upload_s"], runs["slow"].clients["sim_upload_s"])
    # the compare report of the fleets
    page = parse_page(storage / "compare.html")
    assert_figures(page, storage / "compare.html", COMPARE_FIGURES)
    # and the folder is an ordinary sweep folder: `hetsim report` draws it
    page = parse_page(build_report(storage))
    assert "fig-sweep-param-fleet" in page.figures
    assert main(["show", str(storage)]) == 0  # and `hetsim show` prints its trials
    out = capsys.readouterr().out
    assert out.startswith(f"{storage}: what-if") and "slow vs fast: the same accuracy, the same arrivals" in out


@pytest.mark.ray
def test_whatif_with_a_deadline_changes_who_arrives(tmp_path, local_ray, capsys):
    import sweeps

    spec = write_yaml(tmp_path / "whatif.yaml", {
        "name": "deadline",
        "base": SWEEP_BASE | {"algorithm": {"name": "fedavg"}},
        "overrides": ["clock.deadline_s=0.1"],  # fast clients take ~0.01 s, slow links ~0.2 s
        "fleets": [{"name": "fast", "profiles": FAST}, {"name": "slow", "file": "slow.yaml"}],
        "storage": str(tmp_path / "wi"),
        "max_concurrent_trials": 1,  # one trial process runs both fleets
    })
    write_yaml(tmp_path / "slow.yaml", SLOW)
    assert main(["whatif", str(spec), "-q"]) == 0
    assert "slow vs fast: different accuracy from round 0, different arrivals from round 0" in capsys.readouterr().out
    s = sweeps.load_sweep(tmp_path / "wi")
    by = fleet_rounds(s)
    fast, slow = by["fast"], by["slow"]
    assert (fast["num_arrived"] == fast["num_selected"]).all()
    assert (slow["num_arrived"] < slow["num_selected"]).all()
    assert not np.allclose(fast["global_acc"], slow["global_acc"])
    runs = {row.fleet: s.run(row.trial_id) for row in s.trials.itertuples()}
    late = runs["slow"].clients.query("drop_reason == 'deadline'")
    assert len(late) and (late["sim_total_s"] > 0.1).all()
    assert set(late["client_id"].map(runs["slow"].profiles.set_index("client_id")["net_tier"])) == {"5mbps"}
    # run folders and headings carry the fleet names; the page says what differs
    assert load_run(tmp_path / "wi" / "fleets" / "slow").profiles.equals(runs["slow"].profiles)
    text = (tmp_path / "wi" / "compare.html").read_text()
    assert "<h1>hetsim whatif: wi: fast vs slow</h1>" in text and 'id="table-fleets"' in text
    assert "clients.profiles.network.5mbps" in text  # the config diff
    assert "(fleet slow)" in build_report(tmp_path / "wi" / "fleets" / "slow").read_text()


def test_whatif_inputs_are_checked_before_anything_starts(tmp_path, capsys):
    exp = write_yaml(tmp_path / "exp.yaml", SWEEP_BASE)
    ok = write_yaml(tmp_path / "ok.yaml", FAST)
    cases = [
        (["--fleet", f"a={ok}"], "1 fleet(s) given; a what-if compares at least 2"),
        (["--fleet", f"a={ok}", "--fleet", f"b={write_yaml(tmp_path / 'b.yaml', {'network': {'7mbps': 1.0}})}"],
         "fleets.b: clients.profiles.network = {'7mbps': 1.0}: unknown network tier '7mbps'; did you mean"),
        (["--fleet", f"a={ok}", "--fleet", f"b={write_yaml(tmp_path / 'c.yaml', {'network': {'5mbps': 2.0}})}"],
         "fleets.b:"),
        (["--fleet", f"a={ok}", "--fleet", f"b={write_yaml(tmp_path / 'd.yaml', {'clients': {'num_clients': 3}})}"],
         "only clients.profiles may change between fleets, found clients.num_clients"),
        (["--fleet", f"a={ok}", "--fleet", f"b={tmp_path / 'none.yaml'}"], "none.yaml' does not exist"),
        (["--fleet", f"a={ok}", "--fleet", f"b={ok}", "--set", "clients.profiles.dropout=0.5"],
         "clients.profiles is what the fleets set"),
        (["--fleet", f"a={ok}", "--fleet", f"a={ok}"], "fleet 'a' is given twice"),
        (["--fleet", f"a b={ok}", "--fleet", f"c={ok}"], "fleets.a b: a fleet name is letters"),
    ]
    for extra, message in cases:
        assert main(["whatif", "-c", str(exp), "--storage", str(tmp_path / "never"), *extra]) == 2, message
        err = capsys.readouterr().err
        assert message in err, (message, err)
    bad_spec = write_yaml(tmp_path / "w.yaml", {"fleet": []})
    assert main(["whatif", str(bad_spec)]) == 2
    err = capsys.readouterr().err
    assert ("invalid what-if:\n  fleet = []: unknown key; did you mean 'fleets'? allowed keys: name, base, "
            "overrides, fleets") in err
    assert not (tmp_path / "never").exists()


# ---------------------------------------------------------------- in a real browser



@pytest.mark.ray
@pytest.mark.skipif(not any(map(shutil.which, BROWSERS)), reason="no headless Chromium installed "
                    "(Debian: apt-get install chromium)")
def test_reports_render_in_a_headless_browser(fedavg_run, small_sweep, tmp_path):
    """Debian's chromium opens the run and the sweep report offline and draws the figures."""
    import re

    from PIL import Image

    def coloured_share(png: Path) -> float:
        img = np.asarray(Image.open(png).convert("RGB")).astype(int)
        assert img.shape == (2400, 1400, 3)
        return float(((img.max(axis=2) - img.min(axis=2)) > 60).mean())

    for name, folder in (("run", fedavg_run), ("sweep", small_sweep.path)):
        page = build_report(folder, tmp_path / f"{name}.html")
        # no figures folder: the page alone must carry its images
        shutil.rmtree(tmp_path / f"{name}_figures")
        screenshot(page, tmp_path / f"{name}.png")
        # the same page with its images blanked: text and tables only
        blank = tmp_path / f"{name}_blank.html"
        blank.write_text(re.sub(r'src="data:[^"]*"', 'src=""', page.read_text()))
        screenshot(blank, tmp_path / f"{name}_blank.png")
        # the embedded PNGs were decoded and laid out: coloured plot pixels, which text and
        # tables alone barely have (measured: 0.3-11% of the window vs 0.003%)
        with_figures, without = coloured_share(tmp_path / f"{name}.png"), coloured_share(tmp_path / f"{name}_blank.png")
        assert with_figures > 0.001 and with_figures > 10 * without, (name, with_figures, without)


def test_whatif_spec_is_a_sweep_over_named_fleets_of_the_default_experiment():
    from sweeps import resolve
    from sweeps.whatif import base_experiment, whatif_sweep_spec

    spec = whatif_sweep_spec(base_experiment(None), {"a": FAST, "b": SLOW}, name="x", overrides=["rounds=2"])
    assert spec["base"]["dataset"]["name"] == "mnist5k" and spec["base"]["rounds"] == 2  # engine/config/default.yaml
    assert spec["space"] == {"clients.profiles": {"named": {"a": FAST, "b": SLOW}}}
    r = resolve(spec)
    assert r.num_trials == 2 and r.param_columns == {"clients.profiles": "fleet"}
    assert r.trial_raw({"clients.profiles": "b"})["clients"]["profiles"] == SLOW
    assert r.trial_raw({"clients.profiles": "b"})["seed"] == r.trial_raw({"clients.profiles": "a"})["seed"]


@pytest.mark.ray
def test_whatif_fleets_may_replay_trace_files_given_by_relative_paths(tmp_path, local_ray, capsys, monkeypatch):
    """Trials run in Tune's working folders: a fleet's relative trace path still finds its file."""
    import sweeps

    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"trace_id": ["a", "a", "a"], "t_s": [0.0, 1.0, 2.0], "down_mbps": [50.0, 5.0, 50.0],
                  "up_mbps": [10.0, 1.0, 10.0]}).to_csv(tmp_path / "links.csv", index=False)
    replayed = FAST | {"conditions": {"sets": {"all": {"down": {"kind": "trace", "file": "links.csv"},
                                                       "up": {"kind": "trace", "file": "links.csv"}}}}}
    spec = write_yaml(tmp_path / "whatif.yaml", {
        "name": "traces", "base": SWEEP_BASE | {"algorithm": {"name": "fedavg"}},
        "fleets": [{"name": "fast", "profiles": FAST}, {"name": "replayed", "profiles": replayed}],
        "storage": str(tmp_path / "wi"), "max_concurrent_trials": 1})  # one trial process runs both fleets
    assert main(["whatif", str(spec), "-q"]) == 0
    s = sweeps.load_sweep(tmp_path / "wi")
    assert (s.trials["status"] == "finished").all()
    runs = {row.fleet: s.run(row.trial_id) for row in s.trials.itertuples()}
    assert runs["replayed"].clients["down_state"].str.startswith("a@").all()
    assert (runs["replayed"].clients["sim_upload_s"] > runs["fast"].clients["sim_upload_s"]).all()


def _sweep_folder(root: Path, spec: dict, trials: dict[str, dict]) -> Path:
    """A sweep folder as a sweep leaves it, without Ray: sweep.yaml, and one run folder with its
    trial.json per trial (``trials``: trial id -> its params as Tune gives them)."""
    import json

    import yaml

    from sweeps.spec import expand_params, resolve

    resolved = resolve(spec, storage=root)
    root.mkdir(parents=True)
    (root / "sweep.yaml").write_text(yaml.safe_dump(resolved.to_dict(), sort_keys=False))
    for trial_id, params in trials.items():
        run = root / "runs" / trial_id
        values = expand_params(spec["space"], params)
        run_experiment(load_config(spec["base"], values), run, command=["test"])
        (run / "trial.json").write_text(json.dumps({"params": params, "status": "finished"}))
    return root


SHOW_BASE = SWEEP_BASE | {"rounds": 2, "algorithm": {"name": "fedavg"}}


@pytest.fixture(scope="module")
def lr_sweep_folder(tmp_path_factory) -> Path:
    # the show and the damaged-files tests read the same two-trial sweep; built once (a test that
    # damages it works on a copy)
    return _sweep_folder(tmp_path_factory.mktemp("lr") / "sw",
                         {"name": "lr", "base": SHOW_BASE, "space": {"train.lr": {"grid": [0.05, 0.1]}}},
                         {"t_0": {"train.lr": 0.05}, "t_1": {"train.lr": 0.1}})


def test_show_prints_the_trial_table_of_a_sweep_and_of_a_whatif_folder(lr_sweep_folder, tmp_path, capsys):
    from sweeps.whatif import whatif_sweep_spec

    base = SHOW_BASE
    sweep = lr_sweep_folder
    assert main(["show", str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith(f"{sweep}: sweep lr\ntrials: 2 finished\n")
    assert "lr" in out and "t_0" in out and "t_1" in out and "by best_global_acc (max)" in out
    assert f"hetsim report {sweep}" in out

    spec = whatif_sweep_spec(base, {"fast": FAST, "slow": SLOW}, name="wi", storage=tmp_path / "wi")
    wi = _sweep_folder(tmp_path / "wi", spec, {"t_0": {"clients.profiles": "fast"},
                                              "t_1": {"clients.profiles": "slow"}})
    assert main(["show", str(wi)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith(f"{wi}: what-if wi\ntrials: 2 finished\n")
    assert "fleet" in out and "fast" in out and "slow" in out
    assert "slow vs fast: the same accuracy, the same arrivals" in out


def test_show_and_report_of_a_sweep_folder_with_damaged_files(lr_sweep_folder, tmp_path, capsys):
    from engine.results import open_storage
    from sweeps.results import load_sweep, write

    sweep = Path(shutil.copytree(lr_sweep_folder, tmp_path / "sw", symlinks=True))
    loaded = load_sweep(sweep)
    write(open_storage(sweep), loaded.trials, loaded.rounds)  # as a sweep leaves them when it ends
    (sweep / "trials.parquet").write_bytes(b"PAR1 cut short")
    assert main(["show", str(sweep)]) == 0  # the summaries are read from the trials' folders instead
    out, err = capsys.readouterr()
    assert "trials: 2 finished" in out and f"{sweep}/trials.parquet is unreadable" in err
    (sweep / "runs/t_1/trial.json").write_text('{"params": {"train.lr"')
    for argv in (["show", str(sweep)], ["report", str(sweep), "-o", str(tmp_path / "r.html")]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert "This is a bug" not in err and f"{sweep}/runs/t_1/trial.json is damaged (not valid JSON" in err
