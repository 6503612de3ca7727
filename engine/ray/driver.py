"""The driver actor: hosts the round loop of a Ray-executed experiment.

The caller's process only starts it and relays finished rounds to its callbacks (progress
bar, Tune reporting), polling every half second; the loop, the client actors and the run
folder's writer all live in the driver actor, which is pinned to the caller's node. What the
actor runs is the run body the caller hands it (:func:`engine.run.body.execute_run`), so this
module knows nothing of run folders beyond closing one whose loop died.

This module imports Ray but not torch: the caller of a Ray run never hosts the loop.
"""
from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.clients.device import set_ray_gpu_ids
from engine.config.schema import ExperimentConfig
from engine.errors import UserError
from engine.gcpause import imports_without_gc, own_process
from engine.loop.callbacks import CallbackLike, CallbackList, RoundRecord, RunCallback, RunContext, Stop
from engine.plugin_transport import NotLoaded
from engine.ray.cluster import DriverDiedError, ExecutorError, init_ray
from engine.ray.executor import pool_key
from engine.results.manifest import read_manifest, update_manifest, utc_now
from engine.trace import mark

POLL_S = 0.5


class _Relay(RunCallback):
    """Inside the driver actor: queues rounds for the caller; ends the loop when asked to."""

    def __init__(self):
        self.records: list[RoundRecord] = []
        self.stop_request: Stop | None = None

    def on_round_end(self, run, record):
        self.records.append(record)
        return self.stop_request


class DriverActor:
    """The round loop's process (a plain class; :func:`driver_actor_class` makes it an actor)."""

    def __init__(self, cfg: ExperimentConfig | None = None):
        mark("driver actor: up")
        own_process()
        set_ray_gpu_ids([str(g) for g in ray.get_gpu_ids()])
        self._relay = _Relay()
        self._executor = None
        self._warm = None  # a finished run's executor with its actors parked (executor.keep_warm)
        # started early: the client actors start now (unless the config's plugins do not load
        # here: run() then raises their error, which reaches the caller with its type)
        if cfg is not None and not isinstance(cfg, NotLoaded):
            self._executor = _new_executor(cfg)

    def run(self, body: Callable, cfg: ExperimentConfig, path: str, command: list[str],
            resume: bool = False, warnings=None) -> str:
        """``body(cfg, path, callbacks, command, executor=, resume=, warnings=)``: the run."""
        if isinstance(cfg, NotLoaded):
            cfg.check()
        self._relay.records, self._relay.stop_request = [], None  # none left from a previous run
        executor, self._executor = self._executor, None
        if executor is None and self._warm is not None:
            executor = self._warm.reuse(cfg)
            if executor is None:  # another pool: the parked actors give their resources back
                self._warm.close()
            self._warm = None
        if executor is None:
            executor = _new_executor(cfg)  # the client actors start while the body loads the data
        executor.keep_actors = cfg.executor.keep_warm
        try:
            out = str(body(cfg, Path(path), [self._relay], command, executor=executor,
                           resume=resume, warnings=warnings))
        except BaseException:
            executor.keep_actors = False  # a failed run's actors are not handed on
            raise
        finally:
            executor.close()  # also when the run failed before its loop (which closes it)
        if executor.parked:
            executor.keep_actors = False  # its close() from now on kills them
            self._warm = executor
        return out

    def stop(self, message: str, status: str) -> None:
        self._relay.stop_request = Stop(message, status)

    def poll(self) -> list[RoundRecord]:
        records, self._relay.records = self._relay.records, []
        return records


def _new_executor(cfg: ExperimentConfig):
    """A Ray executor whose client actors are being started."""
    with imports_without_gc():  # once per process: the driver actor's start-up (engine.gcpause)
        from engine.ray.executor import RayExecutor  # torch: only the driver actor's process needs it

    executor = RayExecutor(cfg)
    executor.prelaunch()
    return executor


@functools.cache
def driver_actor_class():
    return ray.remote(num_cpus=0, max_concurrency=2, max_restarts=0)(DriverActor)


def _request_driver(ray, cfg: ExperimentConfig, early: bool = False):
    """A driver actor pinned to this node (its run folder is written here); ``early``: it starts
    the client actors for ``cfg`` at once."""
    node_id = ray.get_runtime_context().get_node_id()
    _check_driver_gpus(ray, node_id, cfg.executor.driver_gpus)
    # no GPU unless asked for (executor.driver_gpus): the server aggregates on the CPU
    driver = driver_actor_class().options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        num_gpus=cfg.executor.driver_gpus).remote(cfg if early else None)
    mark("cli: driver actor requested")
    return driver


