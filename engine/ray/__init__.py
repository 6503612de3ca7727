"""Everything that talks to Ray: starting or joining a cluster (:mod:`.cluster`), planning the
client-actor pool (:mod:`.pool`), the client actor (:mod:`.client_actor`), the Ray executor
(:mod:`.executor`), the driver actor that hosts a run's round loop (:mod:`.driver`) and a Ray
node's disk as a filesystem for the others (:mod:`.node_disk`). Nothing outside this package
and :mod:`sweeps` imports Ray.

Importing the package sets the environment Ray reads once, when ``ray`` is imported, before
any of its modules imports Ray.
"""
import os

# Measured with ray 2.60: these keep a local Ray quiet and fast to start.
QUIET_RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage reporting
    "RAY_worker_maximum_startup_concurrency": "64",  # no warning with many actors
    "RAY_AIR_NEW_OUTPUT": "0",
}
for _key, _value in QUIET_RAY_ENV.items():
    os.environ.setdefault(_key, _value)
