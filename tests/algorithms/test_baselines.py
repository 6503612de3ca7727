"""The baselines of FedCSPACK's paper (algorithms/moon.py, fedntd.py, fedspu.py, heterofl.py) and the
reference's Fashion-MNIST CNN: each update rule against an independent float64 reference written
here from its paper (one step with known inputs), their bytes and FLOPs, and the model layer for layer.

The references never call the code under test: models are evaluated from their weights with explicit
float64 matrix products, and gradients come from autograd on those float64 expressions.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from algorithms.base import (
    ArchShape,
    ClientContext,
    ClientResult,
    Payload,
    ServerContext,
    TimingUnsupported,
    TrainSettings,
)
from algorithms.baseline_params import FEDSPU_TIER_RATES, FedNTDParams, FedSPUParams, HeteroFLParams, MoonParams
from algorithms.fedntd import FedNTDClient, FedNTDServer
from algorithms.fedspu import ChainLayout, FedSPUClient, FedSPUServer, chain_of
from algorithms.frozen_models import output_layer, representation
from algorithms.heterofl import HeteroFLServer, nested_positions
from algorithms.moon import MoonClient, MoonServer
from algorithms.training import flat_state, load_flat_state
from engine.models.zoo import MLP, FashionCNN, build_model, count_parameters
from hardware_profiles.errors import UserError

LR = 0.1


def mlp(hidden=5, width=1.0, seed=0):
    torch.manual_seed(seed)
    return MLP((4,), 3, hidden=[hidden], width=width)


def data(n=6, seed=4):  # no sample whose hidden layer is all zero (cos needs a norm)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, torch.tensor([0, 1, 2, 1, 0, 2][:n])


def ctx_of(model, x, y, state=None, cid=0, profile=None):
    return ClientContext(client_id=cid, round=0, arch="", model=model, state={} if state is None else state,
                         train_x=x, train_y=y, rng=np.random.default_rng(3),
                         train=TrainSettings(local_epochs=1, batch_size=len(y), lr=LR), flops_per_sample=1000.0,
                         profile=profile)


def flat(model) -> np.ndarray:
    return flat_state(model).numpy().astype(np.float32)


def unflat(v):
    """(W1, b1, W2, b2) of the 4-5-3 MLP from its flat state, float64 leaves with gradients."""
    v = torch.as_tensor(np.asarray(v, dtype=np.float64))
    parts = torch.split(v, [20, 5, 15, 3])
    shapes = [(5, 4), (5,), (3, 5), (3,)]
    return [p.reshape(s).clone().requires_grad_(True) for p, s in zip(parts, shapes)]


def forward64(params, x):
    """(representation, logits) of the MLP in float64: h = relu(W1 x + b1), logits = W2 h + b2."""
    w1, b1, w2, b2 = params
    h = torch.clamp(x.double() @ w1.T + b1, min=0)
    return h, h @ w2.T + b2


def ce64(logits, y):
    return -(logits.gather(1, y[:, None]).squeeze(1) - torch.logsumexp(logits, 1))


def cos64(a, b):
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))


def sgd_step64(start, loss_fn, mask=None):
    params = unflat(start)
    loss = loss_fn(params)
    grads = torch.autograd.grad(loss, params)
    g = torch.cat([gr.reshape(-1) for gr in grads]).numpy()
    if mask is not None:
        g = g * mask
    return np.asarray(start, dtype=np.float64) - LR * g, float(loss.detach())


def assert_close(got, want, rel=1e-6):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert np.linalg.norm(got - want) <= rel * np.linalg.norm(want), (got, want)


# ------------------------------------------------------------------ the representation convention
def test_a_models_representation_is_the_input_of_its_head_or_its_last_linear():
    model = mlp()
    x, _ = data()
    z, logits = representation(model, x)
    ref_z, ref_logits = forward64(unflat(flat(model)), x)
    assert_close(z.detach().numpy(), ref_z.detach().numpy())
    assert_close(logits.detach().numpy(), ref_logits.detach().numpy())
    # without a head attribute: the last nn.Linear, the output layer of a feed-forward classifier
    plain = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    assert output_layer(plain) is plain[2]
    assert representation(plain, x)[0].shape == (6, 5)
    assert output_layer(build_model("fmnist_cnn", (1, 28, 28), 10)).out_features == 10
    assert output_layer(build_model("cnn", (1, 28, 28), 10)).in_features == 84
    with pytest.raises(ValueError, match="no output layer"):
        output_layer(torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3)))


# ------------------------------------------------------------------ MOON
def test_moon_one_step_equals_the_papers_loss_in_float64():
    mu, tau = 2.0, 0.5
    x, y = data()
    start, glob, prev = flat(mlp(seed=0)), flat(mlp(seed=1)), flat(mlp(seed=2))
    client = MoonClient(MoonParams(mu=mu, temperature=tau))
    model = mlp(seed=9)  # the workspace: anything, receive loads the global model
    ctx = ctx_of(model, x, y, state={"previous": prev})
    broadcast = Payload({"state": glob}, 4 * glob.size)
    client.receive(ctx, broadcast)
    load_flat_state(model, start)  # the step starts from known weights (the global model in a round)
    result = client.fit(ctx, broadcast)

    def loss(params):  # eq. 3 and 4 of the paper, mean over the batch
        z, logits = forward64(params, x)
        zg, zp = forward64(unflat(glob), x)[0].detach(), forward64(unflat(prev), x)[0].detach()
        pos, neg = torch.exp(cos64(z, zg) / tau), torch.exp(cos64(z, zp) / tau)
        return ce64(logits, y).mean() + mu * (-torch.log(pos / (pos + neg))).mean()

    want, want_loss = sgd_step64(start, loss)
    assert_close(result.upload.arrays["state"], want)
    assert result.metrics["train_loss"] == pytest.approx(want_loss, rel=1e-6)
    assert_close(ctx.state["previous"], want)  # the next round's previous model
    assert result.train_flops == 1000.0 * 6 * (1 + 2 / 3)  # two frozen forwards per sample
    assert result.upload.nbytes == 4 * glob.size


def test_moon_before_a_clients_first_training_contrasts_with_the_initial_model():
    x, y = data()
    initial, glob = mlp(seed=0), flat(mlp(seed=1))
    client = MoonClient(MoonParams())
    ctx = ctx_of(initial, x, y)  # the host's workspace holds the initial model before receive
    init = flat(initial)
    broadcast = Payload({"state": glob}, 4 * glob.size)
    client.receive(ctx, broadcast)
    client.fit(ctx, broadcast)
    assert np.array_equal(flat(client.frozen.get(ctx, "previous")), init)
    assert np.array_equal(flat(client.frozen.get(ctx, "global")), glob)
    assert not client.frozen.get(ctx, "global").training


def test_moon_and_fedntd_time_their_frozen_forwards_like_a_full_run():
    shapes = {"": ArchShape(100, 4)}
    for server, params, forwards in ((MoonServer, MoonParams(), 2), (MoonServer, MoonParams(mu=0), 0),
                                     (FedNTDServer, FedNTDParams(), 1), (FedNTDServer, FedNTDParams(beta=0), 0)):
        payload = server.timing_payload(params, shapes)
        assert payload.upload_bytes("") == (416, 0.0) and payload.download_bytes("") == 416
        flops = payload.train_flops(np.array([3.0, 1000.0]), np.array([7, 6]))
        assert flops.tolist() == [3.0 * 7 * (1 + forwards / 3), 1000.0 * 6 * (1 + forwards / 3)]


# ------------------------------------------------------------------ FedNTD
def test_fedntd_one_step_equals_the_papers_loss_in_float64():
    tau, beta = 2.0, 0.7
    x, y = data()
    start, glob = flat(mlp(seed=0)), flat(mlp(seed=1))
    client = FedNTDClient(FedNTDParams(tau=tau, beta=beta))
    model = mlp(seed=9)
    ctx = ctx_of(model, x, y)
    broadcast = Payload({"state": glob}, 4 * glob.size)
    client.receive(ctx, broadcast)
    load_flat_state(model, start)
    result = client.fit(ctx, broadcast)

    def loss(params):  # eq. 5 and 6: KL(q~_g || q~_l) over the classes other than the label
        logits = forward64(params, x)[1]
        glogits = forward64(unflat(glob), x)[1].detach()
        kl = []
        for i in range(len(y)):
            keep = [c for c in range(3) if c != int(y[i])]
            q = torch.softmax(glogits[i, keep] / tau, 0)
            logp = torch.log_softmax(logits[i, keep] / tau, 0)
            kl.append((q * (torch.log(q) - logp)).sum())
        return ce64(logits, y).mean() + beta * torch.stack(kl).mean()

    want, want_loss = sgd_step64(start, loss)
    assert_close(result.upload.arrays["state"], want)
    assert result.metrics["train_loss"] == pytest.approx(want_loss, rel=1e-6)
    assert result.train_flops == 1000.0 * 6 * (1 + 1 / 3)


# ------------------------------------------------------------------ FedSPU
def spu_mask(units: np.ndarray) -> np.ndarray:
    """The updated values of the 4-5-3 MLP's flat state when ``units`` of its hidden layer are drawn."""
    sel = np.zeros(5, dtype=bool)
    sel[units] = True
    w1 = np.repeat(sel[:, None], 4, 1)  # incoming weights of a drawn neuron, all inputs
    w2 = np.repeat(sel[None, :], 3, 0)  # outgoing: every output neuron, the drawn inputs
    return np.concatenate([w1.ravel(), sel, w2.ravel(), np.ones(3, bool)])


