"""What the environment does to a run, tried as a hostile user would: a full disk and a
read-only mount mid-run (a real small tmpfs), corrupt run folders, hostile YAML, nonsense
arguments. Each ends with one message and exit status 2 (never "This is a bug"), the folder
consistent, and, where the cause can be removed, a resume equal to an undisturbed run.
"""
import errno
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import REPO

from engine.config.schema import load_config
from engine.config.yamlio import MAX_YAML_BYTES, YamlError, parse_yaml, read_yaml_file
from engine.loop.callbacks import Stop
from engine.results.tables import WALL_COLUMNS
from engine.run.api import run_experiment
from hetsim.cli import main

TINY = ["dataset.name=digits", "model.name=mlp", "rounds=6", "clients.num_clients=6", "checkpoint.every=2"]


def sets(items):
    return [a for item in items for a in ("--set", item)]


def _results(path) -> pd.DataFrame:
    return pd.read_parquet(Path(path) / "rounds.parquet").drop(columns=list(WALL_COLUMNS), errors="ignore")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An undisturbed run of TINY (what every resumed run must equal)."""
    path = tmp_path_factory.mktemp("ref") / "r"
    assert main(["run", "-q", "-o", str(path), *sets(TINY)]) == 0
    return path


# ---------------------------------------------------------------- YAML limits
def test_billion_laughs_is_refused_in_well_under_a_second():
    doc = "a0: &a0 [lol]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
    t0 = time.perf_counter()
    with pytest.raises(YamlError, match=r"bomb.yaml:6:\d+: YAML refused: aliases expand to more than 100,000"):
        parse_yaml(doc, "bomb.yaml")
    assert time.perf_counter() - t0 < 0.5


def test_aliases_within_the_bound_still_work():
    assert parse_yaml("x: &x {b: 1}\ny: *x\nz: [*x, *x]\n", "ok.yaml") == {
        "x": {"b": 1}, "y": {"b": 1}, "z": [{"b": 1}, {"b": 1}]}


def test_a_yaml_file_above_the_size_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_YAML_BYTES + 1)  # sparse: costs nothing to make
    t0 = time.perf_counter()
    with pytest.raises(YamlError, match=r"big.yaml.* is 10.0 MB, above the 10 MB limit .*HETSIM_YAML_MAX_MB"):
        read_yaml_file(big)
    assert time.perf_counter() - t0 < 0.5


def test_yaml_size_limit_on_the_command_line(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_YAML_BYTES + 1)
    out = subprocess.run([sys.executable, "-m", "hetsim", "validate", "-c", str(big)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "above the 10 MB limit" in out.stderr and "bug" not in out.stderr


# ---------------------------------------------------------------- a full disk, a read-only mount
def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m none /mnt"],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# In a private mount namespace: a 4 MB tmpfs; phase 1 is `hetsim run` with a callback (in place
# of the progress bar, so after the Parquet recorder and the checkpoints) that at the end of
# round K fills the disk to MODE free bytes, or mounts it read-only; then the cause is
# removed and a separate `hetsim run --resume` continues.
DRIVER = r'''
import json, os, subprocess, sys
mnt, mode, k, out, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "none", mnt], check=True)
PHASE1 = """
import os, subprocess, sys
import hetsim.cli as cli
from engine import RunCallback
mnt, mode, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
class Fault(RunCallback):
    def __init__(self, total, unit="round"):
        pass
    def on_round_end(self, run, rec):
        if rec.round != k:
            return
        if mode == "ro":  # a read-only mount stacked on top: files the run holds open (its
            subprocess.run(["mount", "--bind", mnt, mnt], check=True)  # lock) keep the old one
            subprocess.run(["mount", "-o", "remount,bind,ro", mnt], check=True)
            return
        st = os.statvfs(mnt)
        with open(os.path.join(mnt, "filler"), "wb") as f:
            f.write(bytes(max(0, st.f_bavail * st.f_frsize - int(mode))))
