"""Run, resume and report a sweep with Ray Tune.

``run_sweep(spec)`` validates the spec (the checks that load data while Ray starts; nothing is
written before they pass), writes ``<storage>/sweep.yaml``, starts or joins Ray, runs one Tune
trial per configuration (:func:`sweeps.trainable.hetsim_trial`) and writes ``trials.parquet``
and ``rounds.parquet``. ``resume_sweep(storage)`` rebuilds the trainable from ``sweep.yaml`` and
continues with ``Tuner.restore``: finished trials are not rerun, unfinished ones continue from
their last checkpoint (from round 0 without one), errored ones are kept as errors unless
``retry_errored`` (then they continue the same way, keeping their trial id).

Storage is Tune's: ``RunConfig(storage_path, storage_filesystem)`` with the pyarrow filesystem
of :func:`engine.results.storage.open_storage`. A local path on a cluster that the driver joined gets a
:func:`engine.ray.node_disk.node_disk_filesystem`: nodes that do not share the folder send their
results to this node through Ray.

Quiet by default: Tune runs with ``verbose=0`` and ``RAY_AIR_NEW_OUTPUT=0`` (no tables), its
per-trial error logs are muted (errors land in ``trials.parquet``), and one tqdm bar over trials
shows the best metric so far.
"""
from __future__ import annotations

import logging
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

import yaml

QUIET_TUNE_ENV = {"RAY_AIR_NEW_OUTPUT": "0"}  # with verbose=0: no progress tables
for _key, _value in QUIET_TUNE_ENV.items():  # before ray.tune is imported
    os.environ.setdefault(_key, _value)

from ray.tune import Callback  # noqa: E402
from ray.tune.logger import TBXLoggerCallback  # noqa: E402

from engine import mark  # noqa: E402
from engine.results import Storage, check_writable  # noqa: E402
from sweeps.results import (  # noqa: E402
    SWEEP_FILE,
    TUNE_DIR,
    Sweep,
    TrialState,
    collect,
    load_sweep,
    read_sweep_file,
    tune_rounds_frame,
    write,
)
from sweeps.spec import ResolvedSweep, SweepSpecError, resolve  # noqa: E402

# Never set TUNE_DISABLE_AUTO_CALLBACK_LOGGERS: without the default loggers
# ResultGrid.get_dataframe() breaks (measured with ray 2.60).
# Tune's per-trial error tracebacks, "Trials did not complete" and the like: the errors land in
# trials.parquet instead. A trial that cannot be scheduled is still reported.
MUTED_LOGGERS = ("ray.tune",)
KEPT_LOGGERS = ("ray.tune.execution.insufficient_resources_manager",)

# ---------------------------------------------------------------- callbacks
# Tune pickles its RunConfig (callbacks included) into the experiment folder and restores it on
# resume. The RunConfig therefore holds one stateless dispatcher; the live callbacks of the
# current fit (progress bar, caller's callbacks) sit in this process-wide list.
_ACTIVE: list[Any] = []


