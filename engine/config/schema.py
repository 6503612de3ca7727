"""Experiment configuration: one YAML file (or dict) describes an experiment.

Every field is validated on load. Unknown keys, wrong types and out-of-range values raise
:class:`ConfigError`, whose message names the field, the value and what is allowed.
``--set a.b=value`` overrides are applied to the raw mapping before validation, so they are
checked exactly like the file. A config's ``plugins:`` are imported before the sections that
name what they register are validated.

:class:`ExperimentConfig` is the whole config; its sections are :mod:`engine.config.sections`,
overrides :mod:`engine.config.overrides`, the messages of a config that does not validate
:mod:`engine.config.problems`. Their public names are importable from here too.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import Field, SerializeAsAny, ValidationError, ValidationInfo, field_validator

from algorithms.base import AlgorithmParams
from algorithms.params import FedAvgParams
from algorithms.plugins import METHODS, method_params
from engine.config.hints import TYPE_KINDS, bandwidth_problems, input_loc, tier_problems, value_at  # noqa: F401
from engine.config.overrides import (  # noqa: F401 - importable from here, as before the split
    LINK_KEYS,
    apply_overrides,
    overrides_given_twice,
    parse_override,
    split_key,
)
from engine.config.paths import expand_path, missing_paths, resolve_paths
from engine.config.problems import bool_problems, format_errors, well_shaped
from engine.config.sections import (  # noqa: F401 - importable from here, as before the split
    MAX_NAME_BYTES,
    ArchRule,
    AsyncConfig,
    CheckpointConfig,
    ClientsConfig,
    DatasetConfig,
    EvaluationConfig,
    ExecutorConfig,
    FailureInjection,
    ModelConfig,
    OutputConfig,
    PartitionConfig,
    RayConfig,
    Section,
    StalenessConfig,
    TrainConfig,
    absolute_trace_files,
    async_problems,
    named_params,
)
from engine.config.yamlio import check_values, read_yaml_file
from engine.errors import ConfigError, PluginError
from engine.plugin_sources import load_plugins
from engine.plugin_transport import NotLoaded, pack, unpack
from hardware_profiles.clock import RoundPolicy

DEFAULT_CONFIG = Path(__file__).parent / "default.yaml"
__all__ = ["ConfigError", "ExperimentConfig", "load_config", "apply_overrides", "expand_path"]


MAX_SEED = 2 ** 64 - 1  # torch's generators take an unsigned 64-bit seed


class ExperimentConfig(Section):
    plugins: list[str] = Field(
        default_factory=list, description="your own methods, models, datasets, compressors, selection policies "
        "and metrics: module names, or .py files and folders relative to the config file, imported in every "
        "process of the run (docs/plugins.md)")
    seed: int = Field(0, ge=0, le=MAX_SEED)
    rounds: int = Field(20, ge=1)
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    clients: ClientsConfig = Field(default_factory=ClientsConfig)
    algorithm: SerializeAsAny[AlgorithmParams] = Field(
        default_factory=FedAvgParams, description="the method: a registered method's name and its options")
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    clock: RoundPolicy = Field(default_factory=RoundPolicy)
    output: OutputConfig = Field(default_factory=OutputConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    asynchronous: AsyncConfig | None = Field(None, description="docs/async.md; null: synchronous rounds")

    @field_validator("algorithm", mode="wrap")
    @classmethod
    def _method_params(cls, v: Any, handler) -> AlgorithmParams:
        return named_params(v, METHODS, method_params, AlgorithmParams, "algorithm", "method")

    @field_validator("executor")
    @classmethod
    def _timing_only_runs_here(cls, v: ExecutorConfig, info: ValidationInfo) -> ExecutorConfig:
        # declared after clock: a field validator names this field
        clock = info.data.get("clock")
        if clock is not None and clock.mode == "timing_only":
            if v.kind != "inprocess":
                raise ValueError(f"executor.kind = {v.kind!r}: clock.mode = 'timing_only' trains nothing, so it "
                                 "starts no client actors and runs in this process; allowed: inprocess")
            if v.inject_failure is not None:
                raise ValueError("executor.inject_failure makes a client fail while it trains, and clock.mode = "
                                 "'timing_only' trains nothing; remove it")
        return v

    @field_validator("asynchronous")
    @classmethod
    def _asynchronous_fits(cls, v: AsyncConfig | None, info: ValidationInfo) -> AsyncConfig | None:
        # a field validator (declared last: every other section is validated) names this field
        problems = async_problems(v, info.data) if v is not None else []
        if problems:
            raise ValueError("; ".join(problems))
        return v

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def __reduce_ex__(self, protocol):
        # with plugins (or a session's own registrations) they travel with the config and are
        # imported before the rest is unpickled, which may name their classes (engine.plugin_sources)
        packed = pack(self.plugins, self.__getstate__())
        if packed is None:
            return super().__reduce_ex__(protocol)
        return (_restored_config, packed)


def _restored_config(sources: tuple, blob: bytes) -> ExperimentConfig | NotLoaded:
    state = unpack(sources, blob)
    if isinstance(state, NotLoaded):  # raises the plugin's error where the config is first used
        return state
    cfg = ExperimentConfig.__new__(ExperimentConfig)
    cfg.__setstate__(state)
    return cfg


# ---------------------------------------------------------------- loading and overrides


def load_config(
    source: str | Path | dict[str, Any] | None = None, overrides: list[str] | dict | None = None
) -> ExperimentConfig:
    """Load, override and validate an experiment (schema level: each field on its own).

    ``None`` loads the built-in default. Cross-field and data-dependent checks (does the model
    fit the data, can the partition be made, ...) are :func:`engine.run.validate.validate_experiment`.
    """
    if source is None:
        source = DEFAULT_CONFIG
    _check_arguments(source, overrides)
    origins: dict = {}
    if isinstance(source, (str, Path)):
        path = Path(expand_path(str(source)))
        raw = read_yaml_file(path)
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections "
                              f"(seed:, rounds:, dataset:, ...), got a {type(raw).__name__}")
        # the file's paths are relative to its folder; --set values to the working folder (below)
        raw, origins = resolve_paths(raw, path.resolve().parent, str(path))
    else:
        raw = copy.deepcopy(dict(source))
    if overrides:
        raw = apply_overrides(raw, overrides)
    raw, origins = resolve_paths(raw, None, None, origins)
    _import_plugins(raw)
    # the checks before pydantic's see only sections that are mappings: a section given as
    # another type is pydantic's error (below), whatever the section
    shaped = well_shaped(ExperimentConfig, raw)
    profiles = (shaped.get("clients") or {}).get("profiles")
    problems = (check_values(raw) + bool_problems(ExperimentConfig, shaped, "") + missing_paths(shaped, origins)
                + (tier_problems(profiles) + bandwidth_problems(profiles) if isinstance(profiles, dict) else []))
    try:  # every mistake of the file in one message: these lines and pydantic's together
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_errors(err, raw, ExperimentConfig, problems)) from None
    if problems:
        raise ConfigError("invalid experiment config:\n" + "\n".join(problems))
    return cfg


def _import_plugins(raw: dict[str, Any]) -> None:
    """Import the config's plugins before the sections that name what they register are validated."""
    entries = raw.get("plugins")
    if isinstance(entries, list) and all(isinstance(e, str) and e.strip() for e in entries):
        try:
            load_plugins(entries)
        except PluginError as err:
            raise ConfigError(f"invalid experiment config:\n  {err}") from None


