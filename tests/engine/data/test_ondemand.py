"""On-demand federated data: lazy ``synthetic`` generated per client from (seed, id),
Parquet tables read per client from an on-disk row cache; the same splits as the eager builder,
nothing but counts held for the fleet, identical tables on both executors."""
import inspect
import os
import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.cluster import S3Server
from helpers.tabular import comparable_tables, write_leaf

from engine.config.schema import load_config
from engine.data.build import build_data
from engine.data.datasets import load_synthetic
from engine.data.ondemand import OnDemandFederatedData, SyntheticSource, held_out
from engine.data.tabular import leaf_to_parquet
from engine.results.tables import load_run
from engine.run.api import run_experiment

SYNTH_DEFAULTS = {k: v.default for k, v in inspect.signature(load_synthetic).parameters.items()
                  if k not in ("root", "download", "seed", "lazy")}


def source(**kw) -> SyntheticSource:
    return SyntheticSource(seed=kw.pop("seed", 0), **{**SYNTH_DEFAULTS, **kw})


# The Ray runs keep their driver and client actors warm (result-neutral: test_matrix.py): the next
# run with the same actors (num_clients included) reuses those processes instead of starting three
# that each import torch. Every Ray run here has 6 clients (the LEAF table's) for that.
RAY = ["executor.kind=ray", "executor.num_actors=2", "executor.keep_warm=true"]


def lazy_cfg(*extra):
    return load_config(None, ["dataset.name=synthetic", "dataset.params={lazy: true}", "partition.scheme=natural",
                              "model.name=mlp", *extra])


# ---------------------------------------------------------------- lazy synthetic


def test_lazy_synthetic_values_are_pinned_and_depend_only_on_seed_and_client():
    s = source(num_clients=10)
    assert s.sizes.tolist() == [26, 18, 32, 31, 45, 67, 83, 30, 112, 80]
    x, y, tx, ty = s.rows(3)
    assert x.shape == (31, 60) and x.dtype == np.float32 and y.dtype == np.int64 and tx is None and ty is None
    np.testing.assert_allclose(x[0, :3], [-2.5092849731445312, -1.6891463994979858, 0.052418917417526245])
    assert y[:8].tolist() == [5, 1, 5, 1, 8, 1, 8, 1]
    iid = source(num_clients=10, iid=True)
    np.testing.assert_allclose(iid.rows(3)[0][0, :3], [-0.732774019241333, 0.2099580317735672, -0.17622390389442444])
    # a client's rows do not depend on the fleet's size or on which clients were built before
    big = source(num_clients=5000)
    assert (big.sizes[:10] == s.sizes).all()
    big.rows(4000)
    for a, b in zip(big.rows(3), s.rows(3)):
        if a is not None:
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(source(num_clients=10, seed=1).rows(3)[0][:5], x[:5])


def test_lazy_synthetic_follows_the_generative_model():
    """x = v_k + z * sqrt(diag(j^-1.2)): within a client the spread of feature j is j^-0.6;
    Synthetic-IID shares one labelling and no input shift, so its labels are less skewed."""
    s = source(num_clients=4, min_samples=20_000, max_samples=20_000)
    x = s.rows(0)[0]
    np.testing.assert_allclose(x.std(axis=0), np.arange(1, 61) ** -0.6, rtol=0.03)
    skew = {}
    for iid in (False, True):
        d = OnDemandFederatedData(source(num_clients=200, iid=iid), seed=0, test_fraction=0.0,
                                  global_test_fraction=0.0, public_fraction=0.0)
        counts = d.client_label_counts("train")
        assert counts.sum() == d.client_num_train().sum()
        dist = counts / counts.sum(axis=1, keepdims=True)
        skew[iid] = np.mean(0.5 * np.abs(dist - counts.sum(0) / counts.sum()).sum(axis=1))
    assert skew[False] > skew[True] + 0.2, skew