class SweepCallbacks(Callback):
    """Forwards Tune's callback hooks to the callbacks of the fit in progress."""

    def _each(self, name: str, **info) -> None:
        for cb in list(_ACTIVE):
            fn = getattr(cb, name, None)
            if fn is not None:
                fn(**info)

    def on_step_begin(self, iteration, trials, **info):
        self._each("on_step_begin", iteration=iteration, trials=trials, **info)

    def on_trial_start(self, iteration, trials, trial, **info):
        self._each("on_trial_start", iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._each("on_trial_result", iteration=iteration, trials=trials, trial=trial,
                   result=result, **info)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._each("on_trial_complete", iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._each("on_trial_error", iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._each("on_trial_recover", iteration=iteration, trials=trials, trial=trial, **info)

    def on_experiment_end(self, trials, **info):
        self._each("on_experiment_end", trials=trials, **info)


class FailureNotices:
    """One line on stderr (also with -q) when a trial fails and Tune retries it (a worker or a
    whole node lost, an error with ``max_failures`` > 0): what failed and where it continues."""

    def __init__(self, max_failures: int):
        self.max_failures = max_failures

    def on_trial_recover(self, iteration, trials, trial, **info):
        where = "its last checkpoint" if trial.checkpoint is not None else "round 0 (no checkpoint yet)"
        _say(f"trial {trial.trial_id} failed ({_last_failure(trial)}); retry {trial.num_failures} of "
             f"{self.max_failures}, from {where}")


def _last_failure(trial) -> str:
    """The first line of the trial's last failure in Tune's error file (e.g. its worker died)."""
    try:
        text = Path(trial.error_file).read_text().rsplit("Failure # ", 1)[-1]
        lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
        return lines[0][:200] if lines else "unknown error"
    except Exception:  # noqa: BLE001 - a notice must never break the sweep
        return "unknown error"


class NoTensorBoard(TBXLoggerCallback):
    """Takes the place of Tune's TensorBoard logger, which Tune adds unless one is given; writes
    nothing. Its ``__init__`` imports tensorboardX, and through it torch: ~3 s of CPU in the
    sweep's own process (measured with ray 2.60), for event files nobody reads (the results
    are in trials.parquet / rounds.parquet). Tune's CSV and JSON loggers stay: its result
    analysis reads them."""

    def __init__(self):
        self._trial_writer, self._trial_result = {}, {}

    def log_trial_start(self, trial) -> None:
        pass

    def log_trial_result(self, iteration, trial, result) -> None:
        pass

    def log_trial_end(self, trial, failed: bool = False) -> None:
        pass


class SweepProgress:
    """One tqdm bar over trials: finished/errored count and the best metric so far."""

    def __init__(self, total: int | None, metric: str, mode: str, desc: str):
        from tqdm import tqdm

        self.metric, self.mode = metric, mode
        self.bar = tqdm(total=total, unit="trial", desc=desc, dynamic_ncols=True, file=sys.stderr)
        self.done: set[str] = set()
        self.errors = 0
        self.best = math.nan
        self._primed = False

    def _offer(self, value: Any) -> None:
        try:
            v = float(value)
        except (TypeError, ValueError):
            return
        if math.isnan(v):
            return
        if math.isnan(self.best) or (v > self.best if self.mode == "max" else v < self.best):
            self.best = v

    def _refresh(self) -> None:
        post = {f"best {self.metric}": "n/a" if math.isnan(self.best) else f"{self.best:.4g}"}
        if self.errors:
            post["errors"] = str(self.errors)
        self.bar.set_postfix(post, refresh=False)
        self.bar.n = len(self.done)
        self.bar.refresh()

    def on_step_begin(self, iteration, trials, **info):
        if self._primed:
            return
        self._primed = True  # a resumed sweep: count what finished before
        for t in trials:
            if t.status in ("TERMINATED", "ERROR"):
                self.done.add(t.trial_id)
                self.errors += t.status == "ERROR"
                stats = (getattr(t, "metric_analysis", None) or {}).get(self.metric, {})
                self._offer(stats.get(self.mode))
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        before = self.best
        self._offer(result.get(self.metric))
        if self.best != before:
            self._refresh()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.done.add(trial.trial_id)
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info):
        self.done.add(trial.trial_id)
        self.errors += 1
        self._refresh()

    def close(self) -> None:
        self.bar.close()


@contextmanager
def _quiet_tune():
    saved = {name: logging.getLogger(name).level for name in (*MUTED_LOGGERS, *KEPT_LOGGERS)}
    for name in MUTED_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for name in KEPT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


# ---------------------------------------------------------------- building the Tuner


def _say(message: str) -> None:
    print(f"hetsim sweep: {message}", file=sys.stderr, flush=True)


def _alive_nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _init_ray(resolved: ResolvedSweep):
    for key, value in QUIET_TUNE_ENV.items():
        os.environ.setdefault(key, value)
    from engine import init_ray

    ray = init_ray(resolved.spec.ray.address, resolved.spec.ray.num_cpus,
                   num_gpus=resolved.spec.ray.num_gpus, connect_timeout_s=resolved.spec.ray.connect_timeout_s)
    if resolved.spec.ray.address:
        nodes = _alive_nodes(ray)
        cpus = [n["Resources"].get("CPU", 0.0) for n in nodes]
        _say(f"joined the Ray cluster at {resolved.spec.ray.address}: {len(nodes)} node(s), "
             f"{sum(cpus):g} CPUs (largest node {max(cpus, default=0):g})")
    return ray


def _check_fits(ray, resolved: ResolvedSweep) -> None:
    """A trial that cannot fit the cluster would wait forever in Tune: refuse it up front.

    Each bundle of a trial's placement group must fit on one node (the in-process executor's
    trial is a single bundle), and all of them on the cluster."""
    from sweeps.trainable import trial_resources

    specs = trial_resources(resolved).bundles
    bundles = [b.get("CPU", 0.0) for b in specs]
    nodes = _alive_nodes(ray)
    node_cpus = [n["Resources"].get("CPU", 0.0) for n in nodes] or [ray.cluster_resources().get("CPU", 0.0)]
    largest, total = max(node_cpus), sum(node_cpus)
    hint = ("lower resources_per_trial.cpus (or executor.num_actors x executor.cpus_per_actor of "
            "the base experiment)")
    if max(bundles) > largest + 1e-9:
        raise SweepSpecError(
            f"invalid sweep spec:\n  resources_per_trial: one trial needs {max(bundles):g} CPUs on "
            f"one node but the largest node of the Ray cluster has {largest:g} "
            f"({len(node_cpus)} node(s), {total:g} CPUs in all); {hint}")
    if sum(bundles) > total + 1e-9:
        raise SweepSpecError(
            f"invalid sweep spec:\n  resources_per_trial: one trial needs {sum(bundles):g} CPUs but "
            f"the Ray cluster has {total:g}; {hint}")
    _check_gpus_fit(ray, specs)


def _check_gpus_fit(ray, bundles: list[dict]) -> None:
    """GPUs as for CPUs: the trial's total, and each bundle's share from one node."""
    from engine import gpu_capacity

    need = sum(b.get("GPU", 0.0) for b in bundles)
    if need <= 0:
        return
    have = ray.cluster_resources().get("GPU", 0.0)
    node_gpus = [n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n["Alive"]]
    shares = [b["GPU"] for b in bundles if b.get("GPU", 0.0) > 0]
    fits = need <= have + 1e-9 and all(
        gpu_capacity(g, have, node_gpus) >= shares.count(g) for g in set(shares))
    if not fits:
        raise SweepSpecError(
            f"invalid sweep spec:\n  resources_per_trial: one trial needs {need:g} GPUs (bundles "
            f"{shares}) but the Ray cluster has {have:g} (per node: "
            f"{', '.join(f'{g:g}' for g in node_gpus)}); Tune would wait forever. Lower "
            "resources_per_trial.gpus (or executor.num_actors x executor.gpus_per_actor of the base "
            "experiment)")


def _tune_storage(ray, resolved: ResolvedSweep, store: Storage | None = None) -> Storage:
    """The sweep's storage as Tune will use it (see the module docstring)."""
    from engine import node_disk_filesystem, nodes_sharing

    store = store or resolved.open_storage()
    if store.is_remote or not resolved.spec.ray.address:
        return store
    fs = node_disk_filesystem(store.path)
    seen = nodes_sharing(store.path)
    private = [name for name, shared in seen.items() if not shared]
    if private:
        _say(f"storage {store.path} is this node's local disk and {len(private)} of {len(seen)} "
             f"node(s) do not see it ({', '.join(private)}): their trials send their results here "
             "through Ray. For large sweeps use a shared filesystem or an s3:// URI.")
    return Storage(fs, store.path, store.uri)


def _trainable(resolved: ResolvedSweep):
    from ray import tune

    from sweeps.trainable import hetsim_trial, trial_resources

    bound = tune.with_parameters(hetsim_trial, sweep=resolved.to_dict())
    return tune.with_resources(bound, trial_resources(resolved))


def _scheduler(resolved: ResolvedSweep):
    from sweeps.trainable import LAST_PREFIX

    s = resolved.spec.scheduler
    metric = LAST_PREFIX + (s.metric or resolved.spec.metric)
    mode = s.mode or resolved.spec.mode
    if s.name == "asha":
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(
            time_attr="rounds_done",
            metric=metric,
            mode=mode,
            max_t=s.max_t or resolved.rounds,
            grace_period=s.grace_period,
            reduction_factor=s.reduction_factor,
        )
    if s.name == "pbt":
        from ray.tune.schedulers import PopulationBasedTraining

        from sweeps.space import ClipToSpace, tune_mutations

        keys = s.hyperparam_mutations or list(resolved.spec.space)
        return PopulationBasedTraining(
            time_attr="rounds_done",
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
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from sweeps.space import tune_param_space
    from sweeps.trainable import trial_dirname

    spec = resolved.spec
    return tune.Tuner(
        _trainable(resolved),
        param_space=tune_param_space(spec.space),
        tune_config=tune.TuneConfig(
            num_samples=spec.num_samples,
            scheduler=_scheduler(resolved),
            # max_concurrent goes to the generator: Tune ignores TuneConfig.max_concurrent_trials
            # when a BasicVariantGenerator is passed (measured with ray 2.60)
            search_alg=BasicVariantGenerator(random_state=spec.search_seed,
                                             max_concurrent=spec.max_concurrent_trials or 0),
            reuse_actors=True,
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
    _ACTIVE[:] = [*([progress] if progress else []), FailureNotices(resolved.spec.max_failures), *callbacks]
    mark("sweep: fit begins")
    try:
        with _quiet_tune():
            grid = tuner.fit()
            mark("sweep: fit done")
            states = _states(grid, store)
    finally:
        _ACTIVE.clear()
        if progress:
            progress.close()
    trials, rounds = collect(store, read_sweep_file(store), states)
    write(store, trials, rounds)
    mark("sweep: tables written")
    return load_sweep(store)


def _saved_statuses(store: Storage) -> dict[str, str]:
    """Trial statuses as saved in Tune's experiment state: what a resume will act on.

    (After an interruption Tune's in-memory trials all read TERMINATED; the saved state keeps
    the unfinished ones PENDING.)
    """
    from ray.tune import ExperimentAnalysis

    analysis = ExperimentAnalysis(store.child(TUNE_DIR).path, storage_filesystem=store.fs)
    return {t.trial_id: t.status for t in analysis.trials}


def _states(grid, store: Storage) -> list[TrialState]:
    from sweeps.space import plain
    from sweeps.trainable import error_text

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
        except Exception:
            metrics_df = None
        states.append(TrialState(
            trial_id=trial.trial_id,
            params={k: plain(v) for k, v in (trial.config or {}).items()},
            tune_status=saved.get(trial.trial_id, trial.status),
            error=err,
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
) -> Sweep:
    """Validate ``source`` (a spec file or mapping), run it, return the loaded :class:`Sweep`.

    ``storage``: a local path or a URI (``s3://bucket/prefix``); ``callbacks`` are extra Ray Tune
    callbacks (objects with ``on_trial_result`` etc.).
    """
    from engine import check_while_ray_starts

    data_checks: list = []
    resolved = resolve(source, storage=storage, address=address,
                       command=command if command is not None else list(sys.argv), data_checks=data_checks)
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
    _check_fits(ray, resolved)
    store.write_text(SWEEP_FILE, yaml.safe_dump(resolved.to_dict(), sort_keys=False))
    store = _tune_storage(ray, resolved, store)
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
    from ray import tune

    from sweeps.spec import storage_location

    location = storage_location(path)
    saved = read_sweep_file(location, storage_options)
    resolved = ResolvedSweep.from_dict(saved, storage=location, storage_options=storage_options)
    if address is not None:
        resolved.spec.ray.address = address
    ray = _init_ray(resolved)
    store = _tune_storage(ray, resolved)
    tune_dir = store.child(TUNE_DIR).path
    if not tune.Tuner.can_restore(tune_dir, storage_filesystem=store.fs):
        raise FileNotFoundError(f"{resolved.storage} has no Tune state to resume ({TUNE_DIR}/tuner.pkl missing)")
    _check_fits(ray, resolved)
    with _quiet_tune():
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


def summary_table(sweep: Sweep, top: int = 10) -> str:
    """Trials by status, then the best ``top`` trials by ``best_<metric>``."""
    t = sweep.trials
    if t.empty:
        return f"{sweep.path}: no trials"
    counts = t["status"].value_counts()
    head = "trials: " + ", ".join(f"{counts[s]} {s}" for s in
                                  ("finished", "early_stopped", "diverged", "error", "unfinished")
                                  if s in counts)
    metric = sweep.metric
    cols = ["trial_id", *sweep.param_columns.values(), "status", "rounds_done",
            f"final_{metric}", f"best_{metric}", "total_sim_time_s"]
    cols = [c for c in cols if c in t.columns]
    best = sweep.best(top)[cols]
    lines = [head, f"best {min(top, len(best))} by best_{metric} ({sweep.mode}):",
             best.to_string(index=False, float_format=lambda v: f"{v:.4g}")]
    retried = t[t["attempts"] > 1] if "attempts" in t.columns else t.iloc[0:0]
    if len(retried):
        lines.append(f"{len(retried)} trial(s) needed more than one attempt (attempts column)")
    errors = t[t["status"].isin(("error", "diverged"))]
    for _, row in errors.head(5).iterrows():
        lines.append(f"{row['status']} {row['trial_id']}: {row['error']}")
    if len(errors) > 5:
        lines.append(f"... {len(errors) - 5} more errored or diverged trials in trials.parquet")
    return "\n".join(lines)
