"""Run, resume and report a sweep with Ray Tune.

``run_sweep(spec)`` validates the spec (the checks that load data while Ray starts; nothing is written before they
pass), writes ``<storage>/sweep.yaml``, starts or joins Ray, runs one Tune trial per configuration
(:func:`sweeps.trainable.hetsim_trial`) and writes ``trials.parquet`` and ``rounds.parquet``.
``resume_sweep(storage)`` rebuilds the trainable from ``sweep.yaml`` and continues with ``Tuner.restore``: finished
trials are not rerun (also those Tune's saved state missed, see :func:`trial_or_reuse`), unfinished ones continue
from their last checkpoint (from round 0 without one), errored ones are kept as errors unless ``retry_errored``
(then they continue the same way, keeping their trial id).

Fitting the cluster and storage: :mod:`sweeps.cluster`; what a sweep prints, Tune's hooks: :mod:`sweeps.callbacks`.
Over 400 lines because it is the sweep's whole life with Tune: build, run, resume, report."""
from __future__ import annotations

import itertools
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable

import pandas as pd
import yaml

QUIET_TUNE_ENV = {"RAY_AIR_NEW_OUTPUT": "0"}  # with verbose=0: no progress tables
for _key, _value in QUIET_TUNE_ENV.items():  # before ray.tune is imported
    os.environ.setdefault(_key, _value)

from ray import tune  # noqa: E402
from ray.tune import ExperimentAnalysis  # noqa: E402
from ray.tune.schedulers import ASHAScheduler  # noqa: E402

from engine.plugin_transport import Carrier  # noqa: E402
from engine.ray.cluster import check_while_ray_starts, init_ray, joins_cluster  # noqa: E402
from engine.results import Storage, read_table  # noqa: E402
from engine.storage.locations import check_writable  # noqa: E402
from engine.trace import mark  # noqa: E402
from sweeps.callbacks import (  # noqa: E402
    ACTIVE,
    FailureNotices,
    NoTensorBoard,
    SweepCallbacks,
    SweepProgress,
    last_failure,
    quiet_tune,
    say,
)
from sweeps.cluster import alive_nodes, check_fits, tune_storage  # noqa: E402
from sweeps.pbt import SynchPBT  # noqa: E402
from sweeps.results import (  # noqa: E402
    SWEEP_FILE,
    TUNE_DIR,
    Sweep,
    TrialState,
    collect,
    load_sweep,
    read_sweep_file,
    summary_table,  # noqa: F401 - `hetsim sweep` prints it as runner.summary_table
    tune_rounds_frame,
    write,
)
from sweeps.search import TIME_ATTRS, describe_search, shown_values  # noqa: E402
from sweeps.searchers import param_space, search_alg, tune_num_samples  # noqa: E402
from sweeps.space import ClipToSpace, plain, tune_mutations  # noqa: E402
from sweeps.spec import ResolvedSweep, SweepSpecError, resolve, storage_location  # noqa: E402
from sweeps.trackers import check_trackers, make_trackers  # noqa: E402

# ---------------------------------------------------------------- building the Tuner


def _init_ray(resolved: ResolvedSweep):
    for key, value in QUIET_TUNE_ENV.items():
        os.environ.setdefault(key, value)
    ray = init_ray(resolved.spec.ray.address, resolved.spec.ray.num_cpus,
                   num_gpus=resolved.spec.ray.num_gpus, connect_timeout_s=resolved.spec.ray.connect_timeout_s)
    if joins_cluster(resolved.spec.ray.address):
        nodes = alive_nodes(ray)
        cpus = [n["Resources"].get("CPU", 0.0) for n in nodes]
        say(f"joined the Ray cluster at {resolved.spec.ray.address}: {len(nodes)} node(s), "
            f"{sum(cpus):g} CPUs (largest node {max(cpus, default=0):g})")
    return ray


def _trainable(resolved: ResolvedSweep):
    # torch (sweeps.trainable imports the Ray executor): not when this module is imported
    from sweeps.trainable import trial_resources

    plugins = Carrier(resolved.base_cfg.plugins)  # they travel with the trials, to nodes without their files too
    bound = tune.with_parameters(trial_or_reuse, sweep={**resolved.to_dict(), "plugins": plugins})
    return tune.with_resources(bound, trial_resources(resolved))


_function_over = threading.Event()
_function_over.set()  # no trial function runs in this process (a trial's actor)
TEARDOWN_TIMEOUT_S = 300.0  # closing a run folder: compacting its parts, mirroring it to storage