def test_each_client_splits_its_own_rows_by_the_eager_rule_without_overlap():
    src = source(num_clients=60)
    d = OnDemandFederatedData(src, seed=3, test_fraction=0.25, global_test_fraction=0.2, public_fraction=0.1)
    n = src.sizes
    g = held_out(n, 0.2)
    p = held_out(n - g, 0.1)
    t = held_out(n - g - p, 0.25)
    assert (d.client_num_test() == t).all() and (d.client_num_train() == n - g - p - t).all()
    assert (d.client_num_train() >= 1).all()
    for c in (0, 17, 59):
        parts = d.split(c)
        whole = src.rows(c)[0]
        rows = np.concatenate([parts[0], parts[2], parts[4], parts[6]])
        assert len(rows) == n[c]
        # the four sets are a partition of the client's rows
        np.testing.assert_array_equal(np.sort(rows.sum(axis=1)), np.sort(whole.sum(axis=1)))
        for a, b in zip(parts, d.split(c)):  # and the same every time
            np.testing.assert_array_equal(a, b)
    x, y = d.global_test_arrays()
    assert len(y) == d.num_global_test == g.sum() and x.shape == (g.sum(), 60)
    px, py = d.public_arrays()
    assert len(py) == d.num_public == p.sum()


def test_the_global_test_set_comes_from_a_bounded_seeded_subset_of_clients():
    src = source(num_clients=50)
    d = OnDemandFederatedData(src, seed=0, test_fraction=0.25, global_test_fraction=0.2, public_fraction=0.0,
                              heldout_clients=5)
    assert len(d.heldout) == 5 and len(np.unique(d.heldout)) == 5
    assert d.num_global_test == held_out(src.sizes, 0.2)[d.heldout].sum() == len(d.global_test_arrays()[1])
    again = OnDemandFederatedData(src, seed=0, test_fraction=0.25, global_test_fraction=0.2, public_fraction=0.0,
                                  heldout_clients=5)
    assert (again.heldout == d.heldout).all()
    np.testing.assert_array_equal(again.global_test_arrays()[0], d.global_test_arrays()[0])
    # shipped to hosts without the driver's held-out rows
    shipped = pickle.loads(pickle.dumps(d))
    assert shipped._held is None and d._held is not None
    np.testing.assert_array_equal(shipped.split(7)[0], d.split(7)[0])


def test_a_million_lazy_clients_hold_counts_only():
    data = build_data(lazy_cfg("clients.num_clients=1000000"))
    assert data.num_clients == 1_000_000 and data.on_demand
    held = [v for obj in (data, data.source) for v in vars(obj).values() if isinstance(v, np.ndarray)]
    per_client = sum(a.nbytes for a in held) / data.num_clients
    assert per_client < 64, f"{per_client:.1f} bytes per client"  # counts, not rows (60 floats a row)
    x, y, where = data.gather([5, 999_999], with_test=True)
    assert len(y) == sum(data.client_num_train()[[5, 999_999]]) + sum(data.client_num_test()[[5, 999_999]])
    assert set(where) == {5, 999_999} and len(where[999_999][0]) == data.client_num_train()[999_999]


def test_lazy_and_on_disk_need_natural_clients_and_name_the_field():
    with pytest.raises(ValueError, match=r"dataset.params.lazy: true .* partition.scheme = 'natural'.*not 'iid'"):
        build_data(lazy_cfg("partition.scheme=iid", "clients.num_clients=10"))
    with pytest.raises(ValueError, match="synthetic: num_features=0 is invalid"):
        build_data(lazy_cfg("dataset.params={lazy: true, num_features: 0}", "clients.num_clients=10"))
    with pytest.raises(ValueError, match="lazy=True rows are built per client"):
        load_synthetic(lazy=True)


@pytest.mark.ray
def test_lazy_synthetic_runs_end_to_end_with_identical_tables_on_both_executors(tmp_path, ray_session):
    common = ["clients.num_clients=6", "clients.participation=0.5", "rounds=3", "partition.public_fraction=0.0"]
    local = load_run(run_experiment(lazy_cfg(*common), tmp_path / "a"))
    ray = load_run(run_experiment(lazy_cfg(*common, *RAY), tmp_path / "b"))
    a, b = comparable_tables(local), comparable_tables(ray)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)
    assert local.rounds["global_acc"].notna().all() and (local.rounds["num_arrived"] > 0).all()
    assert local.manifest["num_clients"] == 6


# ---------------------------------------------------------------- on-disk Parquet


def _scrambled_table(path, n=2400, clients=30, seed=0, nan_at=None):
    """Rows in random order, string clients, a split column, several row groups."""
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, clients, n)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    if nan_at is not None:
        x[nan_at, 0] = np.nan
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.7)
    split = np.where(rng.random(n) < 0.2, "test", "train")
    split[np.unique(owner, return_index=True)[1]] = "train"  # every client has a training row
    pq.write_table(pa.table({"who": [f"c{o}" for o in owner], "label": y, "a": x[:, 0], "b": x[:, 1],
                             "c": x[:, 2], "d": x[:, 3], "split": split}), path, row_group_size=500)
    return path


