"""FedNova, SCAFFOLD and the FedOpt family against their papers: each update rule equals an
independent float64 reference written from the paper's equations (one step with known inputs,
<= 1e-6 relative), and on convex problems whose fixed points are known: FedNova removes the
objective inconsistency FedAvg shows when clients do different numbers of local steps (Wang et
al., 2020), SCAFFOLD follows centralised gradient descent on a quadratic and converges to its
optimum where FedAvg drifts (Karimireddy et al., 2020)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms.base import Client, ClientContext, ClientResult, Payload, ServerContext, TrainSettings
from algorithms.fedavg import FedAvgClient, FedAvgServer
from algorithms.fednova import FedNovaClient, FedNovaServer, a_norm
from algorithms.fedopt import FedOptServer
from algorithms.heterogeneity_params import FedNovaParams, FedOptParams, ScaffoldParams
from algorithms.params import FedAvgParams
from algorithms.scaffold import ScaffoldClient, ScaffoldServer
from algorithms.training import flat_buffers, flat_params, flat_state, load_flat_params

RTOL = 1e-6


def rel_err(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-12)))


def result(cid: int, n: int, **arrays) -> ClientResult:
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}
    return ClientResult(cid, "", Payload(arrays, 4 * sum(a.size for a in arrays.values())), n, 0.0)


def model_at(x: np.ndarray | None, bn: bool = False) -> torch.nn.Module:
    """A linear layer 4 -> 3 (15 parameters; with BatchNorm 21, and 6 floating buffers) at ``x``."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), *([torch.nn.BatchNorm1d(3)] if bn else []))
    if x is not None:
        load_flat_params(m, x)
    return m


def context(num_clients: int) -> ServerContext:
    return ServerContext(num_clients=num_clients, client_arch=np.array([""] * num_clients, dtype=object))


# ---------------------------------------------------------------- FedNova
def test_fednova_step_equals_the_papers_normalised_averaging():
    """x+ = x - tau_eff sum_i p_i (x - y_i) / ||a_i||_1, tau_eff = sum_i p_i ||a_i||_1 (Wang et al.,
    2020, eq. (6) with FedNova's default tau_eff); BatchNorm buffers: FedAvg's weighted mean."""
    rng = np.random.default_rng(1)
    model = model_at(rng.normal(size=21).astype(np.float32), bn=True)
    with torch.no_grad():  # buffers that are not their defaults
        model[1].running_mean.copy_(torch.tensor([0.1, -0.2, 0.3]))
    x = flat_params(model).double().numpy()
    d, nb = x.size, flat_buffers(model).numel()
    assert (d, nb) == (21, 6)
    n, a = np.array([10, 30, 60]), np.array([3.0, 7.5, 1.0])
    states = rng.normal(size=(3, d + nb)).astype(np.float32)
    server = FedNovaServer(FedNovaParams(name="fednova"), {"": model}, 0, context(3))
    metrics = server.aggregate(0, [result(i, n[i], state=states[i], a=[a[i]]) for i in range(3)])
    p = n / n.sum()
    y = states[:, :d].astype(np.float64)
    tau_eff = float(p @ a)
    ref = x - tau_eff * np.sum(p[:, None] * (x - y) / a[:, None], axis=0)
    assert rel_err(flat_params(model), ref) <= RTOL
    assert rel_err(flat_buffers(model), p @ states[:, d:].astype(np.float64)) <= RTOL
    assert metrics == {"tau_eff": pytest.approx(tau_eff)}


@pytest.mark.parametrize(("tau", "rho"), [(1, 0.0), (7, 0.0), (7, 0.5), (20, 0.9)])
def test_fednova_a_norm_is_the_papers_for_momentum_sgd_and_what_local_sgd_does(tau, rho):
    """||a_i||_1 = sum_k (1 - rho^(tau-k)) / (1 - rho) (the paper's a for momentum SGD), and local
    momentum SGD on a linear objective (a constant gradient g) moves w by exactly -lr ||a||_1 g."""
    ref = tau if rho == 0 else sum((1 - rho ** (tau - k)) / (1 - rho) for k in range(tau))
    assert abs(a_norm(tau, rho) - ref) <= 1e-12 * ref
    g = torch.tensor([0.5, -1.25, 2.0])
    model = torch.nn.Linear(3, 1, bias=False)
    start = flat_params(model).double()

    class Linear(FedNovaClient):
        def batch_loss(self, ctx, model, x, y):
            return (model.weight.reshape(-1) * g).sum()

    ctx = ClientContext(0, 0, "", model, {}, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long),
                        np.random.default_rng(0), TrainSettings(local_steps=tau, batch_size=4, lr=0.01, momentum=rho),
                        1.0)
    res = Linear(FedNovaParams(name="fednova")).fit(ctx, None)
    moved = (flat_params(model).double() - start).numpy()
    assert rel_err(moved, -0.01 * ref * g.double().numpy()) <= 1e-5  # float32 steps
    assert ctx.steps_done == tau and rel_err(res.upload.arrays["a"], [ref]) <= RTOL
    assert res.upload.nbytes == 4 * (flat_state(model).numel() + 1)  # the model and ||a||: counted


