"""Run one experiment into a run folder: the glue between config, simulation and results."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import platform
import posixpath
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from engine.loop.callbacks import (
    CallbackLike,
    RoundRecord,
    RunCallback,
    RunContext,
    Stop,
    around_recorder,
)
from engine.config.schema import ExperimentConfig, dump_config, expand_path, load_config
from engine.results.tables import HEARTBEAT_S, SCHEMA_VERSION, RunWriter, process_identity, utc_now
from engine.results.storage import (
    DirectoryMirror,
    MirrorCallback,
    StorageError,
    check_writable,
    is_uri,
    open_storage,
)
from engine.trace import mark

# The loop's modules (torch) are imported by execute_run, in the process that runs the loop:
# the caller of a Ray run only starts the driver actor and relays rounds.
log = logging.getLogger("hetsim")


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("hetsim", "torch", "torchvision", "numpy", "pandas", "pyarrow", "ray", "pydantic"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


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
        if _claim(path):
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
    if not _claim(path):
        raise FileExistsError(f"run folder {path} was just claimed by another run; choose another {field}")
    return path


def _claim(path: Path) -> bool:
    """Exclusively create the folder's manifest (False if another process got there first)."""
    try:
        fd = os.open(path / "manifest.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump({"schema_version": SCHEMA_VERSION, "status": "starting", **process_identity()}, f)
    return True


def make_executor(cfg: ExperimentConfig):
    if cfg.executor.kind == "ray":
        from engine.ray.executor import RayExecutor

        return RayExecutor(cfg)
    from engine.execution.base import InProcessExecutor

    # One torch thread by default: on 2 cores, small models train as fast with 1 thread as
    # with 2, and 2 threads slow down ~7x as soon as another process competes for a core.
    return InProcessExecutor(threads=cfg.executor.threads_per_actor or 1)


class RunRecorder(RunCallback):
    """Appends every round's rows to the run folder's Parquet parts; compacts them at the end.

    Fault rows (a client host died and was replaced) go to ``faults.parquet`` and are counted
    in the manifest (``faults``); the :class:`ManifestKeeper` writes it at the end of the round.
    """

    def __init__(self, writer):
        self.writer = writer

    def on_round_end(self, run: RunContext, record: RoundRecord) -> None:
        self.writer.append("rounds", [record.row])
        self.writer.append("clients", record.client_rows)
        for name, rows in record.extra_tables.items():
            self.writer.append(name, rows)
        if record.extra_tables.get("faults"):
            run.info["faults"] = run.info.get("faults", 0) + len(record.extra_tables["faults"])

    def on_run_end(self, run: RunContext, status: str) -> None:
        self.writer.finalize()


class _InterruptRequest(RunCallback):
    """Set by the first SIGINT/SIGTERM: the loop stops after the round in flight (its state is
    then complete, so the run is checkpointed); a second signal aborts at once."""

    def __init__(self):
        self.signal_name: str | None = None
        self.stopped = False

    def on_round_end(self, run, record):
        if self.signal_name is not None and record.round < run.cfg.rounds - 1:  # else: it is done
            self.stopped = True
            return Stop(f"interrupted ({self.signal_name}) after round {record.round}", "interrupted")
        return None


@contextlib.contextmanager
def _interrupt_signals(request: _InterruptRequest | None):
    """Route SIGINT/SIGTERM to ``request`` (None: SIGTERM raises KeyboardInterrupt, as Ctrl+C
    does). Only in the main thread, and only where the default handlers are installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if request is None or request.signal_name is not None:
            raise KeyboardInterrupt
        request.signal_name = signal.Signals(signum).name
        print(f"\nhetsim: {request.signal_name}: stopping after the round in flight "
              "(again to abort at once)", file=sys.stderr)

    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    if request is None:
        defaults.pop(signal.SIGINT)  # Ctrl+C already raises KeyboardInterrupt
    previous = {}
    for sig, default in defaults.items():
        if signal.getsignal(sig) is default:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class ManifestKeeper(RunCallback):
    """Owns ``manifest.json`` while the run lives: every write goes through one lock and stamps
    a heartbeat, written after every round and every ``interval`` seconds by a thread, so that
    ``hetsim show`` can tell a crashed run (process gone, heartbeat stale) from a live one."""

    def __init__(self, writer: RunWriter, manifest: dict, interval: float = HEARTBEAT_S):
        self.writer, self.manifest, self.interval = writer, manifest, interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self) -> None:
        with self._lock:
            self.manifest["heartbeat"] = utc_now()
            self.writer.write_json("manifest.json", self.manifest)

    def start(self) -> None:
        self.write()
        self._thread = threading.Thread(target=self._beat, name="hetsim-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def on_round_end(self, run: RunContext, record: RoundRecord) -> None:
        self.manifest["rounds_done"] = record.round + 1
        self.write()


def run_experiment(
    cfg: ExperimentConfig,
    run_dir: str | Path | None = None,
    callbacks: list[CallbackLike] | None = None,
    command: list[str] | None = None,
) -> Path | str:
    """Validate ``cfg``, create its run folder, run it; returns the folder's path.

    Validation (:func:`engine.validate.validate_experiment`) comes first, so a config error
    leaves no folder behind; its warnings are logged and recorded in ``manifest.json``. The
    folder is ``run_dir`` or one named from ``cfg.output`` (:func:`make_run_dir`).
    ``callbacks`` (:mod:`engine.callbacks`) see every finished round and may add metrics or
    stop the run. With ``executor.kind: ray`` the round loop runs inside a driver actor (pinned
    to this node, so the run folder is written here) and ``callbacks`` run in this process on
    the rounds it relays. Rows are appended every round; on failure the manifest records the
    error and every finished round stays readable with :func:`engine.results.load_run`.
    Checkpoints (``checkpoint.every``) let :func:`resume_run` continue an unfinished run.
    Ctrl+C or SIGTERM stops the run after the round in flight, writes a checkpoint and raises
    ``KeyboardInterrupt``; a second one aborts at once.
    A URI ``run_dir`` (or ``output.dir``), e.g. ``s3://bucket/runs/x``, is run through a local
    staging folder (:func:`run_to_storage`) and the URI is returned.
    """
    path, warnings = prepare_run(cfg, run_dir)
    return run_in_folder(cfg, path, callbacks, command, warnings)


def prepare_run(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> tuple[Path | str, list[str]]:
    """Validate ``cfg`` (nothing is written if it fails), log its warnings, then create and
    claim the run folder. Returns the folder (or a URI) and the warnings (for the manifest)."""
    from engine.clients.device import check_device_request
    from engine.run.validate import validate_experiment, validate_while_ray_starts

    check_device_request(cfg)  # `device: cuda` without CUDA: refused before anything is written
    if cfg.executor.kind == "ray":  # the data checks' CPU seconds overlap Ray's start-up
        warnings = validate_while_ray_starts(cfg, run_dir)
    else:
        warnings = validate_experiment(cfg, run_dir)
    for text in warnings:
        log.warning("hetsim: warning: %s", text)
    try:
        return make_run_dir(cfg, run_dir), warnings
    except BaseException:
        if cfg.executor.kind == "ray":  # no run for the driver started during the validation
            from engine.ray.driver import discard_early_driver

            discard_early_driver()
        raise


def run_in_folder(
    cfg: ExperimentConfig,
    path: Path | str,
    callbacks: list[CallbackLike] | None = None,
    command: list[str] | None = None,
    warnings: list[str] | None = None,
) -> Path | str:
    """Run a validated ``cfg`` into ``path``, a folder the caller owns (e.g. a sweep trial's),
    or into a URI through a local staging folder."""
    command = command if command is not None else sys.argv
    if is_uri(str(path)):
        return run_to_storage(cfg, str(path), callbacks, command)
    return _dispatch(cfg, Path(path), callbacks, command, resume=False, warnings=warnings)


def _dispatch(cfg, path, callbacks, command, resume: bool, warnings: list[str] | None = None) -> Path:
    if cfg.executor.kind == "ray":
        from engine.ray.driver import run_on_driver_actor

        with _interrupt_signals(None):
            return run_on_driver_actor(cfg, path, callbacks or [], command, resume=resume,
                                       warnings=warnings)
    request = _InterruptRequest()
    with _interrupt_signals(request):
        out = execute_run(cfg, path, [*(callbacks or []), request], command, resume=resume,
                          warnings=warnings)
    if request.stopped:
        raise KeyboardInterrupt(f"run stopped by {request.signal_name}")
    return out


def resume_config(
    run_dir: str | Path,
    cfg: ExperimentConfig | str | Path | None = None,
    overrides: list[str] | dict | None = None,
) -> ExperimentConfig:
    """The config to resume ``run_dir`` with: its own ``config.yaml``, or ``cfg`` (a config or a
    YAML path), with ``overrides``; a change that could alter results raises ``ConfigError``."""
    from engine.checkpoint.snapshot import check_resumable

    path = Path(run_dir)
    if not (path / "manifest.json").is_file() or not (path / "config.yaml").is_file():
        raise FileNotFoundError(f"{path} is not a run folder (no manifest.json / config.yaml)")
    saved = load_config(path / "config.yaml")
    if isinstance(cfg, ExperimentConfig):
        new = load_config(cfg.to_dict(), overrides) if overrides else cfg
    else:
        new = load_config(cfg if cfg is not None else path / "config.yaml", overrides)
    check_resumable(saved, new)
    return new


def resume_run(
    run_dir: str | Path,
    cfg: ExperimentConfig | str | Path | None = None,
    callbacks: list[CallbackLike] | None = None,
    command: list[str] | None = None,
    overrides: list[str] | dict | None = None,
) -> Path:
    """Continue an unfinished run from its newest checkpoint (from round 0 if it has none).

    Rounds after the checkpoint are recomputed and their rows from the first attempt dropped,
    so every table holds each round once; ``manifest.json`` lists the resume under
    ``resumes``. ``cfg``/``overrides`` may change only fields that cannot change results
    (:data:`engine.checkpoint.RESULT_NEUTRAL_FIELDS`).
    """
    path = Path(run_dir)
    cfg = resume_config(path, cfg, overrides)
    _check_can_resume(path)
    command = command if command is not None else sys.argv
    return _dispatch(cfg, path, callbacks, command, resume=True)


class RunStateError(RuntimeError):
    """A run folder is in a state that does not allow the request (finished, still running)."""


def _check_can_resume(path: Path) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    status = manifest.get("status")
    if status == "finished":
        raise RunStateError(f"{path} finished all its rounds: nothing to resume")
    pid = manifest.get("loop_pid")
    if status == "running" and manifest.get("host") == platform.node() and pid:
        deadline = time.monotonic() + 10.0  # a killed run's Ray workers take a moment to go
        while _our_process_alive(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _our_process_alive(int(pid)):
            raise RunStateError(f"{path} is still being run by process {pid} on this host; stop it first")


def _our_process_alive(pid: int) -> bool:
    """A live hetsim run loop (a Python process or a Ray worker) with this pid."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # a zombie has finished
        return False
    return b"python" in cmdline or b"ray::" in cmdline or b"hetsim" in cmdline


def run_to_storage(cfg: ExperimentConfig, uri: str, callbacks: list[CallbackLike] | None,
                   command: list[str]) -> str:
    """Run into a local staging folder and mirror it to ``uri`` (every ``output.upload_every_s``
    seconds, after checkpoints and when the run ends, also on failure); returns ``uri``.

    The staging folder is removed once the finished run is uploaded; if the last upload fails
    it is kept and the error names it."""
    import shutil
    import tempfile

    remote = open_storage(uri, cfg.output.storage_options)
    check_writable(remote)
    staging = Path(tempfile.mkdtemp(prefix="hetsim-run-")) / posixpath.basename(remote.path)
    mirror = DirectoryMirror(staging, remote)
    try:
        run_experiment(cfg, staging, [*(callbacks or []), MirrorCallback(mirror, cfg.output.upload_every_s)],
                       command)
    finally:
        try:
            mirror.sync()
        except Exception as err:
            raise StorageError(f"uploading the run folder to {uri} failed ({err}); the local copy "
                               f"is in {staging}") from err
    shutil.rmtree(staging.parent, ignore_errors=True)
    return uri


def execute_run(
    cfg: ExperimentConfig,
    path: Path,
    callbacks: list[CallbackLike] | None,
    command: list[str],
    executor=None,
    resume: bool = False,
    allow_config_change: bool = False,
    warnings: list[str] | None = None,
) -> Path:
    """The body of a run, in whichever process hosts the round loop.

    ``executor`` defaults to the one ``cfg.executor`` names (see :func:`make_executor`).
    ``resume``: continue the run in ``path`` from its newest checkpoint (see :func:`resume_run`,
    which checks the config first); ``allow_config_change``: that checkpoint may come from another
    config (:func:`engine.checkpoint.restore_checkpoint`; Population Based Training).
    """
    from engine.checkpoint.snapshot import CheckpointCallback
    from engine.clients.device import check_device_request

    mark("run: begins")
    check_device_request(cfg)
    from engine.loop.simulation import Simulation

    path = Path(path)
    writer = RunWriter(path)
    if resume:
        manifest = json.loads((path / "manifest.json").read_text())
        resume_entry = {
            "at": utc_now(),
            "previous_status": manifest.get("status"),
            "previous_error": manifest.get("error"),
            "command": command,
            "host": platform.node(),
        }
        for key in ("error", "finished"):
            manifest.pop(key, None)
        manifest.update(status="running", **process_identity(), loop_pid=os.getpid())
        dump_config(cfg, path / "config.yaml")  # result-neutral fields may have changed
    else:
        from engine.checkpoint.snapshot import CHECKPOINTS

        shutil.rmtree(path / CHECKPOINTS, ignore_errors=True)  # an overwritten run's: not ours
        dump_config(cfg, path / "config.yaml")
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "status": "running",
            "seed": cfg.seed,
            "algorithm": cfg.algorithm.name,
            "dataset": cfg.dataset.name,
            "started": utc_now(),
            "command": command,
            **process_identity(),  # the round loop's process: the driver actor's under Ray
            "loop_pid": os.getpid(),  # (= pid; kept for readers of schema 1)
            "warnings": list(warnings or []),
            "versions": versions(),
        }
    keeper = ManifestKeeper(writer, manifest)
    keeper.start()
    wall0 = time.perf_counter()
    recorder = RunRecorder(writer)
    sim = None
    try:
        executor = executor if executor is not None else make_executor(cfg)
        sim = Simulation(cfg, executor)
        mark("run: simulation built")
        if not resume:
            writer.write_table("profiles", sim.profiles.to_frame())
        sim.start()
        mark("run: executor started")
        manifest["executor"] = {**sim.executor.describe(), "eval_device": sim.eval_device.type}
        manifest["num_clients"] = sim.data.num_clients
        if resume:
            _restore_for_resume(sim, path, writer, manifest, resume_entry, allow_config_change)
        keeper.write()
        run = RunContext(cfg, path, first_round=sim.next_round, simulation=sim, info=manifest)
        cbs = around_recorder(callbacks, recorder)
        cbs.insert(cbs.index(recorder) + 1, CheckpointCallback(cfg, writer))
        manifest["status"] = sim.run([*cbs, keeper], run)
        if sim.stop is not None:
            manifest["error"] = sim.stop.message
        manifest["sim_time_s"] = sim.sim_time_s
    except BaseException as err:  # record, then re-raise: nothing finished is lost
        manifest["status"] = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        manifest["error"] = "".join(traceback.format_exception_only(type(err), err)).strip()
        raise
    finally:
        keeper.stop()
        manifest["finished"] = utc_now()
        manifest["wall_s"] = time.perf_counter() - wall0
        late = sim.executor.drain_faults() if sim is not None else []
        if late:  # a host died after the last round's record (e.g. while checkpointing)
            writer.append("faults", late)
            manifest["faults"] = manifest.get("faults", 0) + len(late)
        writer.finalize()  # idempotent: also covers a failure before the loop started
        keeper.write()
        mark("run: folder complete")
    return path


def _restore_for_resume(sim: Simulation, path: Path, writer: RunWriter, manifest: dict, entry: dict,
                        allow_config_change: bool = False) -> None:
    """Load the newest checkpoint into ``sim`` and cut the tables back to it."""
    from engine.checkpoint.snapshot import (
        CHECKPOINTS,
        CheckpointError,
        list_checkpoints,
        prune_checkpoints,
        restore_checkpoint,
    )

    ckpt, meta = None, None
    for _, candidate in reversed(list_checkpoints(path)):  # newest first; one that fails to
        try:                                               # load (cut by a power loss) is skipped
            meta = restore_checkpoint(sim, candidate, allow_config_change=allow_config_change)
            ckpt = candidate
            break
        except (CheckpointError, OSError, RuntimeError, ValueError) as err:
            entry.setdefault("skipped", []).append({"checkpoint": candidate.name, "error": str(err)})
    if ckpt is None and entry.get("skipped"):
        raise CheckpointError(
            f"no checkpoint of {path} could be restored ({entry['skipped']}); remove "
            f"{path / CHECKPOINTS} to rerun it from round 0")
    entry["from_round"] = sim.next_round
    entry["checkpoint"] = f"{CHECKPOINTS}/{ckpt.name}" if ckpt is not None else None
    entry["rows_dropped"] = writer.rewind(sim.next_round, meta["tables"] if meta else None)
    prune_checkpoints(path, sim.cfg.checkpoint.keep, newer_than=sim.next_round)
    sim.executor.recovery_checkpoint = ckpt
    manifest.setdefault("resumes", []).append(entry)


