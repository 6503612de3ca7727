"""Hardware profiles, catalog and fleet sampler."""

import dataclasses
import math
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from hardware_profiles import (
    BANDWIDTH_MAX_MBPS,
    BANDWIDTH_MIN_MBPS,
    HardwareProfile,
    ProfileSpec,
    ProfileTable,
    ProfileValidationError,
    UnknownTierError,
    assign_profiles,
    default_catalog,
    exact_counts,
    load_catalog,
)
from hardware_profiles.catalog import CatalogError
from hardware_profiles.profile import LABEL_FIELDS, NUMERIC_FIELDS

GOOD = dict(
    name="x", gflops=10.0, down_mbps=50.0, up_mbps=20.0, latency_s=0.01,
    memory_gb=4.0, availability=0.9, dropout=0.05,
)


def test_no_torch_or_ray_imported():
    code = "import sys, hardware_profiles; assert not {'torch', 'ray'} & set(sys.modules), 'heavy import'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------- HardwareProfile


def test_profile_valid_and_frozen():
    p = HardwareProfile(**GOOD)
    assert p.tier == "" and p.net_tier == ""
    with pytest.raises(ValidationError):
        p.gflops = 1.0  # frozen


def test_profile_extra_forbidden():
    with pytest.raises(ValidationError, match="bogus"):
        HardwareProfile(**GOOD, bogus=1)


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("gflops", 0.0, "must be > 0"),
        ("gflops", -3.0, "must be > 0"),
        ("memory_gb", 0.0, "must be > 0"),
        ("down_mbps", 0.0, "must be > 0"),
        ("up_mbps", -1.0, "must be > 0"),
        ("latency_s", -0.1, "must be >= 0"),
        ("availability", 1.5, r"must be in \[0, 1\]"),
        ("dropout", -0.1, r"must be in \[0, 1\]"),
        ("gflops", float("nan"), "finite"),
        ("down_mbps", 1000.0, r"outside the catalog range \[5, 500\] Mbps"),
        ("up_mbps", 1.0, r"outside the catalog range \[5, 500\] Mbps"),
    ],
)
def test_profile_errors_name_field_value_allowed(field, value, allowed):
    with pytest.raises(ValidationError) as e:
        HardwareProfile(**{**GOOD, field: value})
    msg = str(e.value)
    assert f"{field}={value!r}" in msg
    assert re.search(allowed, msg)


def test_out_of_range_bandwidth_only_when_asked():
    bad = {**GOOD, "down_mbps": 1000.0, "up_mbps": 1.0}
    with pytest.raises(ValidationError, match="allow_out_of_range"):
        HardwareProfile(**bad)
    assert HardwareProfile(**bad, allow_out_of_range=True).down_mbps == 1000.0
    assert HardwareProfile.model_validate(bad, context={"allow_out_of_range": True}).up_mbps == 1.0
    # range edges are inclusive
    HardwareProfile(**{**GOOD, "down_mbps": BANDWIDTH_MIN_MBPS, "up_mbps": BANDWIDTH_MAX_MBPS})
    # allow_out_of_range never permits non-positive values
    with pytest.raises(ValidationError, match="must be > 0"):
        HardwareProfile(**{**GOOD, "down_mbps": 0.0}, allow_out_of_range=True)


# --------------------------------------------------------------- catalog


REQUIRED_DEVICES = {"rpi4", "phone_low", "phone_mid", "phone_high", "laptop_cpu", "edge_gpu"}
REQUIRED_NETWORKS = {"5mbps", "50mbps", "500mbps"}


def test_builtin_catalog_tiers_and_sources():
    c = default_catalog()
    assert REQUIRED_DEVICES <= set(c.devices)
    assert REQUIRED_NETWORKS <= set(c.networks)
    for name, t in {**c.devices, **c.networks}.items():
        assert t.source, f"{name} has no source/rationale"
    assert c.network("5mbps").down_mbps == 5.0 and c.network("500mbps").up_mbps == 500.0
    # every built-in combination is a valid in-range profile
    for d in c.devices:
        for n in c.networks:
            c.profile(d, n)
    # sanity ordering of effective speeds
    g = {k: v.gflops for k, v in c.devices.items()}
    assert g["phone_low"] < g["phone_mid"] < g["phone_high"] < g["laptop_cpu"] < g["edge_gpu"]