class ClosesItsRunFolder:
    """Tune mixin of the trial trainable: its process ends, or runs another trial, only once the
    trial function has closed its run folder. When Tune stops a trial (scheduler stop or PAUSE,
    end of sweep), the function wakes in ``tune.report`` with ``SystemExit`` and closes its run
    folder (parts, manifest, ``trial.json``, mirror). Tune's ``cleanup`` does not wait (the process
    ends with the thread wherever it is); ``reset_config`` waits 2 s, then fails the next trial."""

    def cleanup(self):
        super().cleanup()  # wakes the function (SystemExit in tune.report) and returns
        _function_over.wait(TEARDOWN_TIMEOUT_S)

    def reset_config(self, new_config):
        if super().reset_config(new_config):  # the function ended within Tune's 2 s
            return True
        return _function_over.wait(TEARDOWN_TIMEOUT_S) and super().reset_config(new_config)


def trial_or_reuse(params: dict[str, Any], sweep: dict[str, Any]) -> None:
    """The sweep's Tune trainable: :func:`sweeps.trainable.hetsim_trial`, unless this trial's
    run folder already holds its finished run. Tune saves its experiment state only every few
    seconds, so a sweep killed soon after a trial ended restores that trial as unfinished; its
    rounds are then reported to Tune again from the run folder instead of being recomputed."""
    _function_over.clear()
    try:
        _trial_or_reuse(params, sweep)
    finally:
        _function_over.set()

trial_or_reuse.__mixins__ = (ClosesItsRunFolder,)  # Tune's hook for a function trainable's class


def _trial_or_reuse(params: dict[str, Any], sweep: dict[str, Any]) -> None:
    # torch: as in _trainable
    from sweeps.trainable import TrialFolder, TuneReporter, hetsim_trial

    sweep.get("plugins", Carrier()).check()  # the plugins loaded in this trial's process (else: their error)

    folder = TrialFolder(tune.get_context().get_trial_id())
    rounds = _finished_rounds(folder)
    if rounds is None:
        hetsim_trial(params, sweep)
        return
    spec = ResolvedSweep.from_dict(sweep).spec
    reporter = TuneReporter(last_round=len(rounds) - 1, carry=(spec.metric, spec.scheduler.metric or spec.metric),
                            spec=sweep["spec"])
    run = SimpleNamespace(info={}, path=None)  # what the reporter reads of a live run: no checkpoint
    for row in rounds.to_dict("records"):
        reporter.on_round_end(run, SimpleNamespace(round=int(row["round"]), row=row))
    reporter.flush()


def _finished_rounds(folder) -> pd.DataFrame | None:
    """The rounds of the trial's run if it ended (finished or diverged: ``trial.json`` and the
    run's manifest agree, every round is there), else None."""
    info = folder.previous_info()
    if info.get("status") not in ("finished", "diverged"):
        return None
    try:
        manifest = folder.remote.read_json("manifest.json")
        rounds = read_table(folder.remote, "rounds")
    except (OSError, ValueError):  # a damaged folder: run the trial again
        return None
    if manifest.get("status") != info["status"] or rounds is None or rounds.empty:
        return None
    if rounds["round"].tolist() != list(range(len(rounds))):
        return None
    return rounds


def _scheduler(resolved: ResolvedSweep):
    from sweeps.trainable import LAST_PREFIX  # torch: as in _trainable

    s = resolved.spec.scheduler
    metric = LAST_PREFIX + (s.metric or resolved.spec.metric)
    mode = s.mode or resolved.spec.mode
    time_attr = TIME_ATTRS[s.time_attr]  # rounds_done, or the cumulative simulated seconds / upload bytes
    if s.name == "asha":
        return ASHAScheduler(
            time_attr=time_attr,
            metric=metric,
            mode=mode,
            max_t=s.max_t or resolved.rounds,
            grace_period=s.grace_period,
            reduction_factor=s.reduction_factor,
        )
    if s.name == "pbt":
        keys = s.hyperparam_mutations or list(resolved.spec.space)
        return SynchPBT(  # Tune's PBT, whose synch mode survives a failed trial
            time_attr=time_attr,
            metric=metric,
            mode=mode,
            perturbation_interval=s.perturbation_interval,
            hyperparam_mutations=tune_mutations({k: resolved.spec.space[k] for k in keys}),
            quantile_fraction=s.quantile_fraction,
            resample_probability=s.resample_probability,
            custom_explore_fn=ClipToSpace(resolved.spec.space),
            synch=s.synch,
        )
    return None


CHECKPOINTS_KEPT = 3  # per trial, in <storage>/tune/<trial_id>/checkpoint_* (PBT warns below 3)