class Tier:
    def __init__(self, tier):
        self.tier = tier


def test_fedspu_one_step_updates_the_drawn_neurons_only_as_masked_sgd_in_float64():
    x, y = data()
    own, glob = flat(mlp(seed=0)), flat(mlp(seed=1))
    params = FedSPUParams(early_stopping=False, tier_rates={"slow": 0.4})
    client = FedSPUClient(params)
    model = mlp(seed=9)
    ctx = ctx_of(model, x, y, state={"personal": own}, profile=Tier("slow"))
    client.receive(ctx, Payload({"state": glob}, 4 * glob.size))
    result = client.fit(ctx, Payload({"state": glob}, 4 * glob.size))
    units = result.upload.arrays["units"]
    assert len(units) == int(0.4 * 5) and result.upload.arrays["counts"].tolist() == [2]
    mask = spu_mask(units)
    start = np.where(mask, glob, own)  # its own model, the drawn part from the global one

    def loss(params):
        return ce64(forward64(params, x)[1], y).mean()

    want, _ = sgd_step64(start, loss, mask=mask)
    assert_close(ctx.state["personal"], want)
    assert np.array_equal(ctx.state["personal"][~mask], own[~mask])  # frozen: bit for bit its own
    assert_close(result.upload.arrays["values"], want[mask])
    # bytes: the drawn values down; the values, the neurons and their count up
    assert result.download_nbytes == 4 * mask.sum()
    assert result.upload.nbytes == 4 * mask.sum() + 4 * (2 + 1)
    # FLOPs: a frozen weight skips its weight gradient, 2 FLOPs per use (1 use per sample in a linear layer)
    frozen_weights = (~mask[:20]).sum() + (~mask[25:40]).sum()
    assert result.train_flops == 6 * (1000.0 - 2 * frozen_weights)


