"""FedCSPACK and ASCEND in asynchronous mode (docs/async.md, "Methods"): the rules, each rebuilt
from what the run records, the synchronous limit, and the refusals that remain."""
import numpy as np
import pandas as pd
import pytest
import torch

from algorithms.asynchronous import async_methods, client_state, synchronous_only
from algorithms.compressed_fedavg import decode_upload
from algorithms.fedcspack import aggregate_packs
from algorithms.params import ALGORITHM_PARAMS
from algorithms.training import flat_params, flat_state
from engine.config.schema import load_config
from engine.errors import ConfigError
from engine.loop.simulation import Simulation
from engine.results.tables import load_run
from engine.run.api import run_experiment

BASE = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=6", "checkpoint.every=0",
        "partition.scheme=iid", "clock.apply_availability=false", "clock.apply_dropout=false"]
STRAGGLERS = "clients.profiles={network: {5mbps: 0.5, 500mbps: 0.5}}"
PACKS = "algorithm={name: fedcspack, pack_size: 64, record_packs: true}"
ASCEND = ("algorithm={name: ascend, distill_steps: 4, distill_batch: 32, public_probe_size: 64, probe_batches: 1}",
          "partition.public_fraction=0.1")


def config(tmp_path, *over):
    return load_config(None, [*BASE, f"output.dir={tmp_path}", *over])


def test_every_method_of_the_table_validates_asynchronously_and_the_others_are_refused(tmp_path):
    """async_methods() is what the config accepts under asynchronous (with each method's defaults);
    a method outside it is refused naming the reason its params class gives (synchronous_only)."""
    assert {"fedcspack", "ascend"} <= set(async_methods())
    for name in ALGORITHM_PARAMS:
        over = [f"algorithm.name={name}", "partition.public_fraction=0.1",
                "asynchronous={concurrency: 4, buffer_size: 2}"]
        if name in async_methods():
            assert config(tmp_path, *over).asynchronous.concurrency == 4
        else:
            with pytest.raises(ConfigError, match=f"algorithm.name = '{name}' cannot run asynchronously: "
                                                  f"{synchronous_only(name)[:20]}"):
                config(tmp_path, *over)


def test_stale_pack_aggregation_is_the_documented_formula():
    """W_j += sum_i (M_ij / M_j) c_i D_ij, M_j = sum_i M_ij (not scaled): P = 2, three packs."""
    glob = torch.tensor([1.0, 1.0, 2.0, 2.0, 3.0])
    a = ([0, 1], [1.0, 3.0], [[1.0, 1.0], [4.0, 4.0]])
    b = ([1, 2], [1.0, 2.0], [[8.0, 0.0], [2.0, 2.0]])
    new, mask, weights = aggregate_packs(glob, 2, [a, b], scales=[1.0, 0.5])
    # pack 0: only a (c = 1): 1 + 1; pack 1: (3/4) 1 [4, 4] + (1/4) 0.5 [8, 0] = [4, 3];
    # pack 2: only b (c = 0.5): 3 + 0.5 * 2 (the padding value is cut)
    assert new.tolist() == [2.0, 2.0, 6.0, 5.0, 4.0]
    assert mask.tolist() == [0, 1, 2] and weights.tolist() == [1.0, 4.0, 2.0]
    same, _, _ = aggregate_packs(glob, 2, [a, b])
    assert torch.equal(same, aggregate_packs(glob, 2, [a, b], scales=[1.0, 1.0])[0])
    with pytest.raises(ValueError, match="scales: 1 values for 2 uploads"):
        aggregate_packs(glob, 2, [a, b], scales=[1.0])


class Steps:
    """Records every asynchronous step of a server: its updates and the models before and after."""

    def __init__(self, server):
        self.server, self.original, self.steps = server, server.async_step, []
        server.async_step = self

    def __call__(self, step, updates, rule):
        before = {a: flat_state(m).clone() for a, m in self.server.models.items()}
        out = self.original(step, updates, rule)
        after = {a: flat_state(m).clone() for a, m in self.server.models.items()}
        self.steps.append((step, updates, rule, before, after))
        return out


