"""Experiment configuration: one YAML file (or dict) describes an experiment.

Every field is validated on load. Unknown keys, wrong types and out-of-range values raise
:class:`ConfigError`, whose message names the field, the value and what is allowed.
``--set a.b=value`` overrides are applied to the raw mapping before validation, so they are
checked exactly like the file.

Over 400 lines because it is the whole schema, one section class after another, and the one
place that turns pydantic's errors into messages naming the field; split by section it would
scatter what a user reads as one file.
"""
from __future__ import annotations

import copy
import os
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from algorithms.asynchronous import ASYNC_METHODS, SYNCHRONOUS_ONLY, async_option_problems
from algorithms.params import ALGORITHM_PARAMS
from engine.config.hints import friendly, tier_problems
from engine.config.names import DATASET_NAMES, MODEL_NAMES
from engine.config.paths import expand_path, missing_paths, resolve_paths
from engine.config.yamlio import check_values, parse_yaml, read_yaml_file
from engine.errors import ConfigError
from hardware_profiles.clock import RoundPolicy
from hardware_profiles.deadlines import POLICIES as DEADLINE_POLICIES
from hardware_profiles.sampler import ProfileSpec
from hardware_profiles.suggest import unknown, unknown_key
from hardware_profiles.traces import BUILTIN_PREFIX

DEFAULT_CONFIG = Path(__file__).parent / "default.yaml"
__all__ = ["ConfigError", "ExperimentConfig", "load_config", "apply_overrides", "expand_path"]


def _expanded(v: str | None) -> str | None:
    return None if v is None else expand_path(v)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DatasetConfig(Section):
    name: str = "digits"
    root: str | None = Field(None, description="local folder of dataset files")
    download: bool = Field(False, description="allow torchvision to download (needs internet)")
    params: dict[str, Any] = Field(default_factory=dict, description="loader parameters")

    _expand_root = field_validator("root")(classmethod(lambda cls, v: _expanded(v)))

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, v: str) -> str:
        if v not in DATASET_NAMES:
            raise ValueError(unknown("dataset", v, DATASET_NAMES))
        return v

    @field_validator("params")
    @classmethod
    def _absolute_paths(cls, v: dict[str, Any]) -> dict[str, Any]:
        # a table's path is stored absolute, so a resume from another folder reads the same files
        path = v.get("path")
        if isinstance(path, str) and "://" not in path:
            return {**v, "path": os.path.abspath(expand_path(path))}
        if isinstance(path, list):
            return {**v, "path": [os.path.abspath(expand_path(p)) if isinstance(p, str) and "://" not in p else p
                                  for p in path]}
        if isinstance(v.get("cache_dir"), str):
            v = {**v, "cache_dir": os.path.abspath(expand_path(v["cache_dir"]))}
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
    if v not in MODEL_NAMES:
        raise ValueError(unknown("model", v, MODEL_NAMES))
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


def absolute_trace_files(conditions: Any) -> Any:
    """Trace files of condition sets as absolute paths: the run may read them in another
    working directory (a Ray driver actor, a Tune trial)."""
    if not isinstance(conditions, dict) or not isinstance(conditions.get("sets"), dict):
        return conditions
    sets = {}
    for name, spec in conditions["sets"].items():
        if isinstance(spec, dict):
            spec = dict(spec)
            for process in ("down", "up", "compute", "availability"):
                p = spec.get(process)
                if isinstance(p, dict) and isinstance(p.get("file"), str) and not p["file"].startswith(BUILTIN_PREFIX):
                    spec[process] = {**p, "file": os.path.abspath(expand_path(p["file"]))}
        sets[name] = spec
    return {**conditions, "sets": sets}


class ClientsConfig(Section):
    num_clients: int = Field(20, ge=1)
    participation: float = Field(0.3, gt=0, le=1, description="fraction selected per round")
    profiles: ProfileSpec = Field(default_factory=ProfileSpec)

    @field_validator("profiles", mode="before")
    @classmethod
    def _expand_profile_paths(cls, v: Any) -> Any:
        if isinstance(v, dict):
            v = dict(v)
            for key in ("table", "catalog"):
                if isinstance(v.get(key), str):
                    v[key] = expand_path(v[key])
            if "conditions" in v:
                v["conditions"] = absolute_trace_files(v["conditions"])
        return v