def test_fedspu_a_rate_one_client_sends_its_whole_state_as_fedavg():
    x, y = data()
    client = FedSPUClient(FedSPUParams(early_stopping=False))  # laptop_cpu: 1.0; no profile: rate 1.0
    glob = flat(mlp(seed=1))
    ctx = ctx_of(mlp(seed=9), x, y)
    client.receive(ctx, Payload({"state": glob}, 4 * glob.size))
    result = client.fit(ctx, Payload({"state": glob}, 4 * glob.size))
    assert set(result.upload.arrays) == {"values"} and result.upload.nbytes == 4 * glob.size
    assert result.download_nbytes == 4 * glob.size and result.train_flops == 6 * 1000.0


def test_fedspu_server_averages_each_value_over_the_uploads_that_updated_it():
    server = FedSPUServer(FedSPUParams(early_stopping=False), {"": mlp(seed=0)}, 0, ServerContext(num_clients=3))
    glob = flat(server.models[""])
    rng = np.random.default_rng(0)
    a_units, b_units = np.array([0, 3], np.int32), np.array([3, 4], np.int32)
    uploads = []
    for cid, units, n in ((0, a_units, 10), (1, b_units, 30), (2, None, 20)):
        mask = spu_mask(units) if units is not None else np.ones(43, bool)
        arrays = {"values": rng.normal(size=int(mask.sum())).astype(np.float32)}
        if units is not None:
            arrays.update(units=units, counts=np.array([2], np.int32))
        uploads.append((ClientResult(cid, "", Payload(arrays, 0), n, 0.0), mask))
    server.aggregate(0, [r for r, _ in uploads])
    total, weight = np.zeros(43), np.zeros(43)
    for res, mask in uploads:
        full = np.zeros(43)
        full[mask] = res.upload.arrays["values"]
        total += res.num_samples * full * mask
        weight += res.num_samples * mask
    want = np.where(weight > 0, total / np.maximum(weight, 1), glob)
    assert_close(flat(server.models[""]), want)
    # only the rate-1 client holds hidden neurons 1 and 2: they are its values
    mask_b = spu_mask(np.array([1, 2]))[:20] & ~spu_mask(a_units)[:20] & ~spu_mask(b_units)[:20]
    assert np.array_equal(flat(server.models[""])[:20][mask_b], uploads[2][0].upload.arrays["values"][:20][mask_b])


