"""Storage that works on any cluster: a real two-node Ray cluster whose worker has its own disk,
sweeps into its local, shared and S3 storage (an S3-compatible server on loopback), a Ray run
joined to it, and a node that dies. Storage without Ray: tests/engine/test_storage_locations.py."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from helpers import REPO
from helpers.cluster import (
    PrivateDiskCluster,
    S3Server,
    can_unshare_mounts,
    kill_worker_node,
    moto_missing,
    mount_namespace,
)
from helpers.plugins import isolated_plugins
from helpers.sweeps import BASE, GRID  # the same tiny experiment
from helpers.tabular import comparable_tables, write_leaf

from engine.config.schema import load_config
from engine.data.tabular import leaf_to_parquet
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import run_experiment
from engine.storage.locations import open_storage
from sweeps import load_sweep

RUN_FILES = {"config.yaml", "manifest.json", "rounds.parquet", "clients.parquet", "profiles.parquet", "trial.json"}


# Trials of BASE take ~0.1 s once the disk cache is warm: one node could run all four before Tune
# places the second. Each round sleeps 0.4 s (the realtime clock), so the two trials at a time
# overlap and each node must run one.
PACED = {**BASE, "clock": {"mode": "realtime", "max_sleep_s": 0.4, "time_scale": 1e6}}


def spec(**kw):
    return {"name": "t", "base": PACED, "space": GRID, "max_concurrent_trials": 2, **kw}


# ---------------------------------------------------------------- a real two-node cluster


@pytest.fixture(scope="module")
def private_disk_cluster(tmp_path_factory):
    """Head + worker node; the worker sees its own empty tmpfs at <tmp>/private."""
    why = can_unshare_mounts()
    if why is not None:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("cluster")
    cluster = PrivateDiskCluster(root / "private")
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


def _sweep_on(cluster, spec_file: Path, storage: str, capsys, monkeypatch):
    """`hetsim sweep SPEC --storage S --address A -q` in this process (its exit code and output):
    a second interpreter would import torch, Ray and Tune again (the node-loss test below runs the
    real command); then it leaves the cluster, as that process would by ending."""
    return _hetsim_sweep([str(spec_file), "--storage", storage, "--address", cluster.address], capsys, monkeypatch)


def _hetsim_sweep(args: list[str], capsys, monkeypatch):
    """`hetsim sweep ARGS -q` in this process, as :func:`_sweep_on`."""
    import ray

    from hetsim.cli import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    before = dict(os.environ)
    capsys.readouterr()
    t0 = time.perf_counter()
    try:
        code = main(["sweep", *args, "-q"])
    finally:
        ray.shutdown()
        for var in set(os.environ) - set(before):  # Tune's quiet settings (os.environ.setdefault)
            del os.environ[var]
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err), time.perf_counter() - t0


def _check_complete_run_folders(sweep, files_of):
    trials = sweep.trials
    assert len(trials) == 4 and (trials["status"] == "finished").all(), trials[["status", "error"]]
    assert (trials["node_id"].str.len() > 0).all(), "node_id filled for every trial"
    assert trials["node_id"].nunique() == 2, "two 1-CPU nodes, two trials at a time: both nodes ran trials"
    assert (trials["attempts"] == 1).all()
    for t in trials.itertuples():
        assert set(files_of(t.trial_id)) == RUN_FILES, t.trial_id  # complete, compacted
        run = sweep.run(t.trial_id)
        assert run.manifest["status"] == "finished" and len(run.rounds) == 2 and len(run.clients) > 0
        assert run.rounds["global_acc"].iloc[-1] == t.final_global_acc
    assert len(sweep.rounds) == 8


@pytest.mark.ray
@pytest.mark.slow
def test_local_storage_on_a_cluster_without_a_shared_disk_brings_every_run_folder_home(
        tmp_path, private_disk_cluster, capsys, monkeypatch):
    """The storage path is this node's disk; the worker node has its own disk there. Trials on
    the worker send their run folders through Ray: all 4 arrive, with node_id."""
    cluster = private_disk_cluster
    storage = cluster.private_dir / "sw"  # what the worker node sees there is its own tmpfs
    spec_file = tmp_path / "cluster.yaml"
    spec_file.write_text(yaml.safe_dump(spec()))
    proc, elapsed = _sweep_on(cluster, spec_file, str(storage), capsys, monkeypatch)
    assert proc.returncode == 0, proc.stderr[-4000:] + cluster.logs()
    assert f"joined the Ray cluster at {cluster.address}: 2 node(s)" in proc.stderr
    assert "1 of 2 node(s) do not see it" in proc.stderr and "through Ray" in proc.stderr
    sweep = load_sweep(storage)
    _check_complete_run_folders(sweep, lambda tid: os.listdir(storage / "runs" / tid))
    # the tables rebuilt from the run folders alone say the same
    refreshed = load_sweep(storage, refresh=True).trials.set_index("trial_id")
    for t in sweep.trials.itertuples():
        assert refreshed.loc[t.trial_id, "node_id"] == t.node_id
        assert refreshed.loc[t.trial_id, "final_global_acc"] == t.final_global_acc
    sw = yaml.safe_load((storage / "sweep.yaml").read_text())
    assert sw["spec"]["ray"]["address"] == cluster.address
    print(f"private-disk cluster sweep: 4 trials in {elapsed:.1f} s")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(moto_missing() is not None, reason=str(moto_missing()))
def test_s3_storage_on_a_cluster_has_every_run_folder_and_loads_from_the_uri(
        tmp_path, private_disk_cluster, capsys, monkeypatch):
    cluster = private_disk_cluster
    with S3Server() as s3:
        spec_file = tmp_path / "s3.yaml"
        spec_file.write_text(yaml.safe_dump(spec()))
        uri = "s3://hetsim/sweeps/t"
        for var, value in s3.env.items():  # the sweep and load_sweep read the URI with the standard variables
            monkeypatch.setenv(var, value)
        proc, elapsed = _sweep_on(cluster, spec_file, uri, capsys, monkeypatch)
        assert proc.returncode == 0, proc.stderr[-4000:] + cluster.logs()
        assert f"results: {uri}" in proc.stdout
        sweep = load_sweep(uri)
        assert sweep.path == uri
        store = open_storage(uri)
        _check_complete_run_folders(sweep, lambda tid: store.child("runs", tid).list())
        assert store.exists("trials.parquet") and store.exists("tune/tuner.pkl")
        assert not (tmp_path / "s3").exists()
        # no credentials in sweep.yaml (they came from the environment; resume takes them from there)
        assert "testing" not in store.read_text("sweep.yaml")
        # pandas reads the tables straight from the URI too
        pd.testing.assert_frame_equal(pd.read_parquet(f"{uri}/trials.parquet"), sweep.trials)
        print(f"S3 cluster sweep: 4 trials in {elapsed:.1f} s")


@pytest.mark.ray
@pytest.mark.slow
def test_shared_storage_on_a_cluster_is_written_directly_by_every_node(tmp_path, private_disk_cluster, capsys,
                                                                        monkeypatch):
    """A folder both nodes see (as with NFS): no detour through Ray, the same complete results."""
    cluster = private_disk_cluster
    storage = tmp_path / "shared" / "sw"
    spec_file = tmp_path / "shared.yaml"
    spec_file.write_text(yaml.safe_dump(spec()))
    proc, elapsed = _sweep_on(cluster, spec_file, str(storage), capsys, monkeypatch)
    assert proc.returncode == 0, proc.stderr[-4000:] + cluster.logs()
    assert "joined the Ray cluster" in proc.stderr and "do not see it" not in proc.stderr
    _check_complete_run_folders(load_sweep(storage), lambda tid: os.listdir(storage / "runs" / tid))
    print(f"shared-disk cluster sweep: 4 trials in {elapsed:.1f} s")


# 6 natural clients, all selected, 2 rounds: every client runs on its actor (c % 2) each round
ON_BOTH_NODES = ["partition.scheme=natural", "clients.num_clients=6", "clients.participation=1.0", "rounds=2",
                 "model.name=mlp", "clients.profiles={availability: 1.0, dropout: 0.0}"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_ray_run_joined_to_the_cluster_hosts_clients_on_both_nodes_without_a_shared_disk(
        tmp_path, private_disk_cluster):
    """``executor.kind: ray`` with ``ray.address`` = the cluster: one 1-CPU client actor per node,
    and the worker node's clients get their rows without seeing the head's disk: lazy synthetic
    rows are generated there, an in-memory table's rows (its file is on the head's disk only)
    come through the object store. The tables equal an in-process run's. An on-disk table whose
    row cache the worker lacks is refused at start-up, naming the node."""
    import ray

    from engine.ray.client_actor import DataNotOnNodeError
    from engine.ray.driver import release_warm_actors

    cluster = private_disk_cluster
    write_leaf(tmp_path / "leaf")
    table = leaf_to_parquet(tmp_path / "leaf", str(cluster.private_dir / "leaf.parquet"))  # not on the worker
    table_params = f"path: {table}, client_column: client, split_column: split, features: features"
    cases = {"lazy-synthetic": ["dataset.name=synthetic", "dataset.params={lazy: true}"],
             "in-memory-parquet": ["dataset.name=parquet", f"dataset.params={{{table_params}}}"]}
    # keep_warm: the cases after the first run on its driver and its actor on each node (each run
    # builds its hosts afresh, from its own data: what a worker's actor cannot read still fails)
    on_cluster = ["executor.kind=ray", "executor.num_actors=2", "executor.cpus_per_actor=1",
                  f"ray.address={cluster.address}", "executor.keep_warm=true"]
    t0 = time.perf_counter()
    try:
        for name, dataset in cases.items():
            run = load_run(run_experiment(load_config(None, [*dataset, *ON_BOTH_NODES, *on_cluster]),
                                          tmp_path / name))
            assert run.manifest["status"] == "finished", name
            nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            ex = run.manifest["executor"]
            # an actor on each node (the worker's sees its own disk at private_dir: the refusal below
            # shows it lacks what the head wrote there; its actor's process is gone once the run ends)
            assert len(nodes) == 2 and set(ex["actor_nodes"]) == nodes, (name, ex)
            ran = run.clients.dropna(subset=["wall_fit_s"])
            assert len(ran) == 12 and set(ran["client_id"] % 2) == {0, 1}, name  # both actors' clients ran
            local = load_run(run_experiment(load_config(None, [*dataset, *ON_BOTH_NODES]), tmp_path / f"{name}-local"))
            cluster_tables, local_tables = comparable_tables(run), comparable_tables(local)
            for table_name, frame in cluster_tables.items():
                pd.testing.assert_frame_equal(frame, local_tables[table_name], obj=f"{name}: {table_name}")
        # on disk: the row cache is built on the head (under the private folder), the worker lacks it
        on_disk = [f"dataset.params={{{table_params}, on_disk: true, cache_dir: {cluster.private_dir / 'cache'}}}"]
        with pytest.raises(DataNotOnNodeError, match=r"the row cache .*/cache/.* is not on node [0-9a-f]+ .*"
                                                     r"same path on every node.*on_disk: false"):
            run_experiment(load_config(None, ["dataset.name=parquet", *on_disk, *ON_BOTH_NODES, *on_cluster]),
                           tmp_path / "on-disk")
    finally:
        release_warm_actors()  # their CPUs go back to the cluster now, for the trials of the next test
        if ray.is_initialized():
            ray.shutdown()
    print(f"ray runs joined to the 2-node cluster: {time.perf_counter() - t0:.1f} s")


def share_of_zeros(outputs, targets):
    """A metric this test module registers in its session: it reaches the worker node by value."""
    return float((outputs.argmax(1) == 0).double().mean())


@pytest.fixture
def forget_plugins():
    with isolated_plugins():  # what a test imports as plugins is not left to the next test file
        yield


LICENSED = """
import os

