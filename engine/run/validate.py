"""One validation pass: everything a run would later trip on, checked before any folder is written.

:func:`engine.config.schema.load_config` checks each field on its own (types, ranges, unknown keys,
YAML pitfalls). :func:`validate_experiment` checks what needs several fields or the data: it
loads the dataset (sizes, shapes, classes; cached for the run that follows), partitions it,
assigns profiles and architectures, builds every model and the method's server, exactly as the
run will, but trains nothing. ``hetsim validate``, ``hetsim run`` (through
:func:`engine.run.api.run_experiment`) and the sweep spec check (:mod:`sweeps.spec`) all call it.

Every problem is one line ``<yaml field> = <value>: <what is wrong>; <what is allowed>``; all the
problems of a stage are reported together in one :class:`~engine.errors.ConfigError`.
Experiments that can run but hardly mean anything (a few samples per client, a failure injected
into a client that is never selected, ...) give warnings, which the run prints and records in
``manifest.json``. The rule families are listed in ``docs/validation.md``.

Not here: per-field rules (:mod:`engine.config.schema`), divergence during a run (``train.on_nonfinite``
in :mod:`engine.loop.guards`).

Over 400 lines because every check that needs several fields or the data is here, one short
function per family, so that ``hetsim validate``, a run and a sweep refuse exactly the same things.
"""
from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.base import ModelSize
from algorithms.plugins import SELECTORS
from engine.config.hints import tier_problems
from engine.config.schema import ExperimentConfig
from engine.data.datasets import _COMMON_ARGS, DATASETS, DatasetNotFoundError
from engine.data.memory import memory_problems
from engine.data.tabular import TableDatasetError
from engine.errors import ConfigError, UserError
from engine.loop.selection import select_clients, target_arrivals
from engine.ray.cluster import RayConnectError, check_reachable, cluster_cpus, ray_is_up, resolve_address
from engine.ray.pool import PoolSizeError, plan_pool
from hardware_profiles.condition_spec import Constant
from hardware_profiles.errors import user_frames
from hardware_profiles.profile import RANGE_HINT
from hardware_profiles.traces import TraceError

HEADER = "invalid experiment config:\n"
FEW_SAMPLES = 10  # mean local training samples per client below which a run is mostly noise


def fail(problems: list[str]) -> None:
    if problems:
        raise ConfigError(HEADER + "\n".join(problems))


@dataclass
class Validated:
    """What validating a config gives the run that follows: its warnings, and the parts the
    validation built (:class:`engine.loop.parts.Parts`), handed on so a run builds them once."""

    warnings: list[str]
    parts: Any


def validate_experiment(cfg: ExperimentConfig, run_dir: str | Path | None = None, *,
                        ray_running: bool | None = None) -> list[str]:
    """Raise :class:`ConfigError` listing what would make ``cfg`` fail or mean nothing; return
    the warnings (runs that can be made but are probably not what was meant).

    ``ray_running``: whether the Ray pool check may ask a Ray this process is connected to for
    its CPUs (default: whether one is connected now); pinned by callers that start Ray while
    this runs (:func:`engine.run.startup.validate_while_ray_starts`)."""
    return validate_for_run(cfg, run_dir, ray_running=ray_running).warnings


def validate_for_run(cfg: ExperimentConfig, run_dir: str | Path | None = None, *,
                     ray_running: bool | None = None) -> Validated:
    """:func:`validate_experiment`, keeping what it built for the run (:class:`Validated`)."""
    fail(static_problems(cfg, run_dir))
    return validate_with_data(cfg, ray_running=ray_running)