# the driver started by start_driver_early, with the config it was started for
_early: tuple[ExperimentConfig, object] | None = None


def start_driver_early(cfg: ExperimentConfig) -> None:
    """Start ``cfg``'s driver actor, and through it the client actors, now that Ray is up, while
    this process still validates ``cfg`` with its data: :func:`run_on_driver_actor` takes it
    over, :func:`discard_early_driver` stops it (and its client actors) if ``cfg`` fails. What
    repeated runs attached to a running Ray gain: their actors start during the validation.
    Nothing starts when a warm driver can take the run (``executor.keep_warm``)."""
    global _early
    discard_early_driver()
    if _warm_driver_for(cfg, take=False) is not None:
        return
    try:
        _early = (cfg, _request_driver(ray, cfg, early=True))
    except ExecutorError:  # a driver this node cannot host: said when the run asks for it
        pass


def discard_early_driver() -> None:
    global _early
    early, _early = _early, None
    if early is not None:
        if ray.is_initialized():  # (a Ray started for a config that failed is already down)
            ray.kill(early[1])  # the client actors it owns die with it


def _take_early_driver(cfg: ExperimentConfig):
    global _early
    early, _early = _early, None
    if early is None:
        return None
    if early[0] is cfg:
        return early[1]
    _kill_and_wait(early[1])  # started for another config; its CPUs size the new pool
    return None


def _kill_and_wait(actor, timeout_s: float = 30.0) -> None:
    """``ray.kill`` and return once Ray reports the actor dead (bounded): the kill itself is
    asynchronous, and a pool sized right after it would count the dying actors' CPUs as taken."""
    ray.kill(actor)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return
        time.sleep(0.02)


# (pool key, driver actor, Ray's GCS address): the driver actor of this process's last Ray run
# with executor.keep_warm, its client actors parked in it
_warm: tuple[tuple, object, str] | None = None


def _warm_key(cfg: ExperimentConfig) -> tuple:
    return (*pool_key(cfg), cfg.executor.driver_gpus)


def _warm_driver_for(cfg: ExperimentConfig, take: bool = True):
    """The warm driver if it can run ``cfg`` (same actors, same Ray), taken unless ``take`` is
    False; else None, and a warm driver for other actors is released first (its CPUs are
    what the new pool is sized from)."""
    global _warm
    if _warm is not None and not (ray.is_initialized()
                                  and _warm[2] == ray.get_runtime_context().gcs_address):
        _warm = None  # its Ray is gone, and the actors with it
    if _warm is None:
        return None
    if _warm[0] != _warm_key(cfg):
        release_warm_actors()
        return None
    driver = _warm[1]
    if take:
        _warm = None
    return driver


def release_warm_actors() -> None:
    """Stop the warm driver and its client actors (``executor.keep_warm``), if any: their
    processes and CPUs go back to Ray."""
    global _warm
    warm, _warm = _warm, None
    if warm is not None and ray.is_initialized() and warm[2] == ray.get_runtime_context().gcs_address:
        _kill_and_wait(warm[1])  # the client actors it owns die with it


def run_on_driver_actor(
    body: Callable, cfg: ExperimentConfig, path: Path, callbacks: list[CallbackLike], command,
    resume: bool = False, warnings=None,
) -> Path:
    """Run ``body`` (the run body) in a driver actor for ``cfg``; relay its rounds to ``callbacks``.
    With ``executor.keep_warm`` the driver actor and its client actors stay up after a run that
    ended, for the next run of this process with the same actors (:func:`release_warm_actors`)."""
    global _warm
    init_ray(cfg.ray.address, cfg.ray.num_cpus, num_gpus=cfg.ray.num_gpus,
                   connect_timeout_s=cfg.ray.connect_timeout_s)
    cbs = CallbackList(callbacks)
    run = RunContext(cfg, Path(path), first_round=_resume_round(path) if resume else 0, simulation=None)
    driver = _take_early_driver(cfg) or _warm_driver_for(cfg) or _request_driver(ray, cfg)
    done = driver.run.remote(body, cfg, str(Path(path).resolve()), command, resume, list(warnings or []))
    stop_sent = False

    def relay() -> None:
        nonlocal stop_sent
        for rec in ray.get(driver.poll.remote()):
            stop = cbs.round_end(run, rec)
            if stop is not None and not stop_sent:
                driver.stop.remote(stop.message, stop.status)
                stop_sent = True

    status = "failed"
    cbs.run_begin(run)
    try:
        while not ray.wait([done], timeout=POLL_S)[0]:
            relay()
        relay()
        try:
            result = Path(ray.get(done))
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, UserError):  # a user mistake or the environment (full disk): plain message
                _failed_before_the_body(Path(path), err.cause)
                raise err.cause from None
            raise err.as_instanceof_cause() from None
        status = _manifest_status(result)
        return result
    except ray.exceptions.RayActorError as err:  # the loop's process is gone (killed, OOM, node lost)
        raise DriverDiedError(_driver_died(Path(path), err)) from None
    except KeyboardInterrupt:
        status = "interrupted"
        _stop_after_the_round(driver, done, Path(path))
        raise
    finally:
        mark("cli: driver done")
        if cfg.executor.keep_warm and status not in ("failed", "interrupted"):  # its actors are parked in it
            _warm = (_warm_key(cfg), driver, ray.get_runtime_context().gcs_address)
        else:
            ray.kill(driver)
        cbs.run_end(run, status)


