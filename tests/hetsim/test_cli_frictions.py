"""Small frictions of the command line: `latest` for the newest run folder, and output piped to
a reader that stops early (`| head`)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

from hetsim.cli import main
from hetsim.common import resolve_latest


def _run_folder(parent: Path, name: str, started: str) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"started": started, "status": "finished"}))
    return folder


def test_latest_is_the_newest_run_folder_by_its_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run_folder(tmp_path / "runs", "b-run", "2026-12-01T10:00:00+00:00")
    newest = _run_folder(tmp_path / "runs", "a-run", "2026-12-01T11:00:00+00:00")
    (tmp_path / "runs" / "not-a-run").mkdir()
    time.sleep(0.01)
    os.utime(tmp_path / "runs" / "b-run")  # a later mtime does not make it newer than its start
    assert resolve_latest("latest") == str(Path("runs") / "a-run") == str(newest.relative_to(tmp_path))
    other = _run_folder(tmp_path / "elsewhere", "x", "2026-01-01T00:00:00+00:00")
    assert resolve_latest(str(tmp_path / "elsewhere" / "latest")) == str(other)
    assert resolve_latest("runs/b-run") == "runs/b-run"  # not the shortcut: unchanged
    (tmp_path / "latest").mkdir()  # a folder really named latest wins
    assert resolve_latest("latest") == "latest"


def test_latest_without_runs_is_one_clear_message(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["show", "latest"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetsim: latest: no run folder in runs/") and "Traceback" not in err


@pytest.mark.parametrize("command, code", [(["validate"], 141), (["--help"], 0)])
def test_output_piped_to_a_reader_that_stops_early_is_no_error(command, code):
    proc = subprocess.Popen([sys.executable, "-m", "hetsim", *command], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `| head -0`: nothing will be read
    err = proc.stderr.read().decode()
    assert "Traceback" not in err and "BrokenPipeError" not in err and "This is a bug" not in err, err
    assert proc.wait(timeout=120) == code  # 141: 128 + SIGPIPE, as a shell reports it


def test_sweep_set_and_dry_run_validate_and_list_without_writing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = REPO / "sweeps" / "examples" / "fedavg_lr.yaml"
    assert main(["sweep", str(spec), "--dry-run", "--set", "rounds=2", "--set", "clients.num_clients=8"]) == 0
    out = capsys.readouterr().out
    assert "6 trial(s) of 2 round(s)" in out and "base overrides: " in out and "clients.num_clients=8" in out
    assert "grid points (6, each run 1 time(s))" in out and "lr=0.2, participation=0.6" in out
    assert not any(tmp_path.iterdir())  # nothing written
    # a --set the experiment refuses is a clear error before anything starts
    assert main(["sweep", str(spec), "--dry-run", "--set", "train.lr=-1"]) == 2
    assert "train.lr" in capsys.readouterr().err
    assert main(["sweep", "--resume", str(tmp_path), "--dry-run"]) == 2
    # -o names the results folder, as it does for hetsim run
    assert main(["sweep", str(spec), "--dry-run", "-o", str(tmp_path / "mine")]) == 0
    assert f"results in {tmp_path / 'mine'} (nothing written" in capsys.readouterr().out


def test_the_documented_join_gives_each_client_row_its_profile(tmp_path):
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    run = load_run(run_experiment(load_config(None, [
        "dataset.name=digits", "model.name=mlp", "rounds=2", "clients.num_clients=6",
        "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}"]), tmp_path / "r"))
    doc = (REPO / "docs" / "results.md").read_text()
    code = doc[doc.index("rows = run.clients.merge"):].split("```")[0]
    scope = {"run": run}
    exec(code, scope)  # the docs' own line  # noqa: S102
    rows = scope["rows"]
    assert len(rows) == len(run.clients)
    for _, row in rows.iterrows():
        assert row["down_mbps"] == run.profiles.set_index("client_id").loc[row["client_id"], "down_mbps"]
