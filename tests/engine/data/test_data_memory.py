"""The eager data's memory, estimated at validation: a million clients of eager
``synthetic`` are refused with a message naming ``dataset.params.lazy: true`` before anything is
built; the estimate is the generator's own row count and the peak tracemalloc measures."""
import tracemalloc

import pytest

from engine.config.schema import load_config
from engine.data import memory
from engine.data.build import build_data
from engine.data.memory import GiB, eager_synthetic_bytes, memory_problems
from hetsim.cli import main

MILLION = ["dataset.name=synthetic", "partition.scheme=natural", "clients.num_clients=1000000",
           "clients.profiles={}"]


def test_the_estimate_is_the_generators_rows_and_its_measured_peak():
    cfg = load_config(None, ["dataset.name=synthetic", "partition.scheme=natural", "clients.num_clients=3000",
                             "clients.profiles={}", "dataset.params={num_features: 40}"])
    need, rows = eager_synthetic_bytes(cfg)
    tracemalloc.start()
    try:
        data = build_data(cfg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == len(data.x) == len(data.y)  # the generator's own size draw, replayed
    assert 0.85 * peak <= need <= 1.15 * peak, (need, peak)


def test_a_million_eager_clients_are_refused_naming_lazy(monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_memory", lambda: 16 * GiB)
    called = []
    monkeypatch.setattr("engine.loop.parts.build_data", lambda cfg: called.append(cfg))
    assert main(["validate", *sum((["--set", s] for s in MILLION), [])]) == 2
    err = capsys.readouterr().err
    assert "clients.num_clients = 1000000 with dataset 'synthetic' (eager): generating its " in err
    assert "of the 16.0 GiB of memory available; set dataset.params.lazy: true to build" in err
    assert called == []  # refused before the data is built
    need, rows = eager_synthetic_bytes(load_config(None, MILLION))
    assert 60e6 < rows < 70e6 and need > 25 * GiB  # ~64 rows a client, 60 float32 features
    assert f"{rows:,} rows needs about {need / GiB:.1f} GiB" in err


def test_lazy_or_small_fleets_pass_and_the_hint_adds_the_scheme():
    lazy = load_config(None, [*MILLION, "dataset.params={lazy: true}"])
    assert eager_synthetic_bytes(lazy) is None and memory_problems(lazy, available=1 * GiB) == []
    small = load_config(None, ["dataset.name=synthetic", "clients.num_clients=100"])
    assert memory_problems(small, available=1 * GiB) == []
    assert memory_problems(load_config(None, ["clients.num_clients=1000000"]), available=1 * GiB) == []  # mnist5k
    big = load_config(None, ["dataset.name=synthetic", "clients.num_clients=200000", "partition.scheme=iid"])
    (line,) = memory_problems(big, available=1 * GiB)
    assert "set dataset.params.lazy: true with partition.scheme: natural to build" in line
    # the dataset's own client count wins, as build_data reads it
    own = load_config(None, ["dataset.name=synthetic", "clients.num_clients=10",
                             "dataset.params={num_clients: 300000}"])
    (line,) = memory_problems(own, available=1 * GiB)
    assert line.startswith("  dataset.params.num_clients = 300000 with dataset 'synthetic'")


@pytest.mark.parametrize("clients", [1_000, 3_000_000])
def test_rows_scale_with_the_fleet(clients):
    cfg = load_config(None, ["dataset.name=synthetic", f"clients.num_clients={clients}"])
    _, rows = eager_synthetic_bytes(cfg)
    assert 55 * clients < rows < 75 * clients  # a mean of ~64 samples per client (load_synthetic)