def test_unknown_tier_lists_known_names():
    c = default_catalog()
    with pytest.raises(UnknownTierError, match="nokia.*rpi4"):
        c.device("nokia")
    with pytest.raises(UnknownTierError, match="50mbps"):
        c.network("carrier_pigeon")
    with pytest.raises(UnknownTierError, match="known device tiers"):
        assign_profiles({"devices": {"nokia": 1.0}}, 10, 0)


def test_load_catalog_extends_and_overrides(tmp_path):
    extra = """
devices:
  my_board: {gflops: 7.5, memory_gb: 1, availability: 0.8, dropout: 0.1, source: "bench"}
  rpi4: {availability: 0.5}
networks:
  3g: {down_mbps: 2, up_mbps: 0.5, latency_s: 0.1}
"""
    f = tmp_path / "extra.yaml"
    f.write_text(extra)
    for src in (extra, f, str(f)):
        c = load_catalog(src)
        assert c.device("my_board").gflops == 7.5
        assert c.device("rpi4").availability == 0.5
        assert c.device("rpi4").gflops == default_catalog().device("rpi4").gflops  # untouched field kept
        assert c.network("3g").up_mbps == 0.5
    # the builtin is not mutated
    assert default_catalog().device("rpi4").availability != 0.5
    c = load_catalog({"devices": {"my_board": {"gflops": 1, "memory_gb": 1, "availability": 1, "dropout": 0}}})
    assert "my_board" in c.devices
    # 3g is out of range: usable only with allow_out_of_range
    c = load_catalog(extra)
    with pytest.raises(ValidationError, match="down_mbps"):
        c.profile("rpi4", "3g")
    assert c.profile("rpi4", "3g", allow_out_of_range=True).up_mbps == 0.5
    with pytest.raises(ProfileValidationError, match="client 0: down_mbps=2.0"):
        assign_profiles({"network": {"3g": 1.0}}, 4, 0, catalog=c)
    t = assign_profiles({"network": {"3g": 1.0}, "allow_out_of_range": True}, 4, 0, catalog=c)
    assert t.profile(2).down_mbps == 2.0


def test_load_catalog_rejects_bad_tiers():
    with pytest.raises(CatalogError, match=r"^catalog devices\.x\.gflops: gflops=0\.0 is not allowed: must be > 0$"):
        load_catalog({"devices": {"x": {"gflops": 0, "memory_gb": 1, "availability": 1, "dropout": 0}}})
    with pytest.raises(CatalogError, match=r"catalog devices\.x\.memory_gb: missing"):  # new tier missing a field
        load_catalog({"devices": {"x": {"gflops": 1, "availability": 1, "dropout": 0}}})
    with pytest.raises(ValueError, match="unknown top-level"):
        load_catalog({"gpus": {}})


# --------------------------------------------------------------- sampler


def test_exact_counts_largest_remainder():
    assert exact_counts([0.3, 0.5, 0.2], 10).tolist() == [3, 5, 2]
    assert exact_counts([1 / 3, 1 / 3, 1 / 3], 10).tolist() == [4, 3, 3]
    assert exact_counts([0.5, 0.5], 7).sum() == 7
    assert exact_counts([0.5000005, 0.5000005], 2_000_000).tolist() == [1_000_000, 1_000_000]


def test_default_spec_is_laptop_on_50mbps():
    t = assign_profiles(None, 5, 0)
    assert set(t.tier) == {"laptop_cpu"} and set(t.net_tier) == {"50mbps"}
    assert np.all(t.gflops == default_catalog().device("laptop_cpu").gflops)
    assert np.all(t.down_mbps == 50.0)
    assert len(assign_profiles(ProfileSpec(), 0, 0)) == 0


