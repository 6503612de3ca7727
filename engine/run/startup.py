"""A Ray run's start-up, overlapped: the data checks of the validation run in a thread while
Ray starts (or is joined) and the run's driver actor, and through it its client actors, start.

What a run attached to a running Ray gains: its actors start during the validation. A config
that fails stops them again, and a Ray started for it, before anything is written.
"""
from __future__ import annotations

from pathlib import Path

from engine.config.schema import ExperimentConfig
from engine.run.gpu_checks import gpu_problems
from engine.run.validate import fail, static_problems, validate_with_data


def validate_while_ray_starts(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> list[str]:
    """:func:`validate_experiment` for a run with ``executor.kind: ray``: after the checks that
    need no data, the ones that load it run while this thread starts (or joins) the Ray the
    run needs next, instead of before it. A Ray started for a config that fails is stopped. The
    parts the checks build are dropped: the run's driver actor builds its own, in its process."""
    # Ray: imported for Ray runs only
    from engine.ray.cluster import check_while_ray_starts, init_ray, ray_is_up
    from engine.ray.driver import discard_early_driver, start_driver_early

    running = ray_is_up()
    fail(static_problems(cfg, run_dir) + gpu_problems(cfg, running))  # before Ray starts

    def start():
        init_ray(cfg.ray.address, cfg.ray.num_cpus, num_gpus=cfg.ray.num_gpus,
                 connect_timeout_s=cfg.ray.connect_timeout_s)
        start_driver_early(cfg)  # its actors start while the check still runs

    try:
        validated, _ = check_while_ray_starts(lambda: validate_with_data(cfg, ray_running=running), start)
    except BaseException:
        discard_early_driver()
        raise
    return validated.warnings