class TrainConfig(Section):
    local_epochs: int = Field(1, ge=1)
    local_steps: int | None = Field(
        None, ge=1, description="a number of SGD steps per round instead of local_epochs (the batches of the "
        "same epoch stream; give one of the two)")
    batch_size: int = Field(16, ge=1)
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    lr_decay: float = Field(1.0, gt=0, le=1, description="per-round multiplicative decay")
    on_nonfinite: Literal["stop", "skip_client", "ignore"] = Field(
        "stop", description="an upload or global model with NaN/inf: end the run as 'diverged', "
        "drop that client's upload (drop reason 'nonfinite'), or keep it")

    @model_validator(mode="after")
    def _epochs_or_steps(self) -> "TrainConfig":
        # local_epochs: 1 is the default many config files spell out; any other value with steps is a conflict
        if self.local_steps is not None and self.local_epochs != 1:
            raise ValueError(f"train.local_epochs = {self.local_epochs} and train.local_steps = {self.local_steps}: "
                             "give one of the two (local_steps replaces the epochs; leave local_epochs out or at 1)")
        return self


class EvaluationConfig(Section):
    eval_every: int = Field(1, ge=1)
    personalized: bool = True
    global_model: bool = True
    batch_size: int = Field(1024, ge=1)


MAX_NAME_BYTES = 255  # of one path component (output.name)


class OutputConfig(Section):
    dir: str = Field("runs", description="a local folder or a URI such as s3://bucket/runs (engine.storage.locations)")
    name: str | None = Field(
        None, description="run folder name; default <method>-<dataset>-<time> (method: algorithm or async mode)")
    overwrite: bool = False
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="options of a URI's pyarrow filesystem, e.g. endpoint_override")
    upload_every_s: float = Field(
        60.0, ge=0, description="a URI dir: seconds between uploads of the staged run folder (and at the end)")

    _expand_dir = field_validator("dir")(classmethod(lambda cls, v: _expanded(v)))

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v or "/" in v or v in (".", ".."):
            raise ValueError(f"name {v!r} must be one folder name (no '/'), not a path; "
                             "put the parent folder in output.dir")
        bad = sorted({c for c in v if ord(c) < 32 or ord(c) == 127})
        if bad:  # NUL cannot be in a file name; other control characters break terminals and shells
            raise ValueError(f"name {v!r} contains control character(s) {', '.join(repr(c) for c in bad)}; "
                             "give a printable folder name")
        if len(v.encode()) > MAX_NAME_BYTES:  # the usual file-system limit (ext4, xfs, tmpfs)
            raise ValueError(f"name is {len(v.encode())} bytes long ({v[:40]!r}...); a folder name may have "
                             f"at most {MAX_NAME_BYTES} bytes")
        return v


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
    keep_warm: bool = Field(
        False, description="Ray: after the run, keep its driver and client actors (torch and the method imported) "
        "for this process's next Ray run with the same actors; each run builds its clients afresh")
    inject_failure: FailureInjection | None = None
    # GPUs (docs/gpu.md)
    device: Literal["auto", "cpu", "cuda"] = Field(
        "cpu", description="where clients train: cpu, cuda, or auto (CUDA when this host holds a GPU)")
    gpus_per_actor: float = Field(0.0, ge=0, description="GPU share of each client actor (0.25: four per GPU)")
    driver_gpus: float = Field(0.0, ge=0, description="GPU share of the driver actor (global evaluation)")
    batch_clients: bool = Field(
        False, description="train the selected clients of one architecture together (torch.func; every method; "
        "off by default: no CPU speed-up, and equal to sequential up to float32 reordering; docs/gpu.md)")
    cuda_deterministic: bool = Field(True, description="torch.use_deterministic_algorithms on CUDA")
    state_memory_mb: float | None = Field(
        None, gt=0, description="per client host: client state kept in memory; beyond it the least recently "
        "used states are spilled to disk (null: no limit)")
    state_spill_dir: str | None = Field(None, description="where spilled client states go (default: the temp folder)")

    @field_validator("gpus_per_actor", "driver_gpus")
    @classmethod
    def _ray_gpu_amount(cls, v: float) -> float:
        if v > 1 and not float(v).is_integer():
            raise ValueError("Ray accepts a fraction of one GPU (<= 1) or a whole number of GPUs")
        return v

    @model_validator(mode="after")
    def _gpus_match_device(self) -> "ExecutorConfig":
        if self.device == "cpu" and (self.gpus_per_actor > 0 or self.driver_gpus > 0):
            raise ValueError("executor.gpus_per_actor / driver_gpus reserve GPUs that executor.device "
                             "= 'cpu' never uses; set device: auto or cuda, or the GPUs to 0")
        for field in ("gpus_per_actor", "driver_gpus"):  # they are Ray resources: silently ignored otherwise
            if self.kind == "inprocess" and getattr(self, field) > 0:
                raise ValueError(
                    f"executor.{field} = {getattr(self, field):g} reserves a GPU share for a Ray actor, but "
                    "executor.kind = 'inprocess' starts no actors; to train in this process on a GPU set "
                    f"executor.device: cuda (or auto) and {field}: 0, or set executor.kind: ray")
        if self.kind == "ray" and self.device == "cuda" and self.gpus_per_actor == 0:
            raise ValueError("executor.device = 'cuda' with executor.kind = 'ray' needs "
                             "executor.gpus_per_actor > 0: a client actor without a GPU share has no GPU")
        return self


