"""FedSPU (Niu, Dong and Qin, "FedSPU: Personalized Federated Learning for Resource-Constrained
Devices with Stochastic Parameter Update", AAAI 2025): a random part of each client's model is
updated each round, the rest stays frozen and personal.

**A round of a client** with update rate ``r`` (``tier_rates`` by its device tier, else ``rate``):

1. it draws, in every hidden layer of ``n`` neurons, ``max(1, int(r n))`` of them uniformly (from
   its round generator); a weight is *updated* when its output neuron is drawn (the output
   layer's neurons always are) and its input neuron too (the inputs of the first layer always
   are; after a flatten, the features of a drawn channel); biases and norm layers follow their
   neurons;
2. its model is its own model from its last round (the initial model before its first) with
   the updated part taken from the global model: it downloads that part only
   (``download_nbytes``: 4 bytes a value);
3. it trains with the frozen part masked out of every SGD step (``local_sgd``'s
   ``update_mask``), keeps the result as its own model, and uploads the updated part: its values
   (float32), the drawn neurons (int32) and their count per layer, and with early stopping one
   byte, whether it stopped. A client of rate 1 draws nothing and sends its whole state, as FedAvg.

**The server** sets each parameter to the sample-weighted mean of the uploads that updated it, and
keeps a parameter no upload updated (its authors' ``spu_aggregation``).

**Early stopping** (the paper's section on it, ``lambda`` and the 70/30 split of its code): a
client holds ``val_fraction`` of its training rows out as a validation set; after training,
``L = lambda L_train + (1 - lambda) L_val`` (mean training loss of the round, loss of the trained
model on the validation rows); a client whose ``L`` did not decrease since its previous round stops
and is not selected again (``Server.excluded_clients``). Once fewer clients are left than a round
takes, the early-stopping round is reached (``server_early_stopped`` turns 1) and, as its code
does, every client is selectable again.

**FLOP rule** (the clock's ``train_flops``): a frozen weight needs no weight gradient, which is a
third of a weight's training FLOPs (forward, input gradient, weight gradient: 2 FLOPs each per use).
So a client charges ``seen * (P - sum_l 2 * frozen_l * uses_l)`` with ``P`` the model's training
FLOPs per sample, ``frozen_l`` the frozen weights of layer ``l`` and ``uses_l`` their uses per
sample (1 for a linear layer, the output positions of a convolution), plus a forward pass
(``P / 3``) per validation row with early stopping.

Models: feed-forward chains of linear and convolution layers (norm layers between them), with
layers in the order they run - every model of the zoo but ResNet-18; any other is refused with the
module that breaks the chain. Synchronous only (``FedSPUParams.synchronous_only``); timing-only
runs refuse it (its bytes and FLOPs depend on each client's tier and, with early stopping, on its
losses).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from algorithms.base import (
    FLOAT32_BYTES,
    INDEX_BYTES,
    INT8_BYTES,
    AlgorithmSpec,
    ArchShape,
    Client,
    ClientContext,
    ClientResult,
    Payload,
    Server,
    ServerContext,
    TimingUnsupported,
)
from algorithms.baseline_params import FedSPUParams
from algorithms.fedavg import state_payload
from algorithms.frozen_models import FORWARD_FRACTION
from algorithms.training import evaluate, flat_state, load_flat_state, local_sgd
from hardware_profiles.errors import UserError

VALIDATION_SALT = 0x5B0  # the fixed validation rows of a client (same every round)
WEIGHT_LAYERS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


@dataclass(frozen=True)
class Layer:
    """One weight layer of the chain: its module, neurons in and out, and how its inputs map to the
    previous layer's neurons (``factor`` inputs each; None: the model's inputs, all updated)."""

    module: str
    out_units: int
    in_units: int
    prev: int | None
    factor: int
    hidden: bool  # False: the output layer, whose neurons are all updated


@dataclass(frozen=True)
class Entry:
    """One tensor of the flat state: where it is, its shape, its layer and what indexes it."""

    offset: int
    shape: tuple[int, ...]
    layer: int
    weight: bool  # True: (out, in, ...) of its layer; False: follows its layer's neurons (bias, norm)
    param: bool  # a trainable parameter (else a buffer)


class ChainLayout:
    """The neurons of a model's flat state (:func:`~algorithms.training.flat_state`), from its
    modules in registration order; raises ValueError naming the module that breaks the chain."""

    def __init__(self, model: torch.nn.Module):
        layers: list[Layer] = []
        owner: dict[str, tuple[int, bool]] = {}  # tensor name -> (layer, is weight)
        for name, module in model.named_modules():
            own = [(n, t) for n, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
                   if t.is_floating_point()]
            if not own:
                continue
            prefix = f"{name}." if name else ""
            if isinstance(module, WEIGHT_LAYERS):
                if getattr(module, "groups", 1) != 1:
                    raise ValueError(f"module {name!r} is a grouped convolution, whose neurons FedSPU does not map")
                out_units, in_units = module.weight.shape[:2]
                prev, factor = (len(layers) - 1, 1) if layers else (None, 1)
                if prev is not None:
                    before = layers[prev].out_units
                    if in_units % before:
                        raise ValueError(f"module {name!r} takes {in_units} inputs, which are not the {before} "
                                         f"outputs of {layers[prev].module!r} (or whole features of each)")
                    factor = in_units // before
                layers.append(Layer(name, int(out_units), int(in_units), prev, int(factor), True))
                for n, _ in own:
                    owner[prefix + n] = (len(layers) - 1, n == "weight")
            elif layers and all(t.dim() == 1 and t.numel() == layers[-1].out_units for _, t in own):
                for n, _ in own:  # a norm layer over the previous layer's neurons
                    owner[prefix + n] = (len(layers) - 1, False)
            else:
                raise ValueError(f"module {name!r} ({type(module).__name__}) is neither a linear or convolution "
                                 "layer nor a norm layer over the previous one's neurons")
        if not layers:
            raise ValueError("it has no linear or convolution layer")
        layers[-1] = dataclasses.replace(layers[-1], hidden=False)
        self.layers = layers
        self.entries: list[Entry] = []
        offset = 0
        tensors = [(n, p, True) for n, p in model.named_parameters()]
        tensors += [(n, b, False) for n, b in model.named_buffers() if b.is_floating_point()]
        for n, t, is_param in tensors:
            layer, weight = owner[n]
            self.entries.append(Entry(offset, tuple(t.shape), layer, weight, is_param))
            offset += t.numel()
        self.size = offset

    @property
    def hidden(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if layer.hidden]

    def draw(self, rng: np.random.Generator, rate: float) -> list[np.ndarray]:
        """Each hidden layer's updated neurons (sorted): ``max(1, int(rate n))`` of its ``n``."""
        out = []
        for i in self.hidden:
            n = self.layers[i].out_units
            out.append(np.sort(rng.choice(n, size=max(1, int(rate * n)), replace=False)).astype(np.int32))
        return out

    def unit_masks(self, units: list[np.ndarray] | None) -> list[np.ndarray]:
        """Per layer, which of its neurons are updated (None: all of every layer)."""
        masks = [np.ones(layer.out_units, dtype=bool) for layer in self.layers]
        if units is not None:
            for i, sel in zip(self.hidden, units):
                masks[i] = np.zeros(self.layers[i].out_units, dtype=bool)
                masks[i][sel] = True
        return masks

    def tensor_masks(self, units: list[np.ndarray] | None) -> list[np.ndarray]:
        """Per flat-state tensor, a bool array of its shape: which of its values are updated."""
        neurons = self.unit_masks(units)
        out = []
        for e in self.entries:
            layer = self.layers[e.layer]
            if not e.weight:
                out.append(neurons[e.layer].reshape(e.shape))
                continue
            ins = (np.ones(layer.in_units, dtype=bool) if layer.prev is None
                   else np.repeat(neurons[layer.prev], layer.factor))
            m = neurons[e.layer][:, None] & ins[None, :]
            out.append(np.broadcast_to(m.reshape(m.shape + (1,) * (len(e.shape) - 2)), e.shape))
        return out

    def mask(self, units: list[np.ndarray] | None) -> np.ndarray:
        """The updated values of the flat state (bool, its length)."""
        return np.concatenate([m.reshape(-1) for m in self.tensor_masks(units)]) if self.entries else np.zeros(0, bool)


