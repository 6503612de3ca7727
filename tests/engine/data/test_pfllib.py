"""``partition.scheme: pfllib``: PFLlib's splits equal what PFLlib's own code gives for the same
labels and seed (pfllib_splits.json, written by bench/make_pfllib_fixture.py from PFLlib's and the
FedCSPACK reference's code: same clients, same sizes, same label counts, the same rows), and its
settings are checked with messages that name them."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from engine.config.schema import load_config
from engine.data import pfllib
from engine.data.build import build_data
from engine.data.datasets import FASHION_MNIST_DEBIAN_ROOT, read_idx
from engine.data.partition import partition_pool
from engine.errors import ConfigError

FIXTURE = json.loads((Path(__file__).with_name("pfllib_splits.json")).read_text())
CASES = {case["name"]: case for case in FIXTURE["cases"]}
PFLLIB_FIELDS = ("split", "balance", "class_per_client", "batch_size", "seed", "variant")


def _overrides(case: dict) -> list[str]:
    pf = {k: case[k] for k in PFLLIB_FIELDS}
    return [f"dataset.name={case['dataset']}", "partition.scheme=pfllib", f"partition.alpha={case['alpha']}",
            f"partition.test_fraction={1 - case['train_ratio']}", f"clients.num_clients={case['num_clients']}",
            *(f"partition.pfllib.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in pf.items())]


def _digest(idx: np.ndarray, ptr: np.ndarray) -> str:
    h = hashlib.sha256()
    for c in range(len(ptr) - 1):
        h.update(np.sort(idx[ptr[c]:ptr[c + 1]]).astype("<i8").tobytes())
    return h.hexdigest()


def _assert_same_split(case: dict, y: np.ndarray, tr_idx, tr_ptr, te_idx, te_ptr) -> None:
    assert np.diff(tr_ptr).tolist() == case["train_sizes"]
    assert np.diff(te_ptr).tolist() == case["test_sizes"]
    k = len(case["train_label_counts"][0])
    for idx, ptr, key in ((tr_idx, tr_ptr, "train_label_counts"), (te_idx, te_ptr, "test_label_counts")):
        owner = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
        counts = np.bincount(owner * k + y[idx], minlength=(len(ptr) - 1) * k).reshape(-1, k)
        assert counts.tolist() == case[key], key
    # and the very rows (each client's pool positions)
    assert _digest(tr_idx, tr_ptr) == case["train_sha256"]
    assert _digest(te_idx, te_ptr) == case["test_sha256"]


def test_the_fixture_says_where_it_comes_from():
    prov = FIXTURE["provenance"]
    assert prov["pfllib"]["commit"] == "d832e76f6a23b833038949ec1e4fdefe63a4d350"
    assert prov["fedcspack"]["commit"] == "6bb6d9ef68d8e74873cbd3480337deabbe3a7e76"
    assert {c["split"] for c in CASES.values()} == {"iid", "pat", "dir", "exdir"}
    assert {c["variant"] for c in CASES.values()} == {"pfllib", "fedcspack"}
    assert any(c["nan_cast"] for c in CASES.values())  # PFLlib's 0/0 cast is covered too


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["dataset"] != "fashion_mnist"])
def test_our_split_is_pfllibs_own_for_the_same_seed(name):
    case = CASES[name]
    data = build_data(load_config(None, _overrides(case)))
    _assert_same_split(case, data.y, data.client_train_idx, data.client_train_ptr, data.client_test_idx,
                       data.client_test_ptr)
    # the global test set: every client's local test rows, which no client trains on
    np.testing.assert_array_equal(data.global_test_idx, np.sort(data.client_test_idx))
    assert data.meta["pfllib"]["variant"] == case["variant"] and len(data.public_idx) == 0


def test_the_fmnist_split_of_table_1_is_the_references():
    """FedCSPACK's Fashion-MNIST Dir(0.3) partition (its data_gene.sh settings, batch 16), from the labels."""
    folder = FASHION_MNIST_DEBIAN_ROOT
    files = [os.path.join(folder, f"{s}-labels-idx1-ubyte.gz") for s in ("train", "t10k")]
    if not all(os.path.isfile(f) for f in files):
        pytest.skip(f"needs dataset-fashion-mnist (apt-get install dataset-fashion-mnist: {folder})")
    train, test = (read_idx(f).astype(np.int64) for f in files)
    y = np.concatenate([train, test])
    case = CASES["fedcspack-dir0.3-fmnist"]
    pfllib = {k: case[k] for k in PFLLIB_FIELDS} | {"global_test": "official"}
    tr_idx, tr_ptr, te_idx, te_ptr, held, public = partition_pool(
        y, len(train), num_clients=20, scheme="pfllib", seed=0, alpha=0.3, test_fraction=0.25, pfllib=pfllib)
    _assert_same_split(case, y, tr_idx, tr_ptr, te_idx, te_ptr)
    # official: the 10,000 test images, which (as in the reference) the clients hold too
    np.testing.assert_array_equal(held, np.arange(60_000, 70_000))
    assert len(public) == 0 and np.isin(held, tr_idx).sum() > 7000


