"""The driver actor: runs the round loop of a Ray-executed experiment.

The caller's process only starts it and relays finished rounds to its callbacks (progress
bar, Tune reporting), polling every half second; the loop, the client actors and the run
folder's writer all live in the driver actor, which is pinned to the caller's node.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from engine.config import ExperimentConfig
from engine.ray_executor import init_ray
from engine.simulation import RoundRecord

POLL_S = 0.5
STOP_GRACE_S = 120.0  # after Ctrl+C: time for the round in flight to finish and be written


class RunStopped(Exception):
    """The caller asked the driver actor to stop (Ctrl+C); raised between rounds."""


def _driver_actor_class():
    import ray

    @ray.remote(num_cpus=0, max_concurrency=2, max_restarts=0)
    class DriverActor:
        def __init__(self):
            self._records: list[RoundRecord] = []
            self._stop = False

        def run(self, cfg: ExperimentConfig, path: str, command: list[str]) -> str:
            from engine.run import execute_run

            return str(execute_run(cfg, Path(path), [self._collect], command))

        def _collect(self, record: RoundRecord) -> None:
            self._records.append(record)
            if self._stop:  # the round is already written: stop cleanly between rounds
                raise RunStopped(f"stopped by the caller after round {record.round}")

        def stop(self) -> None:
            self._stop = True

        def poll(self) -> list[RoundRecord]:
            records, self._records = self._records, []
            return records

    return DriverActor


def run_on_driver_actor(
    cfg: ExperimentConfig, path: Path, callbacks: list[Callable[[RoundRecord], None]], command
) -> Path:
    ray = init_ray(cfg.ray.address, cfg.ray.num_cpus)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    driver = _driver_actor_class().options(scheduling_strategy=here).remote()
    done = driver.run.remote(cfg, str(Path(path).resolve()), command)

    def relay() -> None:
        for rec in ray.get(driver.poll.remote()):
            for cb in callbacks:
                cb(rec)

    try:
        while not ray.wait([done], timeout=POLL_S)[0]:
            relay()
        relay()
        try:
            return Path(ray.get(done))
        except ray.exceptions.RayTaskError as err:
            raise err.as_instanceof_cause() from None
    except KeyboardInterrupt:
        # let the driver finish the round in flight, mark the run interrupted and compact it
        driver.stop.remote()
        ray.wait([done], timeout=STOP_GRACE_S)
        raise
    finally:
        ray.kill(driver)
