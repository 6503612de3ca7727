"""The experiment config's sections, one class each (the whole config is
:class:`engine.config.schema.ExperimentConfig`, which also loads it).

Each field says its type, default, range and what it is for (the configuration reference is
generated from them). A name a registry holds (a method, a selection policy, a model, a dataset,
a metric) is looked up when the section is validated, never copied at import: a plugin registered
at any time is found. Cross-field rules of one section are its model validators; those between
sections are :func:`async_problems` and :mod:`engine.run.validate`. Over 400 lines because it is
every section of the config, one class after another, as the configuration reference lists them.
"""
from __future__ import annotations

import os
import re
import types
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from algorithms.asynchronous import async_methods, async_option_problems, synchronous_only
from algorithms.plugins import METRICS, SELECTORS, WORK_POLICIES, selector_params, work_params
from algorithms.registry import Registry
from algorithms.selection import SelectionParams
from algorithms.work import WorkParams
from engine.config.hints import yaml_kind
from engine.config.paths import expand_path
from engine.registry import DATASETS, MODELS
from hardware_profiles.sampler import ProfileSpec
from hardware_profiles.traces import BUILTIN_PREFIX


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
        return _registered(DATASETS, v)

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


class PfllibConfig(Section):
    """PFLlib's data protocol (``partition.scheme: pfllib``; docs/datasets.md): which of its splits,
    with its settings; ``partition.alpha`` is its Dirichlet alpha and ``partition.test_fraction`` its
    ``1 - train_ratio``."""

    split: Literal["iid", "pat", "dir", "exdir"] = Field(
        "dir", description="PFLlib's split: iid (its niid=False: pat over every class), pat (pathological: "
        "class_per_client classes per client), dir (Dirichlet(partition.alpha), balanced), exdir (each client "
        "draws class_per_client classes, then Dirichlet over the clients holding each class)")
    balance: bool = Field(
        True, description="iid/pat: equal shares of a class per client (false: PFLlib's random shares); "
        "exdir: clients over N / num_clients rows take no more classes (false only with variant fedcspack); "
        "dir: always balanced (false is refused)")
    class_per_client: int = Field(2, ge=1, description="pat and exdir: classes per client (PFLlib's "
                                  "generate scripts: 2; FedCSPACK's data_gene.sh: 3)")
    batch_size: int = Field(
        10, ge=1, description="PFLlib's batch_size (10; FedCSPACK's scripts: 16): dir redraws until every "
        "client holds min(batch_size / test_fraction, N / num_clients / 2) rows, unbalanced pat draws shares "
        "from that; it is not the training batch (train.batch_size)")
    seed: int | None = Field(
        1, ge=0, lt=2**32, description="the seed of numpy's legacy generator that draws the split, as "
        "PFLlib's generate scripts seed it (np.random.seed(1)); null: the experiment's seed")
    variant: Literal["pfllib", "fedcspack"] = Field(
        "pfllib", description="whose split code: PFLlib's (TsingZ0/PFLlib), or the FedCSPACK reference's copy "
        "of it (pat shuffles the clients that may take each class; exdir takes balance: false)")
    global_test: Literal["clients", "official"] = Field(
        "clients", description="the global model's test set: clients (every client's local test rows, as "
        "PFLlib's evaluation counts them), or official (the dataset's test split, as FedCSPACK's reference "
        "measures generalization; the clients hold those rows too)")

    @model_validator(mode="after")
    def _balance_exists(self) -> "PfllibConfig":
        if not self.balance and self.split == "dir":
            raise ValueError("partition.pfllib.balance = false with split 'dir': PFLlib's dir split has no "
                             "unbalanced form (a client holding N / num_clients rows always stops taking classes); "
                             "remove balance, or use split pat or exdir")
        if not self.balance and self.split == "exdir" and self.variant == "pfllib":
            raise ValueError("partition.pfllib.balance = false with split 'exdir': PFLlib's own exdir always "
                             "balances; the unbalanced exdir is the FedCSPACK reference's (variant: fedcspack)")
        return self


class PartitionConfig(Section):
    scheme: Literal["iid", "dirichlet", "shards", "natural", "pfllib"] = "dirichlet"
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration")
    shards_per_client: int = Field(2, ge=1)
    min_samples: int = Field(10, ge=1, description="Dirichlet retry until every client has this many")
    test_fraction: float = Field(0.25, gt=0, lt=1, description="local test share of each client")
    global_test_fraction: float = Field(0.2, gt=0, lt=1, description="held out when no official test split")
    public_fraction: float = Field(0.0, ge=0, lt=1, description="server-side public split")
    pfllib: PfllibConfig = Field(default_factory=PfllibConfig, description="scheme pfllib: PFLlib's "
                                 "split and its settings (docs/datasets.md)")

    @model_validator(mode="after")
    def _pfllib_has_no_public_split(self) -> "PartitionConfig":
        if self.scheme == "pfllib" and self.public_fraction:
            raise ValueError(f"partition.public_fraction = {self.public_fraction!r} with scheme 'pfllib': PFLlib's "
                             "protocol gives every row to a client, so there is no server-side public split; "
                             "set public_fraction: 0 or use another scheme")
        return self


def _registered(registry: Registry, name: str) -> str:
    """``name`` if ``registry`` has it (looked up now: a plugin registered since counts)."""
    if name not in registry:
        raise ValueError(registry.unknown(name))
    return name