def _table_cfg(table, cache, *extra, on_disk=True, clients=30):
    params = f"{{path: {table}, client_column: who, split_column: split, cache_dir: {cache}, on_disk: {on_disk}}}"
    return load_config(None, ["dataset.name=parquet", f"dataset.params={params}", "partition.scheme=natural",
                              f"clients.num_clients={clients}", "model.name=mlp", *extra])


def test_an_on_disk_table_gives_each_client_the_rows_the_in_memory_one_does(tmp_path):
    table = _scrambled_table(tmp_path / "t.parquet")
    eager = build_data(_table_cfg(table, tmp_path / "cache", on_disk=False))
    lazy = build_data(_table_cfg(table, tmp_path / "cache"))
    assert lazy.on_demand and lazy.num_clients == eager.num_clients == 30
    assert lazy.source.client_names == sorted(f"c{i}" for i in range(30))  # the eager numbering
    assert (lazy.client_num_train() == eager.client_num_train()).all()
    assert (lazy.client_num_test() == eager.client_num_test()).all()
    assert lazy.num_global_test == eager.num_global_test
    for c in range(30):
        xtr, ytr, xte, yte, xg, yg, *_ = lazy.split(c)
        # local test: exactly the client's own test rows, as in memory
        ex = eager.x[eager.test_indices(c)]
        np.testing.assert_array_equal(np.sort(xte[:, 0]), np.sort(ex[:, 0]))
        np.testing.assert_array_equal(np.sort(yte), np.sort(eager.y[eager.test_indices(c)]))
        # training rows + held out = the client's training rows of the table
        mine = np.concatenate([xtr, xg])[:, 0]
        held = np.intersect1d(eager.global_test_idx, _client_pool(eager, table, c))
        eager_rows = np.concatenate([eager.x[eager.train_indices(c)][:, 0], eager.x[held][:, 0]])
        np.testing.assert_array_equal(np.sort(mine), np.sort(eager_rows))


def _client_pool(eager, table, c):
    """Indices (into the eager pool) of client c's training rows in the table."""
    t = pq.read_table(table).to_pandas()
    names = sorted(t["who"].unique())
    train = t[t["split"] == "train"].reset_index(drop=True)
    return np.flatnonzero(train["who"].to_numpy() == names[c])


def test_the_row_cache_is_built_once_rebuilt_for_a_changed_table_and_never_left_half_written(tmp_path):
    table = _scrambled_table(tmp_path / "t.parquet")
    cache = tmp_path / "cache"
    build_data(_table_cfg(table, cache))
    first = sorted(os.listdir(cache))
    assert len(first) == 1 and set(os.listdir(cache / first[0])) == {"features.f32", "labels.i64", "counts.npz",
                                                                     "meta.json"}
    stamp = os.stat(cache / first[0] / "features.f32").st_mtime_ns
    build_data(_table_cfg(table, cache))
    assert sorted(os.listdir(cache)) == first and os.stat(cache / first[0] / "features.f32").st_mtime_ns == stamp
    _scrambled_table(table, seed=1)  # the same path, new content
    changed = build_data(_table_cfg(table, cache))
    assert len(os.listdir(cache)) == 2 and changed.source.folder != str(cache / first[0])
    bad = _scrambled_table(tmp_path / "bad.parquet", nan_at=1700)  # in the 4th row group: pass 2 fails
    with pytest.raises(ValueError, match="parquet: the features have NaN or infinite values"):
        build_data(_table_cfg(bad, tmp_path / "cache2"))
    assert os.listdir(tmp_path / "cache2") == []  # no partial cache, no .build- folder