def validate_with_data(cfg: ExperimentConfig, *, ray_running: bool | None = None) -> Validated:
    """The checks of :func:`validate_experiment` that load the data (after the static ones); the
    parts they build (:func:`engine.loop.parts.build_parts`) come back with the warnings."""
    warnings: list[str] = []
    fail(_params_problems(cfg) + memory_problems(cfg))  # torch; the data's memory before it is built
    _check_compute_processes(cfg)
    from engine.loop.parts import build_parts  # torch: see _params_problems

    problems: list[str] = []
    parts = build_parts(cfg, _Guard(cfg, problems))
    fail(problems)  # models that cannot be built for the data
    data, profiles = parts.data, parts.profiles
    warnings += _check_conditions(cfg, parts.conditions)
    flops, sizes = _model_figures(cfg, parts)
    n = data.num_clients
    problems = _method_problems(cfg, sizes)
    problems += _pool_problems(cfg, n, ray_running)
    problems += _fleet_problems(cfg, data, profiles, parts.arch_names, parts.client_arch, flops, warnings, sizes)
    problems += _failure_injection_problems(cfg, n, profiles, warnings)
    if cfg.evaluation.global_model and data.num_global_test == 0 and cfg.clock.mode != "timing_only":
        problems.append(f"  partition.global_test_fraction = {cfg.partition.global_test_fraction!r}: "
                        "leaves no global test samples; raise it, or set evaluation.global_model: false")
    fail(problems)
    _build_server(cfg, parts)
    train = data.client_num_train()
    if train.mean() < FEW_SAMPLES:
        warnings.append(
            f"clients hold {train.mean():.1f} local training samples on average (min {train.min()}, "
            f"max {train.max()}) after partition.public_fraction={cfg.partition.public_fraction}, "
            f"partition.global_test_fraction and partition.test_fraction={cfg.partition.test_fraction}: "
            "results will be mostly noise; use fewer clients or smaller held-out fractions")
    return Validated(warnings, parts)


# ---------------------------------------------------------------- without data


def static_problems(cfg: ExperimentConfig, run_dir) -> list[str]:
    problems = []
    if cfg.executor.kind == "ray" and cfg.ray.address is not None:
        try:  # at most ray.connect_timeout_s; a run would otherwise fail after creating its folder
            check_reachable(resolve_address(cfg.ray.address), cfg.ray.connect_timeout_s,
                            cfg.ray.address)
        except RayConnectError as err:  # its message names ray.address
            problems.append(f"  {err}")
    if cfg.ray.address is not None and cfg.ray.num_cpus is not None:
        problems.append(f"  ray.num_cpus = {cfg.ray.num_cpus}: sizes a local Ray only, but ray.address "
                        f"= {cfg.ray.address!r} joins a cluster; remove one of them")
    fault = cfg.executor.inject_failure
    if fault is not None and fault.round >= cfg.rounds:
        problems.append(f"  executor.inject_failure.round = {fault.round}: the run has rounds "
                        f"0..{cfg.rounds - 1} (rounds = {cfg.rounds})")
    if run_dir is None:
        problem = folder_problem(cfg.output.dir, "output.dir")
        if problem:
            problems.append(problem)
    return problems + work_problems(cfg) + timing_selection_problems(cfg) + tier_problems(cfg.clients.profiles)


def timing_selection_problems(cfg: ExperimentConfig) -> list[str]:
    """A selection policy that needs what only training reports, in a run that trains nothing."""
    name = cfg.clients.selection.name
    why = getattr(SELECTORS.get(name), "reads_training", None) if cfg.clock.mode == "timing_only" else None
    return [f"  clients.selection.name = {name!r} cannot choose in clock.mode = 'timing_only': {why}"] if why else []


def work_problems(cfg: ExperimentConfig) -> list[str]:
    """What a work policy cannot do with the clock (field, value, why, what is allowed)."""
    work, clock = cfg.train.work, cfg.clock
    if work.policy != "deadline":
        return []
    out = []
    if clock.mode == "measured":
        out.append("  train.work.policy = 'deadline' plans each client's steps on the virtual clock, and clock.mode "
                   "= 'measured' times training by the host's wall clock; allowed: clock.mode virtual, realtime or "
                   "timing_only")
    if clock.deadline_s is None and clock.deadline is None:
        out.append("  train.work.policy = 'deadline' fits each client's steps before the round's deadline, and the "
                   "run has none; give clock.deadline_s (or clock.deadline: fixed, adaptive or cutoff)")
    elif clock.deadline is not None and clock.deadline.policy == "percentile":
        out.append("  train.work.policy = 'deadline' needs the deadline before the clients train, and "
                   "clock.deadline.policy = 'percentile' sets it from their arrivals; allowed: fixed, adaptive, "
                   "cutoff (or clock.deadline_s)")
    return out