class CheckpointConfig(Section):
    """Checkpoints in the run folder, for ``hetsim run --resume`` (docs/checkpoints.md)."""

    every: int = Field(10, ge=0, description="write one every N rounds; 0: only when a run is interrupted")
    keep: int = Field(2, ge=1, description="newest checkpoints kept in <run>/checkpoints")


_ADDRESS_RE = re.compile(r"^(ray://)?(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$")


class RayConfig(Section):
    address: str | None = Field(
        None, description="null: a private local Ray (loopback, token); 'auto', host:port or "
        "ray://host:port: join that cluster (docs/security.md)")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray")
    num_gpus: int | None = Field(None, ge=0, description="GPUs of a local Ray (default: detected)")
    connect_timeout_s: float = Field(30.0, gt=0, description="give up joining ray.address after this")
    allow_missing_gpus: bool = Field(
        False, description="accept GPU requests this machine cannot meet: num_gpus beyond its CUDA devices "
        "(declared to Ray, e.g. for tests), gpus_per_actor when only other cluster nodes have GPUs")

    @field_validator("address")
    @classmethod
    def _address_form(cls, v: str | None) -> str | None:
        if v is None or v in ("auto", "local") or _ADDRESS_RE.match(v):
            return None if v == "local" else v
        raise ValueError(f"address {v!r} is not allowed: give null (a private local Ray), 'auto', "
                         "host:port or ray://host:port")


class StalenessConfig(Section):
    """The staleness weight ``s(tau)`` of asynchronous updates (algorithms/asynchronous.py)."""

    kind: Literal["constant", "polynomial", "hinge"] = "polynomial"
    a: float = Field(0.5, ge=0, description="polynomial: (1+tau)^-a; hinge: slope after b")
    b: float = Field(4.0, ge=0, description="hinge: updates at most b versions old weigh 1")


class AsyncConfig(Section):
    """Asynchronous server steps on the virtual clock (docs/async.md); absent: synchronous rounds."""

    mode: Literal["fedbuff", "fedasync"] = "fedbuff"
    concurrency: int = Field(10, ge=1, description="clients in flight at any time")
    buffer_size: int = Field(5, ge=1, description="fedbuff: updates per server step (<= concurrency)")
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    server_lr: float = Field(1.0, gt=0, description="fedbuff: the server's step on the buffered deltas")
    mixing: float = Field(0.5, gt=0, le=1, description="fedasync: alpha, the weight of a fresh update")
    max_staleness: int | None = Field(None, ge=0, description="older updates are dropped (reason stale)")
    idle_retry_s: float = Field(60.0, gt=0, description="nobody in flight and nobody online: retry after")

    @model_validator(mode="after")
    def _fits_mode(self) -> "AsyncConfig":
        other = {"fedbuff": ("mixing",), "fedasync": ("buffer_size", "server_lr")}[self.mode]
        for name in other:  # a resolved config (config.yaml) holds every field at its default
            if getattr(self, name) != type(self).model_fields[name].default:
                raise ValueError(f"asynchronous.{name} does not apply to mode {self.mode!r}; "
                                 f"remove it (fedbuff uses buffer_size and server_lr, fedasync mixing)")
        if self.mode == "fedbuff" and self.buffer_size > self.concurrency:
            raise ValueError(f"asynchronous.buffer_size = {self.buffer_size} is not allowed: must be <= "
                             f"concurrency ({self.concurrency}), or the buffer never fills")
        return self


