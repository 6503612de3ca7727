"""Ray Tune sweeps over hetsim experiments.

* :func:`run_sweep` / :func:`resume_sweep` (``hetsim sweep SPEC.yaml`` / ``--resume PATH``)
* :func:`load_sweep` -> :class:`Sweep` (``trials``, ``rounds`` DataFrames and the ``spec``)
* :func:`resolve` validates a spec without starting anything; errors are :class:`SweepSpecError`

Spec schema and folder layout: ``docs/sweeps.md``. Importing this package does not import Ray.
"""
from sweeps.results import Sweep, load_sweep
from sweeps.spec import SweepSpec, SweepSpecError, resolve

__all__ = ["Sweep", "SweepSpec", "SweepSpecError", "load_sweep", "resolve", "run_sweep", "resume_sweep"]


def __getattr__(name):
    if name in ("run_sweep", "resume_sweep"):
        from sweeps import runner  # Ray Tune: importing sweeps does not import Ray

        return getattr(runner, name)
    raise AttributeError(f"module 'sweeps' has no attribute {name!r}")
