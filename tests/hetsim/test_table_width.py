"""The tables `hetsim whatif`, `hetsim show` and `hetsim sweep` print fit 100 columns; `--wide`
prints them whole. Real run folders, a what-if folder laid out as a sweep leaves it."""
import json
from pathlib import Path

import pytest
import yaml

from engine import load_config, run_experiment
from engine.results.text import fold_table, wrap
from hetsim.cli import main
from hetsim.whatif import report_whatif
from sweeps.results import load_sweep
from sweeps.spec import expand_params, resolve
from sweeps.whatif import whatif_sweep_spec

BASE = {"seed": 0, "rounds": 2, "dataset": {"name": "digits"}, "model": {"name": "mlp"},
        "clients": {"num_clients": 6, "participation": 0.5, "profiles": {}}, "algorithm": {"name": "fedavg"}}
FLEETS = {"all_500mbps": {"devices": {"laptop_cpu": 1.0}, "network": {"500mbps": 1.0}},
          "half_on_5mbps": {"devices": {"rpi4": 0.5, "laptop_cpu": 0.5}, "network": {"5mbps": 0.5, "500mbps": 0.5}}}


@pytest.fixture(scope="module")
def whatif_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("w") / "wi"
    spec = whatif_sweep_spec(BASE, FLEETS, name="wi", storage=root)
    resolved = resolve(spec, storage=root)
    root.mkdir(parents=True)
    (root / "sweep.yaml").write_text(yaml.safe_dump(resolved.to_dict(), sort_keys=False))
    for i, fleet in enumerate(FLEETS):
        run, params = root / "runs" / f"t_{i}", {"clients.profiles": fleet}
        run_experiment(load_config(spec["base"], expand_params(spec["space"], params)), run, command=["test"])
        (run / "trial.json").write_text(json.dumps({"params": params, "status": "finished"}))
    return root


def _widest(text: str, root: Path) -> int:
    return max(len(line) for line in text.replace(str(root), "<dir>").splitlines())  # a path is the user's


@pytest.mark.slow  # ~25 s on 2 cores: two runs, then the compare page twice
def test_whatif_and_show_tables_fit_100_columns_and_wide_prints_them_whole(whatif_folder, capsys):
    assert report_whatif(load_sweep(whatif_folder), target=0.3) == 0  # what `hetsim whatif` prints at its end
    folded = capsys.readouterr().out
    assert report_whatif(load_sweep(whatif_folder), target=0.3, width=None) == 0
    whole = capsys.readouterr().out
    assert _widest(folded, whatif_folder) <= 100 < _widest(whole, whatif_folder)
    # the table's blocks: a header starting with `run`, then one row per fleet, named
    blocks = folded.split("\ntime_to_target_s /")[0].strip("\n").split("\n\n")
    assert len(blocks) > 1
    for block in blocks:
        header, *rows = block.splitlines()
        assert header.split()[0] == "run" and [r.split()[0] for r in rows] == list(FLEETS), block
    assert sum(len(b.splitlines()[0].split()) - 1 for b in blocks) == len(whole.splitlines()[0].split()) - 1
    assert main(["show", str(whatif_folder)]) == 0
    shown = capsys.readouterr().out
    assert _widest(shown, whatif_folder) <= 100 and "half_on_5mbps" in shown
    assert main(["show", str(whatif_folder), "--wide"]) == 0
    assert _widest(capsys.readouterr().out, whatif_folder) > 100


def test_fold_table_keeps_the_key_column_in_every_block_and_wrap_never_cuts_words():
    import pandas as pd

    df = pd.DataFrame({"run": ["a", "b"], **{f"column_{i:02d}_with_a_long_name": [i, i + 1] for i in range(8)}})
    text = fold_table(df, 60)
    blocks = text.split("\n\n")
    assert len(blocks) > 1 and all(b.splitlines()[0].split()[0] == "run" for b in blocks)
    assert max(map(len, text.splitlines())) <= 60
    assert sum(b.count("column_") for b in blocks) == 8  # every column once
    assert fold_table(df, None) == df.to_string(index=False)
    line = "word " * 30 + "/a/very/long/path/" * 8
    assert all(len(part) <= 60 or "/" in part for part in wrap(line, 60).splitlines())
    assert wrap(line, 60).replace("\n  ", " ").split() == line.split()