def async_problems(a: AsyncConfig, sections: dict[str, Any]) -> list[str]:
    """What an asynchronous run cannot do with the other (validated) sections (field, value, why)."""
    if not {"algorithm", "clients", "clock", "train"} <= set(sections):
        return []  # one of them is invalid: its own error is reported
    cfg, out = types.SimpleNamespace(**sections), []
    name = cfg.algorithm.name
    if name in SYNCHRONOUS_ONLY:
        out.append(f"algorithm.name = {name!r} cannot run asynchronously: {SYNCHRONOUS_ONLY[name]}; "
                   f"allowed with asynchronous: {', '.join(ASYNC_METHODS)}")
    out.extend(async_option_problems(name, cfg.algorithm))
    if a.concurrency > cfg.clients.num_clients:
        out.append(f"asynchronous.concurrency = {a.concurrency}: more than the {cfg.clients.num_clients} "
                   "clients (clients.num_clients)")
    clock = cfg.clock
    if clock.per_round_deadline:
        out.append(f"clock.deadline.policy = {clock.per_round_deadline!r} closes rounds, and asynchronous runs have "
                   "none (a task's deadline is a timeout from its dispatch); allowed with asynchronous: fixed, or "
                   "clock.deadline_s")
    if clock.over_selection != 1.0:
        out.append(f"clock.over_selection = {clock.over_selection!r} does not apply to asynchronous runs (there "
                   "are no rounds to cut); allowed: 1.0")
    if clock.mode == "realtime":
        out.append("clock.mode = 'realtime' is not supported with asynchronous; allowed: virtual, measured")
    if cfg.train.lr_decay != 1.0:
        out.append(f"train.lr_decay = {cfg.train.lr_decay!r} is per round, and asynchronous runs have "
                   "none; allowed: 1.0")
    return out


def _algorithm_union():
    params = tuple(ALGORITHM_PARAMS.values())
    return Annotated[Union[params], Field(discriminator="name")]  # noqa: UP007


class ExperimentConfig(Section):
    seed: int = Field(0, ge=0)
    rounds: int = Field(20, ge=1)
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    clients: ClientsConfig = Field(default_factory=ClientsConfig)
    algorithm: _algorithm_union() = Field(default_factory=lambda: ALGORITHM_PARAMS["fedavg"]())
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    clock: RoundPolicy = Field(default_factory=RoundPolicy)
    output: OutputConfig = Field(default_factory=OutputConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    asynchronous: AsyncConfig | None = Field(None, description="docs/async.md; null: synchronous rounds")

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


# ---------------------------------------------------------------- loading and overrides


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a", "b", "c"], parsed YAML value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value (e.g. train.lr=0.01)")
    key, raw = item.split("=", 1)
    return split_key(key.strip(), f"override {item!r}"), parse_yaml(raw, f"--set {key.strip()}")


def split_key(key: str, where: str) -> list[str]:
    """``"a.b"`` -> ``["a", "b"]``; an empty key or part (``a..b``, ``.a``) is an error."""
    parts = key.split(".")
    if not key or any(not p.strip() for p in parts):
        raise ConfigError(f"{where}: key {key!r} has an empty part; write dotted keys like train.lr")
    return parts


