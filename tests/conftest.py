"""Suite-wide hygiene: no test module inherits another module's Ray instance."""
import sys

import pytest


@pytest.fixture(autouse=True, scope="module")
def _no_ray_left_behind():
    # a module that started Ray through the engine (e.g. a sweep) and did not stop it would
    # hand the next module a Ray with other resources (no GPUs declared, other CPUs)
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
