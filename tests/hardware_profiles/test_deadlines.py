"""Deadline policies (hardware_profiles.deadlines): each against a case computed by hand.

The fleet: 10 clients, all online, none drops out, no latency, 1 GFLOP/s; client i trains
(i + 1) GFLOP and moves no bytes, so its upload ends exactly i + 1 seconds after the round's start.
"""
import numpy as np
import pytest

from engine.config.schema import load_config
from engine.errors import ConfigError
from hardware_profiles.clock import RoundPolicy, resolve_round
from hardware_profiles.deadlines import (
    AdaptiveDeadline,
    CutoffDeadline,
    DeadlineTracker,
    PercentileDeadline,
    kth_arrival,
    next_cutoff,
)
from hardware_profiles.round_clock import RoundClock
from hardware_profiles.sampler import assign_profiles

N = 10
TOTALS = np.arange(1.0, N + 1)  # seconds after the start, client i: i + 1


def _clock(deadline=None, **clock):
    profiles = assign_profiles({"availability": 1.0, "dropout": 0.0}, N, seed=0)
    profiles.gflops[:] = 1.0
    profiles.latency_s[:] = 0.0
    return RoundClock(profiles, RoundPolicy(deadline=deadline, **clock), seed=0)


def _round(clock, r, target=N):
    """One round of every client; returns (its deadline, the ids kept, the round's seconds)."""
    start = clock.begin(r, np.arange(N))
    sent = {"bytes_down": np.zeros(N), "bytes_up": np.zeros(N), "train_flops": TOTALS * 1e9,
            "compress_ops": np.zeros(N)}
    timing = clock.time(start, sent, None, target)
    np.testing.assert_array_equal(timing.times["total_s"], TOTALS)
    kept = start.runnable[timing.outcome.made_deadline]
    round_s = clock.advance(start, timing, arrived=len(kept), target=target)
    assert set(timing.outcome.drop_reason[~timing.outcome.made_deadline]) <= {"deadline"}
    return timing.deadline_s, kept.tolist(), round_s


def test_fixed_is_deadline_s_under_its_long_name():
    for clock in (_clock(deadline_s=5.0), _clock({"policy": "fixed", "seconds": 5.0})):
        assert _round(clock, 0) == (5.0, [0, 1, 2, 3, 4], 5.0)  # 6..10 s late; the server waits to 5 s


def test_percentile_closes_the_round_at_the_arrival_that_makes_the_share():
    # 80 % of 10 dispatched: the 8th arrival, at 8 s; 25 %: ceil(2.5) = the 3rd, at 3 s
    assert _round(_clock({"policy": "percentile", "percent": 80}), 0) == (8.0, list(range(8)), 8.0)
    assert _round(_clock({"policy": "percentile", "percent": 25}), 0) == (3.0, [0, 1, 2], 3.0)
    assert _round(_clock({"policy": "percentile", "percent": 100}), 0) == (10.0, list(range(10)), 10.0)
    # capped: min(8 s, max_s 5 s)
    assert _round(_clock({"policy": "percentile", "percent": 80, "max_s": 5}), 0) == (5.0, list(range(5)), 5.0)


def test_percentile_counts_only_uploads_that_can_arrive():
    # client 1 (2 s) goes offline at 1.5 s, client 4 (5 s) runs empty at 0.5 s: the arrivals are
    # 1, 3, 4, 6, 7, ... s, so 30 % of 10 (3 uploads) arrive at 4 s
    gone = np.full(N, np.inf)
    gone[1], gone[4] = 1.5, 0.5
    tracker = DeadlineTracker(PercentileDeadline(percent=30))
    assert tracker.deadline(0.0, TOTALS, gone) == 4.0
    assert kth_arrival(TOTALS, gone, 3) == (4.0, 10.0)
    # more than can arrive (9 of 10 here with 2 gone): max_s, or none (the last arrival ends it)
    assert DeadlineTracker(PercentileDeadline(percent=90)).deadline(0.0, TOTALS, gone) is None
    assert DeadlineTracker(PercentileDeadline(percent=90, max_s=7.5)).deadline(0.0, TOTALS, gone) == 7.5


def test_adaptive_learns_a_quantile_of_the_kept_arrivals_with_a_margin():
    clock = _clock({"policy": "adaptive", "quantile": 0.5, "margin": 1.5, "window": 2})
    # round 0: nothing seen, no initial_s: no deadline, all 10 arrive (1..10 s)
    assert _round(clock, 0) == (None, list(range(10)), 10.0)
    # round 1: 1.5 x median(1..10) = 1.5 x 5.5 = 8.25 s: 9 and 10 s are late, the server waits to 8.25
    assert _round(clock, 1) == (8.25, list(range(8)), 8.25)
    # round 2: 1.5 x median(1..10, 1..8) = 1.5 x 5 = 7.5 s (18 values: the 9th and 10th are 5)
    assert _round(clock, 2) == (7.5, list(range(7)), 7.5)
    # round 3: window 2 forgets round 0: 1.5 x median(1..8, 1..7) = 1.5 x 4 = 6 s (the 8th of 15)
    assert _round(clock, 3) == (6.0, list(range(6)), 6.0)


