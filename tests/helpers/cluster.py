"""Test helpers: a real two-node Ray cluster on this machine, and a local S3-compatible server.

:class:`PrivateDiskCluster` starts a head node with ``ray start --head --block`` and a worker
node with ``ray start --address ... --block`` inside its own mount namespace (``unshare -m``),
where a private tmpfs is mounted over a chosen folder: the worker cannot see what the head
writes there, as on real clusters whose nodes do not share a disk. Everything it starts lives
under its own ``--temp-dir`` and process groups, and is stopped by pid (never ``ray stop``,
which would stop other people's Ray instances on the machine).

:class:`S3Server` runs ``moto.server`` on a free loopback port.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
QUIET_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")


def can_unshare_mounts() -> str | None:
    """None if ``unshare -m`` + a tmpfs mount work here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = tempfile.mkdtemp(prefix="hs-unshare-")
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs tmpfs {probe} && touch {probe}/x"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return f"unshare -m / mount not permitted: {r.stderr.strip()[:200]}"
        if os.listdir(probe):
            return "the private mount leaked into this namespace"
        return None
    finally:
        shutil.rmtree(probe, ignore_errors=True)


class PrivateDiskCluster:
    """A head node and one worker node whose view of ``private_dir`` is its own empty tmpfs."""

    def __init__(self, private_dir: Path, head_cpus: int = 1, worker_cpus: int = 1):
        self.private_dir = Path(private_dir)
        self.head_cpus, self.worker_cpus = head_cpus, worker_cpus
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # short: Ray's socket paths live under it (Unix sockets are limited to ~107 bytes)
        self.temp_dir = Path(tempfile.mkdtemp(prefix="hs-ray-", dir="/tmp"))
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, **QUIET_ENV}
        self.env.pop("RAY_ADDRESS", None)

    def _start(self, cmd: list[str], log: str) -> subprocess.Popen:
        out = open(self.temp_dir / log, "wb")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self, timeout_s: float = 180.0) -> "PrivateDiskCluster":
        common = ["--num-gpus=0", "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--block"]
        head = self._start([RAY, "start", "--head", f"--port={self.port}", f"--num-cpus={self.head_cpus}",
                            "--include-dashboard=false", f"--temp-dir={self.temp_dir}", *common], "head.log")
        wait_port(self.port, timeout_s, head)
        self.private_dir.mkdir(parents=True, exist_ok=True)
        worker_cmd = " ".join([RAY, "start", f"--address={self.address}", f"--num-cpus={self.worker_cpus}",
                               *common])
        self._start(["unshare", "-m", "sh", "-c",
                     f"mount -t tmpfs tmpfs {self.private_dir} && exec {worker_cmd}"], "worker.log")
        self.wait_for_nodes(2, timeout_s)
        return self

    def wait_for_nodes(self, n: int, timeout_s: float) -> None:
        code = ("import ray, time, sys\n"
                f"ray.init(address='{self.address}', log_to_driver=False, logging_level='ERROR')\n"
                f"deadline = time.monotonic() + {timeout_s}\n"
                f"while sum(x['Alive'] for x in ray.nodes()) < {n}:\n"
                "    if time.monotonic() > deadline: sys.exit(1)\n"
                "    time.sleep(0.5)\n")
        r = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True,
                           timeout=timeout_s + 60)
        if r.returncode != 0:
            raise RuntimeError(f"the cluster did not reach {n} nodes:\n{self.logs()}\n{r.stderr[-2000:]}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(self.temp_dir.glob("*.log")))

    def node_pids(self) -> list[int]:
        """Every live process of this cluster: its session dir is in their command lines."""
        marker = str(self.temp_dir).encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
        return pids

    def stop(self) -> None:
        for proc in self.procs:  # ray start --block stops its node's processes on SIGTERM
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10  # a head whose worker died may take long: then SIGKILL
        for proc in self.procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid in self.node_pids():  # anything that outlived its parent (workers, reaper)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def moto_missing() -> str | None:
    """Why :class:`S3Server` cannot run here, or None."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return "moto[server] is not installed (pip install -e '.[dev]')"
    return None


class S3Server:
    """``moto.server`` (an S3-compatible server) on a free loopback port, with a bucket."""

    def __init__(self, bucket: str = "hetsim"):
        self.bucket = bucket
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that point pyarrow (and so Tune and pandas) at it."""
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key="testing", secret_key="testing", endpoint_override=self.endpoint,
                                 region="us-east-1", allow_bucket_creation=True)

    def start(self, timeout_s: float = 60.0) -> "S3Server":
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, timeout_s, self.proc)
        self.filesystem().create_dir(self.bucket)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def mount_namespace(pid: int | str = "self") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def kill_worker_node(cluster: PrivateDiskCluster) -> int:
    """SIGKILL every process of the worker node (all of its mount namespace), as a power loss
    would; returns how many were killed."""
    ours = mount_namespace()
    worker_ns = {mount_namespace(pid) for pid in cluster.node_pids()} - {ours, None}
    victims = [int(p) for p in os.listdir("/proc") if p.isdigit() and mount_namespace(p) in worker_ns]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(victims)
