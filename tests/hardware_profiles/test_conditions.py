"""Conditions over virtual time: the processes, the integrator, and runs through them.

References here are written independently of the code under test: plain Python loops in
float64 over one client at a time, from the definitions in docs/conditions.md.
"""
import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from engine.config.schema import load_config
from engine.errors import ConfigError
from engine.results.tables import WALL_COLUMNS, load_run
from engine.run.api import run_experiment
from hardware_profiles.condition_spec import PRESETS, ConditionsSpec, parse_start
from hardware_profiles.processes import (
    ConstantRates,
    Diurnal,
    Intervals,
    MarkovRates,
    TraceRates,
    finish_times,
    keyed_uniforms,
)

GE = PRESETS["gilbert_elliott"]


# ------------------------------------------------------------------ independent references
def markov_state(k: int, cid: int, start, transition, seed: int, salt: int) -> int:
    """The chain of one client stepped slot by slot (the definition)."""
    u = float(keyed_uniforms([cid], [0], seed, salt)[0])
    state = next(i for i, c in enumerate(np.cumsum(start)) if u < c or i == len(start) - 1)
    for slot in range(1, k + 1):
        u = float(keyed_uniforms([cid], [slot], seed, salt)[0])
        row = np.cumsum(transition[state])
        state = next(i for i, c in enumerate(row) if u < c or i == len(row) - 1)
    return state


def integrate(rate_at, edges_of, t0: float, amount: float) -> float:
    """Walk piece by piece: ``rate_at(t)`` is the rate on the piece starting at or before t,
    ``edges_of(t)`` the next piece edge after t."""
    t, left = t0, amount
    while True:
        nxt = edges_of(t)
        cap = (nxt - t) * rate_at(t)
        if cap >= left:
            return t + left / rate_at(t)
        left -= cap
        t = nxt