def _check_model_name(v: str) -> str:
    return _registered(MODELS, v)


def named_params(v: Any, registry: Registry, params_of, base: type[BaseModel], field: str, what: str,
                 key: str = "name"):
    """The options of the registered ``what`` a section names, validated by that name's own params
    class: a mapping ``{name: ..., <options>}`` (a bare string is the name alone). ``field``: the
    section's dotted key, for messages; ``key``: the key that names it (``train.work``: ``policy``)."""
    if isinstance(v, base):
        return v
    if isinstance(v, str):
        v = {key: v}
    if not isinstance(v, dict):
        raise ValueError(f"{field} is a section: a mapping of keys ({key}: the {what}, and its options), "
                         f"not {yaml_kind(v)}")
    if key not in v:
        raise ValueError(f"{field} needs a {key}: the {what}, one of {', '.join(sorted(registry.names()))}")
    name = v[key]
    if not isinstance(name, str) or name not in registry:
        raise _blame(key, name, registry.unknown(name))
    return params_of(name).model_validate(v)


def _blame(loc: str | int | tuple, value: Any, message: str) -> ValidationError:
    """An error of a validator blamed on one part of its field (``algorithm.name``, ``metrics[1]``)."""
    return ValidationError.from_exception_data("config", [{
        "type": "value_error", "loc": loc if isinstance(loc, tuple) else (loc,), "input": value,
        "ctx": {"error": ValueError(message)}}])


class ArchRule(Section):
    """Clients whose profile satisfies every bound given here get ``arch``."""

    arch: str = Field(description="the architecture's name: a registered model, or a name of your own with "
                      "model: (its options in model.arch_params under this name)")
    model: str | None = Field(None, description="the registered model the architecture builds (default: arch "
                              "itself); one model at several sizes is several archs of one model (HeteroFL's "
                              "widths: model.arch_params.<arch>.width)")
    max_gflops: float | None = Field(None, gt=0)
    max_memory_gb: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _known_model(self) -> "ArchRule":
        if self.model is not None:
            if self.model not in MODELS:
                raise _blame("model", self.model, MODELS.unknown(self.model))
            if self.arch != self.model and self.arch in MODELS:
                raise _blame("arch", self.arch, f"{self.arch!r} is a registered model, which this rule's "
                             f"architecture (model {self.model!r}) is not; give it a name of its own")
        elif self.arch not in MODELS:
            raise _blame("arch", self.arch, MODELS.unknown(self.arch) + "; or give the model it builds in model:")
        return self

    @property
    def model_name(self) -> str:
        """The registered model this architecture builds."""
        return self.arch if self.model is None else self.model


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

    @model_validator(mode="after")
    def _known_per_client(self) -> "ModelConfig":
        named = {r.arch for r in self.zoo if r.model is not None}
        for cid, arch in self.per_client.items():
            if arch not in named and arch not in MODELS:
                also = f"; or one of the archs model.zoo names: {', '.join(sorted(named))}" if named else ""
                raise _blame(("per_client", cid), arch, MODELS.unknown(arch) + also)
        twice = {}
        for r in self.zoo:
            if twice.setdefault(r.arch, r.model_name) != r.model_name:
                raise _blame("zoo", r.arch, f"model.zoo names arch {r.arch!r} twice with other models "
                             f"({twice[r.arch]!r}, {r.model_name!r}); give each its own arch name")
        return self

    @property
    def heterogeneous(self) -> bool:
        return bool(self.zoo or self.per_client)

    def model_of(self, arch: str) -> str:
        """The registered model an architecture builds: its zoo rule's ``model``, else the arch's own name."""
        for r in self.zoo:
            if r.arch == arch:
                return r.model_name
        return arch


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
    selection: SerializeAsAny[SelectionParams] = Field(
        default_factory=SelectionParams, description="which clients a round runs: a registered selection "
        "policy's name and its options (default uniform: a seeded draw, every client equally likely)")

    @field_validator("selection", mode="wrap")
    @classmethod
    def _selection_policy(cls, v: Any, handler) -> SelectionParams:
        return named_params(v, SELECTORS, selector_params, SelectionParams, "clients.selection", "selection policy")

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
    work: SerializeAsAny[WorkParams] = Field(
        default_factory=WorkParams, description="how many local steps each client does: a registered work policy "
        "and its options (default fixed: local_steps or local_epochs for everyone; docs/toolbox.md)")

    @field_validator("work", mode="wrap")
    @classmethod
    def _work_policy(cls, v: Any, handler) -> WorkParams:
        return named_params(v, WORK_POLICIES, work_params, WorkParams, "train.work", "work policy", key="policy")

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
    metrics: list[str] = Field(
        default_factory=list, description="registered metrics evaluated beside accuracy and loss: columns "
        "global_<name> and pers_<name> (built in: macro_f1, balanced_accuracy, top5_accuracy)")

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"lists {sorted(m for m in set(v) if v.count(m) > 1)} more than once")
        for i, name in enumerate(v):
            if name not in METRICS:
                raise _blame(i, name, METRICS.unknown(name))
        return v


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
    why = synchronous_only(name)
    if why is not None:
        out.append(f"algorithm.name = {name!r} cannot run asynchronously: {why}; "
                   f"allowed with asynchronous: {', '.join(async_methods())}")
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
