"""Run names and summaries: an asynchronous run is named and summarised by its mode and
counts server steps; energy, battery drops and drops by reason are in every summary; every ``n/a``
says why. Real small runs: synchronous with a deadline, asynchronous, batteries."""
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from engine.results import load_run
from engine.results.manifest import method_label
from hetsim.cli import main, summary_table
from hetsim.report import summary_items
from hetsim.summary import joules

SMALL = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=8", "rounds=3", "seed=1"]
SYNC = ["clients.participation=0.75",
        "clients.profiles={devices: {rpi4: 0.5, laptop_cpu: 0.5}, network: {5mbps: 0.5, 50mbps: 0.5}, "
        "availability: 0.8}", "clock.deadline_s=0.05"]
ASYNC = ["clients.profiles={devices: {phone_low: 0.5, laptop_cpu: 0.5}, network: {4g: 0.5, wifi: 0.5}}",
         "asynchronous={mode: fedbuff, concurrency: 4, buffer_size: 2}"]
ENERGY = ["clients.participation=1.0",
          "clients.profiles={devices: {phone_low: 1.0}, network: {4g: 1.0}, "
          "battery: {start: {low: 0.1, high: 0.9}, threshold: 0.5, charging: never}}"]


def _run(tmp_path, capsys, *overrides) -> tuple[str, str]:
    """``hetsim run`` into ``output.dir=tmp_path``: (run folder, what it printed)."""
    args = ["run", "-q", *sum((["--set", s] for s in [*SMALL, *overrides, f"output.dir={tmp_path}"]), [])]
    assert main(args) == 0
    printed = capsys.readouterr().out
    folder = re.search(r"^results: (.+)$", printed, re.M).group(1)
    return folder, printed


def _line(text: str, label: str) -> str:
    m = re.search(rf"^{re.escape(label)}\s{{2,}}(.+)$", text, re.M)
    assert m, f"no line {label!r} in:\n{text}"
    return m.group(1)


def _no_bare_na(text: str) -> None:
    assert not re.search(r"n/a(?! \()", text), text  # every n/a is followed by its reason


def test_method_label_names_the_asynchronous_mode():
    assert method_label("fedavg") == "fedavg"
    assert method_label("fedavg", "fedbuff") == "fedbuff"
    assert method_label("fedprox", "fedasync") == "fedasync-fedprox"


def test_a_synchronous_summary_counts_rounds_drops_by_reason_and_energy(tmp_path, capsys):
    folder, printed = _run(tmp_path, capsys, *SYNC)
    run = load_run(folder)
    assert re.fullmatch(r"fedavg-digits-\d{8}-\d{6}", folder.split("/")[-1])
    assert _line(printed, "method") == "fedavg (synchronous rounds)"
    assert _line(printed, "rounds") == "3 of 3"
    assert "server steps" not in printed
    # drops: the counts of clients.parquet's reasons, and the deadline made some
    reasons = run.clients["drop_reason"].fillna("")
    counts = reasons[reasons != ""].value_counts()
    assert counts.get("deadline", 0) > 0 and counts.get("unavailable", 0) > 0
    want = f"{counts.sum()} of {len(run.clients)} selected client-rounds: " + \
        ", ".join(f"{k} {v}" for k, v in counts.items())
    assert _line(printed, "dropped") == want
    # energy: the ledger's total (J) and per client that ran
    total = float(run.rounds["energy_j"].sum())
    assert _line(printed, "energy (fleet total)").startswith(joules(total) + ", ")
    wasted = float(run.rounds["energy_wasted_j"].sum())
    assert f"{100 * wasted / total:.1f} % on updates not aggregated" in printed and wasted > 0
    per = run.clients.dropna(subset=["energy_j"]).groupby("client_id")["energy_j"].sum()
    assert _line(printed, "energy per client") == (
        f"mean {joules(per.mean())}, max {joules(per.max())} (client {per.idxmax()}), {len(per)} clients ran")
    assert _line(printed, "battery drops") == "n/a (no batteries: clients.profiles.battery is not set)"
    pers = run.rounds["pers_acc"].dropna().iloc[-1]
    assert _line(printed, "personalized acc (final)").startswith(f"{100 * pers:.2f}% mean, ")
    _no_bare_na(printed)
    # `hetsim show` prints the same summary
    assert main(["show", folder]) == 0
    assert capsys.readouterr().out.strip() == summary_table(folder).strip()
    assert summary_table(folder) in printed


