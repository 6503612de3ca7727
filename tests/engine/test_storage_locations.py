"""Storage that works on any cluster, without Ray: pyarrow filesystems, mirrored run folders,
and `hetsim run` into an S3-compatible server on loopback. On a real two-node cluster:
tests/engine/ray/test_cluster.py."""
import os
import subprocess
import sys

import pandas as pd
import pytest
from helpers.cluster import S3Server, moto_missing
from helpers.sweeps import spec

from engine.config.schema import load_config, redact
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import run_experiment
from engine.storage.locations import DirectoryMirror, StorageError, open_storage
from sweeps import SweepSpecError, resolve

RUN_FILES = {"config.yaml", "manifest.json", "rounds.parquet", "clients.parquet", "profiles.parquet"}


def test_mirror_uploads_new_and_changed_files_and_removes_deleted_ones(tmp_path):
    local, remote = tmp_path / "local", open_storage(tmp_path / "remote")
    (local / "_parts" / "rounds").mkdir(parents=True)
    (local / "_parts" / "rounds" / "0000000.parquet").write_bytes(b"part0")
    (local / "manifest.json").write_text("{}")
    remote.write_text("stale.txt", "from an earlier attempt")
    mirror = DirectoryMirror(local, remote)
    assert mirror.sync() == 2
    assert remote.files() == ["_parts/rounds/0000000.parquet", "manifest.json"]  # stale one gone
    assert mirror.sync() == 0  # nothing changed: nothing sent
    (local / "_parts" / "rounds" / "0000001.parquet").write_bytes(b"part1")
    assert mirror.sync() == 1
    # the run is compacted: the parts disappear locally, and so do their folders remotely
    (local / "rounds.parquet").write_bytes(b"all")
    for p in (local / "_parts" / "rounds").iterdir():
        p.unlink()
    (local / "_parts" / "rounds").rmdir()
    (local / "_parts").rmdir()
    mirror.sync()
    assert remote.files() == ["manifest.json", "rounds.parquet"]
    assert not (tmp_path / "remote" / "_parts").exists()
    assert remote.read_bytes("rounds.parquet") == b"all"


def test_storage_locations_options_and_their_errors(tmp_path, monkeypatch):
    local = open_storage(tmp_path / "x" / ".." / "y")
    assert local.path == str(tmp_path / "y") and local.local_path() == tmp_path / "y" and not local.is_remote
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    s3 = open_storage("s3://bkt/some/prefix/?endpoint_override=127.0.0.1:9&scheme=http")
    assert (s3.path, s3.uri, s3.is_remote, s3.local_path()) == ("bkt/some/prefix", "s3://bkt/some/prefix", True, None)
    assert s3.options == {"endpoint_override": "127.0.0.1:9", "scheme": "http", "region": "us-east-1"}
    assert s3.child("runs", "a").path == "bkt/some/prefix/runs/a"
    # the standard AWS variables become options, so they travel with the filesystem to trials
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    env_s3 = open_storage("s3://bkt/p")
    assert env_s3.options["endpoint_override"] == "http://127.0.0.1:9" and env_s3.options["secret_key"] == "secret"
    assert redact(env_s3.options) == {"endpoint_override": "http://127.0.0.1:9", "region": "us-east-1"}
    with pytest.raises(StorageError, match="apply to URIs"):
        open_storage(tmp_path, {"endpoint_override": "x"})
    with pytest.raises(StorageError, match="no bucket"):
        open_storage("s3:///prefix")
    with pytest.raises(StorageError, match=r"storage options for s3:// \(pyarrow.fs.S3FileSystem\): "
                                           r".*unexpected keyword argument 'colour'"):
        open_storage("s3://bkt/p", {"colour": "blue"})
    with pytest.raises(SweepSpecError, match=r"storage = 's3://bkt/p': storage options for s3://"):
        resolve(spec(storage="s3://bkt/p", storage_options={"colour": "blue"}))
    # a sweep keeps URIs as given and credentials out of sweep.yaml
    r = resolve(spec(storage="s3://bkt/sw", storage_options={"access_key": "a", "secret_key": "b"}))
    assert r.storage == "s3://bkt/sw"
    assert r.to_dict()["spec"]["storage_options"] == {}


@pytest.mark.skipif(moto_missing() is not None, reason=str(moto_missing()))
def test_hetsim_run_writes_its_run_folder_to_s3(tmp_path, monkeypatch, capsys):
    """`hetsim run --set output.dir=s3://...`: staged locally, uploaded, readable from the URI."""
    from hetsim.cli import main

    with S3Server() as s3:
        env = {**os.environ, **s3.env}
        args = [sys.executable, "-m", "hetsim", "run", "-q", "--set", "rounds=2", "--set", "dataset.name=digits",
                "--set", "model.name=mlp", "--set", "clients.num_clients=10", "--set", "output.dir=s3://hetsim/runs",
                "--set", "output.name=r1", "--set", "output.upload_every_s=0"]
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "results: s3://hetsim/runs/r1" in proc.stdout
        store = open_storage("s3://hetsim/runs/r1", {"endpoint_override": s3.endpoint, "access_key": "testing",
                                                      "secret_key": "testing"})
        assert set(store.list()) == RUN_FILES  # compacted: no _parts left
        run = load_run(store)
        assert run.manifest["status"] == "finished" and len(run.rounds) == 2
        # equal to the same run written locally
        local = load_run(run_experiment(load_config(run.config), tmp_path / "local"))
        pd.testing.assert_frame_equal(run.rounds.drop(columns=list(WALL_COLUMNS), errors="ignore"),
                                      local.rounds.drop(columns=list(WALL_COLUMNS), errors="ignore"))
        # a second run with the same name is refused, naming the folder (the CLI in this process,
        # with the same variables: the exit code and message, without a second torch import)
        for var, value in s3.env.items():
            monkeypatch.setenv(var, value)
        capsys.readouterr()
        assert main(args[3:]) == 2 and "s3://hetsim/runs/r1 already exists" in capsys.readouterr().err
        assert main(["run", "-q", "--set", "output.dir=s3://", "--set", "rounds=1"]) == 2
