"""Run folders: created atomically, never reused, paths expanded once; a killed run reads as
crashed; Ctrl+C is honoured promptly and its message says what was saved (with the
distributed executor: test_ray_resume_signals.py, beside that run's resume)."""
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import REPO

from engine.config.schema import load_config
from engine.results.manifest import run_status
from engine.results.tables import RunWriter, load_run, read_table
from engine.run.folders import make_run_dir
from hetsim.cli import main

TINY = ["dataset.name=digits", "model.name=mlp", "rounds=2", "clients.num_clients=6"]


def _claim_after_barrier(barrier, out_dir: str, queue) -> None:
    cfg = load_config({"output": {"dir": out_dir}})
    barrier.wait()
    path = make_run_dir(cfg)
    queue.put((os.getpid(), str(path), json.loads((path / "manifest.json").read_text())["pid"]))


def test_two_processes_released_at_the_same_instant_get_different_folders(tmp_path):
    ctx = mp.get_context("fork")  # (spawn would import torch again in each of them)
    for attempt in range(5):  # each attempt: two real processes, one barrier
        out_dir = tmp_path / f"runs{attempt}"
        barrier, queue = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_claim_after_barrier, args=(barrier, str(out_dir), queue))
                 for _ in range(2)]
        for p in procs:
            p.start()
        got = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        (pid_a, path_a, owner_a), (pid_b, path_b, owner_b) = got
        assert path_a != path_b
        assert (owner_a, owner_b) == (pid_a, pid_b)  # each folder is claimed by its own process
        assert len(list(out_dir.iterdir())) == 2


def test_named_folder_is_never_reused_unless_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["run", "-q", *(a for s in TINY for a in ("--set", s))]
    assert main([*args, "-o", "r"]) == 0
    first = json.loads((tmp_path / "r" / "manifest.json").read_text())
    capsys.readouterr()
    assert main([*args, "-o", "r"]) == 2
    assert "run folder r already exists" in capsys.readouterr().err
    assert json.loads((tmp_path / "r" / "manifest.json").read_text()) == first  # untouched
    (tmp_path / "r" / "_parts").mkdir()  # debris of the old run must not survive an overwrite
    assert main([*args, "-o", "r", "--set", "output.overwrite=true"]) == 0
    second = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert second["started"] != first["started"] and second["status"] == "finished"
    assert not (tmp_path / "r" / "_parts").exists()


def test_home_and_variables_are_expanded_once_everywhere(tmp_path, monkeypatch, capsys):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HS_SUB", "exp")
    args = ["run", "-q", *(a for s in TINY for a in ("--set", s)),
            "--set", "output.dir=~/runs/$HS_SUB", "--set", "output.name=one"]
    assert main(args) == 0
    run_dir = home / "runs" / "exp" / "one"
    assert (run_dir / "rounds.parquet").exists()
    assert list(work.iterdir()) == []  # no ./~ or ./$HS_SUB folder
    assert load_run(run_dir).config["output"]["dir"] == str(home / "runs" / "exp")
    assert main(["run", "-q", *(a for s in TINY for a in ("--set", s)), "-o", "~/other"]) == 0
    assert (home / "other" / "manifest.json").exists()


SLOW_RUN = [*TINY, "rounds=400", "clock.mode=realtime", "clock.max_sleep_s=0.25",
            "clock.time_scale=1000000"]


def _start(tmp_path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "hetsim", "run", "-q", "-o", "r",
         *(a for s in [*SLOW_RUN, *extra] for a in ("--set", s))],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rounds(run_dir: Path, n: int, proc: subprocess.Popen) -> None:
    while True:
        parts = run_dir / "_parts" / "rounds"
        if parts.exists() and len(list(parts.glob("*.parquet"))) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)