def test_adaptive_starts_from_initial_s_and_survives_a_checkpoint():
    clock = _clock({"policy": "adaptive", "quantile": 1.0, "margin": 1.0, "initial_s": 3.0})
    assert _round(clock, 0) == (3.0, [0, 1, 2], 3.0)
    again = _clock({"policy": "adaptive", "quantile": 1.0, "margin": 1.0, "initial_s": 3.0})
    again.restore(clock.state())
    assert _round(again, 1)[0] == _round(clock, 1)[0] == 3.0  # max of 1, 2, 3 s, times 1


def test_cutoff_closes_rounds_on_the_wall_of_virtual_time():
    # cutoffs at 1, 5, 9, ... s after Monday 00:00 (every 4 s, offset 1 s); clock.start 00:00
    clock = _clock({"policy": "cutoff", "every_s": 4, "offset_s": 1})
    assert _round(clock, 0) == (1.0, [0], 1.0)  # 0 -> 1 s: only the 1 s upload
    assert clock.sim_time_s == 1.0
    # starts at 1 s, a cutoff instant itself: it closes at the next one, 5 s (4 s after its start)
    assert _round(clock, 1) == (4.0, [0, 1, 2, 3], 4.0)
    assert _round(clock, 2) == (4.0, [0, 1, 2, 3], 4.0)  # 5 s -> 9 s
    assert clock.sim_time_s == 9.0


def test_cutoff_waits_for_min_reporting_uploads():
    # the cutoff at 1 s has one upload; min_reporting 3 waits for the 3rd, at 3 s
    clock = _clock({"policy": "cutoff", "every_s": 4, "offset_s": 1, "min_reporting": 3})
    assert _round(clock, 0) == (3.0, [0, 1, 2], 3.0)
    # starts at 3 s: the cutoff at 5 s is 2 s away, before the 3rd upload (3 s): it waits to 3 s
    assert _round(clock, 1) == (3.0, [0, 1, 2], 3.0)


def test_next_cutoff_is_strictly_after_the_start():
    assert next_cutoff(0.0, 4.0, 1.0) == 1.0
    assert next_cutoff(1.0, 4.0, 1.0) == 5.0
    assert next_cutoff(0.1 + 0.2, 0.1, 0.0) > 0.1 + 0.2  # 0.30000000000000004 on a grid of 0.1
    assert next_cutoff(86_400.0 + 3_600.0, 86_400.0, 7_200.0) == 86_400.0 + 7_200.0  # Tue 01:00 -> 02:00
    assert next_cutoff(86_400.0 + 7_200.0, 86_400.0, 7_200.0) == 2 * 86_400.0 + 7_200.0  # -> Wed 02:00


def test_resolve_round_takes_the_round_deadline_over_the_policy():
    times = {"total_s": TOTALS}
    policy = RoundPolicy(deadline_s=100.0)
    out = resolve_round(times, np.arange(N), policy, deadline_s=2.5)
    assert out.made_deadline.tolist() == [True, True] + [False] * 8
    assert resolve_round(times, np.arange(N), policy).made_deadline.all()  # default: the policy's
    assert resolve_round(times, np.arange(N), policy, deadline_s=None).made_deadline.all()


@pytest.mark.parametrize(("deadline", "message"), [
    ({"policy": "percentile", "percent": 0}, "clock.deadline.percent"),
    ({"policy": "adaptive", "window": 0}, "clock.deadline.window"),
    ({"policy": "cutoff", "every_s": 60, "offset_s": 60}, "offset_s=60.0 is not allowed: must be < every_s"),
    ({"policy": "soon"}, "allowed: adaptive, cutoff, fixed, percentile"),
])
def test_a_bad_policy_is_refused_naming_the_field(deadline, message):
    with pytest.raises(ConfigError, match="clock.deadline") as err:
        load_config(None, {"clock.deadline": deadline})
    assert message in str(err.value)


def test_policies_that_close_rounds_are_refused_for_asynchronous_runs():
    for deadline in ({"policy": "percentile", "percent": 50}, {"policy": "adaptive"},
                     {"policy": "cutoff", "every_s": 60}):
        with pytest.raises(ConfigError, match=f"clock.deadline.policy = '{deadline['policy']}'"):
            load_config(None, {"clock.deadline": deadline, "asynchronous": {}})
    load_config(None, {"clock.deadline": {"policy": "fixed", "seconds": 9}, "asynchronous": {}})


def test_a_policy_is_a_config_value_for_sweeps():
    cfg = load_config(None, ["clock.deadline={policy: cutoff, every_s: 3600}"])
    assert cfg.clock.deadline == CutoffDeadline(every_s=3600) and cfg.clock.per_round_deadline == "cutoff"
    assert load_config(cfg.to_dict()).clock.deadline == cfg.clock.deadline  # config.yaml round trip
    assert AdaptiveDeadline().quantile == 0.9
