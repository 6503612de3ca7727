"""Nothing a user gives is dropped without a word: a list of named things with a name given twice
is refused naming both; a table of several files is unified column by column, refused naming the
file and the column where they disagree; the Python API's arguments are checked with the CLI's
wording before anything is written."""
import numpy as np
import pandas as pd
import pytest

import engine
from engine.config.schema import load_config
from engine.data.tabular import TableDatasetError, read_parquet_table
from engine.errors import ConfigError
from engine.run.api import run_experiment
from hardware_profiles.catalog import CatalogError, load_catalog
from hetsim.cli import main
from sweeps.spec import SweepSpecError, resolve
from sweeps.whatif import load_whatif_file

TINY = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=4", "rounds=1", "partition.scheme=iid"]


# ---------------------------------------------------------------- names given twice


def test_whatif_fleets_named_twice_are_refused_naming_both(tmp_path):
    spec = tmp_path / "w.yaml"
    spec.write_text("fleets:\n  - {name: a, profiles: {network: {5mbps: 1.0}}}\n"
                    "  - {name: a, profiles: {network: {wifi: 1.0}}}\n  - {name: b, profiles: {}}\n")
    with pytest.raises(SweepSpecError) as err:
        load_whatif_file(spec)
    assert str(err.value) == ("invalid what-if:\n  fleets[0] and fleets[1] are both named 'a'; give each its own "
                              "name")


def test_a_fleet_option_naming_a_fleet_of_the_file_names_both(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.yaml").write_text("fleets:\n  - {name: a, profiles: {}}\n  - {name: b, profiles: {}}\n")
    (tmp_path / "f.yaml").write_text("network: {wifi: 1.0}\n")
    assert main(["whatif", "w.yaml", "--fleet", "a=f.yaml", "--dry-run"]) == 2
    assert "fleet 'a' is given twice (fleets.a of w.yaml and --fleet a=f.yaml)" in capsys.readouterr().err


def test_ascend_arms_given_twice_are_refused_naming_both():
    with pytest.raises(ConfigError, match=r"arms\[0\] and arms\[2\] are both 'topk'; list each arm once"):
        load_config(None, ["algorithm={name: ascend, arms: [topk, randomk, topk]}"])


def test_catalog_tiers_given_twice_are_refused():
    with pytest.raises(CatalogError, match=r"'edge' is given twice \(lines 2 and 3\)"):
        load_catalog("devices:\n  edge: {gflops: 1}\n  edge: {gflops: 2}\n")


def test_a_spec_files_overrides_list_refuses_a_key_given_twice(tmp_path, capsys):
    (tmp_path / "w.yaml").write_text("overrides: [rounds=2, train.lr=0.1, rounds=3]\n"
                                     "fleets:\n  - {name: a, profiles: {}}\n  - {name: b, profiles: {}}\n")
    assert main(["whatif", str(tmp_path / "w.yaml"), "--dry-run"]) == 2
    assert capsys.readouterr().err == ("hetsim: invalid what-if:\n  overrides: key rounds is given twice "
                                       "('rounds=2' and 'rounds=3'); give each key once\n")
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {dataset: {name: digits}, model: {name: mlp}}\noverrides: [rounds=2, rounds=3]\n"
                    "space: {train.lr: {grid: [0.1, 0.2]}}\n")
    with pytest.raises(SweepSpecError, match=r"overrides: rounds is given twice \('rounds=2' and 'rounds=3'\)"):
        resolve(spec, data_checks=[])


# ---------------------------------------------------------------- tables of several files


def _files(tmp_path, first: pd.DataFrame, second: pd.DataFrame):
    folder = tmp_path / "table"
    folder.mkdir()
    first.to_parquet(folder / "a.parquet")
    second.to_parquet(folder / "b.parquet")
    return folder


def _frame(n, seed, **extra):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"f0": rng.normal(size=n), "f1": rng.normal(size=n), "label": rng.integers(0, 3, n),
                         **extra})


def test_a_feature_column_the_first_file_lacks_is_refused_naming_file_and_column(tmp_path):
    folder = _files(tmp_path, _frame(20, 0), _frame(20, 1, f2=np.ones(20)))
    with pytest.raises(TableDatasetError) as err:
        read_parquet_table(folder)
    assert str(err.value) == (f"{folder / 'a.parquet'}: has no column 'f2', which {folder / 'b.parquet'} has; every "
                              "file of the table needs the same columns (or name the features in "
                              "dataset.params.features)")
    # named features: the other column plays no part, and the files are read together
    t = read_parquet_table(folder, features=["f0", "f1"])
    assert t.x.shape == (40, 2)