from engine import plugins

if not os.path.exists({licence!r}):  # on a node whose disk lacks the licence (the worker's)
    raise ImportError("licence file {licence} is missing on this node")
plugins.register_metric("licensed_metric", lambda outputs, targets: 0.5)
"""


@pytest.mark.ray
@pytest.mark.slow
def test_plugins_only_the_head_has_reach_the_worker_nodes_actors_and_trials(tmp_path, private_disk_cluster, capsys,
                                                                          monkeypatch, forget_plugins):
    """The example plugins (a method package folder, a selection policy file) and their config live
    under the private folder: on the head's disk, not on the worker's. A Ray run with an actor on
    each node (and a metric this module registers, by value) equals the in-process run; a 2-trial
    sweep runs a trial on each node; a plugin that cannot be imported on the worker is refused
    before the first round, naming the worker's node."""
    import shutil

    import ray

    from engine import plugins
    from engine.errors import PluginError
    from engine.ray.driver import release_warm_actors

    cluster = private_disk_cluster
    plugins.register_metric("share_of_zeros", share_of_zeros)
    folder = cluster.private_dir / "plugins"
    shutil.copytree(REPO / "examples" / "fedavgm" / "hetsim_fedavgm", folder / "hetsim_fedavgm")
    shutil.copy(REPO / "examples" / "selectors" / "power_of_choice.py", folder)
    exp = folder / "exp.yaml"
    exp.write_text("plugins: [power_of_choice.py, hetsim_fedavgm]\n"
                   "clients: {selection: {name: power_of_choice, d: 6}}\nalgorithm: {name: fedavgm, beta: 0.5}\n")
    small = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=6", "clients.participation=1.0",
             "rounds=2", "clients.profiles={availability: 1.0, dropout: 0.0}", "checkpoint.every=0"]
    on_cluster = ["executor.kind=ray", "executor.num_actors=2", "executor.cpus_per_actor=1",
                  f"ray.address={cluster.address}"]
    t0 = time.perf_counter()
    try:
        run = load_run(run_experiment(load_config(exp, [*small, *on_cluster, "evaluation.metrics=[share_of_zeros]"]),
                                      tmp_path / "joined"))
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert len(nodes) == 2 and set(run.manifest["executor"]["actor_nodes"]) == nodes
        local = load_run(run_experiment(load_config(exp, [*small, "evaluation.metrics=[share_of_zeros]"]),
                                        tmp_path / "local"))
        for name, table in comparable_tables(run).items():
            pd.testing.assert_frame_equal(table, comparable_tables(local)[name], obj=name)
        assert run.clients["selection_reason"].notna().all() and run.clients["pers_share_of_zeros"].notna().any()

        licence = cluster.private_dir / "licence.txt"
        licence.write_text("ok")
        (folder / "licensed.py").write_text(LICENSED.format(licence=str(licence)))
        head = ray.get_runtime_context().get_node_id()
        worker = next(n for n in nodes if n != head)
        with pytest.raises(PluginError, match=rf"plugins\[0\] = '{folder / 'licensed.py'}': importing it failed on "
                                              rf"node {worker[:12]} .*licence file .* is missing on this node"):
            run_experiment(load_config(None, [f"plugins=[{folder / 'licensed.py'}]", *small, *on_cluster,
                                              "evaluation.metrics=[licensed_metric]"]), tmp_path / "refused")
        assert load_run(tmp_path / "refused").rounds.empty
    finally:
        release_warm_actors()
        if ray.is_initialized():
            ray.shutdown()
    spec_file = folder / "sweep.yaml"  # the base beside it, in the private folder
    spec_file.write_text(yaml.safe_dump({
        "name": "plugins", "base": "exp.yaml", "space": {"algorithm.beta": {"grid": [0.0, 0.5]}},
        "overrides": [*small, "clock={mode: realtime, max_sleep_s: 0.4, time_scale: 1e6}"],
        "max_concurrent_trials": 2}))
    proc, elapsed = _sweep_on(cluster, spec_file, str(tmp_path / "sw"), capsys, monkeypatch)
    assert proc.returncode == 0, proc.stderr[-4000:] + cluster.logs()
    trials = load_sweep(tmp_path / "sw").trials
    assert (trials["status"] == "finished").all() and trials["node_id"].nunique() == 2, trials
    print(f"plugins on the 2-node cluster: a joined run, a refusal and a 2-trial sweep in "
          f"{time.perf_counter() - t0:.1f} s")


