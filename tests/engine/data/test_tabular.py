"""Federated datasets a user brings: LEAF's JSON files and Parquet tables (engine.data.tabular),
read into natural clients with their own test sets, run end to end from a config on both
executors, and every malformed table refused with the file and column named."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.tabular import USERS, comparable_tables, write_leaf

from engine.config.schema import load_config
from engine.data.build import build_data
from engine.data.datasets import load_dataset
from engine.data.tabular import TableDatasetError, leaf_to_parquet, read_leaf, read_parquet_table
from engine.results.tables import load_run
from engine.run.api import run_experiment


def test_leaf_users_become_natural_clients_with_their_own_test_rows(tmp_path):
    data = write_leaf(tmp_path / "leaf")
    t = read_leaf(tmp_path / "leaf")
    assert t.client_names == sorted(USERS) and t.num_classes == 3
    for k, u in enumerate(t.client_names):
        x, y, n = data[u]
        np.testing.assert_allclose(t.x[t.clients[k]], x[:n].astype(np.float32))
        np.testing.assert_array_equal(t.y[t.clients[k]], y[:n])
        np.testing.assert_allclose(t.test_x[t.test_clients[k]], x[n:].astype(np.float32))
    # through the engine's partition: local test sets are exactly LEAF's test rows
    cfg = load_config(None, ["dataset.name=leaf", f"dataset.params={{path: {tmp_path / 'leaf'}}}",
                             "partition.scheme=natural", "clients.num_clients=6", "partition.global_test_fraction=0.1"])
    fd = build_data(cfg)
    assert fd.num_clients == 6
    for k, u in enumerate(sorted(USERS)):
        x, y, n = data[u]
        np.testing.assert_allclose(np.sort(fd.x[fd.test_indices(k)], axis=0), np.sort(x[n:].astype(np.float32), axis=0))
        assert len(fd.train_indices(k)) + (fd.global_test_idx.size and 0) <= n
    assert len(fd.global_test_idx) > 0 and not np.intersect1d(fd.global_test_idx, fd.client_test_idx).size


def test_leaf_to_parquet_reads_back_identically(tmp_path):
    write_leaf(tmp_path / "leaf")
    out = leaf_to_parquet(tmp_path / "leaf", str(tmp_path / "leaf.parquet"))
    t1 = read_leaf(tmp_path / "leaf")
    t2 = read_parquet_table(out, client_column="client", split_column="split", features="features")
    for name in ("x", "y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(t1, name), getattr(t2, name))
    assert t1.client_names == t2.client_names
    for a, b in zip(t1.clients + t1.test_clients, t2.clients + t2.test_clients):
        np.testing.assert_array_equal(a, b)
    schema = pq.read_schema(out)
    assert pa.types.is_fixed_size_list(schema.field("features").type) and schema.names == [
        "client", "label", "features", "split"]


@pytest.mark.parametrize("executor", ["inprocess", "ray"])
def test_leaf_and_its_parquet_run_end_to_end_with_identical_tables(tmp_path, executor, ray_session):
    write_leaf(tmp_path / "leaf")
    table = leaf_to_parquet(tmp_path / "leaf", str(tmp_path / "leaf.parquet"))
    common = ["partition.scheme=natural", "clients.num_clients=6", "clients.participation=1.0", "rounds=3",
              "model.name=mlp", f"executor.kind={executor}"]
    if executor == "ray":
        common += ["executor.num_actors=2"]
    leaf = load_run(run_experiment(load_config(None, [
        "dataset.name=leaf", f"dataset.params={{path: {tmp_path / 'leaf'}}}", *common]), tmp_path / "a"))
    parquet = load_run(run_experiment(load_config(None, [
        "dataset.name=parquet",
        f"dataset.params={{path: {table}, client_column: client, split_column: split, features: features}}",
        *common]), tmp_path / "b"))
    a, b = comparable_tables(leaf), comparable_tables(parquet)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)
    assert leaf.rounds["global_acc"].notna().all() and (leaf.rounds["num_arrived"] > 0).all()
    if executor == "ray":  # the same as in-process
        ref = load_run(run_experiment(load_config(None, [
            "dataset.name=leaf", f"dataset.params={{path: {tmp_path / 'leaf'}}}",
            *[c for c in common if not c.startswith("executor")]]), tmp_path / "c"))
        for name, frame in comparable_tables(ref).items():
            pd.testing.assert_frame_equal(a[name], frame, obj=name)


def test_a_table_of_scalar_columns_with_string_clients_or_any_other_scheme(tmp_path):
    rng = np.random.default_rng(1)
    n = 300
    df = pd.DataFrame({"device": rng.choice(["alice", "bob", "carol", "dave"], n),
                       **{f"f{j}": rng.normal(size=n) for j in range(5)}, "y": rng.integers(0, 4, n)})
    path = tmp_path / "t.parquet"
    df.to_parquet(path, row_group_size=64)  # several record batches
    t = read_parquet_table(path, label_column="y", client_column="device")
    assert t.client_names == ["alice", "bob", "carol", "dave"] and t.x.shape == (n, 5) and t.test_x is None
    for k, name in enumerate(t.client_names):
        rows = df[df["device"] == name]
        np.testing.assert_allclose(t.x[t.clients[k]], rows[[f"f{j}" for j in range(5)]].to_numpy(np.float32))
    ds = load_dataset("parquet", path=str(path), label_column="y")  # no client column: other schemes
    cfg = load_config(None, ["dataset.name=parquet", f"dataset.params={{path: {path}, label_column: y}}",
                             "partition.scheme=dirichlet", "clients.num_clients=5", "partition.min_samples=5"])
    assert ds.natural_clients is None and build_data(cfg).num_clients == 5


def test_a_relative_table_path_is_stored_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["dataset.name=parquet", "dataset.params={path: data/t.parquet}"])
    assert cfg.dataset.params["path"] == str(tmp_path / "data" / "t.parquet")


def _write(tmp_path, **cols):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(cols), path)
    return path


@pytest.mark.parametrize("make, kwargs, message", [
    (lambda: {"a": [1.0, 2.0], "b": [0, 1]}, {}, r"label_column = 'label' is not a column.*\['a', 'b'\]"),
    (lambda: {"a": ["x", "y"], "label": [0, 1]}, {}, r"no numeric feature columns"),
    (lambda: {"a": ["x", "y"], "label": [0, 1]}, {"features": ["a"]}, r"feature column 'a' has type string"),
    (lambda: {"a": [1.0, 2.0], "label": [0.5, 1.0]}, {}, r"labels must be integers"),
    (lambda: {"a": [1.0, 2.0], "label": [-1, 1]}, {}, r"negative values"),
    (lambda: {"a": [1.0, None], "label": [0, 1]}, {}, r"missing \(null\) rows"),
    (lambda: {"a": [1.0, float("nan")], "label": [0, 1]}, {}, r"NaN or infinite"),
    (lambda: {"v": [[1.0, 2.0], [3.0]], "label": [0, 1]}, {}, r"lists of different lengths"),
    (lambda: {"a": [1.0, 2.0], "label": [0, 1]}, {"features": ["zz"]}, r"names columns \['zz'\]"),
    (lambda: {"a": [1.0, 2.0], "label": [0, 1]}, {"shape": [3]}, r"shape = \[3\] holds 3 values; each sample has 1"),
    (lambda: {"a": [1.0, 2.0], "label": [0, 3]}, {"num_classes": 2}, r"labels go up to 3"),
    (lambda: {"a": [1.0, 2.0, 3.0], "label": [0, 1, 1], "c": ["u", "u", "w"], "s": ["train", "train", "test"]},
     {"client_column": "c", "split_column": "s"}, r"client 'w' has no training rows"),
    (lambda: {"a": [1.0, 2.0], "label": [0, 1], "s": ["train", "validation"]}, {"split_column": "s"},
     r"values \['validation'\]; allowed: \['train', 'test'\]"),
])
def test_malformed_tables_are_refused_naming_the_column(tmp_path, make, kwargs, message):
    path = _write(tmp_path, **make())
    with pytest.raises(TableDatasetError, match=message):
        read_parquet_table(path, **kwargs)


def test_missing_paths_and_bad_leaf_folders_say_what_is_missing(tmp_path):
    with pytest.raises(TableDatasetError, match="does not exist"):
        read_parquet_table(tmp_path / "nope.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TableDatasetError, match="folder without .parquet files"):
        read_parquet_table(tmp_path / "empty")
    with pytest.raises(TableDatasetError, match=r"no train/\*\.json files"):
        read_leaf(tmp_path / "empty")
    (tmp_path / "l" / "train").mkdir(parents=True)
    (tmp_path / "l" / "test").mkdir(parents=True)
    (tmp_path / "l" / "train" / "a.json").write_text("{not json")
    with pytest.raises(TableDatasetError, match="not a readable LEAF JSON file"):
        read_leaf(tmp_path / "l")
    with pytest.raises(Exception, match=r"parquet: dataset.params.path is required"):
        load_dataset("parquet")
