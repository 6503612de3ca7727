"""The contract between the engine and a federated-learning method.

A method is two plain classes with no Ray and no file I/O in them:

* a :class:`Client` half, created once per client host (a Ray actor or the in-process
  executor), that turns ``broadcast -> local work -> upload`` for one virtual client at a
  time, keeping that client's persistent state in ``ctx.state``;
* a :class:`Server` half, living with the driver, that turns ``uploads -> new global state``
  and produces the next broadcast.

The engine owns everything else: selection, timing, transport, evaluation, logging.
Payloads carry the *real* arrays that would travel and their exact byte counts, so the
bytes the simulation claims are the bytes it moves.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # annotations only: importing the contract (and the params) needs no torch
    import torch

# Wire sizes, in bytes, of everything a method sends (one place for every method)
FLOAT32_BYTES = 4
INDEX_BYTES = 4  # an int32 index (vectors have < 2**31 values)
SEED_BYTES = 8  # a 64-bit seed (Random-K)
OFFSET_BYTES = 4  # a 32-bit offset (Periodic-K)
INT8_BYTES = 1  # an 8-bit quantised value


@dataclass
class Payload:
    """Arrays that travel over the (simulated) network, with their exact size in bytes."""

    arrays: dict[str, np.ndarray]
    nbytes: int
    meta: dict[str, Any] = field(default_factory=dict)


# A broadcast is one payload per model architecture ("" when all clients share one model):
# each client downloads only the payload of its own architecture.
Broadcast = dict[str, Payload]


@dataclass
class TrainSettings:
    """Local optimisation settings, shared by every method's local training."""

    local_epochs: int = 1
    local_steps: int | None = None  # a number of SGD steps instead of local_epochs (None: epochs)
    batch_size: int = 16
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_decay: float = 1.0  # multiplicative per round (reference code: 0.99)


@dataclass
class ClientContext:
    """Everything one virtual client has while it works in one round."""

    client_id: int
    round: int
    arch: str
    model: torch.nn.Module  # the host's workspace model for `arch`, reset before each client
    state: dict[str, Any]  # persistent per-client state, kept by the hosting actor
    train_x: torch.Tensor
    train_y: torch.Tensor
    rng: np.random.Generator  # seeded by (seed, round, client): executor-independent
    train: TrainSettings
    flops_per_sample: float  # training (forward + backward) FLOPs of one sample
    # the client's hardware profile (hardware_profiles.HardwareProfile) so that methods whose
    # decisions depend on simulated time (ASCEND's reward) compute it exactly as the engine does;
    # filled only for methods whose Client sets ``needs_profile = True``
    profile: Any = None
    # executor.batch_clients: this client's local training, already done together with the
    # other clients of its architecture (algorithms.batched_training.TrainedUpdate); local_sgd
    # applies it instead of training
    pretrained: Any = None
    # the clock's phase times of this client's last round (``round``, ``download_s``, ``compute_s``,
    # ``compress_s``, ``upload_s``: clients.parquet's sim_*, conditions over time included), filled
    # only for methods whose Client says :meth:`Client.reads_phase_times`; None before its first
    last_times: dict[str, float] | None = None
    # the SGD steps local_sgd took for this client this round (its batches; FedNova's tau, SCAFFOLD's K)
    steps_done: int = 0


@dataclass
class ClientResult:
    """What a client returns to the driver after one round."""

    client_id: int
    arch: str
    upload: Payload
    num_samples: int  # local training set size (aggregation weight)
    train_flops: float  # FLOPs actually spent training this round
    compress_ops: float = 0.0  # operation count of compression / selection work
    metrics: dict[str, Any] = field(default_factory=dict)  # per-client trace columns
    # bytes this client downloaded when it reads only part of its architecture's broadcast (FedSPU's
    # sub-model: the values it loads, and nothing else of the payload); None: the whole payload
    download_nbytes: int | None = None


