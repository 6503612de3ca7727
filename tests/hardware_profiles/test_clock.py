"""Virtual clock: exact time formulas, seeded draws, round resolution."""

import numpy as np
import pytest
from pydantic import ValidationError

from hardware_profiles import (
    OPS_TO_FLOPS,
    ProfileTable,
    RoundPolicy,
    assign_profiles,
    client_times,
    client_uniforms,
    compute_seconds,
    draw_availability,
    draw_dropout,
    draw_participation,
    resolve_round,
    round_seconds,
    transfer_seconds,
)


def table(n=4, **cols):
    base = dict(gflops=10.0, down_mbps=8.0, up_mbps=8.0, latency_s=0.0, memory_gb=1.0,
                availability=1.0, dropout=0.0)
    kw = {f: np.broadcast_to(np.asarray(cols.get(f, v), dtype=float), (n,)).copy() for f, v in base.items()}
    return ProfileTable(**kw, tier=[""] * n, net_tier=[""] * n)


# --------------------------------------------------------------- formulas


def test_one_megabyte_at_8_mbps_is_one_second_plus_latency():
    assert transfer_seconds(1e6, 8.0, 0.0) == 1.0
    assert transfer_seconds(1e6, 8.0, 0.25) == 1.25
    t = client_times(table(1, latency_s=0.05), [0], bytes_down=1e6, bytes_up=1e6, train_flops=0)
    assert t["download_s"][0] == pytest.approx(1.05, abs=1e-12)
    assert t["upload_s"][0] == pytest.approx(1.05, abs=1e-12)


def test_compute_and_compress_exact():
    assert compute_seconds(2e10, 10.0) == 2.0  # flops / (gflops * 1e9)
    assert OPS_TO_FLOPS == 1.0
    p = table(2, gflops=[10.0, 40.0], down_mbps=[8.0, 80.0], up_mbps=[16.0, 8.0], latency_s=[0.0, 0.1])
    t = client_times(p, [0, 1], bytes_down=1e6, bytes_up=[2e6, 1e6], train_flops=2e10, compress_ops=[1e9, 4e9])
    assert t["compute_s"].tolist() == [2.0, 0.5]
    assert t["compress_s"].tolist() == [0.1, 0.1]
    np.testing.assert_allclose(t["download_s"], [1.0, 0.2])
    np.testing.assert_allclose(t["upload_s"], [1.0, 1.1])
    np.testing.assert_allclose(t["total_s"], [4.1, 1.9])
    assert set(t) == {"download_s", "compute_s", "compress_s", "upload_s", "total_s"}


def test_client_times_subset_and_order_follow_ids():
    p = table(4, gflops=[1.0, 2.0, 4.0, 8.0])
    t = client_times(p, [3, 0], 0, 0, 8e9)
    assert t["compute_s"].tolist() == [1.0, 8.0]
    with pytest.raises(IndexError, match="client id 4"):
        client_times(p, [4], 0, 0, 1)
    with pytest.raises(ValueError, match="bytes_down"):
        client_times(p, [0, 1], [1, 2, 3], 0, 1)
    with pytest.raises(ValueError, match="train_flops"):
        client_times(p, [0], 0, 0, -1)


def test_measured_mode_compute():
    pol = RoundPolicy(mode="measured", host_to_device_ratio=4.0)
    host = np.array([0.5, 1.0])
    t = client_times(table(2), [0, 1], 0, 0, 1e12, measured_compute_s=pol.measured_compute_s(host))
    assert t["compute_s"].tolist() == [2.0, 4.0]
    assert RoundPolicy(mode="realtime", time_scale=0.01).realtime_sleep_s(100.0) == 1.0


# --------------------------------------------------------------- policy


def test_policy_validation_and_selection_count():
    assert RoundPolicy().mode == "virtual" and RoundPolicy().deadline_s is None
    assert RoundPolicy(over_selection=1.3).num_to_select(10) == 13
    assert RoundPolicy(over_selection=1.1).num_to_select(10) == 11  # float fuzz
    assert RoundPolicy(over_selection=1.25).num_to_select(10) == 13
    assert RoundPolicy(over_selection=2.0).num_to_select(10, pool_size=15) == 15
    for bad in (dict(over_selection=0.9), dict(deadline_s=0), dict(host_to_device_ratio=0),
                dict(time_scale=-1), dict(mode="wallclock"), dict(bogus=1)):
        with pytest.raises(ValidationError):
            RoundPolicy(**bad)