def test_on_disk_tables_refuse_what_they_cannot_read_naming_the_field(tmp_path):
    table = _scrambled_table(tmp_path / "t.parquet")
    cfg = load_config(None, ["dataset.name=parquet", f"dataset.params={{path: {table}, on_disk: true}}",
                             "partition.scheme=natural", "clients.num_clients=30"])
    with pytest.raises(ValueError, match="with partition.scheme = .natural. needs dataset.params.client_column"):
        build_data(cfg)
    with pytest.raises(ValueError, match="clients.num_clients = 31 does not match the 30 natural clients"):
        build_data(_table_cfg(table, tmp_path / "cache", clients=31))
    with pytest.raises(ValueError, match="dataset.params.client_column = 'nope' is not a column"):
        build_data(load_config(None, ["dataset.name=parquet", "partition.scheme=natural",
                                      f"dataset.params={{path: {table}, on_disk: true, client_column: nope}}"]))
    # the source reopens its files after travelling to another process
    src = build_data(_table_cfg(table, tmp_path / "cache")).source
    src.rows(0)
    moved = pickle.loads(pickle.dumps(src))
    assert moved._fds is None and src._fds is not None
    for a, b in zip(moved.rows(4), src.rows(4)):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def leaf_local_run(tmp_path_factory):
    """The LEAF table's in-process run: both executor cases compare with it, computed once."""
    folder = tmp_path_factory.mktemp("leaf")
    write_leaf(folder / "leaf")
    table = leaf_to_parquet(folder / "leaf", str(folder / "leaf.parquet"))
    params = (f"dataset.params={{path: {table}, client_column: client, split_column: split, features: features, "
              f"on_disk: true, cache_dir: {folder / 'cache'}}}")
    common = ["dataset.name=parquet", params, "partition.scheme=natural", "clients.num_clients=6",
              "clients.participation=1.0", "rounds=3", "model.name=mlp"]
    return common, load_run(run_experiment(load_config(None, common), folder / "a"))


@pytest.mark.parametrize("executor", ["inprocess", pytest.param("ray", marks=pytest.mark.ray)])
def test_leaf_converted_to_parquet_runs_on_disk_end_to_end_on_both_executors(tmp_path, executor, leaf_local_run,
                                                                              ray_session):
    common, local = leaf_local_run
    assert local.rounds["global_acc"].notna().all() and (local.rounds["num_arrived"] > 0).all()
    seen = local.clients.groupby("client_id")["test_samples"].max().dropna()  # LEAF's own test rows
    assert len(seen) >= 4 and (seen == pd.Series([4, 5, 4, 5, 4, 5]).loc[seen.index]).all()
    if executor == "ray":
        ray = load_run(run_experiment(load_config(None, [*common, *RAY]), tmp_path / "b"))
        a, b = comparable_tables(local), comparable_tables(ray)
        for name in a:
            pd.testing.assert_frame_equal(a[name], b[name], obj=name)


# ---------------------------------------------------------------- client state within a budget


def test_client_states_spill_least_recently_used_beyond_the_budget_and_come_back_intact(tmp_path):
    import torch

    from engine.clients.states import ClientStates

    states = ClientStates(limit_bytes=3 * 4000 + 100, spill_dir=str(tmp_path))
    for c in range(10):
        states[c] = {"residual": torch.full((1000,), float(c)), "round": c}  # 4,000 bytes each
    assert len(states) == 10 and states.spilled == 7 and states.memory_bytes == 12_000
    assert list(states) == list(range(10))  # client order, in memory or not
    spill = [d for d in os.listdir(tmp_path) if d.startswith("hetsim-states-")]
    assert len(spill) == 1 and len(os.listdir(tmp_path / spill[0])) == 7
    got = states[0]  # back into memory; the least recently used (3) goes out
    assert got["round"] == 0 and torch.equal(got["residual"], torch.zeros(1000))
    assert 0 in states._memory and 3 in states._on_disk and states.spilled == 7
    got["round"] = 99  # changed in place, as methods do, then spilled and read again
    states[0] = got
    for c in (4, 5, 6):
        states[c]
    assert 0 in states._on_disk and states[0]["round"] == 99
    assert dict((c, s["round"]) for c, s in states.items()) == {**{c: c for c in range(10)}, 0: 99}
    del states[5]
    assert 5 not in states and len(states) == 9
    # a checkpoint shard holds every state, spilled or not, and reads back the same
    from engine.clients.format import load_client_states, save_client_states

    save_client_states(states, tmp_path / "shard.pt")
    back = load_client_states([tmp_path / "shard.pt"], lambda cid: True)
    assert list(back) == list(states) and all(torch.equal(back[c]["residual"], states[c]["residual"]) for c in back)
    states.close()
    assert not os.path.exists(tmp_path / spill[0])


