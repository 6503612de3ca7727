"""Run folders: claiming a fresh one, and telling whether an existing one may be resumed."""
from __future__ import annotations

import datetime as dt
import platform
import shutil
import time
from pathlib import Path

from engine.config.schema import ExperimentConfig, expand_path
from engine.results.manifest import claim_manifest, read_manifest
from engine.results.storage import is_uri, open_storage


def make_run_dir(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> Path | str:
    """Create and claim a fresh run folder: ``run_dir`` (``-o``), else
    ``<output.dir>/<output.name>``, else ``<output.dir>/<algorithm>-<dataset>-<time>``.

    Claiming is atomic (an exclusive ``mkdir``, then an exclusive create of ``manifest.json``),
    so two runs started in the same instant never share a folder: an automatic name gets a
    ``-2``, ``-3``, ... suffix; a name the user gave is refused if it holds a run, unless
    ``output.overwrite: true`` (then the old run is deleted first). When the folder is a URI
    (``s3://...``) the URI is returned unclaimed: :func:`run_to_storage` stages it locally.
    """
    out = cfg.output
    if run_dir is not None and is_uri(str(run_dir)):
        return str(run_dir)
    if run_dir is not None:
        return _claim_named(Path(expand_path(str(run_dir))), out.overwrite, "-o")
    if is_uri(out.dir):
        base = open_storage(out.dir, out.storage_options)
        name = out.name or f"{cfg.algorithm.name}-{cfg.dataset.name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
        if base.child(name).exists("manifest.json") and not out.overwrite:
            raise FileExistsError(
                f"run folder {base.child(name).uri} already exists; choose another output.name or set "
                "output.overwrite: true")
        return base.child(name).uri
    base = Path(out.dir)
    if out.name:
        return _claim_named(base / out.name, out.overwrite, "output.name")
    base.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    stem = f"{cfg.algorithm.name}-{cfg.dataset.name}-{stamp}"
    for i in range(1, 10_000):
        path = base / (stem if i == 1 else f"{stem}-{i}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        if claim_manifest(path):
            return path
    raise FileExistsError(f"no free run folder name {stem}-N under {base}")


def _claim_named(path: Path, overwrite: bool, field: str) -> Path:
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{field}: {path} is a file, not a run folder")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"run folder {path} already exists; choose another {field} or set "
                "output.overwrite: true to replace it")
        if not (path / "manifest.json").exists():
            raise FileExistsError(
                f"{path} is not empty and holds no hetsim run (no manifest.json); refusing to "
                "delete it for output.overwrite; choose another folder")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    if not claim_manifest(path):
        raise FileExistsError(f"run folder {path} was just claimed by another run; choose another {field}")
    return path


class RunStateError(RuntimeError):
    """A run folder is in a state that does not allow the request (finished, still running)."""


def check_can_resume(path: Path) -> None:
    manifest = read_manifest(path)
    status = manifest.get("status")
    if status == "finished":
        raise RunStateError(f"{path} finished all its rounds: nothing to resume")
    pid = manifest.get("loop_pid")
    if status == "running" and manifest.get("host") == platform.node() and pid:
        deadline = time.monotonic() + 10.0  # a killed run's Ray workers take a moment to go
        while our_process_alive(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if our_process_alive(int(pid)):
            raise RunStateError(f"{path} is still being run by process {pid} on this host; stop it first")


def our_process_alive(pid: int) -> bool:
    """A live hetsim run loop (a Python process or a Ray worker) with this pid."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # a zombie has finished
        return False
    return b"python" in cmdline or b"ray::" in cmdline or b"hetsim" in cmdline
