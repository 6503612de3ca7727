"""The driver actor: runs the round loop of a Ray-executed experiment.

The caller's process only starts it and relays finished rounds to its callbacks (progress
bar, Tune reporting), polling every half second; the loop, the client actors and the run
folder's writer all live in the driver actor, which is pinned to the caller's node.
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.callbacks import CallbackLike, CallbackList, RoundRecord, RunCallback, RunContext, Stop
from engine.config import ExperimentConfig
from engine.ray_executor import init_ray
from engine.trace import mark

POLL_S = 0.5
STOP_GRACE_S = 120.0  # after Ctrl+C: time for the round in flight to finish and be written


class _Relay(RunCallback):
    """Inside the driver actor: queues rounds for the caller; ends the loop when asked to."""

    def __init__(self):
        self.records: list[RoundRecord] = []
        self.stop_request: Stop | None = None

    def on_round_end(self, run, record):
        self.records.append(record)
        return self.stop_request


def _driver_actor_class():
    import ray

    @ray.remote(num_cpus=0, max_concurrency=2, max_restarts=0)
    class DriverActor:
        def __init__(self):
            mark("driver actor: up")
            self._relay = _Relay()

        def run(self, cfg: ExperimentConfig, path: str, command: list[str]) -> str:
            from engine.ray_executor import RayExecutor

            executor = RayExecutor(cfg)
            executor.prelaunch()  # the client actors start while execute_run loads the data
            from engine.run import execute_run

            try:
                return str(execute_run(cfg, Path(path), [self._relay], command, executor=executor))
            finally:
                executor.close()  # also when the run failed before its loop (which closes it)

        def stop(self, message: str, status: str) -> None:
            self._relay.stop_request = Stop(message, status)

        def poll(self) -> list[RoundRecord]:
            records, self._relay.records = self._relay.records, []
            return records

    return DriverActor


def run_on_driver_actor(
    cfg: ExperimentConfig, path: Path, callbacks: list[CallbackLike], command
) -> Path:
    ray = init_ray(cfg.ray.address, cfg.ray.num_cpus)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cbs = CallbackList(callbacks)
    run = RunContext(cfg, Path(path), first_round=0, simulation=None)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    driver = _driver_actor_class().options(scheduling_strategy=here).remote()
    mark("cli: driver actor requested")
    done = driver.run.remote(cfg, str(Path(path).resolve()), command)
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
            raise err.as_instanceof_cause() from None
        status = _manifest_status(result)
        return result
    except KeyboardInterrupt:
        # let the driver finish the round in flight, mark the run interrupted and compact it
        status = "interrupted"
        driver.stop.remote("stopped by the caller (Ctrl+C)", "interrupted")
        ray.wait([done], timeout=STOP_GRACE_S)
        raise
    finally:
        mark("cli: driver done")
        ray.kill(driver)
        cbs.run_end(run, status)


def _manifest_status(path: Path) -> str:
    try:
        return json.loads((path / "manifest.json").read_text()).get("status", "finished")
    except (OSError, ValueError):
        return "finished"