@pytest.mark.parametrize("executor", ["inprocess", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_tight_state_budget_changes_nothing_in_the_results(tmp_path, executor, ray_session):
    """Error-feedback residuals (one model-sized vector per client) spilled at a 64 KB budget:
    the same tables as without a budget."""
    common = ["clients.num_clients=6", "clients.participation=0.5", "rounds=4", "algorithm.name=fedavg_compressed",
              "algorithm.compressor=topk", "algorithm.error_feedback=true", *(RAY if executor == "ray" else [])]
    from engine.loop.callbacks import RunCallback

    class LastRoundStates(RunCallback):  # in-process: the host's states as the last round leaves them
        seen = None

        def on_round_end(self, run, record):
            if executor == "inprocess" and record.round == 3:
                states = run.simulation.executor.host.states
                self.seen = (states.spilled, states.memory_bytes, len(states))

    free = load_run(run_experiment(lazy_cfg(*common), tmp_path / "a"))
    last = LastRoundStates()
    tight = load_run(run_experiment(lazy_cfg(*common, "executor.state_memory_mb=0.0625",
                                             f"executor.state_spill_dir={tmp_path / 'spill'}"), tmp_path / "b",
                                    callbacks=[last]))
    a, b = comparable_tables(free), comparable_tables(tight)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)
    if executor == "inprocess":  # the budget was binding: states went to disk, memory stayed within it
        spilled, memory_bytes, held = last.seen
        assert spilled > 0 and memory_bytes <= 0.0625 * 2**20
        trained = free.clients.loc[free.clients["train_loss"].notna(), "client_id"].nunique()
        assert held == trained  # one residual per client that trained, wherever it is kept


def test_a_table_on_s3_is_read_in_memory_and_on_disk_like_the_local_file(tmp_path, monkeypatch):
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    table = _scrambled_table(tmp_path / "t.parquet")
    with S3Server() as s3:
        for k, v in s3.env.items():
            monkeypatch.setenv(k, v)
        fs = s3.filesystem()
        fs.create_dir("hetsim/tables")
        with fs.open_output_stream("hetsim/tables/part-0.parquet") as f:
            f.write(table.read_bytes())
        local = build_data(_table_cfg(table, tmp_path / "c1", on_disk=False))
        for uri in ("s3://hetsim/tables", "s3://hetsim/tables/part-0.parquet"):
            remote = build_data(_table_cfg(uri, tmp_path / "c2", on_disk=False))
            np.testing.assert_array_equal(remote.x, local.x)
            np.testing.assert_array_equal(remote.client_test_idx, local.client_test_idx)
        disk = build_data(_table_cfg("s3://hetsim/tables", tmp_path / "c3"))
        assert os.path.basename(disk.source.folder).startswith("part-0-")  # named by the table
        ref = build_data(_table_cfg(table, tmp_path / "c4"))
        for c in (0, 29):
            for a, b in zip(disk.split(c), ref.split(c)):
                np.testing.assert_array_equal(a, b)
        with pytest.raises(ValueError, match="'s3://hetsim/nothing' does not exist"):
            build_data(_table_cfg("s3://hetsim/nothing", tmp_path / "c5"))
    with pytest.raises(ValueError, match="storage_options apply to s3:// or gs:// paths"):
        build_data(load_config(None, ["dataset.name=parquet", "partition.scheme=natural", "clients.num_clients=30",
                                      f"dataset.params={{path: {table}, storage_options: {{region: x}}}}"]))


def test_a_column_of_encoded_images_is_decoded_channels_first_in_memory_and_on_disk(tmp_path):
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(40, 6, 5, 3), dtype=np.uint8)  # RGB, 6 x 5

    def png(a):
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="PNG")
        return buf.getvalue()

    owner = np.repeat([3, 1], 20)
    pq.write_table(pa.table({"who": owner, "label": np.arange(40) % 2, "img": [png(p) for p in pixels]}),
                   tmp_path / "img.parquet")
    params = f"path: {tmp_path / 'img.parquet'}, client_column: who, features: img, shape: [3, 6, 5]"
    expected = np.moveaxis(pixels.astype(np.float32) / 255, -1, 1)  # (N, C, H, W)
    common = ["dataset.name=parquet", "partition.scheme=natural", "clients.num_clients=2"]
    eager = build_data(load_config(None, [*common, f"dataset.params={{{params}}}"]))
    assert eager.input_shape == (3, 6, 5) and len(eager.x) == 40
    np.testing.assert_array_equal(np.sort(eager.x.reshape(40, -1), axis=0), np.sort(expected.reshape(40, -1), axis=0))
    # client '1' (rows 20..39) is client 0, client '3' (rows 0..19) is client 1
    for c, rows in ((0, slice(20, 40)), (1, slice(0, 20))):
        mine = {r.tobytes() for r in expected[rows]}
        assert all(r.tobytes() in mine for r in eager.x[eager.train_indices(c)])
    lazy = build_data(load_config(None, [*common, f"dataset.params={{{params}, on_disk: true, "
                                                  f"cache_dir: {tmp_path / 'cache'}}}"]))
    x, _, _, _ = lazy.source.rows(0)
    assert x.shape == (20, 3, 6, 5)
    np.testing.assert_array_equal(x, expected[20:40])  # the row cache keeps the table's order per client
    pq.write_table(pa.table({"who": [0, 0], "label": [0, 1], "img": [png(pixels[0]), b"not an image"]}),
                   tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="column 'img' row 1 is not an image Pillow can decode"):
        build_data(load_config(None, ["dataset.name=parquet", "partition.scheme=natural", "clients.num_clients=1",
                                      f"dataset.params={{path: {tmp_path / 'bad.parquet'}, client_column: who, "
                                      "features: img}"]))


