"""Suite-wide hygiene: no test module inherits another module's Ray instance."""
import re
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="module")
def _no_ray_left_behind():
    # a module that started Ray through the engine (e.g. a sweep) and did not stop it would
    # hand the next module a Ray with other resources (no GPUs declared, other CPUs)
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and not _is_shared_ray(ray):  # see ray_session
        ray.shutdown()


# ------------------------------------------------------------------ one Ray for the modules that can share it
# Starting a local Ray costs seconds of both cores; most Ray modules want the same one (2 CPUs, no
# GPUs). A module asks for it with the `ray_session` fixture; the Ray then outlives the module and
# serves the next one that asks. A module that may start a Ray of its own (other CPUs, declared
# GPUs, a cluster) and does not ask for the shared one starts with no Ray, as before.
SHARED_RAY_CPUS = 2
_shared_ray: dict[str, str] = {}  # "gcs": the address of the shared Ray while it is up
_MAY_START_RAY = re.compile(r"\bray|sweep|whatif|tune", re.IGNORECASE)


def _is_shared_ray(ray) -> bool:
    return ray.is_initialized() and _shared_ray.get("gcs") == ray.get_runtime_context().gcs_address


def start_shared_ray(free_timeout_s: float = 60.0):
    """The shared Ray, started if need be, with all its CPUs free (actors of a previous module,
    killed or closed, give their CPUs back asynchronously; a pool is sized from what is free)."""
    from engine.ray.cluster import init_ray  # deferred: modules without Ray never import it

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and not _is_shared_ray(ray):
        ray.shutdown()  # another module's own Ray (other resources)
    ray = init_ray(num_cpus=SHARED_RAY_CPUS)
    _shared_ray["gcs"] = ray.get_runtime_context().gcs_address
    deadline = time.monotonic() + free_timeout_s
    while ray.available_resources().get("CPU", 0) < SHARED_RAY_CPUS and time.monotonic() < deadline:
        time.sleep(0.1)
    return ray


@pytest.fixture(scope="module")
def ray_session():
    """The suite's shared local Ray (``init_ray(num_cpus=2)``, as a run starts it), all CPUs free."""
    return start_shared_ray()


@pytest.fixture(autouse=True, scope="module")
def _shared_ray_only_where_asked(request):
    # a module that does not share the Ray but may start one gets none (its runs start their own)
    ray = sys.modules.get("ray")
    if ray is not None and _is_shared_ray(ray) and not _module_shares_ray(request):
        if _MAY_START_RAY.search(Path(request.module.__file__).read_text(encoding="utf-8")):
            ray.shutdown()
    yield


def _module_shares_ray(request) -> bool:
    module = request.module
    return any("ray_session" in item.fixturenames for item in request.session.items
               if getattr(item, "module", None) is module)