def test_fedspu_layout_maps_a_convolutions_channels_through_the_flatten():
    layout = ChainLayout(FashionCNN())
    assert [(la.module, la.out_units, la.factor, la.hidden) for la in layout.layers] == [
        ("conv1", 10, 1, True), ("conv2", 20, 1, True), ("fc1", 256, 16, True), ("fc2", 50, 1, True),
        ("fc", 10, 1, False)]
    units = [np.array([1]), np.array([0, 7]), np.array([5]), np.array([2, 3])]
    masks = layout.tensor_masks(units)
    fc1 = masks[4]  # conv1 w, b, conv2 w, b, fc1 w
    want = np.zeros((256, 320), bool)
    want[5, 0:16] = want[5, 7 * 16:8 * 16] = True  # the features of channels 0 and 7
    assert np.array_equal(fc1, want)
    conv2 = masks[2]
    assert conv2.shape == (20, 10, 5, 5) and conv2.sum() == 2 * 1 * 25 and conv2[7, 1].all()
    assert masks[9].all() and masks[8][:, [2, 3]].all() and masks[8].sum() == 10 * 2  # the output layer
    with pytest.raises(ValueError, match="takes 3 inputs"):
        ChainLayout(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Linear(3, 2)))

    class Residual(torch.nn.Module):  # a shortcut, as ResNet's downsample: refused when the server is built
        input_shape = (1, 6, 6)

        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 3, padding=1)
            self.shortcut = torch.nn.Conv2d(1, 4, 1)

        def forward(self, x):
            return self.conv2(self.conv1(x)) + self.shortcut(x)

    with pytest.raises(UserError, match="module 'shortcut' takes 1 inputs, which are not the 4 outputs of 'conv2'"):
        FedSPUServer(FedSPUParams(), {"": Residual()}, 0)

    class Backwards(torch.nn.Module):  # registered a, b; runs b, a
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(self.b(x))

    with pytest.raises(UserError, match="run in the order"):
        chain_of(Backwards(), torch.zeros(1, 4))
    assert chain_of(mlp(), torch.zeros(1, 4))[1] == [1.0, 1.0]
    assert chain_of(FashionCNN(), torch.zeros(1, 1, 28, 28))[1] == [24 * 24, 8 * 8, 1.0, 1.0, 1.0]