def folder_problem(path: str | Path, field: str) -> str | None:
    """Why a run folder cannot be created under ``path`` (None if it can)."""
    p = Path(path)
    probe = p
    try:
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
    except OSError as err:  # e.g. a name longer than the file system allows
        return f"  {field} = {str(path)!r}: cannot be a folder here ({err.strerror or err}); give a shorter path"
    if probe.exists() and not probe.is_dir():
        return (f"  {field} = {str(path)!r}: {str(probe)!r} is a file, not a folder; "
                "give a folder path")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        return (f"  {field} = {str(path)!r}: the folder {str(probe)!r} is not writable by this "
                "user; give a writable folder")
    return None


def _signature_params(fn, skip: tuple[str, ...]) -> list[str] | None:
    """Keyword parameters ``fn`` accepts (None: any, it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.name not in skip and p.name != "self"]


def _unknown_keys(given: dict, allowed: list[str] | None, field: str, owner: str) -> list[str]:
    if allowed is None:
        return []
    return [f"  {field}.{key} = {value!r}: unknown parameter of {owner}; allowed: "
            f"{', '.join(allowed) or 'none'}" for key, value in given.items() if key not in allowed]


def _params_problems(cfg: ExperimentConfig) -> list[str]:
    # torch, imported by the checks that load the data: a Ray run's caller runs them beside
    # Ray's start-up (engine.run.startup), so its static checks and Ray start without torch
    from engine.models.zoo import MODELS

    m = cfg.model
    problems = _unknown_keys(
        cfg.dataset.params, _signature_params(DATASETS[cfg.dataset.name], _COMMON_ARGS),
        "dataset.params", f"dataset {cfg.dataset.name!r}")
    model_args = ("input_shape", "num_classes")
    problems += _unknown_keys(m.params, _signature_params(MODELS[m.name], model_args),
                              "model.params", f"model {m.name!r}")
    used = {m.name, *(r.arch for r in m.zoo), *m.per_client.values()}
    for arch, params in m.arch_params.items():
        if arch not in used:
            problems.append(f"  model.arch_params.{arch} = {params!r}: {arch!r} is not an architecture "
                            f"of this run; used: {', '.join(sorted(used))}")
        elif m.model_of(arch) in MODELS:
            problems += _unknown_keys(params, _signature_params(MODELS[m.model_of(arch)], model_args),
                                      f"model.arch_params.{arch}", f"model {m.model_of(arch)!r}")
    return problems


# ---------------------------------------------------------------- data, profiles, models


class _Guard:
    """The errors of each stage of :func:`build_parts` as config problems: raised at once, but
    a model that cannot be built is added to ``problems`` and the next one built."""

    def __init__(self, cfg: ExperimentConfig, problems: list[str]):
        self.cfg, self.problems = cfg, problems

    @contextlib.contextmanager
    def __call__(self, stage: str, arch: str = "", data=None):
        try:
            yield
        except DatasetNotFoundError as err:
            raise ConfigError(f"{HEADER}  dataset.name = {self.cfg.dataset.name!r}: {err}") from None
        except Exception as err:  # noqa: BLE001 - a stage's known errors, or a plugin's (its frames say where)
            frames = user_frames(err)  # a plugin's loader or model builder raised
            known = isinstance(err, (ValueError, TypeError, RuntimeError, KeyError, OSError, TraceError))
            where = self._where(stage, arch, data, err) if known else None
            if where is None and frames and stage in ("data", "model"):
                field = (f"dataset.name = {self.cfg.dataset.name!r}" if stage == "data"
                         else f"model.name = {arch or self.cfg.model.name!r}")
                where = f"{field}: your plugin's code raised {type(err).__name__}: {err}"
            if where is None:
                raise
            where += f"\n{frames}" if frames and not isinstance(err, UserError) else ""
            if stage != "model":
                raise ConfigError(f"{HEADER}  {where}") from None
            self.problems.append(f"  {where}")

    def _where(self, stage: str, arch: str, data, err: BaseException) -> str | None:
        cfg, text = self.cfg, str(err)
        if isinstance(err, TableDatasetError):  # the table's own problem, whatever its words
            return f"dataset {cfg.dataset.name!r} (dataset.params = {cfg.dataset.params!r}): {text}"
        if stage == "data" and isinstance(err, (ValueError, TypeError)):
            if "partition" in text or "split" in text or "natural" in text or "num_clients" in text:
                return (f"partition.scheme = {cfg.partition.scheme!r} with clients.num_clients = "
                        f"{cfg.clients.num_clients}: {text}")
            return f"dataset {cfg.dataset.name!r} (dataset.params = {cfg.dataset.params!r}): {text}"
        if stage == "profiles" and isinstance(err, (ValueError, KeyError, OSError)):
            text = text.replace(RANGE_HINT, "set clients.profiles.allow_out_of_range: true to "
                                "permit bandwidths outside the catalog range")
            return f"clients.profiles: {text}"
        if stage == "conditions" and isinstance(err, (TraceError, ValueError)):
            return f"clients.profiles.conditions: {err}"
        if stage == "batteries" and isinstance(err, ValueError):
            return f"clients.profiles.battery: {err}"
        if stage == "architectures" and isinstance(err, ValueError):
            text = text.removeprefix("model.per_client: ")
            return (f"model.per_client = {cfg.model.per_client!r}: {text} "
                    f"(clients.num_clients = {cfg.clients.num_clients})")
        if stage == "model" and isinstance(err, (ValueError, RuntimeError, TypeError)):
            return self._model_problem(arch, data, err)
        return None

    def _model_problem(self, arch: str, data, err: BaseException) -> str:
        from engine.models.arch import arch_spec  # torch: see _params_problems

        cfg = self.cfg
        name, params = arch_spec(cfg, arch)
        field = "model.name" if arch in ("", cfg.model.name) else f"model architecture {arch!r}"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return (f"{field} = {name!r} (params {params!r}): cannot be built for dataset {cfg.dataset.name!r} "
                f"(input shape {data.input_shape}, {data.num_classes} classes): {first}")


def _check_compute_processes(cfg: ExperimentConfig) -> None:
    spec = cfg.clients.profiles.conditions
    if spec is None or not spec.sets:
        return
    computes = [name for name, s in spec.sets.items() if not isinstance(s.compute, Constant)]
    if cfg.clock.mode == "measured" and computes:
        fail([f"  clients.profiles.conditions.sets.{computes[0]}.compute: clock.mode = 'measured' takes compute "
              "times from the host, so a compute process cannot apply; remove it or use clock.mode: virtual"])


def _check_conditions(cfg: ExperimentConfig, conditions) -> list[str]:
    """Whether clients can ever be online under the conditions over time; returns warnings."""
    if conditions is None:
        return []
    field = "clients.profiles.conditions"
    never = conditions.never_online(cfg.clock.start_s)
    if cfg.clock.apply_availability and never.all():
        fail([f"  {field}: no client can ever be online from clock.start = {cfg.clock.start!r} on (their "
              "availability intervals all end before it, or a diurnal profile is all zeros); give intervals "
              "after the start, loop: true, or set clock.apply_availability: false"])
    return [f"{field}: {int(never.sum())} of {len(never)} clients can never be online from clock.start = "
            f"{cfg.clock.start!r} on"] if cfg.clock.apply_availability and never.any() else []


def _model_figures(cfg: ExperimentConfig, parts) -> tuple[dict[str, float], dict[str, int]]:
    """Training FLOPs per sample and parameters of each architecture (counting FLOPs runs one
    forward and backward pass: a model that does not fit the data fails here)."""
    # torch: see _params_problems
    from algorithms.training import num_params
    from engine.models.arch import arch_spec
    from engine.models.flops import training_flops_per_sample

    data, flops, sizes, problems = parts.data, {}, {}, []
    for arch, model in parts.models.items():
        name, params = arch_spec(cfg, arch)
        try:
            flops[arch] = float(training_flops_per_sample(name, data.input_shape, data.num_classes, **params))
            sizes[arch] = num_params(model)
        except (ValueError, RuntimeError, TypeError) as err:
            problems.append(f"  {_Guard(cfg, [])._model_problem(arch, data, err)}")
    fail(problems)
    return flops, sizes


def _build_server(cfg: ExperimentConfig, parts) -> None:
    """The method's server (and selection policy), built as the run builds them, from the parts
    the run is handed (ASCEND needs a public split, ...)."""
    # torch: see _params_problems
    from algorithms.base import TimingUnsupported
    from engine.execution.inprocess import InProcessExecutor
    from engine.loop.timing import make_simulation

    try:
        make_simulation(cfg, InProcessExecutor() if cfg.clock.mode != "timing_only" else None, parts=parts)
    except TimingUnsupported as err:
        raise ConfigError(f"{HEADER}  clock.mode = 'timing_only': algorithm.name = {cfg.algorithm.name!r} cannot be "
                          f"timed without training: {err}; run it with clock.mode: virtual") from None
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - a method's or policy's errors at construction, the user's own too
        frames = user_frames(err)
        if not frames and not isinstance(err, (ValueError, RuntimeError, TypeError)):
            raise
        what = f"{type(err).__name__}: {err}\n{frames}" if frames else str(err)
        raise ConfigError(f"{HEADER}  algorithm.name = {cfg.algorithm.name!r}: {what}") from None


# ---------------------------------------------------------------- cross-field rules


def _method_problems(cfg: ExperimentConfig, sizes: dict[str, int]) -> list[str]:
    """Sizes a method's options refer to (K coordinates, packs of the model): its params' own check."""
    smallest_arch = min(sizes, key=sizes.get)
    return cfg.algorithm.check(ModelSize(sizes[smallest_arch], smallest_arch or None))


def _pool_problems(cfg: ExperimentConfig, n: int, ray_running: bool | None) -> list[str]:
    """A Ray pool larger than a local Ray (a cluster's free CPUs are checked when it starts)."""
    ex = cfg.executor
    if ex.kind != "ray" or cfg.ray.address is not None:
        return []
    if ray_running is None:
        ray_running = ray_is_up()
    if ray_running:  # the run will use this Ray (init_ray)
        cpus, source = cluster_cpus(), "the running Ray"
    else:
        cpus = cfg.ray.num_cpus or os.cpu_count() or 1
        source = "ray.num_cpus" if cfg.ray.num_cpus else "this machine's CPU count"
    try:
        plan_pool(n, cpus, ex.cpus_per_actor, ex.num_actors, ex.clients_per_actor)
    except PoolSizeError as err:
        return [f"  {err} ({cpus:g} CPUs of {source})"]
    return []


def _fleet_problems(cfg, data, profiles, arch_names, client_arch, flops, warnings, sizes) -> list[str]:
    """Fleets in which no selected client can ever arrive."""
    policy, n = cfg.clock, data.num_clients
    can = np.ones(n, dtype=bool)
    reasons = []
    if policy.apply_availability:
        never_online = profiles.availability <= 0
        can &= ~never_online
        if never_online.all():
            reasons.append("availability is 0 for every client")
    if policy.apply_dropout:
        always_drops = profiles.dropout >= 1
        can &= ~always_drops
        if always_drops.all():
            reasons.append("dropout is 1 for every client")
    if not can.any():
        why = "; ".join(reasons) or "every client has availability 0 or dropout 1"
        return [f"  clients.profiles: no client can ever arrive ({why}); give some clients "
                "availability > 0 and dropout < 1, or set clock.apply_availability / "
                "clock.apply_dropout: false"]
    # Lower bound of a client's round: two latencies, the download of at least its model's
    # parameters (every method broadcasts them), the upload of the whole model where the method
    # sends it (FedAvg, FedProx) and, unless compute is measured, its training FLOPs; compression
    # only adds to it. Links whose rate changes over time (conditions) get no transfer term.
    fastest = 2 * profiles.latency_s
    params = np.asarray([sizes[a] for a in arch_names], dtype=np.float64)[client_arch]
    if not _links_vary(cfg):
        bits = 8.0 * FLOAT32_BYTES * params
        up_bits = bits if cfg.algorithm.uploads_whole_model else 0.0
        fastest = fastest + bits / (profiles.down_mbps * 1e6) + up_bits / (profiles.up_mbps * 1e6)
    if policy.mode != "measured":
        per_sample = np.asarray([flops[a] for a in arch_names])[client_arch]
        n_train = data.client_num_train()
        steps = getattr(cfg.train, "local_steps", None)
        if steps:  # only the whole epochs its steps surely cover
            samples = (steps // np.maximum(np.ceil(n_train / cfg.train.batch_size), 1)) * n_train
        else:
            samples = n_train * cfg.train.local_epochs
        fastest = fastest + per_sample * samples / (profiles.gflops * 1e9)
    if policy.mode == "realtime" and "max_sleep_s" not in policy.model_fields_set:
        # (a max_sleep_s given on purpose caps the sleeps; the default one must not hide a typo)
        least = float(np.min(np.where(can, fastest, np.inf))) * policy.time_scale
        if least > policy.max_sleep_s:
            return [f"  clock.time_scale = {policy.time_scale!r}: every round would sleep at least "
                    f"{least:.3g} s in realtime mode, more than clock.max_sleep_s = "
                    f"{policy.max_sleep_s:g}; lower time_scale, or set clock.max_sleep_s to cap "
                    "each round's sleep"]
    deadline = policy.fixed_deadline_s
    if deadline is None:
        return []
    field = "clock.deadline_s" if policy.deadline_s is not None else "clock.deadline.seconds"
    meets = can & (fastest <= deadline)
    if not meets.any():
        best = int(np.argmin(np.where(can, fastest, np.inf)))
        return [f"  {field} = {deadline!r}: no client can finish a round in time; "
                f"the fastest (client {best}) needs at least {fastest[best]:.3g} s; give "
                f"{field.split('.')[-1]} >= {fastest[best]:.3g}" + (" or null" if policy.deadline_s else "")]
    target = target_arrivals(cfg, n)
    if meets.sum() < target:
        warnings.append(
            f"{field} = {deadline!r}: only {int(meets.sum())} of {n} clients can "
            f"ever meet it, fewer than the {target} a round aims for")
    return []


FLOAT32_BYTES = 4


def _links_vary(cfg: ExperimentConfig) -> bool:
    spec = cfg.clients.profiles.conditions
    return spec is not None and any(not (isinstance(s.down, Constant) and isinstance(s.up, Constant))
                                    for s in spec.sets.values())


def _failure_injection_problems(cfg, n: int, profiles, warnings) -> list[str]:
    fault = cfg.executor.inject_failure
    if fault is None:
        return []
    if fault.client >= n:
        return [f"  executor.inject_failure.client = {fault.client}: no such client; client ids "
                f"are 0..{n - 1} (clients.num_clients = {n})"]
    selected, _ = select_clients(cfg, n, fault.round)
    if fault.client not in set(selected.tolist()):
        warnings.append(
            f"executor.inject_failure: client {fault.client} is not selected in round {fault.round}, "
            "so no failure will be injected")
    return []
