"""The round clock (hardware_profiles.round_clock): begin, time and advance one round, as the
synchronous loop drives it, against the rules it composes."""
import copy

import numpy as np

from engine.config.schema import load_config
from hardware_profiles.clock import client_times, draw_participation, resolve_round
from hardware_profiles.energy import FleetBatteries, empties_at, ledger
from hardware_profiles.round_clock import RoundClock
from hardware_profiles.sampler import assign_profiles

N = 12


def _clock(**over):
    cfg = load_config({}, {"clients.num_clients": N, "clients.profiles": {
        "devices": {"phone_mid": 0.5, "laptop_cpu": 0.5}, "availability": 0.8, "dropout": 0.1,
        "battery": {"start": {"low": 0.05, "high": 0.9}}}, **over})
    profiles = assign_profiles(cfg.clients.profiles, N, seed=cfg.seed)
    batteries = FleetBatteries(cfg.clients.profiles.battery, profiles, cfg.seed)
    return cfg, profiles, RoundClock(profiles, cfg.clock, cfg.seed, None, batteries)


def _sent(k):
    return {"bytes_down": np.full(k, 4e6), "bytes_up": np.full(k, 2e6), "train_flops": np.full(k, 3e10),
            "compress_ops": np.zeros(k)}


def test_a_round_on_the_clock_is_the_rules_it_composes_and_moves_time_and_batteries_on():
    cfg, profiles, clock = _clock()
    selected = np.arange(N)
    start = clock.begin(0, selected)
    assert start.start_s == cfg.clock.start_s
    available, dropped = draw_participation(profiles, selected, cfg.seed, 0, cfg.clock)
    np.testing.assert_array_equal(start.available, available)
    np.testing.assert_array_equal(start.dropped, dropped)
    np.testing.assert_array_equal(start.low, clock.batteries.too_low(selected) & available)
    runnable = start.runnable
    assert 0 < len(runnable) < N  # some unavailable, dropped or low: the draw above decides
    np.testing.assert_array_equal(runnable, selected[available & ~start.low & ~dropped])

    expected_before = copy.deepcopy(clock.batteries)
    sent = _sent(len(runnable))
    timing = clock.time(start, sent, [0.0] * len(runnable), target=len(runnable))
    times = client_times(profiles, runnable, sent["bytes_down"], sent["bytes_up"], sent["train_flops"],
                         sent["compress_ops"])
    np.testing.assert_allclose(timing.times["total_s"], times["total_s"])
    np.testing.assert_allclose(timing.timeline["upload_end_s"] - start.start_s, times["total_s"])
    expected = resolve_round(times, runnable, cfg.clock, target_k=len(runnable),
                             empties_s=np.asarray(timing.stopped))
    np.testing.assert_array_equal(timing.outcome.made_deadline, expected.made_deadline)
    np.testing.assert_allclose(timing.energy["energy_j"], ledger(profiles, runnable, times, timing.stopped)["energy_j"])

    expected = copy.deepcopy(clock.batteries)
    round_s = clock.advance(start, timing, arrived=int(timing.outcome.made_deadline.sum()), target=len(runnable))
    assert round_s == timing.outcome.round_time_s and clock.sim_time_s == round_s
    expected.advance(round_s, runnable, timing.energy["energy_j"], np.minimum(times["total_s"], timing.stopped),
                     timing.outcome.drop_reason == "battery", start.charging)
    np.testing.assert_array_equal(clock.batteries.level, expected.level)
    assert not np.array_equal(clock.batteries.level, expected_before.level)  # the round moved them
    assert clock.begin(1, selected).start_s == cfg.clock.start_s + round_s


def test_a_missed_deadline_makes_the_server_wait_for_it():
    cfg, profiles, clock = _clock(**{"clock.deadline_s": 1.0, "clients.profiles.availability": 1.0,
                                     "clients.profiles.dropout": 0.0})
    start = clock.begin(0, np.arange(N))
    timing = clock.time(start, _sent(len(start.runnable)), [], target=len(start.runnable))
    assert not timing.outcome.made_deadline.any()  # 30 GFLOP in a second: nobody
    assert clock.advance(start, timing, arrived=0, target=len(start.runnable)) == 1.0
    assert clock.sim_time_s == 1.0


def test_asynchronous_tasks_are_resolved_one_by_one_and_a_late_one_stops_at_the_deadline():
    """The asynchronous loop's questions: each task arrives, runs empty or is abandoned at the
    deadline on its own (no round to wait for); its energy leaves the battery at dispatch."""
    battery = {"start": 1.0, "charging": "never", "idle_drain": True}
    cfg, profiles, clock = _clock(**{"clients.profiles.availability": 1.0, "clients.profiles.dropout": 0.0,
                                     "clients.profiles.battery": battery,
                                     "clients.profiles.overrides": {0: {"battery_wh": 1e-4}}})
    sent, ids = _sent(N), np.arange(N)
    times = client_times(profiles, ids, sent["bytes_down"], sent["bytes_up"], sent["train_flops"], sent["compress_ops"])
    deadline = float(np.median(times["total_s"]))  # about half the tasks are late
    clock.policy = cfg.clock.model_copy(update={"deadline_s": deadline})
    begin = clock.begin(3, ids, start_s=100.0)
    start = begin.only(np.flatnonzero(begin.run_mask))
    np.testing.assert_array_equal(start.runnable, ids)  # everyone online, charged, no dropout
    timing = clock.time_tasks(start, sent, [])

    late = times["total_s"] > deadline
    empty_s = empties_at(profiles, ids, times, clock.batteries.charge_j(ids, start.charging))
    flat = empty_s < np.minimum(times["total_s"], deadline)
    assert flat.tolist() == [True] + [False] * (N - 1)  # the 0.36 J battery only
    assert timing.lost_reason.tolist() == np.where(flat, "battery", np.where(late, "deadline", "")).tolist()
    arrives = timing.lost_reason == ""
    assert 0 < arrives.sum() < N - 1
    np.testing.assert_array_equal(timing.event_s[arrives], timing.timeline["upload_end_s"][arrives])
    np.testing.assert_allclose(timing.event_s[~arrives], 100.0 + np.where(flat, empty_s, deadline)[~arrives])
    np.testing.assert_allclose(timing.stopped, np.where(flat, empty_s, np.where(late, deadline, np.inf)))
    np.testing.assert_allclose(timing.energy["energy_j"], ledger(profiles, ids, times, timing.stopped)["energy_j"])

    expected = copy.deepcopy(clock.batteries)
    clock.spend(start, timing)
    expected.advance(0.0, ids, timing.energy["energy_j"], np.zeros(N), flat, np.zeros(N, dtype=bool))
    np.testing.assert_array_equal(clock.batteries.level, expected.level)
    assert clock.batteries.level[0] == 0.0 and clock.sim_time_s == 0.0  # the loop keeps its own time

    busy, busy_s, before = ids[:3], np.array([1.0, 2.0, 0.0]), clock.batteries.level.copy()
    clock.elapse(5.0, 4, 150.0, busy, busy_s)
    assert (clock.batteries.level[1:] < before[1:]).all()  # idle drain
    expected.advance(5.0, busy, np.zeros(3), busy_s, np.zeros(3, dtype=bool), np.zeros(N, dtype=bool))
    np.testing.assert_array_equal(clock.batteries.level, expected.level)