def test_an_asynchronous_run_is_named_and_summarised_by_its_mode(tmp_path, capsys):
    folder, printed = _run(tmp_path, capsys, *ASYNC)
    assert re.fullmatch(r"fedbuff-digits-\d{8}-\d{6}", folder.split("/")[-1])
    run = load_run(folder)
    assert run.manifest["asynchronous"] == "fedbuff" and run.manifest["algorithm"] == "fedavg"
    assert _line(printed, "method") == "fedbuff: asynchronous, clients train with fedavg (buffer 2, 4 in flight)"
    assert _line(printed, "server steps") == "3 of 3 (asynchronous: `rounds` counts server steps, not rounds)"
    assert not re.search(r"^rounds\s", printed, re.M)
    assert _line(printed, "personalized acc (final)") == (
        "n/a (asynchronous runs evaluate the global model only: clients are not evaluated while dispatched)")
    assert _line(printed, "dropped") == f"none of {len(run.clients)} dispatched client-rounds"
    assert _line(printed, "energy (fleet total)").startswith(joules(float(run.rounds["energy_j"].sum())))
    _no_bare_na(printed)
    # the report's summary table says the same, and its subtitle the mode
    items = dict(summary_items(Path(folder), run))
    assert items["server steps"].startswith("3 of 3") and items["method"].startswith("fedbuff: asynchronous")
    assert items["battery drops"].startswith("n/a (") and items["run folder"] == folder


def test_fedasync_with_fedprox_is_named_by_both(tmp_path, capsys):
    folder, printed = _run(tmp_path, capsys, ASYNC[0], "rounds=2", "algorithm.name=fedprox",
                           "asynchronous={mode: fedasync, concurrency: 3}")
    assert re.fullmatch(r"fedasync-fedprox-digits-\d{8}-\d{6}", folder.split("/")[-1])
    assert _line(printed, "method") == ("fedasync-fedprox: asynchronous, clients train with fedprox "
                                        "(one update per step, 3 in flight)")


def test_an_energy_summary_counts_battery_drops(tmp_path, capsys):
    folder, printed = _run(tmp_path, capsys, *ENERGY)
    run = load_run(folder)
    drops = int(run.rounds["num_battery"].sum())
    assert drops > 0  # half the phones start below the threshold
    lowest = 100 * float(run.rounds["battery_min"].min())
    assert _line(printed, "battery drops") == (
        f"{drops} client-rounds selected but out of charge; lowest level {lowest:.0f} %")
    assert "battery " in _line(printed, "dropped")
    assert (run.clients["drop_reason"] == "battery").sum() == drops
    _no_bare_na(printed)


def test_a_missing_accuracy_says_why(tmp_path, capsys):
    _, printed = _run(tmp_path, capsys, "rounds=1", "evaluation.global_model=false", "evaluation.personalized=false")
    assert _line(printed, "global accuracy (final)") == "n/a (evaluation.global_model: false)"
    assert _line(printed, "personalized acc (final)") == "n/a (evaluation.personalized: false)"


def test_a_run_written_before_the_energy_ledger_says_so(tmp_path, capsys):
    folder, _ = _run(tmp_path, capsys, "rounds=1")
    # an older run folder: its tables without the energy columns
    for table in ("rounds", "clients"):
        path = f"{folder}/{table}.parquet"
        df = pd.read_parquet(path)
        df.drop(columns=[c for c in df if c.startswith("energy_")]).to_parquet(path)
    text = summary_table(folder)
    assert _line(text, "energy") == "n/a (run written before the energy ledger: no energy columns)"
    _no_bare_na(text)
    assert json.loads((tmp_path / folder.split("/")[-1] / "manifest.json").read_text()).get("asynchronous") is None


def test_an_unknown_energy_is_not_summed_over_the_known_rounds(tmp_path, capsys):
    folder, _ = _run(tmp_path, capsys, "rounds=2")
    path = f"{folder}/rounds.parquet"
    df = pd.read_parquet(path)
    df.loc[1, "energy_j"] = float("nan")  # as the ledger writes a round with a tier of unknown power
    df.to_parquet(path)
    text = summary_table(folder)
    assert _line(text, "energy").startswith("n/a (1 of 2 rounds include a client whose tier has no power model")
    assert "energy (fleet total)" not in text


@pytest.mark.parametrize("value, text", [(0.5, "0.5 J"), (1234.0, "1.23 kJ"), (2.5e6, "2.5 MJ")])
def test_joules(value, text):
    assert joules(value) == text