# ---------------------------------------------------------------- SCAFFOLD
def softmax_ce_grad(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gradient of the mean cross-entropy of softmax(x w^T + b) (float64, closed form)."""
    z = x @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p.T @ x / len(y), p.mean(0)


def test_scaffold_client_corrects_every_step_and_updates_its_control_variate_by_option_two():
    """K full-batch steps y <- y - lr (g_i(y) - c_i + c); c_i+ = c_i - c + (x - y) / (K lr); the
    upload carries y and dc_i = c_i+ - c_i (twice FedAvg's bytes); train_loss is the cross-entropy."""
    rng = np.random.default_rng(2)
    model = model_at(rng.normal(size=15).astype(np.float32) * 0.3)
    x_in, y_in = rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 3, 8)
    c, ci = rng.normal(size=15) * 0.1, rng.normal(size=15) * 0.1
    k, lr = 3, 0.2
    broadcast = Payload({"state": flat_state(model).numpy(), "control": c.astype(np.float32)}, 0)
    state = {"control": ci.astype(np.float32)}
    ctx = ClientContext(0, 0, "", model, state, torch.from_numpy(x_in), torch.from_numpy(y_in),
                        np.random.default_rng(0), TrainSettings(local_steps=k, batch_size=8, lr=lr), 1.0)
    client = ScaffoldClient(ScaffoldParams(name="scaffold"))
    client.receive(ctx, broadcast)
    res = client.fit(ctx, broadcast)
    c64, ci64 = c.astype(np.float32).astype(np.float64), ci.astype(np.float32).astype(np.float64)
    w = broadcast.arrays["state"].astype(np.float64)
    x0, xs, losses = w.copy(), x_in.astype(np.float64), []
    for _ in range(k):
        z = xs @ w[:12].reshape(3, 4).T + w[12:]
        top = z.max(1)
        losses.append(np.mean(np.log(np.exp(z - top[:, None]).sum(1)) + top - z[np.arange(8), y_in]))
        gw, gb = softmax_ce_grad(w[:12].reshape(3, 4), w[12:], xs, y_in)
        w = w - lr * (np.concatenate([gw.reshape(-1), gb]) - ci64 + c64)
    assert rel_err(flat_params(model), w) <= 1e-5  # three float32 steps
    ci_new = ci64 - c64 + (x0 - flat_params(model).double().numpy()) / (k * lr)
    assert rel_err(res.upload.arrays["dcontrol"], ci_new - ci64) <= 1e-5
    assert rel_err(state["control"], ci_new) <= RTOL
    assert res.upload.nbytes == 4 * (15 + 15)
    assert rel_err(res.metrics["train_loss"], np.mean(losses)) <= 1e-5  # the cross-entropy, not the linear term
    client.on_dropped(state, 0)  # the server never heard of it: c_i is back
    assert np.array_equal(state["control"], ci.astype(np.float32))


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_scaffold_server_step_equals_the_paper(weighting):
    """x+ = x + eta_g mean_S(y_i - x) (the paper; or sample-weighted), c+ = c + (1/N) sum_S dc_i."""
    rng = np.random.default_rng(3)
    model = model_at(rng.normal(size=15).astype(np.float32))
    x = flat_params(model).double().numpy()
    params = ScaffoldParams(name="scaffold", server_lr=0.7, weighting=weighting)
    server = ScaffoldServer(params, {"": model}, 0, context(10))
    server.control[""] = rng.normal(size=15)
    c = server.control[""].copy()
    n = np.array([5, 20, 75])
    ys, dcs = rng.normal(size=(3, 15)).astype(np.float32), rng.normal(size=(3, 15)).astype(np.float32)
    server.aggregate(0, [result(i, n[i], state=ys[i], dcontrol=dcs[i]) for i in range(3)])
    w = np.full(3, 1 / 3) if weighting == "uniform" else n / n.sum()
    assert rel_err(flat_params(model), x + 0.7 * (w @ (ys.astype(np.float64) - x))) <= RTOL
    assert rel_err(server.control[""], c + dcs.astype(np.float64).sum(0) / 10) <= RTOL
    assert server.broadcast(1)[""].nbytes == 4 * (15 + 15)  # the model and c: counted


# ---------------------------------------------------------------- FedOpt
def reddi_reference(opt: str, x, deltas, eta, b1, b2, tau):
    """Reddi et al. (2021), Algorithm 2 (and FedAvgM for momentum), written out per round."""
    m, v = np.zeros_like(x), np.full_like(x, tau ** 2)
    for delta in deltas:
        if opt == "sgd":
            x = x + eta * delta
            continue
        if opt == "momentum":
            m = b1 * m + delta
            x = x + eta * m
            continue
        m = b1 * m + (1 - b1) * delta
        if opt == "adam":
            v = b2 * v + (1 - b2) * delta ** 2
        elif opt == "yogi":
            v = v - (1 - b2) * delta ** 2 * np.sign(v - delta ** 2)
        else:
            v = v + delta ** 2
        x = x + eta * m / (np.sqrt(v) + tau)
    return x


@pytest.mark.parametrize("opt", ["sgd", "momentum", "adam", "yogi", "adagrad"])
def test_fedopt_steps_equal_reddi_et_al(opt):
    """Three rounds (the moments matter) of the pseudo-gradient Delta = sum_i p_i (y_i - x)."""
    rng = np.random.default_rng(4)
    model = model_at(rng.normal(size=15).astype(np.float32))
    params = FedOptParams(name="fedopt", server_optimizer=opt, server_lr=0.3, beta1=0.8, beta2=0.95, tau=0.05)
    server = FedOptServer(params, {"": model}, 0, context(3))
    x = flat_params(model).double().numpy()
    n = np.array([10, 20, 40])
    p = n / n.sum()
    deltas = []
    for r in range(3):
        cur = flat_params(model).double().numpy()
        ys = (cur + rng.normal(size=(3, 15)) * 0.1).astype(np.float32)
        server.aggregate(r, [result(i, n[i], state=ys[i]) for i in range(3)])
        deltas.append(p @ (ys.astype(np.float64) - cur))
        ref = reddi_reference(opt, x, deltas, 0.3, 0.8, 0.95, 0.05)
        assert rel_err(flat_params(model), ref) <= RTOL, r
    assert set(server.checkpoint_fields) == {"moment", "variance"}
    assert ("" in server.moment) == (opt != "sgd") and ("" in server.variance) == (opt in ("adam", "yogi", "adagrad"))


# ---------------------------------------------------------------- convex problems
class Quadratic(Client):
    """f_i(w) = 1/2 sum_j h_ij (w_j - e_ij)^2: a client's local objective, whatever its batch."""

    targets: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def batch_loss(self, ctx, model, x, y):
        e, h = self.targets[ctx.client_id]
        return 0.5 * (h * (model.weight.reshape(-1) - e) ** 2).sum()


class QuadFedAvg(FedAvgClient):
    targets: dict = {}

    def batch_loss(self, ctx, model, x, y):
        return Quadratic.batch_loss(self, ctx, model, x, y)


class QuadFedNova(FedNovaClient):
    targets: dict = {}

    def batch_loss(self, ctx, model, x, y):
        return Quadratic.batch_loss(self, ctx, model, x, y)


class QuadScaffold(ScaffoldClient, Quadratic):  # SCAFFOLD's correction on top of the quadratic
    pass


def run_rounds(client, server, model, steps, samples, lr, rounds) -> list[np.ndarray]:
    """``rounds`` rounds of every client (full participation); the global weights after each."""
    states = {i: {} for i in range(len(steps))}
    out = []
    workspace = torch.nn.Linear(model.in_features, 1, bias=False)
    for r in range(rounds):
        b = server.broadcast(r)[""]
        results = []
        for i, (k, n) in enumerate(zip(steps, samples)):
            ctx = ClientContext(i, r, "", workspace, states[i], torch.zeros(n, model.in_features),
                                torch.zeros(n, dtype=torch.long), np.random.default_rng([r, i]),
                                TrainSettings(local_steps=k, batch_size=n, lr=lr), 1.0)
            client.receive(ctx, b)
            results.append(client.fit(ctx, b))
        server.aggregate(r, results)
        out.append(flat_params(model).double().numpy())
    return out


def test_fednova_removes_the_objective_inconsistency_fedavg_shows_when_local_steps_differ():
    """Two clients with f_i = 1/2 ||w - e_i||^2, equal data, tau = 1 and 10 local GD steps of lr.
    FedAvg's fixed point weights e_i by 1 - (1 - lr)^tau_i: it is biased towards the client doing
    more steps; FedNova's weights them by (1 - (1 - lr)^tau_i) / tau_i = lr + O(lr^2 tau): it
    converges to the optimum of the true objective up to O(lr tau)."""
    e = [torch.tensor([0.0, 0.0]), torch.tensor([1.0, 2.0])]
    targets = {i: (e[i], torch.ones(2)) for i in range(2)}
    QuadFedAvg.targets = QuadFedNova.targets = targets
    tau, lr, p = np.array([1, 10]), 0.01, np.array([0.5, 0.5])
    optimum = (p[0] * e[0] + p[1] * e[1]).numpy()

    def fixed_point(weights):
        w = p * weights
        return (w[0] * e[0].numpy() + w[1] * e[1].numpy()) / w.sum()

    shrink = 1 - (1 - lr) ** tau
    ends = {}
    for name, client_cls, server_cls, params in (
            ("fedavg", QuadFedAvg, FedAvgServer, FedAvgParams()),
            ("fednova", QuadFedNova, FedNovaServer, FedNovaParams(name="fednova"))):
        model = torch.nn.Linear(2, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        ends[name] = run_rounds(client_cls(params), server_cls(params, {"": model}, 0, context(2)), model, tau,
                                [8, 8], lr, 250)[-1]
    np.testing.assert_allclose(ends["fedavg"], fixed_point(shrink), atol=1e-4)
    np.testing.assert_allclose(ends["fednova"], fixed_point(shrink / tau), atol=1e-4)
    err_avg, err_nova = (np.linalg.norm(ends[k] - optimum) for k in ("fedavg", "fednova"))
    assert err_avg > 0.8  # far off: (0.905, 1.81) instead of (0.5, 1)
    assert err_nova < 0.03 and err_nova < err_avg / 30


def quadratic_problem(n_clients: int = 4, dim: int = 3):
    rng = np.random.default_rng(5)
    e = rng.normal(size=(n_clients, dim)) * 2
    h = rng.uniform(0.5, 2.0, size=(n_clients, dim))
    targets = {i: (torch.tensor(e[i], dtype=torch.float32), torch.tensor(h[i], dtype=torch.float32))
               for i in range(n_clients)}
    e32, h32 = e.astype(np.float32).astype(np.float64), h.astype(np.float32).astype(np.float64)
    return targets, e32, h32


def test_scaffold_with_one_local_step_is_centralised_gradient_descent():
    """K = 1, eta_g = 1, every client every round: c stays the mean of the c_i, so each round is
    x <- x - lr (1/N) sum_i grad f_i(x), centralised GD on the mean of the quadratics."""
    targets, e, h = quadratic_problem()
    QuadScaffold.targets = targets
    params = ScaffoldParams(name="scaffold")
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    lr = 0.1
    got = run_rounds(QuadScaffold(params), ScaffoldServer(params, {"": model}, 0, context(4)), model, [1] * 4,
                     [8] * 4, lr, 30)
    x = np.zeros(3)
    for r in range(30):
        x = x - lr * np.mean(h * (x - e), axis=0)
        assert rel_err(got[r], x) <= 1e-5, r


def test_scaffold_converges_to_the_optimum_of_the_quadratics_where_fedavg_drifts():
    """K = 10 local steps on heterogeneous curvatures: FedAvg's fixed point is biased (client
    drift); SCAFFOLD's control variates remove the drift and it converges to the minimiser of
    (1/N) sum_i f_i, sum_i h_i e_i / sum_i h_i per coordinate, as centralised GD does."""
    targets, e, h = quadratic_problem()
    QuadScaffold.targets = QuadFedAvg.targets = targets
    optimum = (h * e).sum(0) / h.sum(0)
    ends = {}
    for name, client_cls, server_cls, params in (
            ("fedavg", QuadFedAvg, FedAvgServer, FedAvgParams()),
            ("scaffold", QuadScaffold, ScaffoldServer, ScaffoldParams(name="scaffold"))):
        model = torch.nn.Linear(3, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        ends[name] = run_rounds(client_cls(params), server_cls(params, {"": model}, 0, context(4)), model, [10] * 4,
                                [8] * 4, 0.05, 80)[-1]
    assert rel_err(ends["scaffold"], optimum) <= 1e-4
    assert np.linalg.norm(ends["fedavg"] - optimum) > 0.05
