"""A local Ray started by hetsim listens on loopback only and requires a token; hetsim never
joins a cluster the user did not name, and a named one that cannot be reached fails fast."""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers import REPO
from helpers.proc_sockets import cmdline, descendants, is_loopback, listening_sockets

pytestmark = [pytest.mark.ray, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                  reason="reads /proc")]
# one client actor: every kind of process a run starts listens, and each actor fewer is seconds of CPU
TINY = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=8", "rounds=12",
        "clients.participation=0.5", "executor.kind=ray", "ray.num_cpus=2", "evaluation.eval_every=1",
        "executor.num_actors=1"]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def test_hetsim_run_on_ray_listens_on_loopback_only_and_ignores_stray_clusters(tmp_path):
    # A stray RAY_ADDRESS and a recorded `ray start` cluster (Ray would join either silently);
    # both point at a port nothing listens on, so joining them would fail the run.
    short_tmp = Path(tempfile.mkdtemp(prefix="hs", dir="/tmp"))  # Ray's socket paths must stay short
    (short_tmp / "ray").mkdir()
    (short_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")
    env = _env(RAY_ADDRESS="127.0.0.1:9", TMPDIR=str(short_tmp))
    cmd = [sys.executable, "-m", "hetsim", "run", "-q", "-o", str(tmp_path / "run"),
           *(a for s in TINY for a in ("--set", s))]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: dict[tuple, set] = {}  # (pid, proto, ip, port) -> command lines (a worker renames itself)

    def watch():
        while proc.poll() is None:
            pids = descendants(proc.pid)
            for sock in listening_sockets(pids):
                seen.setdefault(sock, set()).add(cmdline(sock[0]))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        proc.kill()
        watcher.join()
    assert proc.returncode == 0, err
    assert "ignoring RAY_ADDRESS=127.0.0.1:9" in err
    names = " | ".join(n for cmds in seen.values() for n in cmds)
    # every kind of process a run starts was watched while it listened
    for kind in ("gcs_server", "raylet", "ray::DriverActor", "ray::ClientActor"):
        assert kind in names, (kind, names)
    assert any(pid == proc.pid for pid, *_ in seen), "the hetsim process itself (driver)"
    open_ = [(sorted(cmds), proto, ip, port) for (pid, proto, ip, port), cmds in seen.items()
             if not is_loopback(ip)]
    assert not open_, f"sockets reachable from the network: {open_}"


def test_local_ray_refuses_a_client_without_the_token(ray_session):
    # the suite's shared Ray (tests/conftest.py): started by init_ray as a run starts its own
    from engine.ray import cluster as ray_cluster

    gcs = ray_session.get_runtime_context().gcs_address
    cpus = ray_session.cluster_resources()["CPU"]
    assert gcs.startswith("127.0.0.1:")
    join = f"import ray; ray.init(address={gcs!r}); print('JOINED', ray.cluster_resources()['CPU'])"
    # (a client must also run in Ray's local-only mode, or it dials the external address)
    local = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    no_token = subprocess.run([sys.executable, "-c", join],
                              env=_env(RAY_AUTH_MODE="disabled", **local),
                              capture_output=True, text=True, timeout=180)
    assert no_token.returncode != 0 and "JOINED" not in no_token.stdout
    assert "Authentication token is missing or incorrect" in no_token.stderr
    # control: the same client with the session's token gets in, so the token is what matters
    assert "RAY_AUTH_TOKEN" not in os.environ  # only Ray's own processes hold it
    token = ray_cluster._local_token
    with_token = subprocess.run([sys.executable, "-c", join],
                                env=_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, **local),
                                capture_output=True, text=True, timeout=180)
    assert f"JOINED {cpus}" in with_token.stdout, with_token.stderr[-2000:]


def test_unreachable_or_silent_address_fails_fast_with_the_field_named():
    from engine.ray.cluster import RayConnectError, check_reachable

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    with pytest.raises(RayConnectError, match=rf"ray.address = '127.0.0.1:{port}'.*Connection refused"):
        check_reachable(f"127.0.0.1:{port}", 5)
    silent = socket.socket()  # accepts connections, never answers: Ray would retry for minutes
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        t0 = time.monotonic()
        with pytest.raises(RayConnectError, match=r"timed out; waited at most 1 s, ray.connect_timeout_s"):
            check_reachable("127.0.0.1:%d" % silent.getsockname()[1], 1.0)
        assert time.monotonic() - t0 < 30
    finally:
        silent.close()
    with pytest.raises(RayConnectError, match="not host:port"):
        check_reachable("just-a-name", 1)


def test_auto_names_its_source_and_refuses_when_nothing_is_running(monkeypatch, tmp_path):
    from engine.ray.cluster import RayConnectError, resolve_address

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(RayConnectError, match="ray.address = 'auto': no running cluster found"):
        resolve_address("auto")
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.1.2.3:6379\n")
    assert resolve_address("auto") == "10.1.2.3:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:6379")
    assert resolve_address("auto") == "10.9.9.9:6379"
    assert resolve_address("10.0.0.1:6379") == "10.0.0.1:6379"