def chain_of(model: torch.nn.Module, x: torch.Tensor | None) -> tuple[ChainLayout, list[float]]:
    """The model's :class:`ChainLayout` and each weight layer's uses per sample (output positions
    per unit: 1 for a linear layer), from one forward pass of ``x`` (a row), which checks that every
    layer runs once, in the chain's order; without ``x`` the layout alone (uses unknown: []).
    Raises :class:`~hardware_profiles.errors.UserError` saying why the model is not such a chain."""
    try:
        layout = ChainLayout(model)
    except ValueError as err:
        raise UserError(f"algorithm.name = 'fedspu': the model {type(model).__name__} is not a chain FedSPU "
                        f"can freeze neurons of: {err}") from None
    if x is None:
        return layout, []
    ran: list[tuple[str, float]] = []

    def record(module, args, out, name):
        ran.append((name, out.numel() / (len(out) * module.weight.shape[0])))

    hooks = [model.get_submodule(layer.module).register_forward_hook(
        lambda m, args, out, name=layer.module: record(m, args, out, name)) for layer in layout.layers]
    training = model.training
    try:
        with torch.no_grad():
            model.eval()
            model(x)
    finally:
        model.train(training)
        for h in hooks:
            h.remove()
    if [n for n, _ in ran] != [layer.module for layer in layout.layers]:
        raise UserError(f"algorithm.name = 'fedspu': the layers of {type(model).__name__} run in the order "
                        f"{[n for n, _ in ran]}, not as registered {[la.module for la in layout.layers]}: "
                        "FedSPU freezes neurons of feed-forward chains only")
    return layout, [uses for _, uses in ran]


