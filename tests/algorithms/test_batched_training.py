"""executor.batch_clients: many clients trained together with torch.func give each client the
result of its own sequential local_sgd, up to float32 reordering (tolerance stated in
docs/gpu.md: relative error of a client's update <= 1e-5 on well-conditioned training; the
checks below use that bound, or bit equality where the kernels are the same)."""
import copy

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn

from algorithms.base import ClientContext, TrainSettings
from algorithms.batched_training import BatchJob, draw_batches, has_randomness, train_batched
from algorithms.training import flat_params, local_sgd
from engine.clients.host import ClientFailure
from engine.config.schema import load_config
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import run_experiment

SIZES = [7, 16, 23, 40, 3]  # batch 8: 1, 2, 3, 5 and 1 steps per epoch; partial last batches


def tiny_bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 3))


def client_data():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(sum(SIZES), 1, 6, 6, generator=gen)
    y = torch.randint(0, 3, (sum(SIZES),), generator=gen)
    offsets = np.cumsum([0, *SIZES])
    ids = [torch.arange(offsets[i], offsets[i + 1]) for i in range(len(SIZES))]
    return x, y, ids


def perturbed_starts(model, n):
    """Each client starts from its own model (personalization) with its own BN statistics."""
    starts = []
    for c in range(n):
        m = copy.deepcopy(model)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * c * torch.sin(torch.arange(p.numel(), dtype=torch.float32)).view_as(p))
            m[1].running_mean.fill_(0.1 * c)
            m[1].num_batches_tracked.fill_(c)
        starts.append(m)
    return starts


@pytest.mark.parametrize("momentum,weight_decay,mu,epochs",
                         [(0.0, 0.0, 0.0, 1), (0.9, 1e-3, 0.0, 2), (0.5, 0.0, 0.1, 2)])
