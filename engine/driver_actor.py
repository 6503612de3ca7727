"""The driver actor: runs the round loop of a Ray-executed experiment.

The caller's process only starts it and relays finished rounds to its callbacks (progress
bar, Tune reporting), polling every half second; the loop, the client actors and the run
folder's writer all live in the driver actor, which is pinned to the caller's node.
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.callbacks import CallbackLike, CallbackList, RunCallback, RunContext, Stop
from engine.config import ExperimentConfig
from engine.ray_executor import init_ray
from engine.simulation import RoundRecord

POLL_S = 0.5
# After Ctrl+C: time for the round in flight to finish and be written; then the driver actor is
# killed and this process closes the run folder itself (finished rounds are already on disk).
STOP_GRACE_S = 5.0


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
            self._relay = _Relay()

        def run(self, cfg: ExperimentConfig, path: str, command: list[str], warnings) -> str:
            from engine.run import execute_run

            return str(execute_run(cfg, Path(path), [self._relay], command, warnings=warnings))

        def stop(self, message: str, status: str) -> None:
            self._relay.stop_request = Stop(message, status)

        def poll(self) -> list[RoundRecord]:
            records, self._relay.records = self._relay.records, []
            return records

    return DriverActor


def run_on_driver_actor(
    cfg: ExperimentConfig, path: Path, callbacks: list[CallbackLike], command, warnings=None
) -> Path:
    ray = init_ray(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.connect_timeout_s)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cbs = CallbackList(callbacks)
    run = RunContext(cfg, Path(path), first_round=0, simulation=None)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    driver = _driver_actor_class().options(scheduling_strategy=here).remote()
    done = driver.run.remote(cfg, str(Path(path).resolve()), command, list(warnings or []))
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
        # let the driver finish the round in flight, mark the run interrupted and compact it;
        # if that takes longer than the grace, stop it and close the folder from here
        status = "interrupted"
        driver.stop.remote("stopped by the caller (Ctrl+C)", "interrupted")
        finished = bool(ray.wait([done], timeout=STOP_GRACE_S)[0])
        ray.kill(driver)
        if not finished:
            close_abandoned_run(Path(path), "interrupted", "stopped by the caller (Ctrl+C) "
                                "during a round; that round is lost")
        raise
    finally:
        ray.kill(driver)
        cbs.run_end(run, status)


def close_abandoned_run(path: Path, status: str, message: str) -> None:
    """Compact the parts of a run whose loop process was killed and record why it ended."""
    from engine.results import RunWriter, utc_now

    writer = RunWriter(path)
    writer.finalize()
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    manifest.update(status=status, error=message, finished=utc_now())
    writer.write_json("manifest.json", manifest)


def _manifest_status(path: Path) -> str:
    try:
        return json.loads((path / "manifest.json").read_text()).get("status", "finished")
    except (OSError, ValueError):
        return "finished"
