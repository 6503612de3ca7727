"""Experiment configuration: one YAML file (or dict) describes an experiment.

Every field is validated on load. Unknown keys, wrong types and out-of-range values raise
:class:`ConfigError`, whose message names the field, the value and what is allowed.
``--set a.b=value`` overrides are applied to the raw mapping before validation, so they are
checked exactly like the file.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from algorithms import ALGORITHMS
from hardware_profiles.clock import RoundPolicy
from hardware_profiles.sampler import ProfileSpec

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "default.yaml"


class ConfigError(ValueError):
    """An invalid experiment configuration; the message lists every problem found."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DatasetConfig(Section):
    name: str = "digits"
    root: str | None = Field(None, description="local folder of dataset files")
    download: bool = Field(False, description="allow torchvision to download (needs internet)")
    params: dict[str, Any] = Field(default_factory=dict, description="loader parameters")

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, v: str) -> str:
        from engine.datasets import DATASETS

        if v not in DATASETS:
            raise ValueError(f"unknown dataset {v!r}; allowed: {', '.join(sorted(DATASETS))}")
        return v


class PartitionConfig(Section):
    scheme: Literal["iid", "dirichlet", "shards", "natural"] = "dirichlet"
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration")
    shards_per_client: int = Field(2, ge=1)
    min_samples: int = Field(10, ge=1, description="Dirichlet retry until every client has this many")
    test_fraction: float = Field(0.25, gt=0, lt=1, description="local test share of each client")
    global_test_fraction: float = Field(0.2, gt=0, lt=1, description="held out when no official test split")
    public_fraction: float = Field(0.0, ge=0, lt=1, description="server-side public split")


def _check_model_name(v: str) -> str:
    from engine.models import MODELS

    if v not in MODELS:
        raise ValueError(f"unknown model {v!r}; allowed: {', '.join(sorted(MODELS))}")
    return v


class ArchRule(Section):
    """Clients whose profile satisfies every bound given here get ``arch``."""

    arch: str
    max_gflops: float | None = Field(None, gt=0)
    max_memory_gb: float | None = Field(None, gt=0)

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, v: str) -> str:
        return _check_model_name(v)


class ModelConfig(Section):
    name: str = "mlp"
    params: dict[str, Any] = Field(default_factory=dict)
    # Heterogeneous models (e.g. ASCEND): the first matching rule picks a client's
    # architecture from its hardware profile; `per_client` pins individual clients.
    zoo: list[ArchRule] = Field(default_factory=list)
    per_client: dict[int, str] = Field(default_factory=dict)
    arch_params: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known_model(cls, v: str) -> str:
        return _check_model_name(v)

    @field_validator("per_client")
    @classmethod
    def _known_per_client(cls, v: dict[int, str]) -> dict[int, str]:
        for arch in v.values():
            _check_model_name(arch)
        return v

    @property
    def heterogeneous(self) -> bool:
        return bool(self.zoo or self.per_client)


class ClientsConfig(Section):
    num_clients: int = Field(20, ge=1)
    participation: float = Field(0.3, gt=0, le=1, description="fraction selected per round")
    profiles: ProfileSpec = Field(default_factory=ProfileSpec)


class TrainConfig(Section):
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(16, ge=1)
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    lr_decay: float = Field(1.0, gt=0, le=1, description="per-round multiplicative decay")


class EvaluationConfig(Section):
    eval_every: int = Field(1, ge=1)
    personalized: bool = True
    global_model: bool = True
    batch_size: int = Field(1024, ge=1)


class OutputConfig(Section):
    dir: str = "runs"
    name: str | None = Field(None, description="run folder name; default <algorithm>-<dataset>-<time>")
    overwrite: bool = False


class FailureInjection(Section):
    """Make one client raise in one round: to check failure handling end to end."""

    round: int = Field(ge=0)
    client: int = Field(ge=0)


class ExecutorConfig(Section):
    kind: Literal["inprocess", "ray"] = "inprocess"
    num_actors: int | None = Field(None, ge=1, description="default: sized from cluster CPUs")
    clients_per_actor: int | None = Field(None, ge=1)
    cpus_per_actor: float = Field(1.0, gt=0)
    threads_per_actor: int | None = Field(
        None, ge=1, description="torch threads per client host; default: CPUs per actor (Ray), 1 (in-process)"
    )
    startup_timeout_s: float = Field(180.0, gt=0, description="give up if actors are not up by then")
    inject_failure: FailureInjection | None = None


class RayConfig(Section):
    address: str | None = Field(
        None, description="null: a private local Ray (loopback, token); 'auto', host:port or "
        "ray://host:port: join that cluster (docs/security.md)")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray")
    connect_timeout_s: float = Field(30.0, gt=0, description="give up joining ray.address after this")


def _algorithm_union():
    params = tuple(spec.params for spec in ALGORITHMS.values())
    return Annotated[Union[params], Field(discriminator="name")]  # noqa: UP007


class ExperimentConfig(Section):
    seed: int = Field(0, ge=0)
    rounds: int = Field(20, ge=1)
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    clients: ClientsConfig = Field(default_factory=ClientsConfig)
    algorithm: _algorithm_union() = Field(default_factory=lambda: ALGORITHMS["fedavg"].params())
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    clock: RoundPolicy = Field(default_factory=RoundPolicy)
    output: OutputConfig = Field(default_factory=OutputConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ---------------------------------------------------------------- loading and overrides


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a", "b", "c"], parsed YAML value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {item!r} has an empty key")
    return path, yaml.safe_load(raw)


def apply_overrides(raw: dict[str, Any], overrides: list[str] | dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``raw`` with dotted-key overrides applied."""
    raw = copy.deepcopy(raw)
    items = overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides)
    for key, value in items:
        path = key.split(".") if isinstance(key, str) else key
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {} if child is None else child
                if not isinstance(child, dict):
                    raise ConfigError(f"override {'.'.join(path)}: {part!r} is not a section")
                node[part] = child
            node = child
        node[path[-1]] = value
    return raw


def _format_errors(err: ValidationError, raw: dict[str, Any]) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"] if not (isinstance(p, str) and p in ALGORITHMS)]
        field = ".".join(loc) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            msg = "unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
        lines.append(f"  {field} = {e.get('input')!r}: {msg}")
    return "invalid experiment config:\n" + "\n".join(lines)


def _allowed_keys(loc: list[str]) -> list[str]:
    model: Any = ExperimentConfig
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    if model is not None and hasattr(model, "model_fields"):
        return list(model.model_fields)
    return []


def load_config(
    source: str | Path | dict[str, Any] | None = None, overrides: list[str] | dict | None = None
) -> ExperimentConfig:
    """Load, override and validate an experiment. ``None`` loads the built-in default."""
    if source is None:
        source = DEFAULT_CONFIG
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping, got {type(raw).__name__}")
    else:
        raw = dict(source)
    if overrides:
        raw = apply_overrides(raw, overrides)
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, raw)) from None


def dump_config(cfg: ExperimentConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