# ---------------------------------------------------------------- on-disk tables with label schemes


def _scheme_cfg(table, cache, scheme, *extra, on_disk=True, split=True):
    sp = ", split_column: split" if split else ""
    return load_config(None, ["dataset.name=parquet", "model.name=mlp", f"partition.scheme={scheme}",
                              f"dataset.params={{path: {table}, client_column: who{sp}, cache_dir: {cache}, "
                              f"on_disk: {on_disk}}}", "clients.num_clients=12", "partition.public_fraction=0.1",
                              *extra])


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
@pytest.mark.parametrize("split", [True, False])
def test_an_on_disk_table_with_a_label_scheme_gives_the_in_memory_partition(tmp_path, scheme, split):
    table = _scrambled_table(tmp_path / "t.parquet")
    eager = build_data(_scheme_cfg(table, tmp_path / "c", scheme, on_disk=False, split=split))
    disk = build_data(_scheme_cfg(table, tmp_path / "c", scheme, split=split))
    assert disk.on_demand and not eager.on_demand and disk.num_clients == 12
    # the same client -> rows assignment, local splits (in the same order), global test and public rows
    for mine, theirs in ((disk.tr_idx, eager.client_train_idx), (disk.tr_ptr, eager.client_train_ptr),
                         (disk.te_idx, eager.client_test_idx), (disk.te_ptr, eager.client_test_ptr),
                         (disk.global_test_idx, eager.global_test_idx), (disk.public_idx, eager.public_idx)):
        np.testing.assert_array_equal(mine, theirs)
    assert disk.num_global_test == eager.num_global_test == (461 if split else 480)
    # ... and the rows behind the indices: the cache is in the eager pool's order
    x, y, where = disk.gather([3, 7, 11], with_test=True)
    assert len(y) == len(np.unique(np.concatenate([eager.train_indices(c) for c in (3, 7, 11)]
                                                  + [eager.test_indices(c) for c in (3, 7, 11)])))
    for c in (3, 7, 11):
        np.testing.assert_array_equal(x[where[c][0]], eager.x[eager.train_indices(c)])
        np.testing.assert_array_equal(y[where[c][0]], eager.y[eager.train_indices(c)])
        np.testing.assert_array_equal(x[where[c][1]], eager.x[eager.test_indices(c)])
    for a, b in zip(disk.global_test_arrays() + disk.public_arrays(),
                    eager.global_test_arrays() + eager.public_arrays()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(disk.client_label_counts("all"), eager.client_label_counts("all"))
    assert {k: v for k, v in disk.meta.items() if k != "on_demand"} == eager.meta
    # one pool-order cache (the client column plays no part), whichever scheme uses it
    build_data(_scheme_cfg(table, tmp_path / "c", "iid" if scheme != "iid" else "shards", split=split))
    assert len(os.listdir(tmp_path / "c")) == 1


def test_on_disk_reads_are_sorted_and_coalesced_into_runs(tmp_path, monkeypatch):
    from engine.data import disk_table

    table = _scrambled_table(tmp_path / "t.parquet")
    data = build_data(_scheme_cfg(table, tmp_path / "c", "iid", split=False))
    src = data.source
    calls = []
    real = disk_table._read
    monkeypatch.setattr(disk_table, "_read", lambda fd, first, count, dtype: calls.append((first, count)) or real(
        fd, first, count, dtype))
    monkeypatch.setattr(disk_table, "GAP_BYTES", 2 * 16)  # 4 features of 4 bytes: gaps of <= 2 rows read through
    rows = np.array([0, 1, 2, 3, 5, 8, 20, 21], dtype=np.int64)
    x, y = src.take(rows)
    # runs 0..8 (gaps of 1 and 2 rows) and 20..21: one read of labels and one of features each
    assert sorted(calls) == [(0, 9), (0, 9 * 4), (20, 2), (20 * 4, 2 * 4)]
    whole = np.fromfile(os.path.join(src.folder, "features.f32"), dtype=np.float32).reshape(-1, 4)
    np.testing.assert_array_equal(x, whole[rows])
    np.testing.assert_array_equal(y, src.take_labels()[rows])
    calls.clear()
    monkeypatch.setattr(disk_table, "GAP_BYTES", 64 << 10)  # the default: 4096 rows of 16 bytes
    x2, y2, where = data.gather([0, 1], with_test=False)  # a round: one read per run, not per row or client
    assert len(y2) == 216 and len(calls) == 2  # 216 scattered rows of 2400: one run, labels and features
    np.testing.assert_array_equal(x2[where[1][0]], whole[data.train_indices(1)])


def _image_png(a) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _image_table(path, n=40):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(n, 6, 5, 3), dtype=np.uint8)
    pq.write_table(pa.table({"who": np.arange(n) % 2, "label": np.arange(n) % 3,
                             "img": [_image_png(p) for p in pixels]}), path, row_group_size=16)
    return np.moveaxis(pixels.astype(np.float32) / 255, -1, 1)  # (N, C, H, W), table order


