"""Property-based tests of the tables a user brings (generators: tests/helpers/inputs.py): trace
files (links, compute, availability) and profile tables, as CSV or Parquet, with any columns and
any cell values. Reading one gives its traces or profiles, or a ``ValueError`` naming the file
(a ``TraceError`` for a trace); never another exception. ``make fuzz`` runs more examples."""
import math

import numpy as np
import pandas as pd
import pytest
from helpers.inputs import examples, no_hang
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hardware_profiles.sampler import assign_profiles
from hardware_profiles.traces import TraceError, read_interval_traces, read_rate_traces

TRACE_COLUMNS = ["trace_id", "client_id", "t_s", "down_mbps", "up_mbps", "factor", "start_s", "end_s", "junk"]
PROFILE_COLUMNS = ["client_id", "gflops", "down_mbps", "up_mbps", "latency_s", "memory_gb", "availability",
                   "dropout", "tier", "net_tier", "battery_wh", "name", "junk"]
CELLS = st.one_of(st.integers(-3, 10), st.sampled_from([0.0, 0.5, 1.5, 100.0, -1.0, 1e300]),
                  st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["a", "", "5", "1e3", "phone_low",
                                                                                   "5mbps", "\u00e9"]), st.none())


@st.composite
def frames(draw, columns):
    names = draw(st.lists(st.sampled_from(columns), min_size=0, max_size=5, unique=True))
    n = draw(st.integers(0, 5))
    kind = draw(st.sampled_from(["mixed", "ints", "floats"]))
    out = {}
    for name in names:
        if kind == "ints":
            out[name] = draw(st.lists(st.integers(-1, 5), min_size=n, max_size=n))
        elif kind == "floats":
            out[name] = draw(st.lists(st.floats(-1, 600, allow_nan=False), min_size=n, max_size=n))
        else:
            out[name] = draw(st.lists(CELLS, min_size=n, max_size=n))
    return pd.DataFrame(out)


def _write(folder, frame: pd.DataFrame, fmt: str, raw: bytes | None = None):
    path = folder / f"t.{fmt}"
    if raw is not None:
        path.write_bytes(raw)
    elif fmt == "csv":
        frame.to_csv(path, index=False)
    else:
        try:
            frame.to_parquet(path)
        except Exception:  # noqa: BLE001 - a column of mixed Python objects pyarrow cannot store
            frame.astype(str).to_parquet(path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("tables")


GOOD_TRACE = pd.DataFrame({"trace_id": ["a", "a", "b", "b"], "t_s": [0.0, 10.0, 0.0, 5.0],
                           "down_mbps": [5.0, 50.0, 1.0, 2.0]})


@settings(max_examples=examples(1.0))
@given(frame=frames(TRACE_COLUMNS), fmt=st.sampled_from(["csv", "parquet"]),
       raw=st.one_of(st.none(), st.binary(max_size=40), st.just(b"\xff\xfe\x00"), st.just(b"trace_id,t_s\n\"a,")))
@example(frame=GOOD_TRACE, fmt="csv", raw=None)
@example(frame=pd.DataFrame({"trace_id": ["a", "a"], "t_s": ["x", 1], "down_mbps": [5, 6]}), fmt="csv", raw=None)
@example(frame=pd.DataFrame({"trace_id": ["a", "a"], "t_s": [0, 1], "down_mbps": [None, "x"]}), fmt="parquet",
         raw=None)
def test_a_trace_file_reads_or_is_refused_naming_it(frame, fmt, raw, folder):
    path = _write(folder, frame, fmt, raw)
    for read in (lambda: read_rate_traces(path, "down_mbps"), lambda: read_interval_traces(path)):
        with no_hang():
            try:
                traces = read()
            except TraceError as err:
                assert str(path) in str(err) or path.name in str(err), str(err)
                continue
        for a, b in traces.values():
            assert np.isfinite(a).all() and np.isfinite(b).all()
    if raw is None and frame.equals(GOOD_TRACE) and fmt == "csv":
        assert sorted(read_rate_traces(path, "down_mbps")) == ["a", "b"]


@settings(max_examples=examples(1.0))
@given(frame=frames(PROFILE_COLUMNS), fmt=st.sampled_from(["csv", "parquet"]),
       raw=st.one_of(st.none(), st.none(), st.binary(max_size=40)))
@example(frame=pd.DataFrame({"client_id": [0, "a"], "gflops": [1.0, 2.0]}), fmt="csv", raw=None)
@example(frame=pd.DataFrame({"client_id": [1, 0], "down_mbps": ["x", 5]}), fmt="csv", raw=None)
@example(frame=pd.DataFrame({"tier": [1.5, None]}), fmt="parquet", raw=None)
def test_a_profile_table_assigns_or_is_refused_naming_it(frame, fmt, raw, folder):
    path = _write(folder, frame, fmt, raw)
    n = max(len(frame), 1)
    with no_hang():
        try:
            table = assign_profiles({"table": str(path)}, n, seed=0)
        except ValueError as err:
            assert "profile table" in str(err) or "client" in str(err), str(err)
            return
    assert len(table) == n and all(math.isfinite(v) for v in table.down_mbps)