def _new_tuner(resolved: ResolvedSweep, store: Storage):
    from sweeps.trainable import trial_dirname  # torch: as in _trainable

    spec = resolved.spec
    return tune.Tuner(
        _trainable(resolved),
        param_space=param_space(resolved),
        tune_config=tune.TuneConfig(
            num_samples=tune_num_samples(resolved),
            scheduler=_scheduler(resolved),
            search_alg=search_alg(resolved),  # sweeps.searchers: grid/random, Optuna, repeats
            # not under PBT: a resumed trial would run beside its paused attempt, kept blocked in
            # tune.report by a cached actor until reused, when it closes the same run folder
            reuse_actors=spec.scheduler.name != "pbt",
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=TUNE_DIR,
            storage_path=store.path,
            storage_filesystem=store.fs,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
            callbacks=[SweepCallbacks(), NoTensorBoard()],
        ),
    )


def _fit(tuner, resolved: ResolvedSweep, store: Storage, quiet: bool, callbacks: Iterable[Any]) -> Sweep:
    progress = None
    if not quiet:
        progress = SweepProgress(resolved.num_trials, resolved.spec.metric, resolved.spec.mode,
                                 resolved.name)
    trackers = make_trackers(resolved.spec.trackers, storage=store, location=resolved.storage,
                             name=resolved.name, param_columns=resolved.param_columns)
    ACTIVE[:] = [*([progress] if progress else []), FailureNotices(resolved.spec.max_failures), *trackers,
                 *callbacks]
    mark("sweep: fit begins")
    try:
        with quiet_tune():
            grid = tuner.fit()
            mark("sweep: fit done")
            states = _states(grid, store)
    finally:
        ACTIVE.clear()
        for tracker in trackers:  # an interruption leaves trials open: close their files / runs
            tracker.close()
        if progress:
            progress.close()
    trials, rounds = collect(store, read_sweep_file(store), states)
    write(store, trials, rounds)
    mark("sweep: tables written")
    return load_sweep(store)


def _saved_statuses(store: Storage) -> dict[str, str]:
    """Trial statuses as saved in Tune's experiment state: what a resume will act on (after an
    interruption Tune's in-memory trials all read TERMINATED; the saved state keeps the unfinished
    ones PENDING; it may miss an ERROR, see :func:`_states`)."""
    analysis = ExperimentAnalysis(store.child(TUNE_DIR).path, storage_filesystem=store.fs)
    return {t.trial_id: t.status for t in analysis.trials}


def _states(grid, store: Storage) -> list[TrialState]:
    from sweeps.trainable import error_text  # torch: as in _trainable

    saved = _saved_statuses(store)
    analysis = grid._experiment_analysis  # Tune's trials, in the order of the ResultGrid
    states = []
    for trial, result in zip(analysis.trials, grid):
        err = None
        if result.error is not None:
            cause = getattr(result.error, "cause", None)
            err = error_text(cause) if isinstance(cause, BaseException) else str(result.error).strip().splitlines()[-1]
        try:
            metrics_df = result.metrics_dataframe
        except Exception:  # noqa: BLE001 - no readable Tune results: the run folder's rows, if any
            metrics_df = None
        states.append(TrialState(
            trial_id=trial.trial_id,
            params={k: plain(v) for k, v in (trial.config or {}).items()},
            # Tune's saved state can miss an error (a worker killed between two tasks): in memory it is there
            tune_status="ERROR" if trial.status == "ERROR" else saved.get(trial.trial_id, trial.status),
            error=err or (last_failure(trial) if trial.status == "ERROR" else None),
            tune_rounds=tune_rounds_frame(metrics_df),
        ))
    return states


# ---------------------------------------------------------------- public API