def _failed_before_the_body(path: Path, err: BaseException) -> None:
    """A run the driver refused before its body started (its plugins do not load there): the
    folder's ``starting`` manifest says ``failed`` and why, as the body would have."""
    try:
        if read_manifest(path).get("status") == "starting":
            update_manifest(path, status="failed", error=str(err), finished=utc_now())
    except (OSError, ValueError):
        pass


def _stop_after_the_round(driver, done, path: Path) -> None:
    """The first Ctrl+C: the driver finishes the round in flight, checkpoints it, marks the run
    interrupted and compacts it, however long that takes (a timer here raced slow rounds: the
    driver was killed mid-checkpoint). A second Ctrl+C aborts: the driver is killed and, once it
    is gone (no second writer), this process closes the folder; the round in flight is lost."""
    print("\nhetsim: stopping after the round in flight (Ctrl+C again to abort at once)", file=sys.stderr)
    driver.stop.remote("stopped by the caller (Ctrl+C)", "interrupted")
    try:
        while not ray.wait([done], timeout=POLL_S)[0]:
            pass
    except KeyboardInterrupt:
        ray.kill(driver)
        try:
            ray.get(done)  # returns once Ray has the driver actor dead
        except Exception:  # noqa: BLE001 - killed: RayActorError, as asked
            pass
        close_abandoned_run(path, "interrupted", "aborted by the caller (Ctrl+C twice) during a round; "
                            "that round is lost")


def _check_driver_gpus(ray, node_id: str, driver_gpus: float) -> None:
    """The driver actor is pinned to this node: refuse a GPU share this node cannot give
    (Ray would wait forever)."""
    if driver_gpus <= 0:
        return
    here = next((n for n in ray.nodes() if n["NodeID"] == node_id), {"Resources": {}})
    have = here["Resources"].get("GPU", 0.0)
    if have + 1e-9 < driver_gpus:
        raise ExecutorError(
            f"executor.driver_gpus={driver_gpus:g}: the driver actor runs on this node, which has "
            f"{have:g} GPUs; Ray would wait forever. Set driver_gpus: 0 or run from a GPU node.")


def _resume_round(path: Path) -> int:
    # torch (the checkpoint format): Ray deserializes the driver actor by importing this module,
    # and torch there would delay the client actors it starts by a second or more
    from engine.checkpoint.folder import latest_checkpoint
    from engine.checkpoint.snapshot import read_meta

    latest = latest_checkpoint(path)
    return int(read_meta(latest)["next_round"]) if latest is not None else 0


def _driver_died(path: Path, err: BaseException) -> str:
    """Mark the run failed (the driver could not) and say how to continue it."""
    from engine.checkpoint.folder import latest_checkpoint  # torch: see _resume_round

    cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    message = f"the driver actor running the round loop died ({cause})"
    try:
        update_manifest(path, status="failed", error=message)
    except OSError:
        pass
    latest = latest_checkpoint(path)
    where = f"checkpoint {latest.name}" if latest is not None else "round 0 (no checkpoint yet)"
    return f"{message}; continue from {where} with: hetsim run --resume {path}"


def close_abandoned_run(path: Path, status: str, message: str) -> None:
    """Compact the parts of a run whose loop process was killed and record why it ended."""
    from engine.results.tables import RunWriter  # pandas: only a run whose loop died needs it

    RunWriter(path).finalize()
    update_manifest(path, status=status, error=message, finished=utc_now())


def _manifest_status(path: Path) -> str:
    try:
        return read_manifest(path).get("status", "finished")
    except (OSError, ValueError):
        return "finished"