# --------------------------------------------------------------- draws


def test_draws_reproducible_and_batch_independent():
    n = 2000
    p = assign_profiles({"availability": 0.5, "dropout": 0.3}, n, 0)
    ids = np.arange(n)
    a = draw_availability(p, ids, seed=11, round=3)
    assert np.array_equal(a, draw_availability(p, ids, seed=11, round=3))
    # subset, reversed and shuffled batches give the same per-client draw
    sub = np.random.default_rng(0).permutation(n)[:137]
    assert np.array_equal(draw_availability(p, sub, 11, 3), a[sub])
    assert np.array_equal(draw_availability(p, ids[::-1], 11, 3), a[::-1])
    for cid in (0, 5, 1999):
        assert draw_availability(p, [cid], 11, 3)[0] == a[cid]
    d = draw_dropout(p, ids, 11, 3)
    assert np.array_equal(draw_dropout(p, sub, 11, 3), d[sub])
    # different round / seed → different draws; streams are independent
    assert not np.array_equal(a, draw_availability(p, ids, 11, 4))
    assert not np.array_equal(a, draw_availability(p, ids, 12, 3))
    assert abs(np.mean(a) - 0.5) < 0.05 and abs(np.mean(d) - 0.3) < 0.05
    assert abs(np.mean(a & d) - 0.15) < 0.03


def test_draw_probabilities_follow_profile():
    n = 4
    p = table(n, availability=[0.0, 1.0, 0.0, 1.0], dropout=[1.0, 0.0, 0.0, 1.0])
    for r in range(5):
        assert draw_availability(p, range(n), 1, r).tolist() == [False, True, False, True]
        assert draw_dropout(p, range(n), 1, r).tolist() == [True, False, False, True]


def test_uniforms_look_uniform():
    u = client_uniforms(np.arange(200_000), seed=0, round=0, salt=1)
    hist, _ = np.histogram(u, bins=10, range=(0, 1))
    assert np.all(np.abs(hist / 20_000 - 1) < 0.05)
    # neighbouring ids are not correlated
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01
    with pytest.raises(ValueError):
        client_uniforms([0], seed=-1, round=0, salt=0)


def test_participation_applies_the_policy_switches():
    p = table(4, availability=[0.0, 1.0, 0.0, 1.0], dropout=[1.0, 0.0, 0.0, 1.0])
    a, d = draw_participation(p, range(4), 1, 0, RoundPolicy())
    assert a.tolist() == [False, True, False, True] and d.tolist() == [True, False, False, True]
    a, d = draw_participation(p, range(4), 1, 0, RoundPolicy(apply_availability=False))
    assert a.all() and d.tolist() == [True, False, False, True]
    a, d = draw_participation(p, range(4), 1, 0, RoundPolicy(apply_dropout=False))
    assert a.tolist() == [False, True, False, True] and not d.any()


def test_the_server_waits_out_the_deadline_only_for_a_needed_lost_client():
    pol = RoundPolicy(deadline_s=10.0)
    late = resolve_round(T([1.0, 20.0]), [0, 1], pol)
    assert late.round_time_s == 1.0
    # a late client was needed for the target of 2: the server cannot tell it from a slow one
    assert round_seconds(late, pol, dropped_in_flight=False, arrived=1, target=2) == 10.0
    assert round_seconds(late, pol, dropped_in_flight=False, arrived=1, target=1) == 1.0
    fine = resolve_round(T([1.0, 2.0]), [0, 1], pol)
    assert round_seconds(fine, pol, dropped_in_flight=True, arrived=2, target=3) == 10.0  # a dropout
    assert round_seconds(fine, pol, dropped_in_flight=False, arrived=2, target=3) == 2.0
    assert round_seconds(fine, RoundPolicy(), dropped_in_flight=True, arrived=2, target=3) == 2.0


# --------------------------------------------------------------- resolution


def T(total):
    return {"total_s": np.asarray(total, dtype=float)}