def run_sweep(
    source: str | Path | dict[str, Any],
    *,
    storage: str | Path | None = None,
    address: str | None = None,
    quiet: bool = False,
    callbacks: Iterable[Any] = (),
    command: list[str] | None = None,
    overrides: list[str] | None = None,
    grid: list[str] | None = None,
) -> Sweep:
    """Validate ``source`` (a spec file or mapping), run it, return the loaded :class:`Sweep`.

    ``storage``: a local path or a URI (``s3://bucket/prefix``); ``callbacks`` are extra Ray Tune
    callbacks (objects with ``on_trial_result`` etc.).
    """
    data_checks: list = []
    resolved = resolve(source, storage=storage, address=address,
                       command=command if command is not None else list(sys.argv), data_checks=data_checks,
                       overrides=overrides, grid=grid)
    store = resolved.open_storage()
    if store.exists(SWEEP_FILE):
        raise FileExistsError(
            f"sweep folder {resolved.storage} already exists; continue it with "
            f"`hetsim sweep --resume {resolved.storage}` or choose another storage")
    mark("sweep: spec resolved")

    def check_data_then_storage():  # the storage check creates the folder: only for a valid spec
        for check in data_checks:
            check()
        check_writable(store)

    # the checks that load the data (seconds of CPU) run while Ray starts, not before it
    _, ray = check_while_ray_starts(check_data_then_storage, lambda: _init_ray(resolved))
    mark("sweep: data checked")
    check_fits(ray, resolved)
    store.write_text(SWEEP_FILE, yaml.safe_dump(resolved.to_dict(), sort_keys=False))
    store = tune_storage(ray, resolved, store)
    return _fit(_new_tuner(resolved, store), resolved, store, quiet, callbacks)


def resume_sweep(
    path: str | Path,
    *,
    address: str | None = None,
    quiet: bool = False,
    callbacks: Iterable[Any] = (),
    retry_errored: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> Sweep:
    """Continue an interrupted sweep: finished trials are kept, unfinished ones continue from
    their last checkpoint; with ``retry_errored`` errored ones too (same trial ids).

    ``storage_options`` add to those saved in ``sweep.yaml`` (which has no credentials)."""
    location = storage_location(path)
    saved = read_sweep_file(location, storage_options)
    resolved = ResolvedSweep.from_dict(saved, storage=location, storage_options=storage_options)
    try:  # before Ray starts: e.g. a tracker package missing here
        check_trackers(resolved.spec.trackers, resolved.storage)
    except ValueError as err:
        raise SweepSpecError(f"invalid sweep spec:\n  {err}") from None
    if address is not None:
        resolved.spec.ray.address = address
    ray = _init_ray(resolved)
    store = tune_storage(ray, resolved)
    tune_dir = store.child(TUNE_DIR).path
    if not tune.Tuner.can_restore(tune_dir, storage_filesystem=store.fs):
        raise FileNotFoundError(f"{resolved.storage} has no Tune state to resume ({TUNE_DIR}/tuner.pkl missing)")
    check_fits(ray, resolved)
    with quiet_tune():
        tuner = tune.Tuner.restore(
            tune_dir,
            trainable=_trainable(resolved),
            resume_unfinished=True,
            # errored trials continue under their own id (Tune's restart_errored would give
            # them new ids, i.e. a second row for the same configuration)
            resume_errored=retry_errored,
            storage_filesystem=store.fs,
        )
    return _fit(tuner, resolved, store, quiet, callbacks)


def is_complete(sweep: Sweep) -> bool:
    return sweep.complete


DRY_RUN_LIST = 50  # grid points listed by --dry-run; more are counted


def dry_run_text(source, *, storage=None, address=None, overrides=None, grid=None) -> str:
    """What ``hetsim sweep --dry-run`` prints: the validated spec's folder, trial count, search
    space and, for a space of grids only, every trial's values. Starts nothing, writes nothing."""
    r = resolve(source, storage=storage, address=address, overrides=overrides, grid=grid)
    lines = [f"sweep {r.name}: {r.num_trials if r.num_trials is not None else 'open-ended'} trial(s) of "
             f"{r.rounds} round(s), results in {r.storage} (nothing written: --dry-run)"]
    if r.spec.overrides:
        lines.append(f"base overrides: {', '.join(r.spec.overrides)}")
    for key, dist in r.spec.space.items():
        (kind, args), = dist.items()
        lines.append(f"  {r.param_columns[key]:<16} {key} ~ {kind} {shown_values(kind, args)}")
    lines += describe_search(r.spec, r.base_cfg.seed)
    kinds = {kind for dist in r.spec.space.values() for kind in dist}
    if kinds == {"grid"} and r.spec.search.algorithm != "optuna":  # a full grid: every point, num_samples times
        keys = list(r.spec.space)
        points = list(itertools.product(*(r.spec.space[k]["grid"] for k in keys)))
        lines.append(f"grid points ({len(points)}, each run {r.spec.num_samples * r.spec.repeats} time(s)):")
        for i, values in enumerate(points[:DRY_RUN_LIST]):
            lines.append(f"  {i:>3}  " + ", ".join(f"{r.param_columns[k]}={v!r}" for k, v in zip(keys, values)))
        if len(points) > DRY_RUN_LIST:
            lines.append(f"  ... and {len(points) - DRY_RUN_LIST} more")
    return "\n".join(lines)