@dataclass(frozen=True)
class ModelSize:
    """What a method's checks of its options may ask about the model, known once the models are
    built (``hetsim validate``): the parameters of the smallest architecture the run trains."""

    parameters: int
    architecture: str | None = None  # its name in a heterogeneous run's zoo

    def __str__(self) -> str:  # for messages: "1,234 parameters (architecture 'cnn')"
        arch = f" (architecture {self.architecture!r})" if self.architecture else ""
        return f"{self.parameters:,} parameters{arch}"


@dataclass(frozen=True)
class ArchShape:
    """What a method's wire format may depend on of one architecture's model."""

    parameters: int  # trainable values (``flat_params``)
    buffers: int = 0  # floating-point buffer values (``flat_buffers``: BatchNorm statistics)

    @property
    def state(self) -> int:
        """Parameters and floating buffers: the full state FedAvg moves."""
        return self.parameters + self.buffers


class TimingUnsupported(ValueError):
    """A method (with these options) whose payload depends on what training produces, so a
    ``clock.mode: timing_only`` run cannot time it; the message says why."""


class TimingPayload:
    """What one client of each architecture downloads and uploads in a round, and the
    compression ops of its upload, known without training: what a ``clock.mode: timing_only``
    run times (``engine/loop/timing.py``). A method gives one from :meth:`Server.timing_payload`.

    ``download``, ``upload``: bytes by architecture; ``ops``: compression ops by architecture.
    A method whose next broadcast depends on who arrived (e.g. FedCSPACK's global mask)
    overrides :meth:`stepped` and :meth:`download_bytes`, and :meth:`state` / :meth:`restore`
    for checkpoints."""

    def __init__(self, download: dict[str, int], upload: dict[str, int], ops: dict[str, float] | None = None):
        self.download, self.upload = dict(download), dict(upload)
        self.ops = dict(ops) if ops is not None else {arch: 0.0 for arch in upload}

    def download_bytes(self, arch: str) -> int:
        """Bytes of the broadcast a client of ``arch`` downloads now."""
        return self.download[arch]

    def upload_bytes(self, arch: str) -> tuple[int, float]:
        """(bytes, compression ops) of a client's upload of ``arch``."""
        return self.upload[arch], self.ops[arch]

    def train_samples(self, n_train: np.ndarray, local_samples) -> np.ndarray:
        """Samples each client trains on per round, from its training rows ``n_train``;
        ``local_samples(rows)`` is the engine's count for rows trained on whole (epochs or
        steps). A method that holds rows out of training overrides this."""
        return local_samples(n_train)

    def train_flops(self, per_sample: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """Training FLOPs of clients that train ``samples`` samples with ``per_sample`` FLOPs each
        (their architecture's forward and backward pass). A method whose clients do more per
        sample (forwards of frozen models: MOON, FedNTD) overrides this with the rule its clients
        report, so that a timing-only run charges what a full run does."""
        return per_sample * samples

    def stepped(self, updated: set[str], synchronous: bool) -> None:
        """A server step ran: a round (``synchronous``), or an asynchronous step; ``updated``:
        the architectures it aggregated at least one upload of."""

    def state(self) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass


class AlgorithmParams(BaseModel):
    """Base of every method's hyperparameters (validated, unknown keys rejected): subclass it and
    declare your options as pydantic fields with defaults; ``name`` is the method's registered name
    (set by the config, no need to declare it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = ""
    # every client uploads the whole model (FedAvg, FedProx): the validation's lower bound of a
    # round then counts its upload; False: the upload may be as small as nothing
    uploads_whole_model: ClassVar[bool] = False
    # why the method cannot run asynchronously (None: it can; the engine's FedBuff/FedAsync step
    # then works on full model states unless the Server overrides ``async_step``)
    synchronous_only: ClassVar[str | None] = None
    # options with no asynchronous meaning: option -> (refused values, why)
    async_refused_options: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {}

    def check(self, model: ModelSize) -> list[str]:
        """Problems of these options against the model, one indented line each (``hetsim validate``
        shows them all at once). The field validators check what needs no model; a method whose
        options refer to the model's size (K coordinates, packs) overrides this."""
        return []


class Client:
    """Client half of a method. One instance serves every client its host runs."""

    # True: the engine fills ``ctx.profile`` (a HardwareProfile built per client and round);
    # methods that do not read it leave it None and skip that cost.
    needs_profile = False

    def __init__(self, params: AlgorithmParams):
        self.params = params

    @classmethod
    def reads_phase_times(cls, params: AlgorithmParams) -> bool:
        """True: the engine fills ``ctx.last_times`` with the clock's phase times of the client's
        last round (what a real client measures of itself; e.g. ASCEND's ``time_model: measured``)."""
        return False

    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        """Load the client's model for this round into ``ctx.model`` (personalization rule)."""
        raise NotImplementedError

    def batch_loss(self, ctx: ClientContext, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local objective on one mini-batch, what :func:`algorithms.training.local_sgd` minimises
        (default: cross-entropy of ``model(x)`` against ``y``). Override it to add terms without
        copying the training loop: a linear term (SCAFFOLD's control variates, FedDyn), a
        contrastive term against models kept in ``ctx.state`` (MOON), a distillation term against
        a teacher (FedNTD). ``train_loss`` reports the mean of what it returns. A method that
        overrides it trains sequentially under ``executor.batch_clients`` (the run says so)."""
        import torch.nn.functional as F  # torch: the contract itself is importable without it

        return F.cross_entropy(model(x), y)

    @classmethod
    def custom_loss(cls) -> bool:
        """Whether this client class overrides :meth:`batch_loss`."""
        return cls.batch_loss is not Client.batch_loss

    @classmethod
    def unbatched_reason(cls) -> str | None:
        """Why ``executor.batch_clients`` cannot train this method's clients together (they then
        train one by one, and the run says why once), or None. Batched training minimises
        cross-entropy with a plain SGD step: a method that overrides :meth:`batch_loss`, or whose
        local training differs otherwise (FedSPU's frozen neurons), says so here."""
        if cls.custom_loss():
            return "defines its own batch_loss, which batched training (cross-entropy) cannot apply"
        return None

    def loss_of(self, ctx: ClientContext):
        """What ``fit`` hands :func:`~algorithms.training.local_sgd` as ``loss``: :meth:`batch_loss`
        bound to ``ctx`` where overridden, else None (cross-entropy, batched training allowed)."""
        if not self.custom_loss():
            return None
        return lambda model, x, y: self.batch_loss(ctx, model, x, y)

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        """Train locally starting from ``ctx.model`` and build the upload."""
        raise NotImplementedError

    def prox_mu(self) -> float:
        """The FedProx coefficient ``fit`` passes to ``local_sgd`` (centre: the received model).

        Batched training (``executor.batch_clients``) trains before ``fit`` runs, so it asks here;
        ``local_sgd`` checks that ``fit`` then asks for the same.
        """
        return 0.0

    def train_rows(self, ctx: ClientContext) -> torch.Tensor | None:
        """The rows of ``ctx.train_x`` / ``ctx.train_y`` that ``fit`` trains on (an int64 index
        tensor on their device, in the order ``fit`` gives them to ``local_sgd``); None: all.

        A method that trains on a subset (ASCEND v3 holds its probe out) says so here, so that
        batched training (``executor.batch_clients``) draws each client's batches over exactly
        those rows; ``local_sgd`` checks that ``fit`` then trains on as many rows.
        """
        return None

    def on_dropped(self, state: dict[str, Any], round: int) -> None:
        """The upload of ``round`` never arrived (deadline, over-selection).

        Called on the client's host before its next round; methods with error feedback put the
        values they sent back into the residual here, so no update mass is lost.
        """


@dataclass
class ServerContext:
    """What the engine tells a server besides its models (all optional for simple methods)."""

    public_x: torch.Tensor | None = None  # server-side public split (distillation), unlabelled use
    public_y: torch.Tensor | None = None  # kept for diagnostics only
    num_clients: int = 0
    client_arch: np.ndarray | None = None  # architecture name per client
    eval_batch_size: int = 1024
    clients_per_round: int = 0  # how many uploads a synchronous round aims to aggregate


class Server:
    """Server half of a method. Owns the global model(s).

    Checkpoints save every global model and the attributes named in ``checkpoint_fields``
    (a method declares the state its next round depends on, e.g. ``("masks",)``); the values
    may be anything :mod:`algorithms.state` encodes, and an unsupported one fails loudly.
    """

    checkpoint_fields: tuple[str, ...] = ()

    def __init__(
        self,
        params: AlgorithmParams,
        models: dict[str, torch.nn.Module],
        seed: int,
        context: ServerContext | None = None,
    ):
        self.params = params
        self.models = models  # one global model per architecture
        self.seed = seed
        self.context = context or ServerContext()

    def broadcast(self, round: int) -> Broadcast:
        raise NotImplementedError

    def aggregate(self, round: int, results: list[ClientResult]) -> dict[str, Any]:
        """Fold the uploads that arrived this round into the global state; returns round metrics."""
        raise NotImplementedError

    def async_step(self, step: int, updates: list, rule) -> dict[str, Any] | None:
        """One asynchronous server step (docs/async.md) over ``updates``
        (:class:`algorithms.asynchronous.AsyncUpdate`, the FedBuff buffer or FedAsync's one update)
        under ``rule`` (:class:`algorithms.asynchronous.StepRule`); returns the step's metrics.
        ``step`` counts server steps (0, 1, ...), as ``round`` counts rounds. None (this default):
        the server has no step of its own, and the engine takes FedBuff/FedAsync over the
        clients' full states (:func:`algorithms.asynchronous.apply_states`); a method whose server
        does more overrides it (FedCSPACK, ASCEND)."""
        return None

    def global_models(self) -> dict[str, torch.nn.Module]:
        return self.models

    def excluded_clients(self, round: int) -> np.ndarray | None:
        """Clients this method does not train in synchronous round ``round`` (FedSPU's
        early-stopped clients): the selection policy chooses among the others. None (this
        default): any client. Asynchronous runs do not ask."""
        return None

    def checkpoint_state(self) -> dict[str, Any]:
        """The global models' state dicts and the ``checkpoint_fields`` (references, not copies)."""
        return {
            "models": {arch: m.state_dict() for arch, m in self.models.items()},
            "fields": {name: getattr(self, name) for name in self.checkpoint_fields},
        }

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`checkpoint_state` (on a server built from the same config)."""
        if sorted(state["models"]) != sorted(self.models):
            raise ValueError(f"checkpoint has models {sorted(state['models'])}, the server {sorted(self.models)}")
        missing = sorted(set(self.checkpoint_fields) - set(state["fields"]))
        if missing:
            raise ValueError(f"checkpoint lacks the server fields {missing} of {type(self).__name__}")
        for arch, model in self.models.items():
            model.load_state_dict(state["models"][arch])
        for name in self.checkpoint_fields:
            setattr(self, name, state["fields"][name])

    @classmethod
    def timing_payload(cls, params: AlgorithmParams, shapes: dict[str, ArchShape]) -> TimingPayload:
        """The method's wire format for ``clock.mode: timing_only`` (per architecture, its model's
        :class:`ArchShape`), or :class:`TimingUnsupported` saying why its payload depends on
        training. This default refuses: a method says what it sends by overriding it."""
        raise TimingUnsupported("the method gives no payload rule (Server.timing_payload)")

    def drain_tables(self) -> dict[str, Any]:
        """Extra trace rows produced since the last call, by table name (e.g. rollbacks).

        Each value is a list of row dicts or a dict of equal-length column arrays; the engine
        appends it to ``<name>.parquet`` in the run folder.
        """
        return {}


@dataclass(frozen=True)
class AlgorithmSpec:
    """A method: its name, its hyperparameter model and its two halves (what
    :func:`engine.plugins.register_method` registers; the halves may be lazy references
    ``"package.module:Class"`` until the registry resolves them)."""

    name: str
    params: type[AlgorithmParams]
    client: type[Client] | str
    server: type[Server] | str
    description: str = ""

    def registry_identity(self) -> tuple:
        """Its parts: two specs of the same parts are the same method."""
        return (self.params, self.client, self.server)
