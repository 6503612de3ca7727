"""Damaged files in a run folder (a full disk, a power loss, a bad copy): every reader and the
resume end with one message naming the file (exit 2), never "This is a bug"; a damaged Parquet
part is set aside and its rounds recomputed from a checkpoint at or before them, so the resumed
tables equal an uninterrupted run's."""
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from engine.config.schema import load_config
from engine.results.tables import WALL_COLUMNS, RunFolderError, RunWriter, damaged_files, load_run, read_table
from engine.run.api import run_experiment
from engine.storage.locations import open_storage
from hetsim.cli import main

TINY = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=4", "clients.participation=0.5",
        "rounds=4", "checkpoint.every=1", "checkpoint.keep=5"]
TABLES = ("rounds", "clients", "profiles")


def _stopped(path: Path, keep_parts: bool) -> Path:
    """TINY stopped after round 2 (3 rounds done; checkpoints before rounds 1, 2 and 3). With
    ``keep_parts`` its tables stay in ``_parts/``, as a killed run leaves them."""
    finalize = RunWriter.finalize
    if keep_parts:
        RunWriter.finalize = lambda self: None
    try:
        run_experiment(load_config(None, TINY), path, callbacks=[lambda rec: rec.round == 2], command=["test"])
    finally:
        RunWriter.finalize = finalize
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Pristine folders, copied by each test: an uninterrupted run, a stopped one with parts, a
    stopped one compacted."""
    root = tmp_path_factory.mktemp("damaged")
    assert main(["run", "-q", "-o", str(root / "finished"), *[a for s in TINY for a in ("--set", s)]]) == 0
    _stopped(root / "parts", keep_parts=True)
    _stopped(root / "compacted", keep_parts=False)
    assert sorted(p.name for p in (root / "parts/_parts/rounds").iterdir()) == [
        "0000000.parquet", "0000001.parquet", "0000002.parquet"]
    return root


def _copy(folders: Path, name: str, tmp_path: Path) -> Path:
    path = tmp_path / name
    shutil.copytree(folders / name, path)
    return path


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert "This is a bug" not in err and "Traceback" not in err, err
    return code, err


def _tables(path: Path) -> dict[str, pd.DataFrame]:
    run = load_run(path)
    return {name: getattr(run, name).drop(columns=list(WALL_COLUMNS), errors="ignore").reset_index(drop=True)
            for name in TABLES}


def _assert_same(a: dict, b: dict) -> None:
    for name in TABLES:
        pd.testing.assert_frame_equal(a[name], b[name], check_dtype=False, obj=name)


def _zero(f: Path) -> None:
    f.write_bytes(b"")


def _garble(f: Path) -> None:
    f.write_bytes(os.urandom(f.stat().st_size or 64))  # right size, not Parquet


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


# (folder, file, damage): what every reader refuses with the file's name and exit status 2
READER_CASES = {
    "zero-byte-part": ("parts", "_parts/rounds/0000001.parquet", _zero),
    "garbled-part": ("parts", "_parts/clients/0000002.parquet", _garble),
    "truncated-manifest": ("parts", "manifest.json", _truncate),
    "zero-byte-profiles": ("parts", "profiles.parquet", _zero),
    "garbled-compacted-rounds": ("compacted", "rounds.parquet", _garble),
    "garbled-finished-rounds": ("finished", "rounds.parquet", _garble),
    "garbled-config": ("finished", "config.yaml", _garble),
}


@pytest.mark.parametrize("case", list(READER_CASES))
def test_readers_name_the_damaged_file_and_exit_2(folders, tmp_path, case, capsys):
    folder, rel, damage = READER_CASES[case]
    path = _copy(folders, folder, tmp_path)
    damage(path / rel)
    for argv in (["show", str(path)], ["report", str(path), "-o", str(tmp_path / "report.html")]):
        code, err = _cli(argv, capsys)
        assert code == 2, (argv, err)
        assert str(path / rel) in err and err.count("\n") == 1, err  # one message, naming the file
        assert "damaged" in err or "unreadable" in err, err
    with pytest.raises(RunFolderError, match=rel.rsplit("/", 1)[-1]):
        load_run(path)
    if rel.startswith("_parts/"):  # the message says what to do: the resume rebuilds it
        assert f"hetsim run --resume {path}" in err
    if rel.endswith(".parquet"):  # as through a storage (object stores are read this way)
        with pytest.raises(RunFolderError, match=f"{path / rel} is unreadable"):
            read_table(open_storage(path), rel.split("/")[-2] if "/" in rel else Path(rel).stem)
    assert (path / rel).exists() and not list(path.rglob("*.damaged")), "a reader changes nothing"


@pytest.mark.parametrize("rel, damage, from_round", [
    ("_parts/rounds/0000001.parquet", _zero, 1),  # round 1: the checkpoint before round 1 rebuilds it
    ("_parts/clients/0000002.parquet", _garble, 2),
], ids=["zero-byte-rounds-part", "garbled-clients-part"])
def test_resume_sets_a_damaged_part_aside_and_rebuilds_its_rounds(folders, tmp_path, rel, damage, from_round,
                                                                  capsys):
    path = _copy(folders, "parts", tmp_path)
    damage(path / rel)
    code, err = _cli(["run", "-q", "--resume", str(path)], capsys)
    assert code == 0, err
    assert f"{path / rel} is damaged" in err and "set aside as" in err
    assert (path / f"{rel}.damaged").is_file() and not list((path / "_parts" / rel.split("/")[1]).glob("*.parquet"))
    _assert_same(_tables(path), _tables(folders / "finished"))
    manifest = load_run(path).manifest
    (entry,) = manifest["resumes"]
    assert entry["from_round"] == from_round and entry["set_aside"] == [f"{rel}.damaged"]
    assert manifest["status"] == "finished"


def test_a_damaged_part_before_every_checkpoint_is_refused_until_the_checkpoints_go(folders, tmp_path, capsys):
    path = _copy(folders, "parts", tmp_path)
    part = path / "_parts/rounds/0000000.parquet"  # round 0: every checkpoint comes after it
    _garble(part)
    before = (path / "manifest.json").read_text()
    code, err = _cli(["run", "-q", "--resume", str(path)], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert str(part) in err and "no checkpoint can rebuild" in err and f"remove {path / 'checkpoints'}" in err
    assert part.is_file() and (path / "manifest.json").read_text() == before, "a refusal changes nothing"
    shutil.rmtree(path / "checkpoints")  # as the message says: recompute from round 0
    code, err = _cli(["run", "-q", "--resume", str(path)], capsys)
    assert code == 0, err
    assert (path / "_parts/rounds/0000000.parquet.damaged").is_file()
    _assert_same(_tables(path), _tables(folders / "finished"))
    assert load_run(path).manifest["resumes"][0]["from_round"] == 0


def test_a_damaged_compacted_table_with_checkpoints_is_refused(folders, tmp_path, capsys):
    path = _copy(folders, "compacted", tmp_path)
    _garble(path / "rounds.parquet")
    code, err = _cli(["run", "-q", "--resume", str(path)], capsys)
    assert code == 2 and str(path / "rounds.parquet") in err and "no checkpoint can rebuild" in err, err


def test_resume_writes_a_damaged_profiles_table_again(folders, tmp_path, capsys):
    path = _copy(folders, "parts", tmp_path)
    _zero(path / "profiles.parquet")
    code, err = _cli(["run", "-q", "--resume", str(path)], capsys)
    assert code == 0, err
    assert f"{path / 'profiles.parquet'} is damaged" in err and "written again from the config" in err
    assert (path / "profiles.parquet.damaged").is_file()
    _assert_same(_tables(path), _tables(folders / "finished"))


def test_a_garbled_checkpoint_file_falls_back_to_an_older_checkpoint(folders, tmp_path, capsys):
    path = _copy(folders, "parts", tmp_path)
    server = path / "checkpoints/round-000003/server.pt"
    _garble(server)  # right size: only loading it tells
    code, err = _cli(["run", "-q", "--resume", str(path)], capsys)
    assert code == 0, err
    assert f"{server} is damaged" in err and "round-000003 could not be loaded and is skipped" in err
    assert load_run(path).manifest["resumes"][0]["from_round"] == 2
    _assert_same(_tables(path), _tables(folders / "finished"))


def test_every_checkpoint_garbled_is_one_message_and_exit_2(folders, tmp_path, capsys):
    path = _copy(folders, "parts", tmp_path)
    for d in (path / "checkpoints").glob("round-*"):
        _garble(d / "server.pt")
    _zero(path / "_parts/rounds/0000002.parquet")
    code, err = _cli(["run", "-q", "--resume", str(path)], capsys)
    assert code == 2 and "no checkpoint of" in err and f"remove {path / 'checkpoints'}" in err, err
    assert "server.pt is damaged" in err
    assert (path / "_parts/rounds/0000002.parquet").is_file(), "nothing set aside without a rebuild"


def test_a_truncated_manifest_refuses_resume(folders, tmp_path, capsys):
    path = _copy(folders, "parts", tmp_path)
    _truncate(path / "manifest.json")
    code, err = _cli(["run", "-q", "--resume", str(path)], capsys)
    assert code == 2 and f"{path / 'manifest.json'} is damaged" in err, err


def test_damaged_files_lists_parts_and_compacted_tables_with_their_first_part(folders, tmp_path):
    path = _copy(folders, "parts", tmp_path)
    assert damaged_files(path) == []
    _zero(path / "_parts/clients/0000001.parquet")
    _garble(path / "profiles.parquet")
    found = {(d.table, d.path.relative_to(path).as_posix(), d.first) for d in damaged_files(path)}
    assert found == {("clients", "_parts/clients/0000001.parquet", 1), ("profiles", "profiles.parquet", 0)}
    meta = json.loads((path / "checkpoints/round-000001/checkpoint.json").read_text())
    assert meta["tables"] == {"rounds": 1, "clients": 1}  # what "at or before" is measured by


def test_a_damaged_chunk_needs_a_checkpoint_from_before_its_first_part(tmp_path, monkeypatch):
    """Merged parts (a chunk) hold the rounds of all their parts: only a checkpoint written before
    the first of them rebuilds it; a later loose part, any checkpoint written before it."""
    from engine.checkpoint.folder import rebuilds
    from engine.results import tables

    monkeypatch.setattr(tables, "COMPACT_PARTS", 4)
    w = RunWriter(tmp_path)
    for r in range(10):
        w.append("rounds", [{"round": r, "x": r}])
    parts = sorted(p.name for p in (tmp_path / "_parts/rounds").iterdir())
    assert parts == ["0000000-0000007.parquet", "0000008.parquet", "0000009.parquet"]
    chunk_bytes = (tmp_path / "_parts/rounds/0000000-0000007.parquet").read_bytes()
    _garble(tmp_path / "_parts/rounds/0000000-0000007.parquet")
    _zero(tmp_path / "_parts/rounds/0000009.parquet")
    chunk, late = damaged_files(tmp_path)
    assert (chunk.first, late.first) == (0, 9)
    assert not rebuilds({"tables": {"rounds": 5}}, [chunk]) and rebuilds({"tables": {}}, [chunk])
    assert rebuilds({"tables": {"rounds": 9}}, [late]) and not rebuilds({"tables": {"rounds": 10}}, [late])
    # resuming at round 9 from a checkpoint written after 9 parts: the late part goes aside
    (tmp_path / "_parts/rounds/0000000-0000007.parquet").write_bytes(chunk_bytes)
    dropped = RunWriter(tmp_path).rewind(9, {"rounds": 9}, damaged=[late.path])
    assert dropped == {"rounds": 0} and (tmp_path / "_parts/rounds/0000009.parquet.damaged").is_file()
    assert tables.read_table(tmp_path, "rounds")["round"].tolist() == list(range(9))