def test_the_seed_is_pfllibs_unless_null_and_then_the_experiments():
    base = ["dataset.name=digits", "partition.scheme=pfllib", "clients.num_clients=10", "partition.alpha=0.5"]
    sizes = {}
    for seed, data_seed in ((0, 1), (5, 1), (5, "null"), (0, "null"), (0, 5)):
        cfg = load_config(None, [*base, f"seed={seed}", f"partition.pfllib.seed={data_seed}"])
        sizes[seed, data_seed] = build_data(cfg).client_num_train().tolist()
    assert sizes[0, 1] == sizes[5, 1]  # PFLlib's fixed data seed: the experiment's seed does not move it
    assert sizes[5, "null"] == sizes[0, 5] != sizes[0, "null"] != sizes[0, 1]


@pytest.mark.parametrize("overrides, message", [
    (["partition.pfllib.split=dir", "partition.pfllib.balance=false"],
     r"partition.pfllib.balance = false with split 'dir': PFLlib's dir split has no unbalanced form"),
    (["partition.pfllib.split=exdir", "partition.pfllib.balance=false"],
     r"PFLlib's own exdir always balances; the unbalanced exdir is the FedCSPACK reference's"),
    (["partition.pfllib.split=pam"], r"partition.pfllib.split.*'pam'.*iid.*pat.*dir.*exdir"),
    (["partition.pfllib.variant=flower"], r"partition.pfllib.variant.*'pfllib' or 'fedcspack'"),
    (["partition.pfllib.seed=-1"], r"partition.pfllib.seed"),
    (["partition.pfllib.class_per_client=0"], r"partition.pfllib.class_per_client"),
    (["partition.public_fraction=0.1"], r"partition.public_fraction = 0.1 with scheme 'pfllib'.*no server-side"),
    (["partition.pfllib.batchsize=16"], r"partition.pfllib.batchsize.*batch_size"),
])
def test_bad_settings_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["partition.scheme=pfllib", *overrides])


@pytest.mark.parametrize("overrides, message", [
    (["partition.pfllib.split=exdir", "partition.pfllib.class_per_client=11"],
     r"class_per_client = 11 is invalid for split 'exdir'; allowed: an integer in 1..10"),
    (["partition.pfllib.split=pat", "partition.pfllib.balance=false", "clients.num_clients=300"],
     r"client 0 holds 1 row\(s\): its train share floor\(0.75 x 1\) is empty \(scikit-learn, in PFLlib"),
    (["partition.pfllib.split=pat", "partition.pfllib.balance=false", "clients.num_clients=1500"],
     r"balance = false: PFLlib draws each of the 300 clients' share of class 0 as .*= randint\(0.059\d*, 0.59\d*\), "
     "which has no integer"),
    (["partition.pfllib.split=dir", "partition.test_fraction=0.1", "clients.num_clients=900"],
     r"PFLlib's dir split needs at least 2 rows per client \(1797 rows for 900 clients\)"),
    (["partition.pfllib.global_test=official"], r"global_test = 'official': this dataset has no official test"),
    (["partition.alpha=0.001", "partition.pfllib.batch_size=200", "clients.num_clients=30"],
     r"dir split found no draw in 50 where every client holds at least 29 rows"),
])
def test_splits_pfllib_cannot_draw_say_why(overrides, message, monkeypatch):
    monkeypatch.setattr(pfllib, "MAX_TRIES", 50)  # PFLlib itself would redraw forever
    cfg = load_config(None, ["dataset.name=digits", "partition.scheme=pfllib", *overrides])
    with pytest.raises(ValueError, match=message):
        build_data(cfg)


def test_an_on_disk_table_gets_the_same_pfllib_split(tmp_path):
    """A Parquet table read per client (on_disk: true) is split by the same draws as in memory."""
    import pandas as pd

    from engine.data.datasets import load_dataset

    ds = load_dataset("digits")
    table = pd.DataFrame({f"f{i}": ds.x[:, i] for i in range(ds.x.shape[1])}).assign(label=ds.y)
    table.to_parquet(tmp_path / "t.parquet")

    def build(on_disk: bool):
        return build_data(load_config(None, [
            "dataset.name=parquet", "model.name=mlp", "partition.scheme=pfllib", "partition.pfllib.split=exdir",
            f"dataset.params={{path: {tmp_path / 't.parquet'}, cache_dir: {tmp_path / 'c'}, on_disk: {on_disk}}}",
            "clients.num_clients=12", "partition.alpha=0.5"]))

    eager, disk = build(False), build(True)
    assert disk.on_demand and not eager.on_demand
    for mine, theirs in ((disk.tr_idx, eager.client_train_idx), (disk.te_ptr, eager.client_test_ptr),
                         (disk.te_idx, eager.client_test_idx), (disk.global_test_idx, eager.global_test_idx)):
        np.testing.assert_array_equal(mine, theirs)
    assert {k: v for k, v in disk.meta.items() if k != "on_demand"} == eager.meta
    assert eager.meta["global_test_fraction"] is None and eager.meta["pfllib"]["split"] == "exdir"