def test_each_client_gets_its_sequential_local_sgd(momentum, weight_decay, mu, epochs):
    model = tiny_bn_net()
    x, y, ids = client_data()
    starts = perturbed_starts(model, len(SIZES))
    settings = TrainSettings(local_epochs=epochs, batch_size=8, lr=0.05, momentum=momentum,
                             weight_decay=weight_decay)
    jobs, sequential, rng_after, reference = [], [], [], []
    for c, (start, train_ids) in enumerate(zip(starts, ids)):
        seq_model = copy.deepcopy(start)
        ctx = ClientContext(client_id=c, round=0, arch="", model=seq_model, state={},
                            train_x=x[train_ids], train_y=y[train_ids], rng=np.random.default_rng(c),
                            train=settings, flops_per_sample=1.0)
        centre = flat_params(seq_model) if mu > 0 else None
        loss, seen = local_sgd(ctx, prox_center=centre, prox_mu=mu)
        sequential.append((seq_model, loss, seen))
        ref_model = copy.deepcopy(start).double()  # the float64 reference of the same training
        ref_ctx = ClientContext(client_id=c, round=0, arch="", model=ref_model, state={},
                                train_x=x[train_ids].double(), train_y=y[train_ids],
                                rng=np.random.default_rng(c), train=settings, flops_per_sample=1.0)
        local_sgd(ref_ctx, prox_center=flat_params(ref_model).double() if mu > 0 else None, prox_mu=mu)
        reference.append(torch.cat([p.detach().reshape(-1) for p in ref_model.parameters()]))
        rng_after.append(ctx.rng.bit_generator.state)
        rng = np.random.default_rng(c)
        batches = draw_batches(rng, train_ids, settings.batch_size, epochs)
        assert rng.bit_generator.state == rng_after[-1]  # the same draws as local_sgd
        jobs.append(BatchJob({n: p.detach().clone() for n, p in start.named_parameters()},
                             {n: b.detach().clone() for n, b in start.named_buffers()}, batches))
    updates = train_batched(copy.deepcopy(model), jobs, x, y, lr=settings.lr, momentum=momentum,
                            weight_decay=weight_decay, prox_mu=mu)
    assert len(updates) == len(SIZES)
    # in float64 the batched algorithm *is* the sequential one: equal to ~1e-15
    jobs64 = [BatchJob({n: p.double() for n, p in j.params.items()},
                       {n: b.double() if b.is_floating_point() else b for n, b in j.buffers.items()},
                       j.batches) for j in jobs]
    updates64 = train_batched(copy.deepcopy(model).double(), jobs64, x.double(), y, lr=settings.lr,
                              momentum=momentum, weight_decay=weight_decay, prox_mu=mu)
    for c, (upd, ref) in enumerate(zip(updates64, reference)):
        w0 = flat_params(starts[c]).double()
        w = torch.cat([upd.params[n].reshape(-1) for n, _ in model.named_parameters()])
        assert float((w - ref).norm() / (ref - w0).norm()) <= 1e-12, c
    for c, (upd, (seq_model, loss, seen)) in enumerate(zip(updates, sequential)):
        assert upd.seen == seen == epochs * SIZES[c]  # every sample, whatever the client's size
        w0 = flat_params(starts[c]).double()
        ws = flat_params(seq_model).double()
        wb = torch.cat([upd.params[n].reshape(-1) for n, _ in seq_model.named_parameters()]).double()
        assert float((wb - ws).norm() / (ws - w0).norm()) <= 1e-5, c
        # ... which is float32 rounding: batched is about as far from float64 as sequential is
        wr = reference[c]
        assert float((wb - wr).norm()) <= 10 * max(float((ws - wr).norm()), 1e-7 * float((wr - w0).norm())), c
        assert upd.loss == pytest.approx(loss, rel=1e-6, abs=1e-7)
        for n, b in seq_model.named_buffers():
            if b.is_floating_point():
                torch.testing.assert_close(upd.buffers[n], b, rtol=1e-5, atol=1e-6)
            else:  # num_batches_tracked: one per step, exactly
                assert int(upd.buffers[n]) == int(b) == c + epochs * -(-SIZES[c] // 8)


def test_applying_an_update_checks_it_is_the_training_fit_asked_for():
    model = tiny_bn_net()
    x, y, ids = client_data()
    rng = np.random.default_rng(0)
    job = BatchJob({n: p.detach().clone() for n, p in model.named_parameters()},
                   {n: b.detach().clone() for n, b in model.named_buffers()},
                   draw_batches(rng, ids[1], 8, 1))
    (upd,) = train_batched(copy.deepcopy(model), [job], x, y, lr=0.05)
    upd.rng_state = rng.bit_generator.state
    ctx = ClientContext(client_id=1, round=0, arch="", model=model, state={}, train_x=x[ids[1]],
                        train_y=y[ids[1]], rng=rng, train=TrainSettings(batch_size=8), flops_per_sample=1.0,
                        pretrained=upd)
    with pytest.raises(RuntimeError, match=r"prox_mu=0\.1, but the batch was trained with prox_mu=0\.0"):
        local_sgd(ctx, prox_center=flat_params(model), prox_mu=0.1)
    upd.used = False
    rng.integers(10)  # the method drew from ctx.rng before training
    with pytest.raises(RuntimeError, match=r"drew from ctx\.rng between receive\(\) and local_sgd\(\)"):
        local_sgd(ctx)
    assert has_randomness(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)))
    assert not has_randomness(model)


# ---------------------------------------------------------------- through the engine

BASE = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=10", "clients.participation=0.6",
        "clients.profiles={}", "partition.alpha=0.3", "rounds=3"]


def both_runs(tmp_path, *extra):
    """The same experiment sequential and batched; checks the batched one did batch."""
    import algorithms.batched_training as bt

    calls = []
    real = bt.train_batched

    def spy(model, jobs, *args, **kw):
        calls.append(len(jobs))
        return real(model, jobs, *args, **kw)

    runs = []
    for batch in (False, True):
        cfg = load_config(None, [*BASE, *extra, f"executor.batch_clients={batch}"])
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(bt, "train_batched", spy)
            runs.append(load_run(run_experiment(cfg, tmp_path / f"b{batch}")))
        assert bool(calls) == batch and all(n > 1 for n in calls)
    return runs


def without_wall(df):
    return df.drop(columns=list(WALL_COLUMNS), errors="ignore")


FEDBUFF = "asynchronous={mode: fedbuff, concurrency: 6, buffer_size: 3}"