@pytest.mark.parametrize("scheme", ["natural", "iid"])
def test_images_stay_encoded_on_disk_and_are_decoded_per_round_when_asked_or_when_they_would_not_fit(
        tmp_path, scheme, monkeypatch):
    expected = _image_table(tmp_path / "img.parquet")

    def cfg(decode, on_disk=True, cache="c"):
        extra = f", decode_images: {decode}" if decode else ""
        return load_config(None, ["dataset.name=parquet", f"partition.scheme={scheme}", "clients.num_clients=2",
                                  f"dataset.params={{path: {tmp_path / 'img.parquet'}, client_column: who, "
                                  f"features: img, shape: [3, 6, 5], on_disk: {on_disk}, "
                                  f"cache_dir: {tmp_path / cache}{extra}}}"])

    built = build_data(cfg("on_build"))
    per_round = build_data(cfg("per_round"))
    files = set(os.listdir(per_round.source.folder))
    assert "images.bin" in files and "features.f32" not in files
    assert "features.f32" in set(os.listdir(built.source.folder))
    assert per_round.source.image_column == "img" and built.source.image_column is None
    x1, y1, w1 = built.gather([0, 1], with_test=True)
    x2, y2, w2 = per_round.gather([0, 1], with_test=True)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    assert x2.shape[1:] == (3, 6, 5) and all((w1[c][0] == w2[c][0]).all() for c in (0, 1))
    if scheme == "natural":  # client 0 holds the even rows of the table, in table order
        np.testing.assert_array_equal(per_round.source.rows(0)[0], expected[0::2])
    # auto: decoded (4 * 90 floats a row) unless the disk's free space would not hold it
    assert build_data(cfg(None, cache="auto1")).source.image_column is None
    from engine.data import disk_table

    monkeypatch.setattr(disk_table.shutil, "disk_usage", lambda p: type("U", (), {"free": 40 * 90 * 4})())
    assert build_data(cfg(None, cache="auto2")).source.image_column == "img"
    with pytest.raises(ValueError, match=r"dataset.params.decode_images = 'later' is invalid; allowed: "
                                         r"\['auto', 'on_build', 'per_round'\]"):
        build_data(cfg("later"))
    with pytest.raises(ValueError, match="decode_images = 'per_round' applies to on_disk: true tables only"):
        build_data(cfg("per_round", on_disk=False))
    # kept encoded, every image's header is still checked when the cache is built
    good = pq.read_table(tmp_path / "img.parquet").column("img").to_pylist()
    for blobs, message in (([good[0], b"not an image"], "column 'img' row 1 is not an image Pillow can decode"),
                           ([good[0], _image_png(np.zeros((4, 4, 3), np.uint8))],
                            r"images of different sizes \(\[3, 6, 5\] and \[3, 4, 4\] at row 1\)")):
        pq.write_table(pa.table({"who": [0, 1], "label": [0, 1], "img": blobs}), tmp_path / "img.parquet")
        with pytest.raises(ValueError, match=message):
            build_data(cfg("per_round", cache="bad"))
    assert not os.listdir(tmp_path / "bad")  # nothing half-written