def test_a_killed_run_reads_as_crashed(tmp_path, capsys):
    proc = _start(tmp_path, "clock.time_scale=100000")
    try:
        _wait_for_rounds(tmp_path / "r", 2, proc)
        live = json.loads((tmp_path / "r" / "manifest.json").read_text())
        assert live["status"] == "running" and live["pid"] == proc.pid and live["heartbeat"]
        assert run_status(live) == "running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["status"] == "running"  # what the dead process left behind ...
    assert run_status(manifest) == "crashed"  # ... and what it means
    assert main(["show", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert f"crashed (its process {proc.pid}" in out
    rounds = len(read_table(tmp_path / "r", "rounds"))
    assert rounds >= 2 and re.search(rf"^rounds\s+{rounds} of \d+$", out, re.M), out


def test_a_stale_heartbeat_on_another_host_reads_as_crashed():
    old = {"status": "running", "host": "elsewhere", "pid": 1, "heartbeat": "2020-01-01T00:00:00+00:00"}
    assert run_status(old) == "crashed"
    assert run_status({**old, "heartbeat": time_now()}) == "running"
    assert run_status({**old, "status": "finished"}) == "finished"


def time_now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).isoformat()


def test_ctrl_c_is_honoured_promptly_and_says_what_was_saved(tmp_path):
    proc = _start(tmp_path)
    try:
        _wait_for_rounds(tmp_path / "r", 2, proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)  # 400 rounds would take >100 s
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    saved = len(read_table(tmp_path / "r", "rounds"))
    assert saved >= 2
    assert f"interrupted; {saved} finished round(s) are saved in r" in err
    assert "Traceback" not in err
    run = load_run(tmp_path / "r")
    assert run.manifest["status"] == "interrupted" and len(run.rounds) == saved
    assert (tmp_path / "r" / "rounds.parquet").exists()  # compacted


ROW_SHAPES = {  # rows appended as dicts: each shape must read back as pandas would have written it
    "ints and missing": [{"a": 1, "b": None}, {"a": None, "b": 2.5}],
    "keys that only some rows have": [{"a": 1}, {"b": "x"}, {"a": 3, "c": True}],
    "numpy scalars": [{"a": np.float32(1.5), "b": np.int64(3), "c": np.bool_(True), "d": np.float64(np.nan)}],
    "ints and floats": [{"a": 1}, {"a": 2.5}, {"a": np.int64(4)}],
    "strings and missing": [{"s": "x"}, {"s": None}],
    "lists": [{"l": [1, 2]}, {"l": [3]}],
    "bools and missing": [{"b": True}, {"b": None}],
    "all missing": [{"n": None}, {"n": None}],
    "large ints": [{"a": 2**40}],
    "mixed kinds (pandas decides)": [{"a": 1}, {"a": "x"}],
}


@pytest.mark.parametrize("shape", sorted(ROW_SHAPES))
def test_appended_rows_read_back_as_pandas_would_write_them(tmp_path, shape):
    import pandas as pd

    from engine.results.tables import RunWriter

    rows = ROW_SHAPES[shape]
    writer = RunWriter(tmp_path / "run")
    if shape == "mixed kinds (pandas decides)":  # Arrow cannot type it; pandas cannot write it
        with pytest.raises(Exception):  # noqa: B017 - pyarrow raises one of several types
            pd.DataFrame(rows).to_parquet(tmp_path / "ref.parquet", index=False)
        with pytest.raises(Exception):  # noqa: B017 - the same error as pandas', whichever it is
            writer.append("t", rows)
        return
    pd.DataFrame(rows).to_parquet(tmp_path / "ref.parquet", index=False)
    writer.append("t", [{}, {}])  # no columns: nothing written, as before
    writer.append("t", rows)
    assert [p.name for p in (tmp_path / "run" / "_parts" / "t").iterdir()] == ["0000000.parquet"]
    pd.testing.assert_frame_equal(read_table(tmp_path / "run", "t"),
                                  pd.read_parquet(tmp_path / "ref.parquet"))


@pytest.mark.parametrize("as_uri", [False, True])
def test_a_table_read_while_its_run_compacts_it_is_read_again(tmp_path, monkeypatch, as_uri):
    """A sweep collects a trial's rounds while the trial may still be finishing: a part that
    disappears between listing and reading means the compacted table is there now."""
    import pandas as pd

    import engine.results.tables as results
    import engine.storage.locations as storage
    from engine.results.tables import RunWriter

    run = tmp_path / "run"
    writer = RunWriter(run)
    for r in range(3):
        writer.append("rounds", [{"round": r, "x": float(r)}])
    compacted = []

    def finish_then(read):
        def wrapper(*args, **kwargs):
            if not compacted:  # the run finishes between the listing and this read
                compacted.append(True)
                RunWriter(run).finalize()
            return read(*args, **kwargs)
        return wrapper

    if as_uri:
        monkeypatch.setattr(storage.Storage, "read_parquet", finish_then(storage.Storage.read_parquet))
        got = read_table(run.as_uri(), "rounds")
    else:
        monkeypatch.setattr(results, "_read_parquet", finish_then(results._read_parquet))
        monkeypatch.setattr(results, "_read_arrow", finish_then(results._read_arrow))  # the parts' fast path
        got = read_table(run, "rounds")
    assert compacted and (run / "rounds.parquet").exists()
    pd.testing.assert_frame_equal(got, pd.DataFrame({"round": [0, 1, 2], "x": [0.0, 1.0, 2.0]}))


def test_parts_are_merged_as_they_come_so_a_long_run_keeps_few_files(tmp_path, monkeypatch):
    import engine.results.tables as tables

    monkeypatch.setattr(tables, "COMPACT_PARTS", 8)
    monkeypatch.setattr(tables, "CHUNK_BYTES", 2_000)  # a few merges fill a chunk
    run = tmp_path / "run"
    writer = RunWriter(run)
    for r in range(400):
        writer.append("rounds", [{"round": r, "x": float(r)}])
        writer.append("clients", [{"round": r, "client_id": c, "x": r * c} for c in range(3)])
    parts = run / "_parts" / "rounds"
    names = sorted(p.name for p in parts.iterdir())
    assert len(names) < 40 and sum("-" in n for n in names) > 1  # a few chunks, not 400 parts
    assert read_table(run, "rounds")["round"].tolist() == list(range(400))
    assert read_table(run, "clients")["client_id"].tolist() == [0, 1, 2] * 400

    # killed during a merge: the chunk is written, the parts it holds are still there
    chunk = next(n for n in names if "-" in n)
    first, last = (int(x) for x in chunk[:-len(".parquet")].split("-"))
    leftover = pd.read_parquet(parts / chunk).iloc[:1]
    leftover.to_parquet(parts / f"{first:07d}.parquet", index=False)
    assert read_table(run, "rounds")["round"].tolist() == list(range(400))  # not read twice

    resumed = RunWriter(run)
    dropped = resumed.rewind(150, {"rounds": 150, "clients": 150})
    assert dropped == {"rounds": 250, "clients": 750}
    assert not (parts / f"{first:07d}.parquet").exists()  # the leftover is cleaned up
    for r in range(150, 400):
        resumed.append("rounds", [{"round": r, "x": float(r)}])
    assert read_table(run, "rounds")["round"].tolist() == list(range(400))
    resumed.finalize()
    assert read_table(run, "rounds")["x"].tolist() == [float(r) for r in range(400)]
    assert not (run / "_parts").exists()


@pytest.mark.parametrize("shape", sorted(ROW_SHAPES))
def test_merged_parts_compact_to_the_same_table_as_parts_compacted_once(tmp_path, monkeypatch, shape):
    import engine.results.tables as tables

    rows = [{"round": r, **row} for r in range(12) for row in ROW_SHAPES[shape]]
    out = {}
    for every in (3, 10**9):  # merged as they come; compacted only at the end (as before)
        monkeypatch.setattr(tables, "COMPACT_PARTS", every)
        writer = RunWriter(tmp_path / str(every))
        for row in rows:  # one part per row: every change of type across parts is met
            writer.append("t", [row])
        try:
            writer.finalize()
        except Exception as err:  # noqa: BLE001 - a table Parquet cannot hold fails alike both ways
            out[every] = type(err)
        else:
            out[every] = read_table(tmp_path / str(every), "t")
    if isinstance(out[3], type):
        assert out[3] is out[10**9]
    else:
        pd.testing.assert_frame_equal(out[3], out[10**9])


@pytest.mark.parametrize("rows", [
    [{"round": r, "x": float(r), "arm": "topk" if r % 2 else None} for r in range(5)],
    # parts whose schemas differ (a column all null in one, absent in another): the pandas path
    [{"round": 0, "x": 1.0}, {"round": 1, "x": None}, {"round": 2, "x": 3.0, "tag": "a"}],
    # parts written from frames (pandas' metadata in each file)
    [pd.DataFrame({"round": [r], "x": [float(r)], "n": pd.array([r], dtype="Int64")}) for r in range(3)],
])
def test_parts_read_in_one_conversion_equal_the_parts_read_one_by_one(tmp_path, rows):
    import engine.results.tables as tables

    writer = RunWriter(tmp_path)
    for row in rows:
        writer.append("rounds", row if isinstance(row, pd.DataFrame) else [row])
    part_dir = tmp_path / tables.PARTS / "rounds"
    one_by_one = tables._read_files([part_dir / n for n in tables.live_parts(tables._names(part_dir))])
    pd.testing.assert_frame_equal(tables._read_parts(part_dir), one_by_one)