@pytest.mark.parametrize("algorithm,extra", [
    ("{name: fedavg}", ()),
    ("{name: fedprox, mu: 0.05}", ()),
    ("{name: fedcspack, pack_size: 64, k: 0.3}", ()),
    ("{name: fedavg_compressed, compressor: randomk, k: 0.1}", ()),
    ("{name: ascend, reward: v2}", ()),
    ("{name: ascend, reward: v1, policy: exp3}", ()),
    ("{name: ascend}", ()),  # v3: its local probe held out of the batched training too
    ("{name: fedprox, mu: 0.05}", (FEDBUFF,)),  # asynchronous: a wave of clients trains together
    ("{name: fedavg_compressed, compressor: topk, k: 0.1}", (FEDBUFF,)),
])
def test_batched_runs_equal_sequential_runs_on_the_cpu(tmp_path, algorithm, extra):
    seq, bat = both_runs(tmp_path, f"algorithm={algorithm}", "train.momentum=0.5", "train.local_epochs=2",
                         "partition.public_fraction=0.1", *extra)
    # clients of different sizes (Dirichlet 0.3), so different numbers of steps
    assert seq.clients["num_samples"].nunique() > 3
    # bytes and everything discrete are equal; metrics within float32 reordering (here the
    # MLP's batched matmuls give bit-equal updates on this CPU; the bound is what we promise)
    exact = ["bytes_up", "bytes_down", "num_arrived", "num_samples", "train_flops", "compress_ops"]
    for col in exact:
        for a, b in ((seq.rounds, bat.rounds), (seq.clients, bat.clients)):
            if col in a:
                assert a[col].fillna(-1).tolist() == b[col].fillna(-1).tolist(), col
    pd.testing.assert_frame_equal(without_wall(seq.rounds), without_wall(bat.rounds), rtol=1e-5, atol=1e-6)
    pd.testing.assert_frame_equal(without_wall(seq.clients), without_wall(bat.clients), rtol=1e-5, atol=1e-6)
    if "fedcspack" in algorithm:
        assert seq.clients["packs_shared"].fillna(-1).tolist() == bat.clients["packs_shared"].fillna(-1).tolist()


def test_ascend_v3_and_fedcspack_batched_make_the_same_discrete_choices(tmp_path, monkeypatch):
    """A few rounds of each: the same arms (ASCEND v3, epsilon-greedy past its warm-up) and the
    same pack masks (FedCSPACK: the indices each upload shares), the tables within tolerance."""
    from algorithms.fedcspack import FedCSPACKServer

    masks = {False: [], True: []}
    batched = [False]
    plain = FedCSPACKServer.aggregate

    def aggregate(self, round, results):
        masks[batched[0]].extend((round, r.client_id, r.upload.arrays["idx"].tolist()) for r in results)
        return plain(self, round, results)

    monkeypatch.setattr(FedCSPACKServer, "aggregate", aggregate)
    common = ["train.momentum=0.5", "partition.public_fraction=0.1", "rounds=5"]
    seq, bat = both_runs(tmp_path / "a", "algorithm={name: ascend, warmup: 0, eps_min: 0.3, k: 0.1}", *common)
    ran = seq.clients["arm_label"].notna()
    assert (seq.clients.loc[ran, "arm_reason"] != "warmup").sum() >= 20  # choices past the warm-up
    assert seq.clients.loc[ran, "arm_label"].nunique() > 1
    for col in ("arm_label", "arm_reason", "num_samples", "bytes_up"):
        assert seq.clients[col].fillna(-1).tolist() == bat.clients[col].fillna(-1).tolist(), col
    for col in ("phi", "psi", "reward", "train_loss"):
        np.testing.assert_allclose(bat.clients[col], seq.clients[col], rtol=1e-5, atol=1e-6, err_msg=col)
    pd.testing.assert_frame_equal(without_wall(seq.rounds), without_wall(bat.rounds), rtol=1e-5, atol=1e-6)

    for flag in (False, True):
        batched[0] = flag
        cfg = load_config(None, [*BASE, "algorithm={name: fedcspack, pack_size: 64, k: 0.3}", *common,
                                 f"executor.batch_clients={flag}"])
        run_experiment(cfg, tmp_path / f"f{flag}")
    assert masks[False] and masks[False] == masks[True]