def _check_arguments(source: Any, overrides: Any) -> None:
    """The Python API's ``config`` and ``overrides``, refused as the CLI refuses a bad file or --set."""
    if isinstance(source, os.PathLike) and not isinstance(source, Path):
        return
    if not isinstance(source, (str, Path, Mapping)):
        raise ConfigError(f"config = {source!r}: give an ExperimentConfig, a mapping of sections (seed:, rounds:, "
                          f"dataset:, ...), a YAML file's path or None (the default experiment), not "
                          f"{type(source).__name__}")
    if overrides is None or isinstance(overrides, Mapping):
        bad = [k for k in (overrides or {}) if not (isinstance(k, str) or (isinstance(k, (list, tuple)) and k
                                                                           and all(isinstance(p, str) for p in k)))]
        if bad:
            raise ConfigError(f"overrides: key {bad[0]!r} is not a dotted key; write keys like 'train.lr'")
        return
    if isinstance(overrides, (str, bytes)):
        raise ConfigError(f"overrides = {overrides!r} is one string; give a list of key=value strings, e.g. "
                          f"[{overrides!r}], or a mapping such as {{'train.lr': 0.01}}")
    if not isinstance(overrides, (list, tuple)):
        raise ConfigError(f"overrides = {overrides!r}: give a list of key=value strings, e.g. ['rounds=5'], or a "
                          "mapping such as {'train.lr': 0.01}")
    for i, item in enumerate(overrides):
        if not isinstance(item, str):
            raise ConfigError(f"overrides[{i}] = {item!r}: give a key=value string, e.g. 'rounds=5'")


SECRET_OPTIONS = ("access_key", "secret_key", "session_token")  # of output.storage_options


def redact(options: dict[str, Any] | None) -> dict[str, Any]:
    """Storage options without credentials (what may be written into a folder)."""
    return {k: v for k, v in (options or {}).items() if k not in SECRET_OPTIONS}


def dump_config(cfg: ExperimentConfig, path: str | Path) -> None:
    raw = cfg.to_dict()
    raw["output"]["storage_options"] = redact(raw["output"]["storage_options"])  # no credentials
    Path(path).write_text(yaml.safe_dump(raw, sort_keys=False))