def test_markov_rates_match_a_chain_stepped_by_hand_in_any_order():
    values, start, tr, slot = [1.0, 0.1], [0.7, 0.3], [[0.9, 0.1], [0.3, 0.7]], 2.0
    scale = np.array([10.0, 20.0, 5.0, 8.0])
    ids, t0 = np.array([0, 1, 2, 3]), np.array([0.5, 3.0, 10.0, 41.0])
    amount = np.array([100.0, 5.0, 50.0, 300.0])

    def reference(c):
        rate = lambda t: values[markov_state(int(t // slot), c, start, tr, 7, 99)] * scale[c]  # noqa: E731
        return integrate(rate, lambda t: (math.floor(t / slot) + 1) * slot, float(t0[c]), float(amount[c]))

    got = finish_times(MarkovRates(values, tr, start, slot, scale, 7, 99, ["g", "b"]), ids, t0, amount)
    assert got == pytest.approx([reference(c) for c in ids], rel=1e-12)
    # reversed order, and asked after later times first (a replay): the same ends
    m = MarkovRates(values, tr, start, slot, scale, 7, 99, ["g", "b"])
    finish_times(m, ids, t0 + 100, amount)
    assert np.array_equal(finish_times(m, ids[::-1], t0[::-1], amount[::-1])[::-1], got)


def test_trace_rates_loop_hold_and_shift_exactly():
    t = [np.array([0.0, 1.0, 3.0, 6.0]), np.array([10.0, 12.0, 15.0])]
    v = [np.array([10.0, 1.0, 5.0, 99.0]), np.array([3.0, 7.0, 42.0])]
    looped = TraceRates(t, v, trace_of=[0, 1, 0], offset_s=[0.0, 1.0, 2.5], loop=True)
    # client 0: 10 in [0,1), 2 in [1,3), 15 in [3,6), then again 10 at 6..7 -> 30 ends at 6.3
    # client 1 (trace 1 shifted by 1: at t it is at 1+t): 3/s until t=1, 7/s until 4, 3/s...
    # client 2 starts at 4.0 = trace time 6.5 = 0.5 of lap 2: 5 in 0.5, 2 in [1,3) ... 13 -> 7.7
    assert finish_times(looped, [0, 1, 2], [0.0, 0.0, 4.0], [30.0, 100.0, 13.0]) == pytest.approx(
        [6.3, 18.285714285714285, 7.7], rel=1e-12)
    held = TraceRates(t[:1], v[:1], trace_of=[0], offset_s=[0.0], loop=False)
    # 10 + 2 + 15 by t = 6, then the last row's value (99/s): 4 more take 4/99 s
    assert finish_times(held, [0], [0.0], [31.0])[0] == pytest.approx(6 + 4 / 99, rel=1e-12)


def test_constant_rates_give_the_closed_form():
    c = ConstantRates(np.array([2.0, 4.0]))
    assert finish_times(c, [0, 1], [1.0, 1.0], [4.0, 4.0]).tolist() == [3.0, 2.0]
    assert finish_times(c, [0], [5.0], [0.0]).tolist() == [5.0]  # no work: no time


def test_intervals_and_diurnal_availability():
    iv = Intervals([np.array([0.0, 10.0])], [np.array([5.0, 20.0])], set_of=[0, 0], offset_s=[0.0, 3.0],
                   loop=True)
    on, leaves = iv.online([0, 1], np.array([4.0, 8.0]))
    assert on.tolist() == [True, True] and leaves.tolist() == [5.0, 17.0]  # client 1 is at 11 of [10, 20)
    on, _ = iv.online([0, 1], np.array([25.0, 25.0]))  # period 20: at 5 and 8 of the next lap
    assert on.tolist() == [False, False]
    d = Diurnal([0.0] * 22 + [1.0, 1.0], tz_offset_h=np.array([0.0, 2.0]), seed=0, salt=1)
    on, leaves = d.online([0, 1], np.array([22.5 * 3600] * 2), round=3)
    assert on.tolist() == [True, False] and np.isinf(leaves).all()  # client 1: 00:30 local


def test_spec_rejects_what_cannot_run_with_one_message_each():
    bad = [
        ({"sets": {"a": {"down": {"kind": "markov", "states": {"g": 1.0, "b": 0.1},
                                  "transition": [[0.9, 0.2], [0.5, 0.5]]}}}}, "row-stochastic"),
        ({"sets": {"a": {"down": {"kind": "markov", "states": {"g": 0.0}, "transition": [[1.0]]}}}}, "must be > 0"),
        ({"sets": {"a": {"availability": {"kind": "diurnal", "hourly": [0.5] * 23}}}}, "give 24"),
        ({"sets": {"a": {"availability": {"kind": "diurnal", "hourly": [0.5] * 24, "tz_offset_h": 15}}}},
         "[-12, 14]"),
        ({"sets": {"a": {"share": 0.5}, "b": {"share": 0.2}}}, "sum to 1"),
        ({"sets": {"a": {"down": "no_such_preset"}}}, "unknown preset"),
    ]
    for spec, message in bad:
        with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
            ConditionsSpec.model_validate(spec)
    assert parse_start("Tue 08:30") == 86400 + 8.5 * 3600
    with pytest.raises(ValueError, match="HH:MM"):
        parse_start("25:00")


# ------------------------------------------------------------------ runs
TINY = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=10", "clients.participation=0.6",
        "rounds=4", "clients.profiles={network: {5mbps: 0.5, 50mbps: 0.5}}", "clock.start=Tue 21:30"]


def fleet(tmp_path) -> list[str]:
    """Markov links and compute, a replayed link trace, a diurnal and an interval availability."""
    links = tmp_path / "links.csv"
    pd.DataFrame({"trace_id": ["a"] * 4 + ["b"] * 3, "t_s": [0, 5, 20, 60, 0, 30, 90],
                  "down_mbps": [8.0, 1.5, 20.0, 8.0, 3.0, 40.0, 3.0],
                  "up_mbps": [2.0, 0.5, 6.0, 2.0, 1.0, 9.0, 1.0]}).to_csv(links, index=False)
    online = tmp_path / "online.csv"
    pd.DataFrame({"trace_id": ["x", "x", "y"], "start_s": [0.0, 100_000.0, 0.0],
                  "end_s": [90_000.0, 604_800.0, 604_800.0]}).to_csv(online, index=False)
    sets = (f"{{fading: {{share: 0.4, down: gilbert_elliott, up: {{preset: gilbert_elliott, slot_s: 0.5}}, "
            f"compute: thermal_throttling}}, "
            f"replayed: {{share: 0.3, down: {{kind: trace, file: '{links}'}}, up: {{kind: trace, file: '{links}', "
            f"loop: false, offset_s: 3}}, availability: {{kind: intervals, file: '{online}'}}}}, "
            f"night: {{share: 0.3, availability: {{preset: night_charging, tz_offset_h: {{low: -3, high: 3}}}}}}}}")
    return [*TINY, f"clients.profiles.conditions={{sets: {sets}}}"]


def fading_timeline(row, p, origin: float):
    """The phase ends of a client of the ``fading`` set: Gilbert-Elliott links, throttling
    compute, every chain stepping from the run's start ``origin`` (set 0: salts 0x71D0..2)."""
    cid = int(row["client_id"])

    def chain(slot_s, salt, start, transition, values, scale):
        def rate(t):
            return values[markov_state(int((t - origin) // slot_s), cid, start, transition, 0, salt)] * scale
        return rate, lambda t: origin + (math.floor((t - origin) / slot_s) + 1) * slot_s

    good_bad = ([1.0, 0.0], GE["transition"], [1.0, 0.1])
    down, next_down = chain(1.0, 0x71D0, *good_bad, p["down_mbps"] * 1e6)
    cpu, next_cpu = chain(60.0, 0x71D2, [1.0, 0.0], [[0.9, 0.1], [0.2, 0.8]], [1.0, 0.5], p["gflops"] * 1e9)
    up, next_up = chain(0.5, 0x71D1, *good_bad, p["up_mbps"] * 1e6)
    dl_end = integrate(down, next_down, row["start_s"] + p["latency_s"], 8.0 * row["bytes_down"])
    tr_end = integrate(cpu, next_cpu, dl_end, row["train_flops"])
    cp_end = integrate(cpu, next_cpu, tr_end, row["compress_ops"]) if row["compress_ops"] > 0 else tr_end
    return dl_end, tr_end, cp_end, integrate(up, next_up, cp_end + p["latency_s"], 8.0 * row["bytes_up"])


def replayed_timeline(row, p, links):
    """The phase ends of a client of the ``replayed`` set: the trace and offset profiles.parquet
    names, down looped, up held past its end; constant compute."""

    def replay(column, trace, offset, loop):
        rows = links[links["trace_id"] == trace]
        t, v = rows["t_s"].to_numpy(float), rows[column].to_numpy(float)
        period = t[-1] - t[0]

        def piece(x):  # (rate, next edge) at virtual time x
            pos = x + offset - t[0]
            lap = math.floor(pos / period) if loop else 0
            local = pos - lap * period
            if not loop and local >= period:
                return v[-1] * 1e6, math.inf
            j = max(i for i in range(len(t) - 1) if t[i] - t[0] <= local)
            return v[j] * 1e6, t[j + 1] - t[0] + lap * period - offset
        return (lambda x: piece(x)[0]), (lambda x: piece(x)[1])

    rate, nxt = replay("down_mbps", p["down_trace"], p["down_offset_s"], True)
    dl_end = integrate(rate, nxt, row["start_s"] + p["latency_s"], 8.0 * row["bytes_down"])
    tr_end = dl_end + row["train_flops"] / (p["gflops"] * 1e9)
    cp_end = tr_end + row["compress_ops"] / (p["gflops"] * 1e9)
    assert p["up_offset_s"] == 3.0
    rate, nxt = replay("up_mbps", p["up_trace"], 3.0, False)
    return dl_end, tr_end, cp_end, integrate(rate, nxt, cp_end + p["latency_s"], 8.0 * row["bytes_up"])


def test_every_time_column_recomputes_from_the_profiles_and_the_traces(tmp_path):
    run = load_run(run_experiment(load_config(None, fleet(tmp_path)), tmp_path / "run"))
    c, r, prof = run.clients, run.rounds, run.profiles.set_index("client_id")
    ran = c[c["drop_reason"].isin(["", "deadline", "over_selected"])]
    assert {"fading", "replayed", "night"} == set(prof["conditions"])
    states = ran["down_state"].astype(str)
    assert (states.isin(["good", "bad", ""]) | states.str.match(r"^[ab]@\d+$")).all() and len(ran) > 10
    links = pd.read_csv(tmp_path / "links.csv")
    # round starts chain from clock.start with the simulated round times
    assert r["round_start_s"].iloc[0] == 86400 + 21.5 * 3600
    assert np.allclose(r["round_start_s"].diff().iloc[1:], r["sim_round_s"].iloc[:-1], rtol=0, atol=1e-9)
    for _, row in ran.iterrows():
        p, s0 = prof.loc[row["client_id"]], row["start_s"]
        assert s0 == r.loc[r["round"] == row["round"], "round_start_s"].iloc[0]
        down_bits, up_bits = 8.0 * row["bytes_down"], 8.0 * row["bytes_up"]
        if p["conditions"] == "fading":
            dl_end, tr_end, cp_end, up_end = fading_timeline(row, p, r["round_start_s"].iloc[0])
        elif p["conditions"] == "replayed":
            dl_end, tr_end, cp_end, up_end = replayed_timeline(row, p, links)
        else:  # constant links and compute: today's closed form
            dl_end = s0 + p["latency_s"] + down_bits / (p["down_mbps"] * 1e6)
            tr_end = dl_end + row["train_flops"] / (p["gflops"] * 1e9)
            cp_end = tr_end + row["compress_ops"] / (p["gflops"] * 1e9)
            up_end = cp_end + p["latency_s"] + up_bits / (p["up_mbps"] * 1e6)
        for col, want in (("download_end_s", dl_end), ("train_end_s", tr_end), ("compress_end_s", cp_end),
                          ("upload_end_s", up_end)):
            assert row[col] == pytest.approx(want, rel=1e-12, abs=1e-9), (col, row["client_id"], row["round"])
        assert row["sim_total_s"] == pytest.approx(up_end - s0, rel=1e-9, abs=1e-9)
    checked = prof.loc[ran["client_id"], "conditions"].value_counts()
    assert (checked.reindex(["fading", "replayed", "night"]) >= 2).all(), checked  # every set's formulas


def test_a_client_that_goes_offline_mid_round_is_dropped_at_that_time(tmp_path):
    online = tmp_path / "online.csv"
    # every client online only for the first 0.05 s of virtual time: round 0 starts inside it,
    # and no client can finish a 5 Mbps round that fast
    pd.DataFrame({"trace_id": ["x"], "start_s": [0.0], "end_s": [0.05]}).to_csv(online, index=False)
    over = [*TINY, "clock.start=00:00", "clients.profiles={network: {5mbps: 1.0}}", "rounds=2", "clock.deadline_s=1",
            f"clients.profiles.conditions={{sets: {{all: {{availability: {{kind: intervals, file: '{online}', "
            "loop: false}}}}"]
    run = load_run(run_experiment(load_config(None, over), tmp_path / "run"))
    first = run.clients[run.clients["round"] == 0]
    assert (first["drop_reason"] == "offline").all() and run.rounds["num_arrived"].tolist() == [0, 0]
    # the server cannot tell them from slow clients: it waits out the deadline; by then they are gone
    assert run.rounds["sim_round_s"].iloc[0] == 1.0
    assert (run.clients[run.clients["round"] == 1]["drop_reason"] == "unavailable").all()


def test_constant_conditions_change_no_existing_column(tmp_path):
    plain = load_run(run_experiment(load_config(None, TINY), tmp_path / "plain"))
    same = load_run(run_experiment(load_config(None, [*TINY, "clients.profiles.conditions={sets: {x: {}}}"]),
                                   tmp_path / "same"))
    for a, b in ((plain.rounds, same.rounds), (plain.clients, same.clients)):
        keep = [col for col in a.columns if col not in WALL_COLUMNS]
        pd.testing.assert_frame_equal(a[keep], b[keep])


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"clients\.profiles\.conditions.*row-stochastic"):
        load_config(None, [*TINY, "clients.profiles.conditions={sets: {a: {down: {kind: markov, "
                                  "states: {g: 1.0, b: 0.5}, transition: [[0.5, 0.6], [1, 0]]}}}}"])
    with pytest.raises(ConfigError, match="start"):
        load_config(None, [*TINY, "clock.start=8am"])


@pytest.mark.parametrize("rows, message", [
    ({"trace_id": ["a", "a"], "t_s": [0.0, 0.0], "down_mbps": [1.0, 1.0]}, "increase strictly"),
    ({"trace_id": ["a", "a"], "t_s": [0.0, 5.0], "down_mbps": [0.0, 1.0]}, "must be > 0"),
    ({"trace_id": ["a", "a"], "t_s": [0.0, float("nan")], "down_mbps": [1.0, 1.0]}, "not a finite number"),
    ({"trace_id": ["a"], "t_s": [0.0], "down_mbps": [1.0]}, "at least 2"),
    ({"trace_id": ["a", "a"], "t_s": [0.0, 5.0]}, "missing"),
])
def test_bad_trace_files_are_config_errors_before_anything_is_written(tmp_path, rows, message):
    from engine.run.validate import validate_experiment

    path = tmp_path / "t.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    cfg = load_config(None, [*TINY, f"clients.profiles.conditions={{sets: {{x: {{down: {{kind: trace, "
                                    f"file: '{path}'}}}}}}}}", f"output.dir={tmp_path / 'runs'}"])
    with pytest.raises(ConfigError, match=rf"clients\.profiles\.conditions: .*{message}"):
        validate_experiment(cfg)
    assert not (tmp_path / "runs").exists()


def test_unknown_trace_ids_and_missing_files_are_named(tmp_path):
    from engine.run.validate import validate_experiment

    path = tmp_path / "t.csv"
    pd.DataFrame({"trace_id": ["a", "a"], "t_s": [0.0, 5.0], "down_mbps": [1.0, 2.0]}).to_csv(path, index=False)
    for spec, message in ((f"{{kind: trace, file: '{path}', traces: [b]}}", r"names \['b'\], not in"),
                          (f"{{kind: trace, file: '{tmp_path / 'none.csv'}'}}", "does not exist")):
        with pytest.raises(ConfigError, match=message):  # a missing file: already at load_config
            sets = f"clients.profiles.conditions={{sets: {{x: {{down: {spec}}}}}}}"
            validate_experiment(load_config(None, [*TINY, sets]))


def test_a_method_reading_the_profile_sees_its_conditions_at_the_rounds_start(tmp_path):
    """ASCEND prices its choice with the clock's formulas on ctx.profile: under a Markov up link
    the profile it gets carries the link state's rate at the round's start. Slots of 1000 s: a
    round's upload is in the state the round started in (the one clients.parquet records)."""
    base = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=6", "clients.participation=1.0",
            "rounds=1", "partition.public_fraction=0.2", "algorithm={name: ascend, warmup: 1}",
            "clients.profiles={network: {50mbps: 1.0}, availability: 1.0, dropout: 0.0}"]
    markov = [*base, "clients.profiles.conditions={sets: {x: {up: {kind: markov, states: {good: 1.0, bad: 0.1}, "
                     "transition: [[0.5, 0.5], [0.5, 0.5]], slot_s: 1000}}}}"]
    changing = load_run(run_experiment(load_config(None, markov), tmp_path / "markov")).clients
    constant = load_run(run_experiment(load_config(None, base), tmp_path / "constant")).clients
    assert {"good", "bad"} <= set(changing["up_state"])  # the test is about something
    bits = 8.0 * changing["bytes_up"]
    factor = changing["up_state"].map({"good": 1.0, "bad": 0.1})
    extra = bits / (factor * 50e6) - bits / 50e6  # the slower link's seconds, 0 in the good state
    assert np.allclose(changing["sim_T"] - constant["sim_T"], extra, rtol=1e-9, atol=1e-12)


def test_intervals_by_client_and_a_fleet_that_is_never_online(tmp_path):
    from engine.run.validate import validate_experiment

    path = tmp_path / "per_client.csv"  # FedScale-style: one interval list per client id
    ids = list(range(10))
    pd.DataFrame({"client_id": ids, "start_s": [0.0] * 10, "end_s": [86400.0 * 2 + 60 * c for c in ids]}).to_csv(
        path, index=False)
    over = [*TINY, "clock.start=Tue 00:00", f"clients.profiles.conditions={{sets: {{x: {{availability: "
            f"{{kind: intervals, file: '{path}', traces: by_client, loop: false}}}}}}}}"]
    run = load_run(run_experiment(load_config(None, over), tmp_path / "run"))
    prof = run.profiles.set_index("client_id")
    assert (prof["availability_trace"] == prof.index.astype(str)).all()  # each its own intervals
    # Tuesday 00:00 is t = 86400: every client is online until 48 h + c minutes
    assert (run.clients["drop_reason"] != "unavailable").all()
    late = [*TINY, "clock.start=Thu 00:00", *over[-1:]]  # after every interval: never online again
    with pytest.raises(ConfigError, match="no client can ever be online"):
        validate_experiment(load_config(None, late))
    some = [*TINY, "clock.start=Wed 00:05", *over[-1:]]  # clients 0-5 ended by then (0:05 = 5 min)
    assert any("6 of 10 clients can never be online" in w for w in validate_experiment(load_config(None, some)))


def test_an_offline_client_records_when_it_left(tmp_path):
    online = tmp_path / "online.csv"
    pd.DataFrame({"trace_id": ["x"], "start_s": [0.0], "end_s": [0.05]}).to_csv(online, index=False)
    over = [*TINY, "clock.start=00:00", "clients.profiles={network: {5mbps: 1.0}}", "rounds=1",
            f"clients.profiles.conditions={{sets: {{all: {{availability: {{kind: intervals, file: '{online}', "
            "loop: false}}}}"]
    c = load_run(run_experiment(load_config(None, over), tmp_path / "run")).clients
    assert (c["drop_reason"] == "offline").all() and (c["left_s"] == 0.05).all()
    assert (c["upload_end_s"] > c["left_s"]).all()  # it would have needed longer