def test_fedspu_early_stopping_retires_a_client_until_too_few_are_left():
    x, y = data()
    client = FedSPUClient(FedSPUParams(val_fraction=0.5))
    glob = flat(mlp(seed=1))
    ctx = ctx_of(mlp(seed=9), x, y)
    held = client.validation_rows(ctx)
    assert len(held) == 3 and client.train_rows(ctx).tolist() == sorted(set(range(6)) - set(held.tolist()))
    client.receive(ctx, Payload({"state": glob}, 0))
    first = client.fit(ctx, Payload({"state": glob}, 0))
    assert first.num_samples == 3 and first.upload.arrays["stopped"].tolist() == [0]  # no previous loss yet
    model = mlp(seed=9)
    load_flat_state(model, ctx.state["personal"])
    with torch.no_grad():
        val_loss = float(F.cross_entropy(model(x[held]), y[held]))
    assert ctx.state["es_loss"] == pytest.approx(0.7 * first.metrics["train_loss"] + 0.3 * val_loss, rel=1e-6)
    ctx.state["es_loss"] = -1.0  # a loss it cannot beat: it stops
    client.receive(ctx, Payload({"state": glob}, 0))
    assert client.fit(ctx, Payload({"state": glob}, 0)).upload.arrays["stopped"].tolist() == [1]

    server = FedSPUServer(FedSPUParams(), {"": mlp()}, 0, ServerContext(num_clients=5, clients_per_round=2))
    full = {"values": flat(mlp())}

    def result(cid, stopped):
        return ClientResult(cid, "", Payload({**full, "stopped": np.array([stopped], np.uint8)}, 0), 1, 0.0)

    assert server.excluded_clients(0) is None
    assert server.aggregate(0, [result(0, 1), result(1, 1)]) == {"es_active_clients": 3, "early_stopped": 0}
    assert server.excluded_clients(1).tolist() == [0, 1]
    assert server.aggregate(1, [result(2, 1), result(3, 0)]) == {"es_active_clients": 2, "early_stopped": 0}
    assert server.aggregate(2, [result(3, 1)]) == {"es_active_clients": 1, "early_stopped": 1}
    assert server.es_round == 2 and server.excluded_clients(3) is None  # reached: every client again