def _finished_trials(storage: Path) -> dict[str, str]:
    """{trial id: manifest text} of the trials whose trial.json says finished."""
    done = {}
    for info_file in storage.glob("runs/*/trial.json"):
        try:
            if json.loads(info_file.read_text())["status"] == "finished":
                done[info_file.parent.name] = (info_file.parent / "manifest.json").read_text()
        except (ValueError, OSError):
            continue  # being written
    return done


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_into_local_storage_whose_driver_is_killed_resumes_on_the_cluster(
        tmp_path, private_disk_cluster, capsys, monkeypatch):
    """`hetsim sweep` with this node's disk as storage is SIGKILLed once its first trial finished
    (its storage actor dies with it); `hetsim sweep --resume --address` finishes the sweep in the
    same folder: the first trial kept as it was, the other run again to the same numbers as a
    direct run."""
    cluster = private_disk_cluster
    storage = cluster.private_dir / "killed"
    base = {**PACED, "rounds": 4}  # 4 x 0.4 s a trial: the second trial still runs at the kill
    spec_file = tmp_path / "killed.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "killed", "base": base, "space": {"train.lr": {"grid": [0.05, 0.1]}},
                                         "max_concurrent_trials": 1}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsim", "sweep", str(spec_file), "--storage", str(storage), "--address",
         cluster.address, "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
    deadline = time.monotonic() + 300
    try:
        while not _finished_trials(storage) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, err[-4000:]
    first = _finished_trials(storage)
    assert len(first) == 1, err[-4000:]

    resumed, elapsed = _hetsim_sweep(["--resume", str(storage), "--address", cluster.address], capsys, monkeypatch)
    assert resumed.returncode == 0, resumed.stderr[-4000:] + cluster.logs()
    sweep = load_sweep(storage)
    t = sweep.trials.set_index("trial_id")
    assert len(t) == 2 and (t["status"] == "finished").all() and (t["rounds_done"] == 4).all(), t
    (kept, kept_manifest), = first.items()
    assert (storage / "runs" / kept / "manifest.json").read_text() == kept_manifest  # not run again
    assert t.loc[kept, "attempts"] == 1
    assert sorted(sweep.rounds.groupby("trial_id")["round"].apply(list).tolist()) == [[0, 1, 2, 3]] * 2
    other = next(tid for tid in t.index if tid != kept)
    run = sweep.run(other)
    assert run.rounds["global_acc"].iloc[-1] == t.loc[other, "final_global_acc"]
    direct = load_run(run_experiment(load_config({**base, "train": {"lr": float(t.loc[other, "lr"])}}),
                                     tmp_path / "direct"))
    pd.testing.assert_frame_equal(run.rounds.drop(columns=list(WALL_COLUMNS), errors="ignore"),
                                  direct.rounds.drop(columns=list(WALL_COLUMNS), errors="ignore"))
    # the folder resumed off the cluster (a local Ray, no storage actor): Tune's saved handlers
    # read it directly, the finished sweep is reported as it is
    local, local_s = _hetsim_sweep(["--resume", str(storage), "--address", "local"], capsys, monkeypatch)
    assert local.returncode == 0, local.stderr[-4000:]
    assert "joined" not in local.stderr and "do not see it" not in local.stderr
    pd.testing.assert_frame_equal(load_sweep(storage).trials, sweep.trials)
    print(f"sweep driver killed after trial {kept}; resumed on the cluster in {elapsed:.1f} s, "
          f"again with a local Ray in {local_s:.1f} s")


