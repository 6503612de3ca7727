"""A study's list of runs as one sweep: every run a case of a ``cases`` dimension.

A study (``studies/*.py``) is a list of named runs that differ from one base in a few keys.
:func:`run_cases` runs them as one ``hetsim sweep`` (so they get warm trial processes, the sweep
tables, trackers and resume) under ``<root>/sweeps/<n>/``, and returns each finished run's
folder. A later call with the same ``root`` runs only the cases no earlier call finished (or
stopped as diverged); an interrupted sweep's unfinished cases start again in a new sweep.

Not here: what a study measures or reports (the study's own module).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATUS_DONE = ("finished", "diverged")


def cases_spec(cases: dict[str, dict[str, Any]], storage: str | Path, *, base: dict[str, Any] | str | None = None,
               overrides: list[str] | None = None, name: str = "study", jobs: int = 1, dimension: str = "run",
               metric: str = "global_acc", mode: str = "max") -> dict[str, Any]:
    """The sweep spec: ``cases`` (name -> {dotted key: value}) over ``base`` (+ ``overrides``),
    ``jobs`` trials at a time, one CPU each, on a local Ray of ``jobs`` CPUs."""
    return {"name": name, "base": base, "overrides": list(overrides or []),
            "space": {dimension: {"cases": cases}}, "metric": metric, "mode": mode,
            "max_concurrent_trials": jobs, "resources_per_trial": {"cpus": 1}, "ray": {"num_cpus": jobs},
            "storage": str(storage)}


def finished_cases(root: str | Path, dimension: str = "run") -> dict[str, Path]:
    """Run folders of the cases that a sweep under ``root/sweeps/`` finished (or stopped as
    diverged), by case name; a folder whose trial or run says otherwise is not counted."""
    done: dict[str, Path] = {}
    for info in sorted(Path(root).glob("sweeps/*/runs/*/trial.json")):
        try:
            trial = json.loads(info.read_text())
            manifest = json.loads((info.parent / "manifest.json").read_text())
        except (OSError, ValueError):  # a damaged or half-written trial: it runs again
            continue
        case = (trial.get("params") or {}).get(dimension)
        if case and trial.get("status") in STATUS_DONE and manifest.get("status") == trial["status"]:
            done[case] = info.parent
    return done


def run_cases(cases: dict[str, dict[str, Any]], root: str | Path, *, base: dict[str, Any] | str | None = None,
              overrides: list[str] | None = None, name: str = "study", jobs: int = 1, dimension: str = "run",
              command: list[str] | None = None, quiet: bool = False, done: dict[str, Path] | None = None,
              ) -> dict[str, Path]:
    """Run the ``cases`` not finished yet under ``root`` (nor in ``done``, folders the caller
    found elsewhere) as one sweep; return the run folder of every finished case."""
    from sweeps.runner import run_sweep  # reason: Ray Tune, only when something is left to run

    done = {**(done or {}), **finished_cases(root, dimension)}
    pending = {n: c for n, c in cases.items() if n not in done}
    if pending:
        storage = Path(root) / "sweeps" / str(len(list(Path(root).glob("sweeps/*"))))
        if not quiet:
            print(f"{len(pending)} run(s) to go ({len(cases) - len(pending)} finished earlier): sweep {storage}",
                  flush=True)
        spec = cases_spec(pending, storage, base=base, overrides=overrides, name=name, jobs=jobs, dimension=dimension)
        run_sweep(spec, quiet=quiet, command=command)
        done.update(finished_cases(root, dimension))
    return {n: done[n] for n in cases if n in done}
