"""Which clients a round selects: seeded, and costing the number selected, not the fleet size."""
from __future__ import annotations

import numpy as np

from engine.config.schema import ExperimentConfig

SELECT_SALT = 0x5E1EC7


def target_arrivals(cfg: ExperimentConfig, num_clients: int) -> int:
    """How many uploads a round aims to aggregate: ``participation`` of the fleet, at least 1."""
    return max(1, int(round(cfg.clients.participation * num_clients)))


def select_clients(cfg: ExperimentConfig, num_clients: int, round: int) -> tuple[np.ndarray, int]:
    """(selected ids sorted, target number of arrivals). With over-selection more clients are
    selected than needed and the first ``target`` to finish are kept."""
    target = target_arrivals(cfg, num_clients)
    m = cfg.clock.num_to_select(target, num_clients)
    rng = np.random.default_rng([cfg.seed, round, SELECT_SALT])
    return np.sort(rng.choice(num_clients, size=m, replace=False)), target
