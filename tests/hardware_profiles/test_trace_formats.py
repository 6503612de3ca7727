"""Converters of field trace formats into hetsim's trace schema, and the shipped example traces.

Each input is written here from the format's public description (FedScale's device-trace pickles,
Mahimahi packet-delivery traces, the HSDPA dataset's 6-column logs); each result is checked
against numbers worked out by hand, read back through the schema's readers, and each converter
refuses malformed input with a message naming the file and the line or client.
"""
from __future__ import annotations

import importlib.util
import os
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import REPO

from hardware_profiles.trace_formats import (
    fedscale_availability,
    fedscale_compute,
    fedscale_compute_speeds,
    fedscale_links,
    hsdpa_link,
    mahimahi_link,
    to_file,
)
from hardware_profiles.traces import TraceError, read_interval_traces, read_rate_traces

EXAMPLES = REPO / "hardware_profiles" / "traces"


def _pickle(path: Path, obj) -> Path:
    path.write_bytes(pickle.dumps(obj))
    return path


def _text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- FedScale

BEHAVE = {
    7: {"active": [10, 50, 100], "inactive": [40, 60, 200], "finish_time": 150, "duration": 3, "model": "x"},
    "b": {"active": [0, 30, 38, 45], "inactive": [20, 40, 40, 45], "finish_time": 100},  # overlap, empty
    "t": {"active": [0, 20], "inactive": [20, 30], "finish_time": 50},  # touching: merged
    3: {"active": [120], "inactive": [130], "finish_time": 100},  # past finish_time: no rows
    4: {"active": [80, -5], "inactive": [90.5, 5], "finish_time": 90},  # unsorted, clipped both ends
    5: {"active": [5, 70], "inactive": [20], "finish_time": 90},  # no partner: until finish_time
}


def test_fedscale_behaviour_becomes_intervals(tmp_path):
    df = fedscale_availability(_pickle(tmp_path / "client_behave_trace", BEHAVE))
    assert list(df.columns) == ["trace_id", "start_s", "end_s"]
    assert list(df["trace_id"]) == ["7", "7", "7", "b", "b", "t", "4", "4", "5", "5"]
    assert df["start_s"].tolist() == [10.0, 50.0, 100.0, 0.0, 30.0, 0.0, 0.0, 80.0, 5.0, 70.0]
    assert df["end_s"].tolist() == [40.0, 60.0, 150.0, 20.0, 40.0, 30.0, 5.0, 90.0, 20.0, 90.0]
    for suffix in ("csv", "parquet"):
        back = read_interval_traces(to_file(df, tmp_path / f"avail.{suffix}"))
        assert set(back) == {"7", "b", "t", "4", "5"}
        assert back["7"][0].tolist() == [10.0, 50.0, 100.0] and back["7"][1].tolist() == [40.0, 60.0, 150.0]
        assert back["t"][0].tolist() == [0.0] and back["t"][1].tolist() == [30.0]


def test_fedscale_behaviour_refuses_malformed(tmp_path):
    cases = {
        "no_finish": ({1: {"active": [0], "inactive": [5]}}, r"client 1: .*lacks \['finish_time'\]"),
        "bad_finish": ({1: {"active": [0], "inactive": [5], "finish_time": 0}}, r"'finish_time' = 0 is not a finite"),
        "not_list": ({1: {"active": 3, "inactive": [5], "finish_time": 9}}, r"'active' must be a list"),
        "nan": ({1: {"active": [float("nan")], "inactive": [5], "finish_time": 9}}, r"'active' = nan"),
        "text": ({1: {"active": ["x"], "inactive": [5], "finish_time": 9}}, r"'active' = 'x'"),
        "record": ({1: [0, 5]}, r"client 1: a client_behave_trace entry is a dict"),
        "empty": ({}, r"non-empty dict"),
        "list": ([1, 2], r"non-empty dict .* got list"),
        "never": ({1: {"active": [10], "inactive": [5], "finish_time": 9}}, r"no client .* has an online interval"),
    }
    for name, (obj, message) in cases.items():
        path = _pickle(tmp_path / name, obj)
        with pytest.raises(TraceError, match=message) as err:
            fedscale_availability(path)
        assert str(path) in str(err.value)
    with pytest.raises(TraceError, match="does not exist"):
        fedscale_availability(tmp_path / "missing")
    with pytest.raises(TraceError, match="not a readable .* pickle"):
        fedscale_availability(_text(tmp_path / "plain.txt", "active 0 inactive 5\n"))


