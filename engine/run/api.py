"""The public way to run: :func:`run_experiment`, :func:`resume_run` and the one-call
:func:`simulate`. Validation first, then a claimed folder, then the run body
(:mod:`engine.run.body`) in this process or in a Ray driver actor (:mod:`engine.ray.driver`).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.clients.device import check_device_request
from engine.config.schema import ExperimentConfig, load_config
from engine.errors import ConfigError, CorruptRunFolderError, UserError
from engine.gcpause import imports_without_gc
from engine.loop.callbacks import CallbackLike, as_callbacks
from engine.plugin_sources import load_plugins, resolve_entries
from engine.registry import name_for
from engine.results.manifest import read_manifest, update_manifest
from engine.results.tables import Run, load_run
from engine.run.folders import check_can_resume, check_not_in_use, make_run_dir
from engine.run.signals import InterruptRequest, interrupt_signals
from engine.run.staging import run_to_storage
from engine.run.startup import validate_while_ray_starts
from engine.run.validate import validate_for_run
from engine.storage.locations import is_uri

log = logging.getLogger("hetsim")


def run_experiment(
    cfg: ExperimentConfig,
    run_dir: str | Path | None = None,
    callbacks: list[CallbackLike] | None = None,
    command: list[str] | None = None,
) -> Path | str:
    """Validate ``cfg``, create its run folder, run it; returns the folder's path.

    Args:
        cfg: the experiment (:func:`engine.config.schema.load_config` builds one).
        run_dir: the run folder (a path or a URI); default: one named from ``cfg.output``.
        callbacks: see every finished round and may add metrics or stop the run.
        command: the command line recorded in the manifest (default: ``sys.argv``).

    Validation (:func:`engine.run.validate.validate_experiment`) comes first, so a config error
    leaves no folder behind; its warnings are logged and recorded in ``manifest.json``. The
    folder is ``run_dir`` or one named from ``cfg.output`` (:func:`make_run_dir`).
    ``callbacks`` (:mod:`engine.loop.callbacks`) see every finished round and may add metrics or
    stop the run. With ``executor.kind: ray`` the round loop runs inside a driver actor (pinned
    to this node, so the run folder is written here) and ``callbacks`` run in this process on
    the rounds it relays. Rows are appended every round; on failure the manifest records the
    error and every finished round stays readable with :func:`engine.results.tables.load_run`.
    Checkpoints (``checkpoint.every``) let :func:`resume_run` continue an unfinished run.
    Ctrl+C or SIGTERM stops the run after the round in flight, writes a checkpoint and raises
    ``KeyboardInterrupt``; a second one aborts at once.
    A URI ``run_dir`` (or ``output.dir``), e.g. ``s3://bucket/runs/x``, is run through a local
    staging folder (:func:`run_to_storage`) and the URI is returned.
    """
    check_arguments(cfg, run_dir, callbacks)
    started = time.time()
    prepared = prepare_run(cfg, run_dir)
    return run_in_folder(cfg, prepared.path, callbacks, command, prepared.warnings, started=started,
                         parts=prepared.parts)


def check_arguments(cfg: Any, run_dir: Any = None, callbacks: Any = None) -> None:
    """The API's arguments, refused (``ConfigError``) before anything is written."""
    if not isinstance(cfg, ExperimentConfig):
        raise ConfigError(f"cfg = {cfg!r}: give an ExperimentConfig (engine.load_config(...)); simulate() also "
                          "takes a mapping or a YAML path")
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise ConfigError(f"run_dir = {run_dir!r}: give a folder path (str or pathlib.Path), a URI, or None")
    if isinstance(run_dir, (str, os.PathLike)) and not str(run_dir).strip():
        raise ConfigError("run_dir = '': give a folder path, or None for one named from output")
    as_callbacks(callbacks)


@dataclass
class PreparedRun:
    """A validated config's claimed run folder (or URI), its warnings (for the manifest) and the
    parts the validation built (None for a Ray run: its driver actor builds its own)."""

    path: Path | str
    warnings: list[str]
    parts: Any = None