def decode_units(upload: Payload) -> list[np.ndarray] | None:
    """The drawn neurons per hidden layer an upload names (None: every neuron, a rate-1 client)."""
    if "units" not in upload.arrays:
        return None
    return np.split(np.asarray(upload.arrays["units"]), np.cumsum(upload.arrays["counts"])[:-1])


def spu_flops(per_sample: float, seen: int, saved_per_sample: float, validation_rows: int) -> float:
    """The FLOP rule above: training with frozen weights' gradients skipped, plus the validation forward."""
    return seen * (per_sample - saved_per_sample) + validation_rows * per_sample * FORWARD_FRACTION


@dataclass
class _Round:
    """What a client drew in ``receive`` for its ``fit``."""

    units: list[np.ndarray] | None
    mask: np.ndarray
    params: list[torch.Tensor | None]
    saved_per_sample: float


class FedSPUClient(Client):
    params: FedSPUParams
    needs_profile = True  # its device tier gives its update rate

    def __init__(self, params: FedSPUParams):
        super().__init__(params)
        self.layouts: dict[str, tuple[ChainLayout, list[float]]] = {}
        self.initial: dict[str, np.ndarray] = {}
        self.pending: dict[int, _Round] = {}

    @classmethod
    def unbatched_reason(cls) -> str | None:
        return "freezes a random part of each client's model (an update mask), which batched training does not apply"

    def rate(self, ctx: ClientContext) -> float:
        tier = getattr(ctx.profile, "tier", "") or ""
        return float(self.params.tier_rates.get(tier, self.params.rate))

    def layout(self, ctx: ClientContext) -> tuple[ChainLayout, list[float]]:
        """The architecture's chain and its layers' uses per sample (:func:`chain_of`), once."""
        if ctx.arch not in self.layouts:
            self.layouts[ctx.arch] = chain_of(ctx.model, ctx.train_x[:1])
            self.initial[ctx.arch] = flat_state(ctx.model).cpu().numpy()  # the host reset it to the initial model
        return self.layouts[ctx.arch]

    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        layout, uses = self.layout(ctx)
        rate = self.rate(ctx)
        units = layout.draw(ctx.rng, rate) if rate < 1 else None
        tensors = layout.tensor_masks(units)
        mask = np.concatenate([t.reshape(-1) for t in tensors])
        own = ctx.state.get("personal", self.initial[ctx.arch])
        merged = np.where(mask, np.asarray(broadcast.arrays["state"]), own).astype(np.float32)
        load_flat_state(ctx.model, merged)
        device = next(ctx.model.parameters()).device
        params = [None if t.all() else torch.from_numpy(np.ascontiguousarray(t, dtype=np.float32)).to(device)
                  for t, e in zip(tensors, layout.entries) if e.param]
        saved = sum(2.0 * float((~t).sum()) * uses[e.layer]
                    for t, e in zip(tensors, layout.entries) if e.param and e.weight)
        self.pending[ctx.client_id] = _Round(units, mask, params, saved)

    def validation_rows(self, ctx: ClientContext) -> np.ndarray:
        """The client's fixed validation rows (early stopping), at most all but one row."""
        n = len(ctx.train_y)
        if not self.params.early_stopping:
            return np.zeros(0, dtype=np.int64)
        m = min(int(self.params.val_fraction * n), max(n - 1, 0))
        return np.sort(np.random.default_rng([VALIDATION_SALT, ctx.client_id, n]).permutation(n)[:m])

    def train_rows(self, ctx: ClientContext) -> torch.Tensor | None:
        held = self.validation_rows(ctx)
        if len(held) == 0:
            return None
        keep = np.ones(len(ctx.train_y), dtype=bool)
        keep[held] = False
        return torch.from_numpy(np.flatnonzero(keep)).to(ctx.train_x.device)

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        drawn = self.pending.pop(ctx.client_id)
        rows = self.train_rows(ctx)
        train = ctx if rows is None else dataclasses.replace(ctx, train_x=ctx.train_x[rows], train_y=ctx.train_y[rows])
        loss, seen = local_sgd(train, update_mask=drawn.params)
        state = flat_state(ctx.model)
        ctx.state["personal"] = state.detach().cpu().numpy().copy()
        values = ctx.state["personal"][drawn.mask]
        arrays = {"values": values}
        nbytes = FLOAT32_BYTES * values.size
        if drawn.units is not None:
            arrays["units"] = np.concatenate(drawn.units)
            arrays["counts"] = np.array([len(u) for u in drawn.units], dtype=np.int32)
            nbytes += INDEX_BYTES * (arrays["units"].size + arrays["counts"].size)
        metrics = {"train_loss": loss, "update_rate": float(drawn.mask.mean())}
        held = self.validation_rows(ctx)
        if self.params.early_stopping:
            idx = torch.from_numpy(held).to(ctx.train_x.device)
            val = loss
            if len(held):
                loss_sum, _, n = evaluate(ctx.model, ctx.train_x[idx], ctx.train_y[idx])
                val = loss_sum / n
            es_loss = self.params.es_lambda * loss + (1.0 - self.params.es_lambda) * val
            last = ctx.state.get("es_loss")
            stopped = last is not None and last - es_loss <= 0.0
            ctx.state["es_loss"] = es_loss
            arrays["stopped"] = np.array([stopped], dtype=np.uint8)
            nbytes += INT8_BYTES
            metrics.update(es_loss=es_loss, early_stopped=int(stopped))
        return ClientResult(ctx.client_id, ctx.arch, Payload(arrays, nbytes), len(train.train_y),
                            spu_flops(ctx.flops_per_sample, seen, drawn.saved_per_sample, len(held)), metrics=metrics,
                            download_nbytes=FLOAT32_BYTES * int(drawn.mask.sum()))

    def on_dropped(self, state, round: int) -> None:
        """A lost upload changes nothing here: the client's own model and loss are its own."""


