"""What the Ray resume tests (tests/engine/ray/test_ray_resume*.py) share: the processes of a run
(who they are, whether they are gone), free CPUs on the shared Ray, and a `hetsim run` process
joining this test process's Ray."""
import time
from pathlib import Path

from engine.ray import cluster as ray_cluster
from engine.results.manifest import process_identity


def descendants(pid: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_states(pids) -> dict[int, str]:
    """Each process's state and command line, for a failure message."""
    out = {}
    for pid in pids:
        try:
            state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            state = "State: gone"
        out[pid] = f"{state.split(':', 1)[1].strip()} {command_line(pid)[:200]}"
    return out


def alive(pid: int, start: int | None = None) -> bool:
    """``pid`` runs (a zombie has finished); with ``start``, only the process that started then:
    the OS hands a dead process's pid to a later one (pid_max 32768 wraps within minutes on a busy
    machine, and another test's Ray worker then looked like a killed run's actor still alive)."""
    try:
        running = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
    return running and (start is None or process_identity(pid)["pid_start"] == start)


def started(pids) -> dict[int, int]:
    """Each running pid's start time (see :func:`alive`); one already gone is left out."""
    starts = {pid: process_identity(pid)["pid_start"] for pid in pids}
    return {pid: start for pid, start in starts.items() if start is not None}


def wait_gone(pids, timeout=30.0) -> list[int]:
    """``pids``: a list, or ``{pid: start time}`` from :func:`started`."""
    starts = pids if isinstance(pids, dict) else dict.fromkeys(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p, s) for p, s in starts.items()):
        time.sleep(0.05)
    return [p for p, s in starts.items() if alive(p, s)]


def wait_for_cpus(ray, cpus=2.0, timeout=60.0):
    """Killed actors give their CPUs back asynchronously; a new pool is sized from what is free."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.05)


def on_this_cluster(ray) -> list[str]:
    """`hetsim run` joins this test's Ray (as on a cluster, `ray.address`): no Ray start-up per run."""
    return ["executor.kind=ray", f"ray.address={ray.get_runtime_context().gcs_address}"]


def join_env() -> dict[str, str]:
    """What a process needs to join this test's private local Ray (docs/security.md): its
    session token, and Ray's local-only mode so that it looks for the cluster on loopback."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_cluster._local_token,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