def prepare_run(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> PreparedRun:
    """Validate ``cfg`` (nothing is written if it fails), log its warnings, then create and
    claim the run folder; what the validation built is handed on (:class:`PreparedRun`)."""
    check_device_request(cfg)  # `device: cuda` without CUDA: refused before anything is written
    parts = None
    if cfg.executor.kind == "ray":  # the data checks' CPU seconds overlap Ray's start-up
        warnings = validate_while_ray_starts(cfg, run_dir)
    else:
        validated = validate_for_run(cfg, run_dir)
        warnings, parts = validated.warnings, validated.parts
    for text in warnings:
        log.warning("hetsim: warning: %s", text)
    try:
        return PreparedRun(make_run_dir(cfg, run_dir), warnings, parts)
    except BaseException:
        if cfg.executor.kind == "ray":  # no run for the driver started during the validation
            from engine.ray.driver import discard_early_driver  # Ray: imported for Ray runs only

            discard_early_driver()
        raise


def run_in_folder(
    cfg: ExperimentConfig,
    path: Path | str,
    callbacks: list[CallbackLike] | None = None,
    command: list[str] | None = None,
    warnings: list[str] | None = None,
    started: float | None = None,
    parts: Any = None,
) -> Path | str:
    """Run a validated ``cfg`` into ``path``, a folder the caller owns (e.g. a sweep trial's),
    or into a URI through a local staging folder. ``started``: when the command began (Unix
    time), recorded in ``manifest.json`` as ``command_wall_s`` once the run ends; ``parts``: what
    the validation built (:class:`PreparedRun`), for an in-process run."""
    command = command if command is not None else sys.argv
    if is_uri(str(path)):
        return run_to_storage(run_experiment, cfg, str(path), callbacks, command)
    out = _dispatch(cfg, Path(path), callbacks, command, resume=False, warnings=warnings, parts=parts)
    if started is not None:  # the summary's wall time counts the start-up too (validation, Ray)
        update_manifest(out, command_wall_s=time.time() - started)
    return out


def _execute_run(*args, **kwargs) -> Path:
    """:func:`engine.run.body.execute_run`, imported where the body runs: the caller of a Ray run
    hands this to the driver actor (by reference) without importing torch, which would delay
    its Ray start-up by a second or more."""
    with imports_without_gc():  # once per process: a driver actor's start-up (engine.gcpause)
        # torch: only the process that runs the round loop needs it (see the docstring)
        from engine.run.body import execute_run

    return execute_run(*args, **kwargs)


def _dispatch(cfg, path, callbacks, command, resume: bool, warnings: list[str] | None = None, parts=None) -> Path:
    if cfg.executor.kind == "ray":
        from engine.ray.driver import run_on_driver_actor  # Ray: imported for Ray runs only

        with interrupt_signals(None):
            return run_on_driver_actor(_execute_run, cfg, path, callbacks or [], command, resume=resume,
                                       warnings=warnings)
    request = InterruptRequest()
    with interrupt_signals(request):
        out = _execute_run(cfg, path, [*(callbacks or []), request], command, resume=resume,
                           warnings=warnings, parts=parts)
    if request.stopped:
        raise KeyboardInterrupt(f"run stopped by {request.signal_name}")
    return out


def resume_config(
    run_dir: str | Path,
    cfg: ExperimentConfig | str | Path | None = None,
    overrides: list[str] | dict | None = None,
) -> ExperimentConfig:
    """The config to resume ``run_dir`` with: its own ``config.yaml``, or ``cfg`` (a config or a
    YAML path), with ``overrides``; a change that could alter results raises ``ConfigError``, a
    damaged manifest or a checkpoint the config cannot continue ``CorruptRunFolderError``."""
    # torch (the checkpoint format): a resume only, not a new run's caller
    from engine.checkpoint.folder import check_damaged_tables, check_resume_point
    from engine.checkpoint.snapshot import check_resumable

    path = Path(run_dir)
    if not (path / "manifest.json").is_file() or not (path / "config.yaml").is_file():
        raise FileNotFoundError(f"{path} is not a run folder (no manifest.json / config.yaml)")
    check_not_in_use(path)  # a live run's files are not judged (a part being written reads as damaged)
    read_manifest(path)  # a truncated one or a JSON list: said before anything starts
    try:
        saved = load_config(path / "config.yaml")
    except UserError as err:
        raise CorruptRunFolderError(
            f"{path / 'config.yaml'} is damaged: {err}; restore it from a copy (every checkpoint's "
            "checkpoint.json holds the config too, under 'config')") from None
    if isinstance(cfg, ExperimentConfig):
        new = load_config(cfg.to_dict(), overrides) if overrides else cfg
    else:
        new = load_config(cfg if cfg is not None else path / "config.yaml", overrides)
    check_resumable(saved, new)
    check_resume_point(path, new)  # config.yaml edited after the checkpoint, or past its rounds
    check_damaged_tables(path)  # a damaged table file no checkpoint can rebuild: before anything changes
    return new


def resume_run(
    run_dir: str | Path,
    cfg: ExperimentConfig | str | Path | None = None,
    callbacks: list[CallbackLike] | None = None,
    command: list[str] | None = None,
    overrides: list[str] | dict | None = None,
) -> Path:
    """Continue an unfinished run from its newest checkpoint (from round 0 if it has none).

    Args:
        run_dir: the run folder to continue.
        cfg: the config to continue with; default: the folder's own ``config.yaml``.
        callbacks: as for :func:`run_experiment`.
        command: the command line recorded in the manifest.
        overrides: ``key=value`` items or a dict over the config.

    Rounds after the checkpoint are recomputed and their rows from the first attempt dropped,
    so every table holds each round once; ``manifest.json`` lists the resume under
    ``resumes``. ``cfg``/``overrides`` may change only fields that cannot change results
    (:data:`engine.checkpoint.snapshot.RESULT_NEUTRAL_FIELDS`).
    """
    if not isinstance(run_dir, (str, os.PathLike)):
        raise ConfigError(f"run_dir = {run_dir!r}: give the run folder to resume (str or pathlib.Path)")
    as_callbacks(callbacks)
    path = Path(run_dir)
    cfg = resume_config(path, cfg, overrides)
    check_can_resume(path)
    command = command if command is not None else sys.argv
    return _dispatch(cfg, path, callbacks, command, resume=True)




def simulate(
    config: ExperimentConfig | dict | str | Path | None = None,
    overrides: list[str] | dict | None = None,
    *,
    run_dir: str | Path | None = None,
    callbacks: list[CallbackLike] | None = None,
    plugins: list[str | Path] | None = None,
    algorithm: Any = None,
    model: Any = None,
    dataset: Any = None,
    selection: Any = None,
    metrics: list[Any] | None = None,
    work: Any = None,
) -> Run:
    """Run an experiment and return it loaded into pandas: the one call a notebook needs.

    The run folder is written as by :func:`run_experiment`.

    Args:
        config: an :class:`ExperimentConfig`, a dict, a YAML path, or None (the default experiment).
        overrides: ``["rounds=5", ...]`` or ``{"train.lr": 0.01}``, checked like the file.
        run_dir: the run folder; default: one named from the config's ``output``.
        callbacks: see every finished round (:class:`engine.loop.callbacks.RunCallback` or ``f(record)``).
        plugins: module names or ``.py`` files/folders (relative to the working folder) added to the
            config's ``plugins:``: imported here and in every process of the run.
        algorithm, model, dataset, selection: a registered name, or the object itself (an
            ``AlgorithmSpec`` or a class registered with ``@register_method``; an ``nn.Module`` class;
            a loader; a ``SelectionPolicy`` class), registered under its ``__name__`` if it is not yet.
            Objects defined in a notebook travel to Ray by value.
        metrics: names or functions ``fn(outputs, targets) -> float``, added to ``evaluation.metrics``.
        work: a local-work policy (``train.work.policy``): a registered name, or a function
            ``fn(view) -> steps`` registered under its ``__name__`` if it is not yet.

    Returns:
        The run, loaded: ``rounds``, ``clients`` and ``profiles`` as DataFrames, ``path``, ``manifest``.

    Raises:
        ConfigError: the config or an override is invalid (nothing is written).
        PluginError: a plugin or an object given cannot be registered or imported.
    """
    entries = resolve_entries([str(p) for p in plugins or ()], None)
    load_plugins(entries)  # first: the config may name what they register
    cfg = config if isinstance(config, ExperimentConfig) else load_config(config)
    objects = _object_overrides(cfg, entries, algorithm, model, dataset, selection, metrics, work)
    if objects:  # the objects first, then the overrides (which may set the options they bring)
        cfg = load_config(cfg.to_dict(), objects)
    if overrides:
        cfg = load_config(cfg.to_dict(), overrides)
    check_arguments(cfg, run_dir, callbacks)
    return load_run(run_experiment(cfg, run_dir, callbacks, command=[]))


def _object_overrides(cfg: ExperimentConfig, entries: list[str], algorithm, model, dataset, selection,
                      metrics, work=None) -> dict[str, Any]:
    """The overrides the objects given to :func:`simulate` stand for (registering them if need be);
    a method or policy other than the config's replaces its section (the old options are its own)."""
    out: dict[str, Any] = {}
    if entries:
        out["plugins"] = list(dict.fromkeys([*cfg.plugins, *entries]))
    for key, kind, obj, current in (("algorithm", "algorithm", algorithm, cfg.algorithm.name),
                                    ("clients.selection", "selection policy", selection, cfg.clients.selection.name)):
        if obj is not None:
            name = name_for(kind, obj)
            out[key] = {**(cfg.algorithm if key == "algorithm" else cfg.clients.selection).model_dump(),
                        "name": name} if name == current else {"name": name}
    if work is not None:
        name = name_for("work policy", work)
        out["train.work"] = {**cfg.train.work.model_dump(), "policy": name} if name == cfg.train.work.policy \
            else {"policy": name}
    if model is not None:
        out["model.name"] = name_for("model", model)
    if dataset is not None:
        out["dataset.name"] = name_for("dataset", dataset)
    if metrics:
        out["evaluation.metrics"] = list(dict.fromkeys([*cfg.evaluation.metrics,
                                                        *(name_for("metric", m) for m in metrics)]))
    return out