@pytest.fixture(scope="module")
def dirichlet_eager_run(tmp_path_factory):
    """The in-memory dirichlet run both executor cases compare with, computed once."""
    folder = tmp_path_factory.mktemp("dirichlet")
    table = _scrambled_table(folder / "t.parquet")
    common = ["rounds=2", "clients.participation=0.5", "clients.num_clients=6"]  # 6: see RAY
    run = load_run(run_experiment(_scheme_cfg(table, folder / "c", "dirichlet", *common, on_disk=False), folder / "a"))
    return table, common, run


@pytest.mark.parametrize("executor", ["inprocess", pytest.param("ray", marks=pytest.mark.ray)])
def test_an_on_disk_dirichlet_run_equals_the_in_memory_run(tmp_path, executor, dirichlet_eager_run, ray_session):
    """The on-disk split on either executor gives the tables of the in-memory split in-process."""
    table, common, eager = dirichlet_eager_run
    on = [*RAY, "ray.num_cpus=2"] if executor == "ray" else []
    disk = load_run(run_experiment(_scheme_cfg(table, tmp_path / "c", "dirichlet", *common, *on), tmp_path / "b"))
    a, b = comparable_tables(eager), comparable_tables(disk)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)
    assert eager.rounds["global_acc"].notna().all() and len(eager.rounds) == 2


def test_a_partitioned_on_disk_table_travels_without_its_labels_and_reads_them_back(tmp_path):
    table = _scrambled_table(tmp_path / "t.parquet")
    data = build_data(_scheme_cfg(table, tmp_path / "c", "shards"))
    data.global_test_arrays()
    moved = pickle.loads(pickle.dumps(data))
    assert moved._labels is None and moved._held is None and moved.source._fds is None
    np.testing.assert_array_equal(moved.client_label_counts("train"), data.client_label_counts("train"))
    assert (moved.client_label_counts("train") > 0).sum(axis=1).max() <= 2  # shards: two labels a client at most
    for a, b in zip(moved.gather([2, 5], with_test=True)[:2], data.gather([2, 5], with_test=True)[:2]):
        np.testing.assert_array_equal(a, b)


def test_the_row_index_of_a_split_is_built_once_and_saved_beside_the_cache(tmp_path, monkeypatch):
    from engine.data import ondemand

    table = _scrambled_table(tmp_path / "t.parquet")
    first = build_data(_scheme_cfg(table, tmp_path / "c", "dirichlet"))
    saved = [f for f in os.listdir(first.source.folder) if f.startswith("index-")]
    assert len(saved) == 1
    monkeypatch.setattr(ondemand, "partition_pool", lambda *a, **k: pytest.fail("the saved index was rebuilt"))
    again = build_data(_scheme_cfg(table, tmp_path / "c", "dirichlet"))
    np.testing.assert_array_equal(again.tr_idx, first.tr_idx)
    np.testing.assert_array_equal(again.public_idx, first.public_idx)
    monkeypatch.undo()
    other = build_data(_scheme_cfg(table, tmp_path / "c", "dirichlet", "seed=1"))  # another split: its own index
    assert len([f for f in os.listdir(first.source.folder) if f.startswith("index-")]) == 2
    assert not np.array_equal(other.tr_idx, first.tr_idx)
    # a damaged index file is rebuilt, not trusted
    with open(os.path.join(first.source.folder, saved[0]), "wb") as f:
        f.write(b"PK\x03\x04 not a zip")
    rebuilt = build_data(_scheme_cfg(table, tmp_path / "c", "dirichlet"))
    np.testing.assert_array_equal(rebuilt.tr_idx, first.tr_idx)