cli.ProgressBar = Fault
sys.exit(cli.main(sys.argv[4:]))
"""
run = os.path.join(mnt, "r")
p1 = subprocess.run([sys.executable, "-c", PHASE1, mnt, mode, k, "run", "-o", run, *args],
                    capture_output=True, text=True)
manifest = json.load(open(os.path.join(run, "manifest.json")))
if mode == "ro":
    subprocess.run(["umount", mnt], check=True)
else:
    os.unlink(os.path.join(mnt, "filler"))
p2 = subprocess.run([sys.executable, "-m", "hetsim", "run", "-q", "--resume", run], capture_output=True, text=True)
subprocess.run(["cp", os.path.join(run, "rounds.parquet"), out], check=True)
print(json.dumps({"code1": p1.returncode, "err1": p1.stderr, "manifest": manifest,
                  "code2": p2.returncode, "err2": p2.stderr}))
'''


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare -rm and tmpfs (user namespaces)")
@pytest.mark.parametrize("mode, first_failure, marked", [
    # room for the manifest (one page and its temporary), not for the next round's Parquet parts
    ("8192", "no space left on the device while writing the Parquet tables of round 3", True),
    # the parts fit, the checkpoint after round 3 (torch.save: RuntimeError of inline_container) not
    ("40000", "no space left on the device while writing the checkpoint after round 3", True),
    # read-only: the manifest itself cannot be written, so the folder cannot be marked failed
    ("ro", "the file system is read-only while writing manifest.json in round 2", False),
], ids=["disk-full-parquet", "disk-full-checkpoint", "read-only"])
def test_full_or_read_only_disk_is_a_user_error_and_resume_equals_an_undisturbed_run(
        tmp_path, reference, mode, first_failure, marked):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env_cmd = ["unshare", "-rm", sys.executable, "-c", DRIVER, str(mnt), mode, "2", str(tmp_path / "rounds.parquet"),
               *sets(TINY)]
    proc = subprocess.run(env_cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    run = f"{mnt}/r"
    assert out["code1"] == 2, out["err1"]
    err = out["err1"].strip()
    assert err.startswith(f"hetsim: {first_failure}") and "\n" not in err, err
    assert err.endswith(f"and resume with `hetsim run --resume {run}`")
    assert "This is a bug" not in err and "Traceback" not in err
    if marked:
        assert f"the run folder {run} is marked failed; free space" in err
        assert out["manifest"]["status"] == "failed" and first_failure in out["manifest"]["error"]
    else:
        assert "the run folder could not be marked failed: manifest.json cannot be written" in err
        assert out["manifest"]["status"] == "running"  # its process is gone: `show` says crashed
    assert out["code2"] == 0, out["err2"]
    pd.testing.assert_frame_equal(_results(reference), pd.read_parquet(tmp_path / "rounds.parquet").drop(
        columns=list(WALL_COLUMNS), errors="ignore"))


def test_torch_write_failure_on_a_full_disk_is_attributed_without_a_tmpfs(tmp_path, monkeypatch, capsys):
    # the fallback where user namespaces are not available: torch's own error, disk reported full
    import engine.clients.format as fmt
    import engine.errors as errors

    def full(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 768 vs 662")

    monkeypatch.setattr(fmt.torch, "save", full)
    monkeypatch.setattr(errors.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 0))
    path = tmp_path / "r"
    assert main(["run", "-q", "-o", str(path), *sets(TINY)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetsim: no space left on the device while writing the checkpoint after round 1 (")
    assert f"resume with `hetsim run --resume {path}`" in err and "bug" not in err
    assert json.loads((path / "manifest.json").read_text())["status"] == "failed"


def test_an_enospc_outside_a_run_folder_is_exit_2(tmp_path, monkeypatch, capsys):
    def full(args):  # e.g. `hetsim report` writing its page to a full disk
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "report.html"))

    monkeypatch.setattr("hetsim.results_cli.cmd_report", full)  # bound when main builds the parser
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hetsim: no space left on the device while writing a file ({tmp_path / 'report.html'})")
    assert "free space and try again" in err and "bug" not in err


def test_resume_while_the_disk_is_still_full_says_so(stopped_run, monkeypatch, capsys):
    import engine.run.body as body

    def full(cfg, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path) + ".x1y2.tmp")

    monkeypatch.setattr(body, "dump_config", full)
    code, err = _resume(stopped_run, capsys)
    assert code == 2
    assert err.startswith(f"hetsim: no space left on the device while writing the run folder ({stopped_run})")
    assert err.strip().endswith(f"free space and resume with `hetsim run --resume {stopped_run}`")


# ---------------------------------------------------------------- corrupt run folders
@pytest.fixture()
def stopped_run(tmp_path):
    """A run stopped after round 3, with checkpoints before rounds 2 and 4 (resumable)."""
    cfg = load_config(None, [*TINY, "checkpoint.keep=3"])
    path = run_experiment(cfg, tmp_path / "r", callbacks=[lambda rec: Stop("enough") if rec.round == 3 else None],
                          command=["test"])
    return Path(path)


def _resume(path, capsys):
    code = main(["run", "-q", "--resume", str(path)])
    out, err = capsys.readouterr()
    assert "This is a bug" not in err and "Traceback" not in err
    return code, err


def test_truncated_manifest_refuses_resume(stopped_run, capsys):
    text = (stopped_run / "manifest.json").read_text()
    (stopped_run / "manifest.json").write_text(text[: len(text) // 2])
    code, err = _resume(stopped_run, capsys)
    assert code == 2 and f"{stopped_run / 'manifest.json'} is damaged (not valid JSON" in err
    assert f"hetsim run -c {stopped_run / 'config.yaml'}" in err


def test_manifest_that_is_a_json_list_refuses_resume(stopped_run, capsys):
    (stopped_run / "manifest.json").write_text("[1, 2]")
    code, err = _resume(stopped_run, capsys)
    assert code == 2 and "manifest.json holds a JSON list, not a manifest (a JSON object)" in err


def test_config_edited_after_the_checkpoint_names_the_fields(stopped_run, capsys):
    cfg = stopped_run / "config.yaml"
    cfg.write_text(cfg.read_text().replace("lr: 0.05", "lr: 0.2"))
    code, err = _resume(stopped_run, capsys)
    assert code == 2, err
    assert "its config differs from the one checkpoint round-000004 was written with" in err
    assert "train.lr: 0.05 in the checkpoint, now 0.2" in err
    assert f"remove {stopped_run / 'checkpoints'}" in err


def test_checkpoint_past_the_last_round_refuses_resume(stopped_run, capsys):
    meta_path = stopped_run / "checkpoints" / "round-000004" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta["next_round"] = 99
    meta_path.write_text(json.dumps(meta))
    code, err = _resume(stopped_run, capsys)
    assert code == 2 and "checkpoint round-000004 continues at round 99, past the run's rounds = 6" in err


def test_a_damaged_checkpoint_is_skipped_for_an_older_one_and_that_is_printed(stopped_run, reference, capsys):
    server = stopped_run / "checkpoints" / "round-000004" / "server.pt"
    server.write_bytes(server.read_bytes()[:100])
    code, err = _resume(stopped_run, capsys)
    assert code == 0, err
    assert "hetsim: warning: checkpoint" in err and "round-000004 could not be loaded and is skipped" in err
    manifest = json.loads((stopped_run / "manifest.json").read_text())
    assert manifest["resumes"][-1]["from_round"] == 2
    assert any("round-000004 could not be loaded" in w for w in manifest["warnings"])
    pd.testing.assert_frame_equal(_results(reference), _results(stopped_run))


def test_every_checkpoint_damaged_is_a_user_error(stopped_run, capsys):
    for d in (stopped_run / "checkpoints").glob("round-*"):
        (d / "server.pt").write_bytes(b"x" * (d / "server.pt").stat().st_size)  # right size, not torch
    code, err = _resume(stopped_run, capsys)
    assert code == 2 and "no checkpoint of" in err and "could be restored" in err
    assert f"remove {stopped_run / 'checkpoints'} to rerun it from round 0" in err


# ---------------------------------------------------------------- compare arguments
@pytest.mark.parametrize("argv, words", [
    (["--metric", "no_such_column"], ["--metric 'no_such_column' is not a column", "give one of:", "global_acc",
                                      "sim_time_s"]),
    (["--target", "2"], ["--target 2 is outside the allowed range", "[0, 1]"]),
    (["--target", "nan"], ["--target nan is outside the allowed range", "[0, 1]"]),
    (["--target", "inf", "--metric", "train_loss"], ["--target inf", "a finite number"]),
], ids=["metric", "target-2", "target-nan", "target-inf-loss"])
def test_compare_refuses_a_missing_metric_and_a_target_out_of_range(reference, argv, words, capsys):
    assert main(["compare", str(reference), str(reference), *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("hetsim: compare: ")
    for word in words:
        assert word in err, (word, err)


# ---------------------------------------------------------------- silent nonsense
def test_skip_client_that_skipped_every_upload_warns_in_terminal_and_manifest(tmp_path, capsys):
    path = tmp_path / "r"
    assert main(["run", "-q", "-o", str(path), *sets([*TINY, "rounds=2", "train.lr=1e30",
                                                     "train.on_nonfinite=skip_client"])]) == 0
    out, err = capsys.readouterr()
    assert "hetsim: warning: train.on_nonfinite: skip_client skipped every upload of the run" in err
    assert "accuracy is chance" in err and "warning" in out  # the summary repeats it
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert any("skipped every upload" in w for w in manifest["warnings"])