@pytest.mark.ray
@pytest.mark.slow
def test_a_trial_on_a_node_that_dies_continues_from_its_checkpoint_on_another_node(tmp_path, private_disk_cluster):
    """Every process of the worker node is SIGKILLed while a trial runs there (last test of the
    module: the worker does not come back). The trial restarts on the head node from its last
    checkpoint and ends with the results of an undisturbed run."""
    cluster = private_disk_cluster
    storage = cluster.private_dir / "dies"
    base = {**BASE, "rounds": 30, "algorithm": {"name": "fedavg"}}
    spec_file = tmp_path / "dies.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "dies", "base": base, "space": {"train.lr": {"grid": [0.05, 0.1]}},
                                         "max_concurrent_trials": 2, "checkpoint_every": 5, "max_failures": 1}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsim", "sweep", str(spec_file), "--storage", str(storage), "--address",
         cluster.address, "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
    victim, deadline = None, time.monotonic() + 300
    try:
        while victim is None and time.monotonic() < deadline and proc.poll() is None:
            for info_file in storage.glob("runs/*/trial.json"):
                try:
                    info = json.loads(info_file.read_text())
                except ValueError:
                    continue
                on_worker = mount_namespace(info["pid"]) not in (mount_namespace(), None)
                done = len(list(info_file.parent.glob("_parts/rounds/*.parquet")))
                if on_worker and done >= 7:  # a checkpoint at 5 is in storage, round 7+ is not
                    victim = (info["trial_id"], done)
                    assert kill_worker_node(cluster) > 0
            time.sleep(0.05)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert victim is not None, "a trial ran on the worker node"
    assert proc.returncode == 0, err[-4000:]
    assert f"trial {victim[0]} failed (" in err and "retry 1 of 1, from its last checkpoint" in err
    t = load_sweep(storage).trials.set_index("trial_id")
    assert (t["status"] == "finished").all() and (t["rounds_done"] == 30).all()
    row = t.loc[victim[0]]
    assert row["attempts"] == 2 and row["resumed_from_round"] in (5, 10, 15, 20, 25)
    assert row["resumed_from_round"] <= victim[1]
    assert t["node_id"].nunique() == 1, "both trials ended on the head node"
    run = load_sweep(storage).run(victim[0])
    assert run.rounds["round"].tolist() == list(range(30))
    direct = load_run(run_experiment(load_config({**base, "train": {"lr": float(row["lr"])}}), tmp_path / "direct"))
    pd.testing.assert_frame_equal(run.rounds.drop(columns=list(WALL_COLUMNS), errors="ignore"),
                                  direct.rounds.drop(columns=list(WALL_COLUMNS), errors="ignore"))
    print(f"worker node killed after {victim[1]} rounds of trial {victim[0]}; it restarted on the head node "
          f"from round {row['resumed_from_round']}\n--- what the user saw (stderr):\n{err[-3000:]}")
