"""The toolbox's selection policies on views with known inputs: power-of-choice (Cho et al., 2020),
Oort (Lai et al., 2021) and availability/battery-aware selection; what each picks and why."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from algorithms.selection import ClientHistory, SelectionView, checked_selection
from algorithms.selectors import AvailableFirst, AvailableFirstParams, Oort, OortParams, PowD, PowDParams

N = 10


def view(round=5, count=3, candidates=None, seed=0, gflops=None, samples=None, online=None, battery=None,
         history=None) -> SelectionView:
    profiles = SimpleNamespace(gflops=np.asarray(gflops if gflops is not None else np.linspace(1, 10, N)))
    return SelectionView(round=round, count=count, num_clients=N, candidates=candidates,
                         rng=np.random.default_rng(seed), profiles=profiles,
                         train_samples=np.asarray(samples if samples is not None else np.full(N, 50)),
                         now_s=0.0, history=history or ClientHistory(N),
                         _online=None if online is None else (lambda ids: np.asarray(online)[ids]),
                         _battery=None if battery is None else (lambda ids: np.asarray(battery, dtype=float)[ids]))


def heard(losses, durations=None, last_round=4) -> ClientHistory:
    h = ClientHistory(N)
    ids = np.flatnonzero(~np.isnan(losses))
    d = np.ones(N) if durations is None else np.asarray(durations, dtype=float)
    h.record(last_round, ids, np.ones(len(ids), bool), d[ids], d[ids] / 2, np.asarray(losses)[ids])
    return h


# ---------------------------------------------------------------- pow_d
def test_pow_d_keeps_the_highest_losses_of_d_candidates_drawn_by_data_size():
    losses = np.linspace(0.1, 1.0, N)
    samples = np.arange(1, N + 1) * 10
    v = view(count=3, samples=samples, history=heard(losses))
    sel = checked_selection("pow_d", PowD(PowDParams(name="pow_d", d=6), N, 0).select(v), v)
    drawn = np.random.default_rng(0).choice(np.arange(N), size=6, replace=False, p=samples / samples.sum())
    expected = drawn[np.argsort(-losses[drawn], kind="stable")[:3]]
    assert sorted(sel.ids.tolist()) == sorted(expected.tolist())
    assert np.allclose(np.sort(sel.score), np.sort(losses[expected]))
    assert set(sel.reason) == {"highest last loss of 6 drawn"}


def test_pow_d_tries_a_client_never_heard_from_first_and_takes_idle_candidates_asynchronously():
    losses = np.full(N, 0.5)
    losses[7] = np.nan  # never ran
    v = view(count=2, history=heard(losses), seed=3)
    policy = PowD(PowDParams(name="pow_d", d=N, sampling="uniform"), N, 0)
    sel = checked_selection("pow_d", policy.select(v), v)
    assert 7 in sel.ids and sel.reason[sel.ids.tolist().index(7)].startswith("never ran")
    idle = np.array([1, 4, 8])
    v = view(count=2, candidates=idle, history=heard(losses))
    assert set(checked_selection("pow_d", policy.select(v), v).ids) <= set(idle)


# ---------------------------------------------------------------- oort
def test_oort_utility_is_statistical_utility_with_staleness_bonus_times_the_system_penalty():
    """U_i = n_i L_i + sqrt(0.1 ln(r + 1) / (r_i + 1)), times (T / t_i)^alpha when t_i > T; T the
    median of the measured durations."""
    losses = np.linspace(0.2, 2.0, N)
    durations = np.linspace(1.0, 10.0, N)
    samples = np.arange(N) + 20
    v = view(round=8, samples=samples, history=heard(losses, durations, last_round=3))
    ids = np.arange(N)
    got = Oort(OortParams(name="oort"), N, 0).utility(v, ids)
    t_pref = np.median(durations)
    ref = samples * losses + math.sqrt(0.1 * math.log(9) / 4)
    ref = np.where(durations > t_pref, ref * (t_pref / durations) ** 2, ref)
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_oort_explores_by_speed_first_then_exploits_high_utility_fast_clients():
    fresh = view(round=0, count=4)
    policy = Oort(OortParams(name="oort"), N, 0)
    sel = checked_selection("oort", policy.select(fresh), fresh)
    assert len(sel.ids) == 4 and set(sel.reason) == {"explore: never heard from"}
    # later: everyone heard from; equal losses, but clients 0-4 are 10x slower than 5-9
    durations = np.where(np.arange(N) < 5, 50.0, 5.0)
    for seed in range(20):  # the slow ones: (T / 50)^2 = 0.3 of the utility (T the median, 27.5 s), below the cut-off
        late = view(round=200, count=3, seed=seed, history=heard(np.ones(N), durations))
        sel = checked_selection("oort", policy.select(late), late)
        assert set(sel.reason) == {"exploit: utility"} and (sel.ids >= 5).all(), (seed, sel.ids)


def test_oort_gives_epsilon_of_the_count_to_exploration_while_there_are_clients_to_explore():
    losses = np.where(np.arange(N) < 6, 1.0, np.nan)  # 6 heard from, 4 never
    p = OortParams(name="oort", exploration=0.9, exploration_decay=0.5, exploration_min=0.25)
    for r, explore in ((0, 4), (1, 2), (5, 1)):  # eps 0.9 (4 of 4 cap), 0.45 -> 2, min 0.25 -> 1
        v = view(round=r, count=4, history=heard(losses))
        sel = checked_selection("oort", Oort(p, N, 0).select(v), v)
        assert list(sel.reason).count("explore: never heard from") == explore, r
        assert (sel.ids[np.array(sel.reason) == "explore: never heard from"] >= 6).all()


def test_oort_chooses_among_the_clients_online_now_unless_told_the_whole_fleet():
    """Oort's coordinator chooses among the clients that check in; pow_d (the paper does not model
    availability) only with online_only."""
    online = np.arange(N) >= 4
    for seed in range(10):
        v = view(round=seed, count=3, seed=seed, online=online, history=heard(np.where(online, 1.0, 5.0)))
        assert online[checked_selection("oort", Oort(OortParams(name="oort"), N, 0).select(v), v).ids].all()
        pow_d = PowD(PowDParams(name="pow_d", online_only=True), N, 0)
        assert online[checked_selection("pow_d", pow_d.select(v), v).ids].all()
    everyone = Oort(OortParams(name="oort", online_only=False, exploration_min=0.0), N, 0)
    v = view(round=200, count=3, online=online, history=heard(np.where(online, 1.0, 5.0)))
    assert not online[checked_selection("oort", everyone.select(v), v).ids].any()  # offline: higher losses


# ---------------------------------------------------------------- available_first
def test_available_first_picks_only_clients_online_now_and_prefers_full_batteries():
    online = np.arange(N) % 3 != 0  # 0, 3, 6, 9 offline
    v = view(count=4, online=online)
    sel = checked_selection("available_first", AvailableFirst(AvailableFirstParams(name="available_first"), N, 0)
                            .select(v), v)
    assert online[sel.ids].all() and len(sel.ids) == 4 and sel.reason == "online now"
    battery = np.where(np.arange(N) < 5, 0.05, 0.95)
    battery[8] = np.nan  # mains-powered: counts as full
    counts = np.zeros(N)
    policy = AvailableFirst(AvailableFirstParams(name="available_first", battery_exponent=2.0), N, 0)
    for seed in range(200):
        v = view(count=2, seed=seed, online=online, battery=battery)
        sel = checked_selection("available_first", policy.select(v), v)
        counts[sel.ids] += 1
        assert online[sel.ids].all()
    assert counts[[1, 2, 4]].sum() < 0.05 * counts.sum()  # charge 0.05: 361x less likely than 0.95
    assert counts[8] > 0


@pytest.mark.parametrize("policy", [PowD(PowDParams(name="pow_d"), N, 0), Oort(OortParams(name="oort"), N, 0),
                                    AvailableFirst(AvailableFirstParams(name="available_first"), N, 0)])
def test_each_policy_picks_from_the_idle_candidates_of_an_asynchronous_wave(policy):
    idle = np.array([2, 5, 7])
    v = view(count=2, candidates=idle, online=np.ones(N, bool), history=heard(np.full(N, 0.3)))
    sel = checked_selection(type(policy).__name__, policy.select(v), v)
    assert set(sel.ids) <= set(idle) and len(sel.ids) == 2
