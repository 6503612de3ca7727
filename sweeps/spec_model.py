"""The sweep spec's schema: :class:`SweepSpec` and its sections (pydantic, ``extra='forbid'``),
the distributions a space may use, and the names a sweep reserves.

The checks that give each field its error message are :mod:`sweeps.spec_checks`; :func:`sweeps.spec.resolve`
runs them in order.
"""
from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine import ConfigError
from sweeps.search import SearchSpec
from sweeps.trackers import TrackersSpec

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint", "named", "cases")
# Grid-like kinds: every value is a trial (x num_samples). `named` is a grid over named values
# (mappings, lists, ...): Tune and the tables see the names, the trial applies the value.
# `cases` is a grid over named *sets of overrides* ({dotted key: value, ...}): its key is a
# label, not a config key, so one sweep can hold a study's cells that differ in several keys.
GRID_KINDS = ("grid", "named", "cases")
NAMED_KINDS = ("named", "cases")  # Tune sees names; the trial applies what they stand for
# Columns a sweep's metric may name: every rounds.parquet column, plus the method's
# `server_*` metrics and the per-architecture `global_acc_<arch>` of heterogeneous models.
METRIC_PREFIXES = ("server_", "global_acc_", "global_loss_")
# Keys the sweep itself owns: where trials write, how they reach Ray, what a trial reserves.
RESERVED_KEYS = ("output", "ray", "checkpoint", "executor.kind", "executor.num_actors",
                 "executor.cpus_per_actor", "executor.gpus_per_actor", "executor.clients_per_actor")
# trials.parquet columns besides the hyperparameters (a hyperparameter never takes these names)
TRIAL_COLUMNS = ("trial_id", "status", "error", "rounds_done", "total_sim_time_s",
                 "total_bytes_up", "total_bytes_down", "total_energy_j", "total_energy_wasted_j",
                 "wall_s", "node_id", "run_dir", "attempts",
                 "resumed_from_round", "exploits", "restored_from", "pareto", "config_id", "repeat")

# YAML 1.1 (PyYAML) reads `1e-3` as a string; numbers written that way are meant as floats.
_FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class SweepSpecError(ConfigError):
    """An invalid sweep spec (a ``ValueError``); the message names field, value and what is allowed."""


def _num(v: Any) -> Any:
    if isinstance(v, str) and _FLOAT_RE.match(v.strip()):
        f = float(v)
        return int(f) if f.is_integer() and not re.search(r"[.eE]", v) else f
    return v


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SchedulerSpec(_Model):
    name: Literal["fifo", "asha", "pbt"] = "fifo"
    time_attr: Literal["rounds", "sim_time_s", "bytes_up"] = Field(
        "rounds", description="the unit of grace_period/max_t/perturbation_interval: rounds, simulated "
        "seconds or cumulative upload bytes")
    metric: str | None = Field(None, description="the scheduler's metric; default: the sweep's metric")
    mode: Literal["max", "min"] | None = Field(None, description="default: the sweep's mode")
    # ASHA
    # int | float: whole rounds, or simulated seconds / bytes with another time_attr (sweeps.search)
    grace_period: int | float = Field(1, gt=0, description="ASHA: time_attr units before a trial may be stopped")
    reduction_factor: float = Field(2.0, gt=1)
    max_t: int | float | None = Field(None, gt=0, description="default: the experiment's rounds (time_attr rounds)")
    # Population Based Training
    perturbation_interval: int | float = Field(
        2, gt=0, description="PBT: time_attr units between exploit/explore steps (each one a checkpoint)")
    hyperparam_mutations: list[str] | None = Field(
        None, description="PBT: space keys it may change; default: every key of the space")
    quantile_fraction: float = Field(0.25, ge=0, le=0.5,
                                     description="PBT: bottom fraction that copies the top fraction")
    resample_probability: float = Field(0.25, ge=0, le=1)
    synch: bool = Field(False, description="PBT: pause trials at each interval until all reach it "
                        "(checkpoints every round)")