def test_deadline_drops_exactly_the_late_clients():
    total = [1.0, 5.0, 5.0000001, 2.0, 9.0]
    out = resolve_round(T(total), [10, 11, 12, 13, 14], RoundPolicy(deadline_s=5.0))
    assert out.made_deadline.tolist() == [True, True, False, True, False]
    assert out.drop_reason.tolist() == ["", "", "deadline", "", "deadline"]
    assert out.round_time_s == 5.0  # slowest client that made it
    assert out.client_ids[out.made_deadline].tolist() == [10, 11, 13]
    assert np.count_nonzero(out.drop_reason == "deadline") == 2


def test_no_deadline_waits_for_all():
    out = resolve_round(T([3.0, 7.0]), [0, 1], RoundPolicy())
    assert out.made_deadline.all() and out.round_time_s == 7.0


def test_over_selection_keeps_fastest_k():
    total = [4.0, 1.0, 3.0, 2.0, 2.0, 10.0]
    ids = [0, 1, 2, 3, 4, 5]
    pol = RoundPolicy(over_selection=1.5)
    assert pol.num_to_select(4) == 6  # 6 selected, the fastest 4 kept
    out = resolve_round(T(total), ids, pol, target_k=4)
    assert out.made_deadline.tolist() == [False, True, True, True, True, False]
    assert out.drop_reason.tolist() == ["over_selected", "", "", "", "", "over_selected"]
    assert out.round_time_s == 3.0
    # ties broken by lower client id
    out = resolve_round(T([2.0, 2.0, 2.0]), [9, 3, 5], RoundPolicy(), target_k=2)
    assert out.made_deadline.tolist() == [False, True, True]


def test_reason_precedence_and_flags():
    total = [1.0, 1.0, 9.0, 9.0, 2.0, 3.0]
    avail = [False, True, True, False, True, True]
    dropped = [True, True, False, True, False, False]
    pol = RoundPolicy(deadline_s=5.0)
    out = resolve_round(T(total), range(6), pol, available=avail, dropped=dropped, target_k=1)
    assert out.drop_reason.tolist() == ["unavailable", "dropout", "deadline", "unavailable", "", "over_selected"]
    assert out.round_time_s == 2.0
    # flags off: availability/dropout ignored
    pol = RoundPolicy(deadline_s=5.0, apply_availability=False, apply_dropout=False)
    out = resolve_round(T(total), range(6), pol, available=avail, dropped=dropped)
    assert out.drop_reason.tolist() == ["", "", "deadline", "deadline", "", ""]


def test_nobody_made_it():
    out = resolve_round(T([9.0, 8.0]), [0, 1], RoundPolicy(deadline_s=5.0))
    assert not out.made_deadline.any() and out.round_time_s == 5.0
    out = resolve_round(T([1.0]), [0], RoundPolicy(), available=[False])
    assert out.round_time_s == 0.0 and out.drop_reason.tolist() == ["unavailable"]
    out = resolve_round(T([]), [], RoundPolicy())
    assert out.round_time_s == 0.0 and out.made_deadline.size == 0


def test_end_to_end_10k_clients():
    n = 10_000
    p = assign_profiles({"devices": {"rpi4": 0.5, "laptop_cpu": 0.5},
                         "network": {"5mbps": 0.5, "500mbps": 0.5}}, n, seed=1)
    ids = np.arange(n)
    pol = RoundPolicy(deadline_s=30.0)
    t = client_times(p, ids, bytes_down=4e6, bytes_up=4e6, train_flops=3e10, compress_ops=1e6)
    a = draw_availability(p, ids, 1, 0)
    d = draw_dropout(p, ids, 1, 0)
    out = resolve_round(t, ids, pol, a, d)
    # rpi4 on 5 Mbps: 0.05+6.4 + 10 + ~0 + 0.05+6.4 ≈ 22.9 s < 30; all feasible clients make it
    assert np.count_nonzero(out.drop_reason == "deadline") == 0
    assert out.round_time_s == pytest.approx(2 * (0.05 + 6.4) + 10.0 + 1e6 / 3e9)
    again = resolve_round(client_times(p, ids, 4e6, 4e6, 3e10, 1e6), ids, pol,
                          draw_availability(p, ids, 1, 0), draw_dropout(p, ids, 1, 0))
    assert np.array_equal(out.drop_reason, again.drop_reason) and out.round_time_s == again.round_time_s