def test_exact_proportions_and_determinism():
    spec = {"profiles": {"devices": {"rpi4": 0.3, "phone_mid": 0.5, "laptop_cpu": 0.2},
                         "network": {"5mbps": 0.5, "500mbps": 0.5}}}
    n = 1000
    t = assign_profiles(spec, n, seed=7)
    tiers, counts = np.unique(t.tier, return_counts=True)
    assert dict(zip(tiers, counts)) == {"rpi4": 300, "phone_mid": 500, "laptop_cpu": 200}
    assert np.count_nonzero(t.down_mbps == 5.0) == 500  # exactly half on 5 Mbps
    assert np.count_nonzero(t.net_tier == "500mbps") == 500
    # values follow the tier
    c = default_catalog()
    for name in ("rpi4", "phone_mid", "laptop_cpu"):
        assert np.all(t.gflops[t.tier == name] == c.device(name).gflops)
    # deterministic by seed, different across seeds
    t2 = assign_profiles(spec, n, seed=7)
    pd.testing.assert_frame_equal(t.to_frame(), t2.to_frame())
    t3 = assign_profiles(spec, n, seed=8)
    assert not np.array_equal(t.tier, t3.tier)
    # devices and network are shuffled independently (not perfectly correlated)
    assert 0 < np.count_nonzero((t.tier == "rpi4") & (t.net_tier == "5mbps")) < 300


def test_proportions_must_sum_to_one():
    with pytest.raises(ValidationError, match="sum to"):
        ProfileSpec(devices={"rpi4": 0.3, "phone_mid": 0.5})
    ProfileSpec(devices={"rpi4": 0.3, "phone_mid": 0.7 + 5e-7})  # within 1e-6
    with pytest.raises(ValidationError, match=">= 0"):
        ProfileSpec(network={"5mbps": 1.5, "50mbps": -0.5})
    with pytest.raises(ValidationError, match="not both"):
        ProfileSpec(network={"5mbps": 1.0}, bandwidth={"distribution": "uniform"})
    with pytest.raises(ValidationError, match="extra"):
        ProfileSpec(device={"rpi4": 1.0})


@pytest.mark.parametrize("dist", ["loguniform", "uniform"])
def test_bandwidth_distributions(dist):
    n = 20000
    t = assign_profiles({"bandwidth": {"distribution": dist, "low": 5, "high": 500}}, n, seed=3)
    assert t.down_mbps.min() >= 5.0 and t.down_mbps.max() <= 500.0
    assert np.array_equal(t.up_mbps, t.down_mbps)  # default up_ratio 1
    med = np.median(t.down_mbps)
    if dist == "loguniform":
        assert abs(med - math.sqrt(5 * 500)) < 5  # geometric midpoint = 50
    else:
        assert abs(med - 252.5) < 10
    assert np.array_equal(t.down_mbps, assign_profiles({"bandwidth": {"distribution": dist}}, n, seed=3).down_mbps)
    t = assign_profiles({"bandwidth": {"low": 20, "high": 500, "up_ratio": 0.25}}, 100, seed=0)
    assert np.allclose(t.up_mbps, t.down_mbps * 0.25)


def test_overrides_tier_then_fields():
    spec = {"overrides": {3: {"down_mbps": 5, "up_mbps": 5}, "7": {"tier": "rpi4"},
                          9: {"net_tier": "500mbps", "latency_s": 0.0, "tier": "edge_gpu", "gflops": 123}}}
    t = assign_profiles(spec, 10, 0)
    assert t.down_mbps[3] == 5 and t.up_mbps[3] == 5 and t.tier[3] == "laptop_cpu"
    assert t.tier[7] == "rpi4" and t.gflops[7] == 3.0 and t.net_tier[7] == "50mbps"
    p = t.profile(9)
    assert (p.tier, p.gflops, p.net_tier, p.down_mbps, p.latency_s) == ("edge_gpu", 123.0, "500mbps", 500.0, 0.0)
    assert t.profile(0) == default_catalog().profile("laptop_cpu", "50mbps").model_copy(update={"name": "client_0"})
    with pytest.raises(ValueError, match="client id 10"):
        assign_profiles({"overrides": {10: {"gflops": 1}}}, 10, 0)
    with pytest.raises(ValidationError, match="bogus"):
        ProfileSpec(overrides={1: {"bogus": 1}})
    with pytest.raises(ProfileValidationError, match="client 2: down_mbps=1000.0"):
        assign_profiles({"overrides": {2: {"down_mbps": 1000}}}, 4, 0)
    t = assign_profiles({"overrides": {2: {"down_mbps": 1000}}, "allow_out_of_range": True}, 4, 0)
    assert t.profile(2).down_mbps == 1000.0


