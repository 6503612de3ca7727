"""The compare, what-if and sweep tables say async and say why: an asynchronous run or
trial is labelled by its mode ("fedbuff, async"), and an empty cell reads ``n/a [k]`` with a
footnote giving the run summary's reason. Real small runs; a what-if folder laid out as a sweep
leaves it (no Ray)."""
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from engine import load_config, run_experiment
from engine.results.manifest import method_cell
from hetsim.cli import main
from hetsim.compare import compare_table, load_entries, shown_table
from hetsim.summary import why_no_accuracy
from sweeps.results import load_sweep, name_columns, summary_table
from sweeps.spec import expand_params, resolve
from sweeps.whatif import whatif_sweep_spec

FEDBUFF = {"mode": "fedbuff", "concurrency": 2, "buffer_size": 2}
BASE = {"seed": 0, "rounds": 2, "dataset": {"name": "digits"}, "model": {"name": "mlp"},
        "clients": {"num_clients": 4, "participation": 0.5, "profiles": {}}, "algorithm": {"name": "fedavg"},
        "asynchronous": FEDBUFF}
FLEETS = {"fast": {"devices": {"laptop_cpu": 1.0}, "network": {"500mbps": 1.0}},
          "slow": {"devices": {"rpi4": 1.0}, "network": {"5mbps": 1.0}}}
ASYNC_REASON = "asynchronous runs evaluate the global model only: clients are not evaluated while dispatched"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """An asynchronous what-if folder (two fleets) and a synchronous run whose last round's energy
    is unknown (as the ledger writes a round with a tier of unknown power)."""
    root = tmp_path_factory.mktemp("c")
    whatif = root / "wi"
    spec = whatif_sweep_spec(BASE, FLEETS, name="wi", storage=whatif)
    whatif.mkdir()
    (whatif / "sweep.yaml").write_text(yaml.safe_dump(resolve(spec, storage=whatif).to_dict(), sort_keys=False))
    for i, fleet in enumerate(FLEETS):  # a named dimension: the trial holds the name
        run, params = whatif / "runs" / f"t_{i}", {"clients.profiles": fleet}
        run_experiment(load_config(spec["base"], expand_params(spec["space"], params)), run, command=["test"])
        (run / "trial.json").write_text(json.dumps({"params": params, "status": "finished"}))
    sync = run_experiment(load_config({**BASE, "asynchronous": None}), root / "sync", command=["test"])
    rounds = pd.read_parquet(sync / "rounds.parquet")
    rounds.loc[1, "energy_j"] = float("nan")
    rounds.to_parquet(sync / "rounds.parquet")
    return {"whatif": whatif, "sync": sync}


def test_method_cell_says_async_and_the_mode():
    assert method_cell({"algorithm": {"name": "fedprox"}}) == "fedprox"
    assert method_cell({"algorithm": {"name": "fedprox"}, "asynchronous": None}) == "fedprox"
    assert method_cell({"algorithm": {"name": "fedavg"}, "asynchronous": FEDBUFF}) == "fedbuff, async"
    assert method_cell({"algorithm": {"name": "fedprox"}, "asynchronous": {"mode": "fedasync"}}) == \
        "fedasync-fedprox, async"


def test_compare_labels_async_runs_and_footnotes_every_empty_cell(folders):
    entries = load_entries([folders["whatif"], folders["sync"]])
    assert [e.label for e in entries] == ["wi: fast (fedbuff, async)", "wi: slow (fedbuff, async)", "sync"]
    named = run_experiment(load_config(BASE), folders["sync"].parent / "fedbuff-digits", command=["test"])
    assert load_entries([named])[0].label == "fedbuff-digits (async)"  # its name gives the mode already
    table, _ = compare_table(entries, target=0.99)
    shown, footnotes = shown_table(table)
    energy_reason = "1 of 2 rounds include a client whose tier has no power model, so their energy is unknown"
    assert footnotes[0] == f"[1] n/a: {ASYNC_REASON}"
    assert footnotes[1].startswith(f"[2] n/a: {energy_reason}") and len(footnotes) == 2
    for i in (0, 1):  # the asynchronous fleets: no personalized accuracy, and the summary's reason
        assert shown.at[i, "final_pers_acc"] == shown.at[i, "best_pers_acc"] == "n/a [1]"
        assert shown.at[i, "energy_j"].endswith(" J")
    assert shown.at[2, "final_pers_acc"].endswith("%")  # a synchronous run has one
    assert shown.at[2, "energy_j"] == "n/a [2]"  # not the sum of the known round
    assert (shown["time_to_target_s"] == "not reached").all()  # explained by the target lines instead
    assert not shown.isin(["–", "nan"]).any().any()
    # the reasons are the run summary's own
    run = entries[0].run
    assert why_no_accuracy(run.rounds, run.config, "pers_acc") == ASYNC_REASON


def test_the_printed_table_and_the_page_carry_the_footnotes(folders, tmp_path, capsys):
    page = tmp_path / "cmp.html"
    assert main(["compare", str(folders["whatif"]), str(folders["sync"]), "--target", "0.99", "-o", str(page)]) == 0
    out = capsys.readouterr().out
    assert "n/a [1]" in out and f"[1] n/a: {ASYNC_REASON}" in out.replace("\n  ", " ")
    assert "–" not in out
    html = page.read_text()
    assert "n/a [1]" in html and f"[1] n/a: {ASYNC_REASON}" in html and "wi: fast (fedbuff, async)" in html


def test_sweep_trials_say_async_in_their_method_column(folders):
    sweep = load_sweep(folders["whatif"])
    assert sweep.trials["method"].tolist() == ["fedbuff, async", "fedbuff, async"]
    assert name_columns(sweep) == ["fleet", "method"]
    text = summary_table(sweep, width=None)
    header, *rows = text.splitlines()[2:]
    assert header.split()[:3] == ["trial_id", "fleet", "method"]
    assert all("fedbuff, async" in row for row in rows) and len(rows) == 2
    synchronous = sweep.trials.assign(method="fedavg")
    assert name_columns(type(sweep)(sweep.path, synchronous, sweep.rounds, sweep.spec, sweep.param_columns)) == \
        ["fleet"]  # a synchronous sweep: its hyperparameters name it