def test_a_round_that_trains_one_by_one_says_why_once_per_run(tmp_path):
    """executor.batch_clients: a host with a single client of an architecture, or a model with
    dropout, trains sequentially; the driver says so once per reason, not every round, in its log
    and in the run's manifest."""
    import logging

    from engine.loop.batching import UnbatchedNotice
    from engine.results.manifest import read_manifest

    class TwoHosts:
        def host_of(self, ids):
            return np.asarray(ids) % 2

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("hetsim")
    logger.addHandler(handler)
    try:
        models = {"small": nn.Sequential(nn.Linear(2, 2)), "drop": nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))}
        notice = UnbatchedNotice(True, ["small", "drop"], np.array([0, 0, 0, 0, 1, 1]), models)
        notice.check(TwoHosts(), [0, 2], "round 0")  # two of 'small' on host 0: batched
        assert lines == []
        notice.check(TwoHosts(), [0, 1, 2], "round 1")  # host 1 has one
        notice.check(TwoHosts(), [1, 3, 0], "round 2")  # host 0 has one: not said again
        assert len(lines) == 1 and "round 1 gave a client host a single client of architecture 'small' (client 1)" \
            in lines[0]
        notice.check(TwoHosts(), [4, 5], "round 3")
        notice.check(TwoHosts(), [4, 5], "round 4")
        assert len(lines) == 2 and "architecture 'drop' has dropout" in lines[1]
        assert [f"hetsim: warning: {w}" for w in notice.warnings] == lines
        UnbatchedNotice(False, ["small"], np.zeros(3, dtype=int), models).check(TwoHosts(), [0], "round 0")
        assert len(lines) == 2  # batch_clients off: nothing to say
        # asynchronous FedBuff: after the first wave, clients are dispatched one at a time
        path = run_experiment(load_config(None, [*BASE, FEDBUFF, "executor.batch_clients=true"]), tmp_path / "r")
        said = [w for w in read_manifest(path)["warnings"] if "single client" in w]
        assert len(said) == 1 and said[0].startswith("executor.batch_clients: wave 1 gave a client host a single")
        assert sum("single client" in line for line in lines) == 2  # this run's one line
    finally:
        logger.removeHandler(handler)


def test_batched_convolutions_match_within_the_stated_tolerance(tmp_path):
    """A CNN: batched convolutions sum in another order than one client's do."""
    extra = ["dataset.name=mnist5k", "model.name=cnn", "clients.num_clients=6", "clients.participation=0.5",
             "train.lr=0.01", "rounds=2", "dataset.params={}"]
    seq, bat = both_runs(tmp_path, *extra)
    assert seq.clients["bytes_up"].fillna(-1).tolist() == bat.clients["bytes_up"].fillna(-1).tolist()
    for col in ("global_acc", "global_loss", "train_loss", "pers_acc"):
        np.testing.assert_allclose(bat.rounds[col], seq.rounds[col], rtol=1e-4, atol=1e-5, err_msg=col)


def test_batched_runs_are_deterministic(tmp_path):
    runs = [load_run(run_experiment(load_config(None, [*BASE, "executor.batch_clients=true",
                                                        "train.momentum=0.9"]), tmp_path / str(i)))
            for i in range(2)]
    pd.testing.assert_frame_equal(without_wall(runs[0].clients), without_wall(runs[1].clients))
    pd.testing.assert_frame_equal(without_wall(runs[0].rounds), without_wall(runs[1].rounds))


def test_a_method_drawing_randomness_before_training_cannot_be_batched(tmp_path, monkeypatch):
    from algorithms.fedavg import FedAvgClient

    plain_fit = FedAvgClient.fit

    def fit(self, ctx, broadcast):
        ctx.rng.integers(10)  # a draw the batched data order could not have seen
        return plain_fit(self, ctx, broadcast)

    monkeypatch.setattr(FedAvgClient, "fit", fit)
    cfg = load_config(None, [*BASE, "executor.batch_clients=true", "rounds=1"])
    with pytest.raises(ClientFailure, match=r"failed in round 0: RuntimeError: batch_clients: the method drew"):
        run_experiment(cfg, tmp_path / "r")