def test_every_profile_number_can_be_overridden_per_client():
    # a distinct valid value per field, all in one override; each lands in the client's profile
    values = {f: 0.25 + i / 100 for i, f in enumerate(NUMERIC_FIELDS)}
    values.update(down_mbps=7.0, up_mbps=9.0)
    p = assign_profiles({"overrides": {1: values}}, 2, 0).profile(1)
    assert {f: getattr(p, f) for f in NUMERIC_FIELDS} == values


def test_global_availability_dropout_override():
    t = assign_profiles({"devices": {"rpi4": 0.5, "phone_low": 0.5}, "availability": 1.0, "dropout": 0.0,
                         "overrides": {1: {"dropout": 0.5}}}, 6, 0)
    assert np.all(t.availability == 1.0)
    assert t.dropout.tolist() == [0.0, 0.5, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValidationError, match=r"availability=1.2.*\[0, 1\]"):
        ProfileSpec(availability=1.2)


FULL_ROWS = [
    dict(client_id=2, gflops=3.0, down_mbps=5.0, up_mbps=5.0, latency_s=0.05, memory_gb=4.0,
         availability=0.9, dropout=0.0, tier="rpi4", net_tier="5mbps"),
    dict(client_id=0, gflops=60.0, down_mbps=500.0, up_mbps=100.0, latency_s=0.0, memory_gb=16.0,
         availability=1.0, dropout=0.1, tier="laptop_cpu", net_tier="custom"),
    dict(client_id=1, gflops=1.5, down_mbps=20.0, up_mbps=5.0, latency_s=0.04, memory_gb=2.0,
         availability=0.4, dropout=0.1, tier="", net_tier="4g"),
]


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_table_from_file(tmp_path, ext):
    df = pd.DataFrame(FULL_ROWS).drop(columns=["net_tier"])  # net_tier "custom" is no catalog tier
    path = tmp_path / f"profiles.{ext}"
    df.to_csv(path, index=False) if ext == "csv" else df.to_parquet(path, index=False)
    t = assign_profiles({"table": str(path)}, 3, seed=0)
    # rows reordered by client_id; numeric columns win over tier values
    assert t.gflops.tolist() == [60.0, 1.5, 3.0]
    assert t.up_mbps.tolist() == [100.0, 5.0, 5.0]
    assert t.tier.tolist() == ["laptop_cpu", "laptop_cpu", "rpi4"]  # empty cell keeps the default
    assert t.net_tier.tolist() == ["50mbps"] * 3  # label not in the table: from the default
    assert t.profile(1).availability == 0.4


def test_table_partial_columns_and_tier_column(tmp_path):
    path = tmp_path / "bw.csv"
    pd.DataFrame({"down_mbps": [5, 500], "up_mbps": [5, 50], "tier": ["rpi4", "edge_gpu"]}).to_csv(path, index=False)
    t = assign_profiles({"table": str(path), "network": {"4g": 1.0}}, 2, 0)
    assert t.down_mbps.tolist() == [5.0, 500.0] and t.up_mbps.tolist() == [5.0, 50.0]
    assert t.latency_s.tolist() == [0.04, 0.04] and t.net_tier.tolist() == ["4g", "4g"]
    assert t.tier.tolist() == ["rpi4", "edge_gpu"] and t.gflops.tolist() == [3.0, 300.0]


def test_table_errors(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"gflops": [1.0, 2.0]}).to_csv(path, index=False)
    with pytest.raises(ProfileValidationError, match="2 rows.*3"):
        assign_profiles({"table": str(path)}, 3, 0)
    pd.DataFrame({"gflops": [1.0, 2.0], "gpu": [1, 1]}).to_csv(path, index=False)
    with pytest.raises(ProfileValidationError, match="unknown columns.*gpu"):
        assign_profiles({"table": str(path)}, 2, 0)
    pd.DataFrame({"client_id": [0, 0], "gflops": [1.0, 2.0]}).to_csv(path, index=False)
    with pytest.raises(ProfileValidationError, match="permutation"):
        assign_profiles({"table": str(path)}, 2, 0)
    # first offending client (lowest id) is reported with column and value
    table = pd.DataFrame({"client_id": [1, 0, 2], "gflops": [-1.0, 2.0, 0.0], "dropout": [0.0, 0.0, 2.0]})
    table.to_csv(path, index=False)
    with pytest.raises(ProfileValidationError, match=r"client 1: gflops=-1.0 is not allowed: must be > 0"):
        assign_profiles({"table": str(path)}, 3, 0)
    with pytest.raises(ValueError, match="unsupported extension"):
        assign_profiles({"table": str(tmp_path / "t.xlsx")}, 3, 0)