class ResourcesSpec(_Model):
    cpus: float | None = Field(
        None, gt=0, description="CPUs of one trial; default 1 (in-process), 0.01 (Ray executor)")
    gpus: float = Field(
        0.0, ge=0, description="GPUs of one trial's own process (the Ray executor's client actors "
        "add executor.gpus_per_actor each)")


class RaySpec(_Model):
    address: str | None = Field(None, description="existing cluster; None starts a local Ray")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray")
    num_gpus: int | None = Field(None, ge=0, description="GPUs of a local Ray (default: detected)")
    connect_timeout_s: float = Field(30.0, gt=0, description="give up joining the address after this")


class Objective(_Model):
    """One objective of a trade-off: a rounds.parquet column (its best value over the rounds,
    by ``mode``) or a trials.parquet total (``total_bytes_up``, ``total_sim_time_s``, ...)."""

    name: str
    mode: Literal["max", "min"]


TRIAL_OBJECTIVES = ("total_sim_time_s", "total_bytes_up", "total_bytes_down", "total_energy_j",
                    "total_energy_wasted_j", "wall_s")


class SweepSpec(_Model):
    name: str | None = Field(None, description="default: the spec file's name")
    base: str | dict[str, Any] | None = Field(
        None, description="experiment YAML path (relative to the spec) or inline mapping")
    overrides: list[str] = Field(default_factory=list, description="key=value items on the base")
    space: dict[str, dict[str, Any]] = Field(..., description="dotted config key -> distribution")
    num_samples: int = Field(1, ge=1)
    metric: str = "global_acc"
    mode: Literal["max", "min"] = "max"
    target: float | None = Field(
        None, description="a value of metric: trials.parquet gets time_to_<metric>_<target> (simulated s)")
    rank_by: Literal["best", "final", "time_to_target"] = Field(
        "best", description="how the summary and Sweep.best rank trials (time_to_target needs target)")
    objectives: list[Objective] = Field(
        default_factory=list, description="trade-off objectives: trials.parquet marks the Pareto-optimal trials")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    max_concurrent_trials: int | None = Field(None, ge=1)
    resources_per_trial: ResourcesSpec = Field(default_factory=ResourcesSpec)
    storage: str | None = Field(
        None, description="sweep folder: a path or a URI (s3://bucket/prefix); default sweeps_out/<name>")
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="options of the URI's pyarrow filesystem (endpoint_override, ...)")
    max_failures: int = Field(0, ge=0, description="retries of a failed trial, from its last checkpoint")
    checkpoint_every: int | None = Field(
        None, ge=1, description="rounds between trial checkpoints; default: the experiment's checkpoint.every")
    search_seed: int | None = Field(0, ge=0, description="seed of the random sampling (None: fresh)")
    search: SearchSpec = Field(default_factory=SearchSpec, description="search algorithm (sweeps.search)")
    repeats: int = Field(1, ge=1, description="runs of every configuration, repeat i with seed + i")
    ray: RaySpec = Field(default_factory=RaySpec)
    columns: dict[str, str] = Field(
        default_factory=dict, description="dotted key -> its column name in the tables (default: "
        "the key's last component)")
    trackers: TrackersSpec = Field(
        default_factory=TrackersSpec, description="experiment trackers: [tensorboard, mlflow] or "
        "{mlflow: {tracking_uri: ...}} (sweeps.trackers); default none")

    @model_validator(mode="after")
    def _ranking(self) -> "SweepSpec":
        if self.target is not None and not math.isfinite(self.target):
            raise ValueError(f"target = {self.target!r}: give a finite value of the metric")
        if self.rank_by == "time_to_target" and self.target is None:
            raise ValueError("rank_by = 'time_to_target' needs a target (a value of metric, e.g. target: 0.8)")
        return self

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scheduler_shorthand(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", v):
            raise ValueError(f"name {v!r} must be a folder name (letters, digits, . _ + -)")
        return v