def test_fedcspack_fedbuff_step_rebuilds_from_the_recorded_uploads(tmp_path):
    """Every step, recomputed in numpy from the updates it got (their packs, mask weights, deltas
    and staleness), is the model the server holds; stale updates took part."""
    cfg = config(tmp_path, STRAGGLERS, PACKS, "rounds=6",
                 "asynchronous={concurrency: 5, buffer_size: 2, server_lr: 0.8, staleness: {kind: polynomial, a: 1.0}}")
    sim = Simulation(cfg)
    sim.start()
    steps = Steps(sim.server)
    records = [sim.run_round(r) for r in range(6)]
    p = 64
    for _, updates, rule, before, after in steps.steps:
        assert (rule.mode, rule.server_lr) == ("fedbuff", 0.8)
        w = before[""].numpy().astype(np.float64)
        n = len(flat_params(sim.server.models[""]))
        packs = -(-n // p)
        num, mass = np.zeros((packs, p)), np.zeros(packs)
        for u in updates:
            s = (1.0 + u.staleness) ** -1.0  # polynomial, a = 1
            assert u.weight == pytest.approx(s)
            arrays = u.result.upload.arrays
            num[arrays["idx"]] += arrays["w"][:, None].astype(np.float64) * 0.8 * s * arrays["delta"]
            mass[arrays["idx"]] += arrays["w"]
        step_w = np.divide(num, mass[:, None], out=np.zeros_like(num), where=mass[:, None] > 0)
        expected = w[:n] + step_w.reshape(-1)[:n]
        assert np.abs(expected - after[""].numpy()[:n]).max() < 1e-6
        assert (after[""].numpy()[n:] == before[""].numpy()[n:]).all()  # no buffers travel
    assert max(u.staleness for s in steps.steps for u in s[1]) > 0  # stale updates were aggregated
    # the tables: each step's packs are those of the updates it applied, the mask their sums
    rows = pd.DataFrame([c for rec in records for c in rec.client_rows])
    applied = rows[rows["made_deadline"]]
    assert np.allclose(applied["staleness_weight"], (1.0 + applied["staleness"]) ** -1.0)
    packs_t = pd.concat([pd.DataFrame(rec.extra_tables["packs"]) for rec in records])
    mask_t = pd.concat([pd.DataFrame(rec.extra_tables["global_mask"]) for rec in records])
    assert (packs_t.groupby("round")["client_id"].agg(lambda c: sorted(set(c)))
            == applied.groupby("round")["client_id"].agg(sorted)).all()
    sums = packs_t.groupby(["round", "pack"])["weight"].sum()
    mask = mask_t.set_index(["round", "pack"])["weight"]
    assert np.allclose(mask.sort_index(), sums.sort_index(), rtol=1e-6)


def test_ascend_fedbuff_step_rebuilds_from_the_recorded_uploads(tmp_path):
    """With distillation off (0 steps) and no rollback, an ASCEND step is FedBuff over the decoded
    compressed deltas: w + server_lr sum_i (m_i / sum m) s_i delta_i."""
    cfg = config(tmp_path, STRAGGLERS, "partition.public_fraction=0.1", "rounds=5",
                 "algorithm={name: ascend, distill_steps: 0, gamma: null, public_probe_size: 64, probe_batches: 1}",
                 "asynchronous={concurrency: 5, buffer_size: 2, server_lr: 0.7, staleness: {kind: hinge, a: 1, b: 0}}")
    sim = Simulation(cfg)
    sim.start()
    steps = Steps(sim.server)
    for r in range(5):
        sim.run_round(r)
    for _, updates, _, before, after in steps.steps:
        m = np.array([u.result.num_samples for u in updates], dtype=np.float64)
        s = 1.0 / (np.array([u.staleness for u in updates]) + 1.0)  # hinge, a = 1, b = 0
        n = decode_upload(updates[0].result.upload).numel
        deltas = np.stack([decode_upload(u.result.upload).dense().numpy() for u in updates])
        expected = before[""].numpy()[:n] + 0.7 * ((m / m.sum()) * s) @ deltas
        assert np.abs(expected - after[""].numpy()[:n]).max() < 1e-6
        # client_state is what the default step averages: the base plus the decoded delta
        assert np.allclose(client_state(updates[0].result.upload, updates[0].base, n)[:n],
                           updates[0].base[:n] + deltas[0], atol=1e-7)
    assert max(u.staleness for s in steps.steps for u in s[1]) > 0


def test_ascend_rewards_close_on_arrival_and_rebuild_from_the_clients_table(tmp_path):
    """Each update's reward is decided when the server resolves it (applied: the reward computed
    at the upload; stale or offline: -clip) and the policy learns it at the client's next
    dispatch: the row of that dispatch names the wave it closes (reward_round), whether it was
    lost, and comes after the update was resolved."""
    r = load_run(run_experiment(config(tmp_path, STRAGGLERS, *ASCEND, "rounds=8",
                                       "asynchronous={concurrency: 5, buffer_size: 2, max_staleness: 0}"),
                                tmp_path / "run"))
    c = r.clients.sort_values(["client_id", "wave"])
    assert (c["drop_reason"] == "stale").any()  # lost updates happened
    closed = 0
    for _, rows in c.groupby("client_id"):
        prev = rows.iloc[:-1].reset_index(drop=True)
        nxt = rows.iloc[1:].reset_index(drop=True)
        assert rows.iloc[0]["reward_round"] == -1  # the first participation closes nothing
        assert (nxt["reward_round"] == prev["wave"]).all()
        assert (nxt["reward_lost"] == (prev["drop_reason"] != "")).all()
        assert (nxt["start_s"] >= prev["resolved_s"]).all()  # resolved before the next dispatch
        lost = nxt[nxt["reward_lost"]]
        assert (lost["reward"] == -1.0).all()  # reward_clip
        closed += len(nxt)
    assert closed > 0


def test_ascend_measured_rewards_get_the_phase_times_of_the_clients_last_wave(tmp_path):
    """time_model: measured: the loop keeps each wave's phase times (clients.parquet's sim_*) for
    the client's next dispatch, so every reward that closes an applied update is the measured one
    (without them it would fall back to the profile's, reward_measured False)."""
    r = load_run(run_experiment(config(tmp_path, STRAGGLERS, ASCEND[1], "rounds=6",
                                       "algorithm={name: ascend, distill_steps: 2, public_probe_size: 64, "
                                       "probe_batches: 1, time_model: measured}",
                                       "asynchronous={concurrency: 5, buffer_size: 2}"), tmp_path / "run"))
    c = r.clients
    closing = c[c["reward_round"] >= 0]
    assert len(closing) > 0 and closing["reward_measured"].all()
    assert not c.loc[c["reward_round"] < 0, "reward_measured"].any()


def test_ascend_rollback_discards_exactly_the_updates_of_the_step(tmp_path):
    """A rolled-back step restores the models and names its updates by (client, wave): each of
    those clients restores its residual and policy at its next dispatch (restored_round = that
    wave), and no other client does, even one of the same wave applied in another step."""
    cfg = config(tmp_path, STRAGGLERS, ASCEND[1], "rounds=8", "train.lr=0.5",
                 "algorithm={name: ascend, distill_steps: 4, gamma: 0.0, probe_batches: 1, public_probe_size: 64, "
                 "forced_rounds: 1}", "asynchronous={concurrency: 5, buffer_size: 2}")
    sim = Simulation(cfg)
    sim.start()
    steps = Steps(sim.server)
    records = [sim.run_round(r) for r in range(8)]
    rb = pd.DataFrame([row for rec in records for row in rec.extra_tables.get("rollbacks", [])])
    rolled = set(rb.loc[rb["action"] == "rolled_back", "round"])
    assert rolled  # the test is about something
    for step, _, _, before, after in steps.steps:
        assert torch.equal(before[""], after[""]) == (step in rolled)
    c = pd.DataFrame([row for rec in records for row in rec.client_rows])
    done = c[c["made_deadline"]]
    discarded = {(int(k), int(w)) for k, w, s in zip(done["client_id"], done["wave"], done["round"]) if s in rolled}
    restored = {(int(k), int(w)) for k, w in zip(c["client_id"], c["restored_round"]) if np.isfinite(w)}
    last_wave = c.groupby("client_id")["wave"].max()
    assert restored == {(k, w) for k, w in discarded if w < last_wave[k]}  # the others were not dispatched again
    assert restored
    assert (c.loc[c["reward_round"] >= 0].apply(lambda row: (row["client_id"], row["reward_round"]), axis=1)
            .isin(restored).sum() == 0)  # a discarded update's reward is never fed to the policy


@pytest.mark.parametrize("method", ["fedcspack", "ascend"])
def test_fedbuff_with_the_whole_fleet_in_one_buffer_is_the_synchronous_method(tmp_path, method):
    """concurrency = buffer_size = every client, constant staleness, server_lr 1: each step is the
    synchronous round (wave r = round r, the same client seeds): the global models agree and, for
    ASCEND, every client chose the same arms and closed the same rewards. ASCEND without
    distillation: on one architecture the teacher is the student (a zero KL gradient), where
    Adam's normalised steps turn the float64-against-float32 rounding of the two aggregations
    (~1e-8) into lr-sized moves (measured: 1.6e-5 after 4 steps); the distillation's own rule is
    the synchronous one."""
    algo = {"fedcspack": [PACKS],
            "ascend": ["algorithm={name: ascend, distill_steps: 0, public_probe_size: 64, probe_batches: 1}",
                       ASCEND[1]]}[method]
    over = ["clients.participation=1.0", "clients.profiles={}", "rounds=3", *algo]
    sync = Simulation(config(tmp_path, *over))
    start = flat_state(sync.server.models[""]).numpy().copy()
    sync_rows = sync_records(sync)
    asyn = Simulation(config(tmp_path, *over, "asynchronous={concurrency: 6, buffer_size: 6, "
                                               "staleness: {kind: constant}}"))
    async_rows = sync_records(asyn)
    a, b = (flat_state(s.server.models[""]).numpy() for s in (sync, asyn))
    diff = float(np.abs(a - b).max())
    assert diff < 1e-6, diff  # float64 sums in another order
    assert np.abs(a - start).max() > 1e-3  # the model moved
    if method == "ascend":
        cols = ["client_id", "arm", "reward_round", "reward_arm"]
        left = sync_rows[cols].sort_values(["client_id", "reward_round"]).reset_index(drop=True)
        right = async_rows[cols].sort_values(["client_id", "reward_round"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(left, right)
        assert np.allclose(sync_rows.sort_values(["round", "client_id"])["reward"],
                           async_rows.sort_values(["round", "client_id"])["reward"], atol=1e-4, equal_nan=True)


def sync_records(sim):
    sim.start()
    return pd.DataFrame([c for r in range(3) for c in sim.run_round(r).client_rows])


@pytest.mark.parametrize("setting, message", [
    ("algorithm={name: ascend, reward: v2}", r"algorithm.reward = 'v2' cannot run asynchronously: .*allowed with "
                                             r"asynchronous: v4, v3"),
    ("algorithm={name: ascend, reward: v1}", r"algorithm.reward = 'v1' cannot run asynchronously"),
])
def test_what_remains_refused_names_the_field_the_value_and_what_is_allowed(tmp_path, setting, message):
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, "partition.public_fraction=0.1", setting, "asynchronous={concurrency: 4, buffer_size: 2}")
