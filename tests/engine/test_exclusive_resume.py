"""Resume is exclusive: one process at a time per run folder (an OS lock, not a pid alone), the
status read again under the lock, a pid trusted only with its start time, and a folder left by
a run killed during its start-up started again with the same ``-o``."""
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO
from helpers.ray_processes import join_env, on_this_cluster

from engine.results.manifest import process_identity
from engine.results.tables import load_run
from engine.run.folders import LOCK_FILE, _loop_alive
from hetsim.cli import main

TINY = ["dataset.name=digits", "model.name=mlp", "rounds=2", "clients.num_clients=6"]
SLOW_RUN = [*TINY, "rounds=400", "clock.mode=realtime", "clock.max_sleep_s=0.25",
            "clock.time_scale=1000000"]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _hetsim(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hetsim", *args], cwd=tmp_path, env={**ENV, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _sets(settings: list[str]) -> list[str]:
    return [a for s in settings for a in ("--set", s)]


def _wait_for(predicate, procs, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for proc in procs:
            assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _rounds_running(run: Path, n: int) -> bool:
    try:
        manifest = json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("status") == "running" and manifest.get("rounds_done", 0) >= n


def test_two_resumes_started_together_one_runs_the_other_is_refused_at_once(tmp_path, capsys, monkeypatch):
    run = tmp_path / "r"
    first = _hetsim(tmp_path, "run", "-q", "-o", "r", *_sets(SLOW_RUN))
    try:
        _wait_for(lambda: _rounds_running(run, 2), [first])
        # the fresh run holds the folder; the refused resume runs in this process (the lock is
        # between processes either way; a `hetsim` process of its own cost seconds of start-up)
        monkeypatch.chdir(tmp_path)
        code = main(["run", "--resume", "r"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"run folder r is in use by pid {first.pid} on {platform.node()} since" in err
        assert "Traceback" not in err
        assert main(["run", "-q", "-o", str(run), *_sets(TINY)]) == 2  # nor is it claimed again
        assert f"run folder {run} is in use by pid {first.pid}" in capsys.readouterr().err
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        first.kill()
    rounds_before = json.loads((run / "manifest.json").read_text())["rounds_done"]

    pair = [_hetsim(tmp_path, "run", "-q", "--resume", "r") for _ in range(2)]
    try:
        ended = None
        deadline = time.monotonic() + 120
        while ended is None:  # the loser must end on its own while the winner still runs
            ended = next((p for p in pair if p.poll() is not None), None)
            assert time.monotonic() < deadline
            time.sleep(0.1)
        winner = pair[1 - pair.index(ended)]
        out, err = ended.communicate()
        assert ended.returncode == 2, err
        assert f"run folder r is in use by pid {winner.pid}" in err and "Traceback" not in err
        assert winner.poll() is None
        _wait_for(lambda: _rounds_running(run, rounds_before + 2), [winner])
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["pid"] == winner.pid and len(manifest["resumes"]) == 1  # one resume only
        winner.send_signal(signal.SIGTERM)  # stops after the round in flight, resumable
        out, err = winner.communicate(timeout=120)
        assert winner.returncode == 130, err
    finally:
        for p in pair:
            p.kill()
    assert load_run(run).manifest["status"] == "interrupted"
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == winner.pid  # the last holder's note


def test_a_resume_of_a_folder_in_use_says_so_before_it_judges_the_files(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["run", "-q", "-o", str(run), *_sets([*TINY, "rounds=4", "checkpoint.every=1",
                                                       "checkpoint.keep=1"])]) == 0
    # as a file a live run is writing, read half written; it holds rounds older than the one
    # checkpoint, so a resume that judged it would refuse the folder as damaged
    (run / "rounds.parquet").write_bytes(b"")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(run / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["run", "--resume", str(run)]) == 2
        err = capsys.readouterr().err
        assert f"run folder {run} is in use" in err and "damaged" not in err
    finally:
        holder.kill()
        holder.wait()
    assert main(["run", "--resume", str(run)]) == 2  # once free: the folder's files are judged
    assert "rounds.parquet is damaged" in capsys.readouterr().err


def test_a_pid_is_trusted_only_with_its_start_time(tmp_path, capsys):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = {"status": "running", "host": platform.node(), **process_identity(sleeper.pid)}
        assert _loop_alive(live)
        assert not _loop_alive({**live, "pid_start": live["pid_start"] + 1})  # the pid was reused
        assert not _loop_alive({**live, "host": "elsewhere"})  # other hosts: the heartbeat decides
        sleeper.kill()
        sleeper.wait()
        assert not _loop_alive(live)
    finally:
        sleeper.kill()

    run = tmp_path / "r"
    assert main(["run", "-q", "-o", str(run), *_sets(TINY)]) == 0
    manifest = json.loads((run / "manifest.json").read_text())
    # a crashed run whose pid now belongs to another live Python process (this one)
    stale = {**manifest, "status": "running", **process_identity(), "loop_pid": os.getpid()}
    stale["pid_start"] += 1
    (run / "manifest.json").write_text(json.dumps(stale))
    t0 = time.monotonic()
    assert main(["run", "-q", "--resume", str(run)]) == 0, capsys.readouterr().err
    assert time.monotonic() - t0 < 60
    resumed = load_run(run)
    assert resumed.manifest["status"] == "finished" and len(resumed.rounds) == 2
    assert resumed.manifest["resumes"][0]["previous_status"] == "running"


KILLED_AT_CLAIM = """
import os, sys
from engine.config.schema import load_config
from engine.run.folders import make_run_dir
make_run_dir(load_config(None, sys.argv[2:]), sys.argv[1])
os.kill(os.getpid(), 9)  # killed during the start-up: the folder is claimed, nothing ran
"""


def test_a_folder_killed_during_start_up_says_how_to_restart_and_the_same_o_reuses_it(tmp_path, capsys):
    run = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_CLAIM, str(run), *TINY], env=ENV, cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL
    assert json.loads((run / "manifest.json").read_text())["status"] == "starting"
    assert main(["run", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "killed during its start-up, before its first round" in err
    restart = f"hetsim run -c {run / 'config.yaml'} -o {run}"
    assert restart in err
    assert main(restart.split()[1:] + ["-q"]) == 0, capsys.readouterr().err
    again = load_run(run)
    assert again.manifest["status"] == "finished" and len(again.rounds) == 2
    assert again.profiles is not None
    # a folder with rounds in it is still refused without output.overwrite
    assert main(restart.split()[1:] + ["-q"]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.ray
def test_a_ray_run_killed_during_its_start_up_is_started_again_with_the_same_o(tmp_path, capsys, ray_session):
    """The killed run joins the suite's shared Ray (``ray.address``, as on a cluster) and the run
    started again in this process runs on it too: no Ray start-up of their own (each killed one
    left its Ray's processes behind to notice and exit)."""
    run = tmp_path / "r"
    ray_run = [*TINY, *on_this_cluster(ray_session), "executor.num_actors=1"]  # one actor: seconds less
    for _ in range(3):  # the start-up's claimed-but-not-running window is short: catch it
        shutil.rmtree(run, ignore_errors=True)
        proc = _hetsim(tmp_path, "run", "-q", "-o", "r", *_sets(ray_run), env=join_env())
        status = None
        try:
            while proc.poll() is None and status is None:
                try:  # claimed: the manifest, then the config (microseconds later)
                    if (run / "config.yaml").exists():
                        status = json.loads((run / "manifest.json").read_text())["status"]
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.005)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            proc.kill()
        if status == "starting" and json.loads((run / "manifest.json").read_text())["status"] == "starting":
            break
    else:
        pytest.skip("the run was past its start-up each time it was killed")
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE, "config.yaml", "manifest.json"]
    assert main(["run", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "killed during its start-up" in err and f"hetsim run -c {run / 'config.yaml'} -o {run}" in err
    assert main(["run", "-q", "-c", str(run / "config.yaml"), "-o", str(run)]) == 0, capsys.readouterr().err
    again = load_run(run)
    assert again.manifest["status"] == "finished" and again.manifest["executor"]["kind"] == "ray"
    assert len(again.rounds) == 2


def test_a_file_system_without_locks_still_runs_and_says_so(tmp_path, monkeypatch, caplog):
    import errno

    import engine.run.folders as folders
    from engine.config.schema import load_config

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(folders.fcntl, "flock", no_locks)
    with caplog.at_level("WARNING", logger="hetsim"):
        path = folders.make_run_dir(load_config(None, TINY), tmp_path / "r")
    assert json.loads((path / "manifest.json").read_text())["status"] == "starting"
    assert "has no file locks (No locks available)" in caplog.text