def test_fedscale_loader_refuses_code(tmp_path):
    # a pickle that names a function: refused before the name is looked up, never called
    path = _pickle(tmp_path / "evil", {1: {"active": [0], "inactive": [5], "finish_time": 9, "x": os.getcwd}})
    with pytest.raises(TraceError, match=r"refusing to load .*getcwd"):
        fedscale_availability(path)
    # numpy values, as a trace written with numpy holds, load
    ok = {1: {"active": np.array([0.0, 20.0]), "inactive": [np.float64(5.0), np.int64(30)], "finish_time": 40}}
    df = fedscale_availability(_pickle(tmp_path / "numpy", ok))
    assert df["start_s"].tolist() == [0.0, 20.0] and df["end_s"].tolist() == [5.0, 30.0]


CAPACITY = {1: {"computation": 100.0, "communication": 5000.0}, "c2": {"computation": 250, "communication": 1500.5}}


def test_fedscale_capacity_becomes_links_and_compute(tmp_path):
    path = _pickle(tmp_path / "client_device_capacity", CAPACITY)
    links = fedscale_links(path)
    assert list(links.columns) == ["trace_id", "t_s", "down_mbps", "up_mbps"]
    assert list(links["trace_id"]) == ["1", "1", "c2", "c2"]
    assert links["t_s"].tolist() == [0.0, 86400.0, 0.0, 86400.0]
    assert links["down_mbps"].tolist() == [5.0, 5.0, 1.5005, 1.5005]
    assert links["up_mbps"].tolist() == links["down_mbps"].tolist()
    assert fedscale_links(path, duration_s=3600)["t_s"].tolist() == [0.0, 3600.0, 0.0, 3600.0]

    speeds = fedscale_compute_speeds(path)
    assert list(speeds.columns) == ["client_id", "ms_per_sample"]
    assert list(speeds["client_id"]) == ["1", "c2"] and speeds["ms_per_sample"].tolist() == [100.0, 250.0]

    compute = fedscale_compute(path, reference_ms=200.0)
    assert list(compute.columns) == ["trace_id", "t_s", "factor"]
    assert compute["factor"].tolist() == [2.0, 2.0, 0.8, 0.8]  # 200 / 100, 200 / 250

    for suffix in ("csv", "parquet"):
        back = read_rate_traces(to_file(links, tmp_path / f"links.{suffix}"), "up_mbps")
        assert back["c2"][0].tolist() == [0.0, 86400.0] and back["c2"][1].tolist() == [1.5005, 1.5005]
        assert read_rate_traces(to_file(links, tmp_path / f"l2.{suffix}"), "down_mbps")["1"][1].tolist() == [5.0, 5.0]
        back = read_rate_traces(to_file(compute, tmp_path / f"compute.{suffix}"), "factor")
        assert back["1"][1].tolist() == [2.0, 2.0] and back["c2"][1].tolist() == [0.8, 0.8]


def test_fedscale_capacity_refuses_malformed(tmp_path):
    cases = {
        "zero": ({1: {"computation": 10, "communication": 0}}, r"client 1: 'communication' = 0 is not a finite"),
        "neg": ({1: {"computation": -1, "communication": 5}}, r"'computation' = -1"),
        "missing": ({1: {"communication": 5}}, r"lacks \['computation'\]"),
        "text": ({1: {"computation": "fast", "communication": 5}}, r"'computation' = 'fast'"),
    }
    for name, (obj, message) in cases.items():
        path = _pickle(tmp_path / name, obj)
        for convert in (fedscale_links, fedscale_compute_speeds, lambda p: fedscale_compute(p, 100)):
            with pytest.raises(TraceError, match=message):
                convert(path)
    path = _pickle(tmp_path / "ok", CAPACITY)
    for reference in (0, -5, float("nan")):
        with pytest.raises(ValueError, match="reference_ms"):
            fedscale_compute(path, reference_ms=reference)
    with pytest.raises(ValueError, match="duration_s"):
        fedscale_links(path, duration_s=0)


# --------------------------------------------------------------------------- Mahimahi

MAHIMAHI = "0\n0\n500\n999\n2500\n2500\n4200\n"  # 1500-byte packets at these milliseconds