def test_string_labels_in_a_later_file_are_refused_not_cast(tmp_path):
    second = _frame(20, 1)
    second["label"] = second["label"].astype(str)
    folder = _files(tmp_path, _frame(20, 0), second)
    with pytest.raises(TableDatasetError) as err:
        read_parquet_table(folder)
    assert str(err.value) == (f"{folder / 'b.parquet'}: column 'label' has type large_string, but "
                              f"{folder / 'a.parquet'} has it as int64; every file of the table needs the same types")


def test_float_labels_in_a_later_file_are_refused_naming_it(tmp_path):
    second = _frame(20, 1)
    second["label"] = second["label"] + 0.5
    folder = _files(tmp_path, _frame(20, 0), second)
    with pytest.raises(TableDatasetError, match=r"b\.parquet: column 'label' has type double, but .*a\.parquet "
                                                 r"has it as int64"):
        read_parquet_table(folder)


def test_integer_widths_and_floats_are_unified(tmp_path):
    first, second = _frame(20, 0), _frame(20, 1)
    second["label"] = second["label"].astype(np.int32)
    second["f0"] = second["f0"].astype(np.float32)
    folder = _files(tmp_path, first, second)
    t = read_parquet_table(folder)
    whole = pd.concat([first, second])
    np.testing.assert_array_equal(t.y, whole["label"].to_numpy())
    np.testing.assert_allclose(t.x[:, 0], whole["f0"].to_numpy(np.float32))


def test_a_label_column_typo_is_blamed_on_the_dataset_with_did_you_mean(tmp_path, monkeypatch, capsys):
    # a table with a split column: its name in the message once sent the blame to partition.scheme
    frame = _frame(40, 0, split=np.where(np.arange(40) < 30, "train", "test"))
    frame.to_parquet(tmp_path / "t.parquet")
    monkeypatch.chdir(tmp_path)
    code = main(["validate", "--set", "dataset={name: parquet, params: {path: t.parquet, label_column: lable, "
                 "split_column: split}}", "--set", "model.name=mlp", "--set", "clients.num_clients=4"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "partition.scheme" not in err
    assert err.splitlines()[1].startswith("  dataset 'parquet' (dataset.params = ")
    assert "dataset.params.label_column = 'lable' is not a column of" in err and "did you mean 'label'?" in err


# ---------------------------------------------------------------- the Python API's arguments


@pytest.mark.parametrize("config, overrides, words", [
    (5, None, "config = 5: give an ExperimentConfig, a mapping of sections"),
    ([1, 2], None, "config = [1, 2]: give an ExperimentConfig"),
    (None, "rounds=5", "overrides = 'rounds=5' is one string; give a list of key=value strings, e.g. ['rounds=5']"),
    (None, 5, "overrides = 5: give a list of key=value strings"),
    (None, ["rounds=5", 7], "overrides[1] = 7: give a key=value string"),
    (None, {3: 1}, "overrides: key 3 is not a dotted key"),
])
def test_simulate_checks_config_and_overrides_like_the_cli(config, overrides, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        engine.simulate(config, overrides)
    assert words in str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("callbacks, words", [
    (object(), "callbacks = <object object"),
    ([print, 42], "callbacks[1] = 42: neither a RunCallback nor callable"),
    ([engine.RunCallback], "callbacks[0] = RunCallback: a RunCallback class; give an instance"),
])
def test_a_bad_callback_is_refused_before_the_run_folder_exists(callbacks, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        run_experiment(load_config(None, TINY), tmp_path / "run", callbacks=callbacks)
    assert words in str(err.value)
    assert list(tmp_path.iterdir()) == []  # no `failed` folder left behind


def test_run_dir_that_is_a_file_names_the_folder_not_a_cli_flag(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError) as err:
        run_experiment(load_config(None, TINY), tmp_path / "afile")
    assert str(err.value) == f"{tmp_path / 'afile'} is a file, not a run folder; give a folder"
    with pytest.raises(ConfigError, match="run_dir = 5: give a folder path"):
        run_experiment(load_config(None, TINY), 5)