class FedSPUServer(Server):
    params: FedSPUParams
    checkpoint_fields = ("stopped", "es_round")

    def __init__(self, params: FedSPUParams, models: dict[str, torch.nn.Module], seed: int,
                 context: ServerContext | None = None):
        super().__init__(params, models, seed, context)
        self.layouts = {}
        for arch, model in models.items():  # checked here (validation) when the model knows its input
            shape = getattr(model, "input_shape", None)
            row = torch.zeros((1, *shape)) if shape is not None else None
            self.layouts[arch] = chain_of(model, row)[0]
        self.stopped = np.zeros(self.context.num_clients, dtype=bool)  # early-stopped clients
        self.es_round = -1  # the round early stopping was reached in (-1: not yet)

    def broadcast(self, round: int):
        """Each architecture's state; a client reads (and is charged for) the part it updates."""
        return {arch: state_payload(flat_state(m)) for arch, m in self.models.items()}

    @classmethod
    def timing_payload(cls, params: FedSPUParams, shapes: dict[str, ArchShape]):
        raise TimingUnsupported("FedSPU's bytes and FLOPs depend on each client's update rate (its device tier) and, "
                                "with early stopping, on its losses, which a timing-only run does not train")

    def excluded_clients(self, round: int) -> np.ndarray | None:
        if not self.params.early_stopping or self.es_round >= 0 or not self.stopped.any():
            return None
        return np.flatnonzero(self.stopped)

    def aggregate(self, round: int, results: list[ClientResult]) -> dict:
        for arch, model in self.models.items():
            mine = [r for r in results if r.arch == arch]
            if not mine:
                continue
            layout = self.layouts[arch]
            state = flat_state(model).double().numpy()
            total, weight = np.zeros_like(state), np.zeros_like(state)
            for res in mine:
                mask = layout.mask(decode_units(res.upload))
                total[mask] += res.num_samples * np.asarray(res.upload.arrays["values"], dtype=np.float64)
                weight[mask] += res.num_samples
            held = weight > 0
            state[held] = total[held] / weight[held]
            load_flat_state(model, state.astype(np.float32))
        if not self.params.early_stopping:
            return {}
        for res in results:
            if res.client_id >= len(self.stopped):
                self.stopped = np.concatenate([self.stopped, np.zeros(res.client_id + 1 - len(self.stopped), bool)])
            self.stopped[res.client_id] = bool(res.upload.arrays["stopped"][0])
        active = int(len(self.stopped) - self.stopped.sum())
        if self.es_round < 0 and active < self.context.clients_per_round:
            self.es_round = round
        return {"es_active_clients": active, "early_stopped": int(self.es_round >= 0)}


SPEC = AlgorithmSpec("fedspu", FedSPUParams, FedSPUClient, FedSPUServer,
                     "FedSPU: random neurons updated per round by device tier, the rest frozen; early stopping")