def test_mahimahi_bins_packets(tmp_path):
    path = _text(tmp_path / "Verizon-LTE.down", MAHIMAHI)
    df = mahimahi_link(path)
    assert list(df.columns) == ["trace_id", "t_s", "down_mbps"]
    assert set(df["trace_id"]) == {"Verizon-LTE"}
    # 1 s windows up to ceil(4200 ms) = 5 s: 4, 0, 2, 0, 1 packets; 1 packet/s = 1500 * 8 / 1e6 = 0.012 Mbps;
    # empty windows get the 0.01 floor; the end row repeats the last rate
    assert df["t_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert df["down_mbps"].tolist() == [0.048, 0.01, 0.024, 0.01, 0.012, 0.012]

    # 500 ms windows up to 4.5 s: 2 2 0 0 0 2 0 0 1 packets, 1 packet per 0.5 s = 0.024 Mbps
    half = mahimahi_link(path, trace_id="lte", column="up_mbps", bin_ms=500, floor_mbps=0.03)
    assert list(half.columns) == ["trace_id", "t_s", "up_mbps"] and set(half["trace_id"]) == {"lte"}
    assert half["t_s"].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5]
    assert half["up_mbps"].tolist() == [0.048, 0.048, 0.03, 0.03, 0.03, 0.048, 0.03, 0.03, 0.03, 0.03]

    # a packet exactly at the end (3000 ms, a whole number of windows) counts in the last window
    exact = mahimahi_link(_text(tmp_path / "exact", "0\n1000\n2999\n3000\n\n"))
    assert exact["t_s"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert exact["down_mbps"].tolist() == [0.012, 0.012, 0.024, 0.024]

    for suffix in ("csv", "parquet"):
        back = read_rate_traces(to_file(df, tmp_path / f"m.{suffix}"), "down_mbps")
        assert back["Verizon-LTE"][0].tolist() == df["t_s"].tolist()
        assert back["Verizon-LTE"][1].tolist() == df["down_mbps"].tolist()
        assert read_rate_traces(to_file(half, tmp_path / f"h.{suffix}"), "up_mbps")["lte"][1][0] == 0.048


def test_mahimahi_refuses_malformed(tmp_path):
    cases = {
        "word": ("12\nabc\n", r"line 2: 'abc' is not a timestamp"),
        "negative": ("-5\n10\n", r"line 1: '-5' is not a timestamp"),
        "fraction": ("1\n2.5\n", r"line 2: '2.5'"),
        "back": ("1\n\n10\n5\n", r"line 4: timestamp 5 is before the previous one \(10\)"),
        "empty": ("\n\n", r"holds no timestamps"),
        "zero": ("0\n0\n", r"lasts no time"),
    }
    for name, (text, message) in cases.items():
        path = _text(tmp_path / name, text)
        with pytest.raises(TraceError, match=message) as err:
            mahimahi_link(path)
        assert str(path) in str(err.value)
    path = _text(tmp_path / "ok", MAHIMAHI)
    with pytest.raises(ValueError, match="column"):
        mahimahi_link(path, column="factor")
    with pytest.raises(ValueError, match="floor_mbps"):
        mahimahi_link(path, floor_mbps=0)
    with pytest.raises(ValueError, match="bin_ms"):
        mahimahi_link(path, bin_ms=0)
    with pytest.raises(TraceError, match="does not exist"):
        mahimahi_link(tmp_path / "missing")


# --------------------------------------------------------------------------- HSDPA / Ghent 4G

HSDPA = (
    "1289406399 549692 59.851754 10.781778 125000 1000\n"  # 1 Mbps over [548692, 549692) ms
    "1289406400 550692 59.851864 10.781833 0 1000\n"  # nothing: the floor
    "\n"
    "1289406401\t552692  59.851964 10.781901 500000 2000\n"  # 2 Mbps over 2 s
    "1289406402 553192 59.85206  10.781969 31250 500\n"  # 0.5 Mbps over 0.5 s
)


def test_hsdpa_log_becomes_pieces(tmp_path):
    path = _text(tmp_path / "report.2010-09-13_1003CEST.log", HSDPA)
    df = hsdpa_link(path)
    assert list(df.columns) == ["trace_id", "t_s", "down_mbps"]
    assert set(df["trace_id"]) == {"report.2010-09-13_1003CEST"}
    assert df["t_s"].tolist() == [0.0, 1.0, 2.0, 4.0, 4.5]
    assert df["down_mbps"].tolist() == [1.0, 0.01, 2.0, 0.5, 0.5]

    raw = hsdpa_link(path, trace_id="bus", column="up_mbps", floor_mbps=0.2, rebase=False)
    assert list(raw.columns) == ["trace_id", "t_s", "up_mbps"] and set(raw["trace_id"]) == {"bus"}
    assert raw["t_s"].tolist() == [548.692, 549.692, 550.692, 552.692, 553.192]
    assert raw["up_mbps"].tolist() == [1.0, 0.2, 2.0, 0.5, 0.5]

    # a first line with 0 elapsed ms only marks the start
    start = hsdpa_link(_text(tmp_path / "start", "1 100 0 0 0 0\n2 1100 0 0 250000 1000\n"))
    assert start["t_s"].tolist() == [0.0, 1.0] and start["down_mbps"].tolist() == [2.0, 2.0]

    for suffix in ("csv", "parquet"):
        back = read_rate_traces(to_file(df, tmp_path / f"hsdpa.{suffix}"), "down_mbps")
        (t, v), = back.values()
        assert t.tolist() == [0.0, 1.0, 2.0, 4.0, 4.5] and v.tolist() == [1.0, 0.01, 2.0, 0.5, 0.5]


def test_hsdpa_refuses_malformed(tmp_path):
    good = "1 1000 0 0 100 1000\n"
    cases = {
        "columns": (good + "2 2000 0 0 100\n", r"line 2: 5 columns; an HSDPA-format log has 6"),
        "word": (good + "2 2000 0 0 lots 1000\n", r"line 2: column 5 \(bytes since the previous line\) = 'lots'"),
        "negative": (good + "2 2000 0 0 -1 1000\n", r"line 2: column 5 .* = '-1'"),
        "inf": (good + "2 inf 0 0 1 1000\n", r"line 2: column 2 \(ms since start\) = 'inf'"),
        "back": (good + "\n2 1000 0 0 1 1000\n", r"line 3: time 1000 ms does not increase"),
        "stall": (good + "2 2000 0 0 0 0\n", r"line 2: 0 bytes over 0 ms"),
        "burst": ("1 1000 0 0 100 0\n2 2000 0 0 5 1000\n", r"line 1: 100 bytes over 0 ms"),
        "empty": ("", r"holds no measurement"),
        "marker": ("1 1000 0 0 0 0\n", r"holds no measurement"),
    }
    for name, (text, message) in cases.items():
        path = _text(tmp_path / name, text)
        with pytest.raises(TraceError, match=message) as err:
            hsdpa_link(path)
        assert str(path) in str(err.value)
    with pytest.raises(ValueError, match="floor_mbps"):
        hsdpa_link(_text(tmp_path / "ok", good), floor_mbps=-1)
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not a readable"):
        hsdpa_link(tmp_path / "binary")


# --------------------------------------------------------------------------- writing


def test_to_file_checks_suffix_columns_and_schema(tmp_path):
    df = pd.DataFrame({"trace_id": ["a", "a"], "t_s": [0.0, 1.0], "down_mbps": [1.0, 1.0]})
    with pytest.raises(ValueError, match="suffix '.txt'"):
        to_file(df, tmp_path / "x.txt")
    with pytest.raises(ValueError, match="a trace frame has trace_id"):
        to_file(pd.DataFrame({"client_id": ["a"], "ms_per_sample": [1.0]}), tmp_path / "x.csv")
    with pytest.raises(TraceError, match="must be > 0"):
        to_file(df.assign(down_mbps=[0.0, 0.0]), tmp_path / "zero.csv")
    assert not (tmp_path / "zero.csv").exists()
    assert to_file(df, tmp_path / "sub" / "dir" / "x.pq").is_file()


# --------------------------------------------------------------------------- shipped examples


def _example_script():
    spec = importlib.util.spec_from_file_location("make_example_traces", REPO / "bench" / "make_example_traces.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_traces_read_back_and_are_what_the_script_writes(tmp_path, capsys):
    script = _example_script()
    written = script.main(["--out", str(tmp_path)])
    assert [p.name for p in written] == list(script.FILES)
    for name in script.FILES:
        shipped = EXAMPLES / name
        assert shipped.stat().st_size < 100_000
        assert shipped.read_bytes() == (tmp_path / name).read_bytes(), f"{name}: rerun bench/make_example_traces.py"

    for column in ("down_mbps", "up_mbps"):
        links = read_rate_traces(EXAMPLES / "fluctuating_links.csv", column)
        assert set(links) == {"commuter_cellular", "home_wifi_evening", "rural_dsl"}
        for t, _ in links.values():
            assert t[0] == 0 and t[-1] == 3600 and np.all(np.diff(t) == 60)
    down = read_rate_traces(EXAMPLES / "fluctuating_links.csv", "down_mbps")
    for name, (low, high, *_) in script.LINKS.items():
        assert low <= down[name][1].min() and down[name][1].max() <= high

    compute = read_rate_traces(EXAMPLES / "compute_throttle.csv", "factor")
    assert set(compute) == {"thermal_phone", "battery_saver_tablet"}
    for _, factor in compute.values():
        assert 0.4 <= factor.min() and factor.max() <= 1.0 and factor.min() < 0.8

    phones = read_interval_traces(EXAMPLES / "night_phones.csv")
    assert set(phones) == {"phone_early", "phone_typical", "phone_late"}
    minutes = np.arange(0, 604800, 60)
    night = ((minutes % 86400) >= 22 * 3600) | ((minutes % 86400) < 7 * 3600)
    for start, end in phones.values():
        assert start[0] == 0 and end[-1] == 604800  # a looped replay repeats the week
        i = np.searchsorted(start, minutes, side="right") - 1
        online = (i >= 0) & (minutes < end[np.clip(i, 0, None)])
        assert 0.25 < online.mean() < 0.5
        assert online[night].sum() > 0.7 * online.sum() and online[~night].any()  # mostly 22:00-07:00