def apply_overrides(raw: dict[str, Any], overrides: list[str] | dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``raw`` with dotted-key overrides applied.

    Setting one of ``clients.profiles.network`` / ``bandwidth`` drops the other from ``raw``
    (they exclude each other); setting both in the same overrides is left to validation."""
    raw = copy.deepcopy(raw)
    items = overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides)
    paths = []
    for key, value in items:
        path = split_key(key, f"override {key!r}") if isinstance(key, str) else key
        paths.append(tuple(path))
        node = raw
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {'.'.join(path)}: {'.'.join(path[:i + 1])} is a value "
                                  f"({child!r}), not a section")
            node = child
        node[path[-1]] = value
    _drop_replaced_link(raw, paths)
    return raw


LINK_KEYS = ("network", "bandwidth")  # clients.profiles: a tier mix or a distribution, not both


def _drop_replaced_link(raw: dict[str, Any], paths: list[tuple]) -> None:
    # the default config gives `bandwidth`; `--set ...network=` must not fail with "not both"
    given = {k for k in LINK_KEYS if any(p[:3] == ("clients", "profiles", k) for p in paths)}
    profiles = (raw.get("clients") or {}).get("profiles")
    if len(given) == 1 and isinstance(profiles, dict):
        profiles.pop(next(k for k in LINK_KEYS if k not in given), None)


# ---------------------------------------------------------------- booleans where numbers go


def _flatten(annotation: Any) -> list[Any]:
    """The alternatives of a type: Union/Optional split, Annotated unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _flatten(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _flatten(arg)]
    return [annotation]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def bool_problems(annotation: Any, value: Any, where: str) -> list[str]:
    """``true``/``false`` given where the schema wants a number (pydantic would read 1/0)."""
    alternatives = _flatten(annotation)
    if isinstance(value, bool):
        bases = {typing.get_origin(t) or t for t in alternatives}
        if bases & {int, float} and bool not in bases:
            return [f"  {where} = {value!r}: a boolean where a number is expected; write a number"]
        return []
    out: list[str] = []
    models = [t for t in alternatives if _is_model(t)]
    if isinstance(value, dict) and models:
        model = models[0]
        if len(models) > 1:  # a discriminated union (algorithm): the member named by `name`
            named = [m for m in models if m.model_fields.get("name") is not None
                     and m.model_fields["name"].default == value.get("name")]
            if not named:
                return []
            model = named[0]
        for key, sub in value.items():
            field = model.model_fields.get(key) if isinstance(key, str) else None
            if field is not None:
                out += bool_problems(field.annotation, sub, f"{where}.{key}" if where else key)
        return out
    for t in alternatives:
        origin, args = typing.get_origin(t), typing.get_args(t)
        if origin is dict and isinstance(value, dict) and len(args) == 2:
            for key, sub in value.items():
                out += bool_problems(args[1], sub, f"{where}.{key}")
        elif origin in (list, tuple) and isinstance(value, list) and args:
            for i, sub in enumerate(value):
                out += bool_problems(args[0], sub, f"{where}[{i}]")
    return out


def _format_errors(err: ValidationError, raw: dict[str, Any], problems: list[str] = ()) -> str:
    lines = list(problems)
    for e in err.errors():
        raw_loc = e["loc"]  # a union's tag is no field: algorithm.<name>, clock.deadline.<policy>
        loc = [str(p) for i, p in enumerate(raw_loc) if not (isinstance(p, str) and (
            p in ALGORITHM_PARAMS or (p in DEADLINE_POLICIES and i and raw_loc[i - 1] == "deadline")))]
        field = ".".join(loc) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = unknown_key(loc[-1], _allowed_keys(loc[:-1]))
        else:
            msg = friendly(e, loc) or msg
        lines.append(f"  {field} = {e.get('input')!r}: {msg}")
    return "invalid experiment config:\n" + "\n".join(lines)


def _allowed_keys(loc: list[str]) -> list[str]:
    model: Any = ExperimentConfig
    for part in loc:
        model = _section_of(model)
        if model is None:
            return []
        if isinstance(model, dict):  # a mapping such as profiles.overrides: the part is a key
            model = model["value"]
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        model = field.annotation
    model = _section_of(model)
    return list(model.model_fields) if model is not None and not isinstance(model, dict) else []


def _section_of(t: Any) -> Any:
    """The section class in ``t`` (``X | None`` unwrapped); ``{"value": V}`` for ``dict[K, V]``."""
    if typing.get_origin(t) is dict and len(typing.get_args(t)) == 2:
        return {"value": typing.get_args(t)[1]}
    models = [a for a in _flatten(t) if _is_model(a)]
    return models[0] if len(models) == 1 else None


def load_config(
    source: str | Path | dict[str, Any] | None = None, overrides: list[str] | dict | None = None
) -> ExperimentConfig:
    """Load, override and validate an experiment (schema level: each field on its own).

    ``None`` loads the built-in default. Cross-field and data-dependent checks (does the model
    fit the data, can the partition be made, ...) are :func:`engine.run.validate.validate_experiment`.
    """
    if source is None:
        source = DEFAULT_CONFIG
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
    profiles = (raw.get("clients") or {}).get("profiles") if isinstance(raw.get("clients"), dict) else None
    problems = (check_values(raw) + bool_problems(ExperimentConfig, raw, "") + missing_paths(raw, origins)
                + (tier_problems(profiles) if isinstance(profiles, dict) else []))
    try:  # every mistake of the file in one message: these lines and pydantic's together
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, raw, problems)) from None
    if problems:
        raise ConfigError("invalid experiment config:\n" + "\n".join(problems))
    return cfg


SECRET_OPTIONS = ("access_key", "secret_key", "session_token")  # of output.storage_options


def redact(options: dict[str, Any] | None) -> dict[str, Any]:
    """Storage options without credentials (what may be written into a folder)."""
    return {k: v for k, v in (options or {}).items() if k not in SECRET_OPTIONS}


def dump_config(cfg: ExperimentConfig, path: str | Path) -> None:
    raw = cfg.to_dict()
    raw["output"]["storage_options"] = redact(raw["output"]["storage_options"])  # no credentials
    Path(path).write_text(yaml.safe_dump(raw, sort_keys=False))