def test_profile_table_validation_vectorised():
    n = 5
    cols = {f: np.ones(n) * v for f, v in dict(gflops=1, down_mbps=50, up_mbps=50, latency_s=0,
                                                  memory_gb=1, availability=1, dropout=0).items()}
    cols.update(tier=[""] * n, net_tier=[""] * n)
    ProfileTable(**cols)
    bad = {**cols, "up_mbps": np.array([50, 50, 50, 501, 0.0]), "availability": np.array([1, 1, 1, 1, -1.0])}
    with pytest.raises(ProfileValidationError, match=r"client 3: up_mbps=.*501.*\[5, 500\].*allow_out_of_range"):
        ProfileTable(**bad)
    with pytest.raises(ProfileValidationError, match=r"client 4: up_mbps=.*0.0.*must be > 0"):
        ProfileTable(**bad, allow_out_of_range=True)
    with pytest.raises(ProfileValidationError, match="shape"):
        ProfileTable(**{**cols, "gflops": np.ones(n - 1)})


def test_to_frame_and_roundtrip():
    t = assign_profiles({"devices": {"rpi4": 0.5, "edge_gpu": 0.5}}, 6, 1)
    df = t.to_frame()
    assert list(df.columns) == ["client_id", "gflops", "down_mbps", "up_mbps", "latency_s", "memory_gb",
                                "availability", "dropout", "train_w", "idle_w", "rx_w", "tx_w", "tail_j",
                                "battery_wh", "cache_bytes", "topk_ns_in_cache", "topk_ns_out_of_cache",
                                "randomk_ns_per_kept", "periodick_ns_per_kept", "quant_ns_per_elem",
                                "tier", "net_tier"]
    # a profiles.parquet written before the power model: its power is unknown, no battery
    old = ProfileTable.from_frame(df.drop(columns=["train_w", "idle_w", "rx_w", "tx_w", "tail_j", "battery_wh"]))
    assert np.isnan(old.train_w).all() and (old.battery_wh == 0).all()
    assert df["client_id"].tolist() == list(range(6)) and len(t) == 6
    t2 = ProfileTable.from_frame(df.sample(frac=1, random_state=0))  # shuffled rows, client_id reorders
    pd.testing.assert_frame_equal(t2.to_frame(), df)
    t3 = ProfileTable.from_profiles([t.profile(i) for i in range(len(t))])
    pd.testing.assert_frame_equal(t3.to_frame(), df)
    with pytest.raises(IndexError):
        t.profile(6)


def test_large_fleet_is_small_and_fast():
    import time

    start = time.perf_counter()  # test-only timing; the package never reads the clock
    t = assign_profiles({"devices": {"rpi4": 0.2, "phone_low": 0.2, "phone_mid": 0.2, "phone_high": 0.2,
                                     "edge_gpu": 0.2},
                         "bandwidth": {"distribution": "loguniform"}}, 100_000, 0)
    assert time.perf_counter() - start < 2.0
    assert len(t) == 100_000
    assert t.nbytes <= 100_000 * 8 * 21  # 19 float64 (6 of the power model, 6 selection costs) + 2 pointers
    assert np.count_nonzero(t.tier == "edge_gpu") == 20_000


def test_the_profile_table_has_a_column_for_every_profile_field_and_no_other():
    # ProfileTable lists its columns as dataclass fields (typed, readable); the profile's field
    # lists are the one source: a field added there and not here (or the reverse) fails here
    columns = [f.name for f in dataclasses.fields(ProfileTable) if f.name != "allow_out_of_range"]
    assert sorted(columns) == sorted(NUMERIC_FIELDS + LABEL_FIELDS)