def test_fedspu_options_and_its_refusals():
    assert FedSPUParams().tier_rates == FEDSPU_TIER_RATES
    assert FedSPUParams.synchronous_only and "rounds" in FedSPUParams.synchronous_only
    for bad in ({"rate": 0}, {"rate": 1.5}, {"tier_rates": {"rpi4": 0}}, {"tier_rates": [0.2]}, {"val_fraction": 1}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            FedSPUParams(**bad)
    with pytest.raises(TimingUnsupported, match="device tier"):
        FedSPUServer.timing_payload(FedSPUParams(), {"": ArchShape(10)})
    assert FedSPUClient.unbatched_reason() and MoonClient.unbatched_reason() and FedNTDClient.unbatched_reason()


# ------------------------------------------------------------------ HeteroFL
def test_heterofl_positions_are_the_leading_blocks_of_the_widest():
    wide, narrow = MLP((6,), 3, hidden=[8]), MLP((6,), 3, hidden=[8], width=0.5)
    pos = nested_positions(wide, narrow)
    want = [*range(0, 24), *range(48, 52), *[56 + r * 8 + c for r in range(3) for c in range(4)], 80, 81, 82]
    assert pos.tolist() == want
    # a convolution's sub-model: the first channels, and after the flatten the first channels' features
    big, small = FashionCNN(), FashionCNN(width=0.5)
    p = nested_positions(big, small)
    assert len(p) == count_parameters(small) and np.array_equal(flat(big)[p].shape, flat(small).shape)
    with pytest.raises(ValueError, match="leading block"):
        nested_positions(narrow, wide)


def test_heterofl_averages_each_parameter_over_the_clients_that_hold_it_in_float64():
    for weighting in ("uniform", "samples"):
        torch.manual_seed(0)
        models = {"wide": MLP((6,), 3, hidden=[8]), "half": MLP((6,), 3, hidden=[8], width=0.5)}
        server = HeteroFLServer(HeteroFLParams(weighting=weighting), models, 0)
        glob = flat(models["wide"]).astype(np.float64)
        assert np.array_equal(flat(models["half"]), flat(models["wide"])[server.positions["half"]])  # sliced
        rng = np.random.default_rng(1)
        ups = [("wide", 10), ("half", 30), ("half", 20)]
        results = [ClientResult(i, a, Payload({"state": rng.normal(size=len(server.positions[a])).astype(np.float32)},
                                              0), n, 0.0) for i, (a, n) in enumerate(ups)]
        server.aggregate(0, results)
        total, weight = np.zeros_like(glob), np.zeros_like(glob)
        for res in results:
            w = res.num_samples if weighting == "samples" else 1.0
            for k, where in enumerate(server.positions[res.arch]):
                total[where] += w * float(res.upload.arrays["state"][k])
                weight[where] += w
        want = np.where(weight > 0, total / np.where(weight > 0, weight, 1), glob)
        assert_close(flat(models["wide"]), want)
        assert np.array_equal(flat(models["half"]), flat(models["wide"])[server.positions["half"]])


def test_heterofl_asynchronous_fedbuff_averages_each_parameters_delta_over_the_updates_holding_it():
    from algorithms.asynchronous import AsyncUpdate, StepRule

    torch.manual_seed(0)
    models = {"wide": MLP((6,), 3, hidden=[8]), "half": MLP((6,), 3, hidden=[8], width=0.5)}
    server = HeteroFLServer(HeteroFLParams(), models, 0)
    glob = flat(models["wide"]).astype(np.float64)
    rng = np.random.default_rng(2)
    ups = []
    for arch, s in (("wide", 1.0), ("half", 0.5)):
        base = flat(models[arch]).astype(np.float64) + rng.normal(size=len(server.positions[arch])) * 0.01
        state = (base + rng.normal(size=base.size) * 0.1).astype(np.float32)
        ups.append(AsyncUpdate(ClientResult(0, arch, Payload({"state": state}, 0), 5, 0.0), base, 0, 1, s, 0))
    server.async_step(0, ups, StepRule("fedbuff", server_lr=0.8))
    total, weight = np.zeros_like(glob), np.zeros_like(glob)
    for u in ups:
        pos = server.positions[u.result.arch]
        total[pos] += u.weight * (u.result.upload.arrays["state"].astype(np.float64) - u.base)
        weight[pos] += 1.0
    assert_close(flat(models["wide"]), glob + 0.8 * np.where(weight > 0, total / np.maximum(weight, 1), 0))


# ------------------------------------------------------------------ the reference's Fashion-MNIST CNN
class ReferenceFashionCNN(torch.nn.Module):
    """FedCSPACK's reference ``CNNMNIST_BIG`` as its code writes it (system/model/models.py), for comparison."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = torch.nn.Dropout2d()
        self.fc1 = torch.nn.Linear(320, 256)
        self.fc2 = torch.nn.Linear(256, 50)
        self.fc = torch.nn.Linear(50, num_classes)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return self.fc(self.fc2(x))


def test_the_fashion_cnn_is_the_references_layer_for_layer():
    from algorithms.batched_training import has_randomness

    ours, ref = build_model("fmnist_cnn", (1, 28, 28), 10), ReferenceFashionCNN()
    assert count_parameters(ours) == count_parameters(ref) == 100_816
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in ref.named_parameters()]
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    ours.eval(), ref.eval()
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-6)
    ours.train(), ref.train()
    for seed in (1, 2):  # the same dropout draws from the same seed (the engine seeds each client)
        torch.manual_seed(seed)
        a = ours(x)
        torch.manual_seed(seed)
        b = ref(x)
        assert torch.allclose(a, b, atol=1e-6)
    torch.manual_seed(1)
    assert not torch.allclose(ours(x), a)  # another draw: dropout is on in training
    assert has_randomness(ours)  # executor.batch_clients trains its clients one by one
    assert count_parameters(build_model("fmnist_cnn", (1, 28, 28), 62)) == 100_816 - 510 + 51 * 62
    with pytest.raises(ValueError, match="width"):
        build_model("fmnist_cnn", (1, 28, 28), 10, width=0)


def test_a_narrow_model_scales_its_hidden_outputs_only_while_training():
    wide = MLP((4,), 3, hidden=[4])
    narrow = MLP((4,), 3, hidden=[4], width=0.5)
    assert [n for n, _ in wide.named_parameters()] == [n for n, _ in narrow.named_parameters()]
    narrow.eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        h = torch.relu(narrow.net[1](x))
        assert torch.allclose(narrow(x), narrow.net[3](h))
        narrow.train()
        assert torch.allclose(narrow(x), narrow.net[3](h / 0.5))
    assert math.isclose(FashionCNN(width=0.25).conv1.out_channels, 3)
