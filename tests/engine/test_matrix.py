"""The feature matrix (issue 36): one small run for every (method x executor x sync/async x data
source x conditions) cell meant to work, and a refusal at validation, naming the field, the value
and what is allowed, for every cell that is not.

"Meant to work" comes from the code's own constants, not from a list here: a method runs
asynchronously iff it is in :data:`algorithms.asynchronous.ASYNC_METHODS`, so a method added
there flips its asynchronous cells to runs. Every cell runs in-process; on Ray a stratified
subset (:data:`RAY_CELLS`: every method, data source, mode and conditions value at least once)
runs, since each Ray run starts its own actors (17-40 s a run on 2 cores at load 15). The other Ray cells are
the same code path as their in-process cells (tests/engine/ray/test_ray_executor.py and the
identical-tables tests in tests/engine/test_async.py and tests/engine/data/test_ondemand.py compare
the executors).

``docs/matrix.md`` is :func:`render` (checked below); regenerate it with
``PYTHONPATH=.:tests python tests/engine/test_matrix.py > docs/matrix.md``.
"""
from __future__ import annotations

import itertools
import typing
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO

from algorithms.asynchronous import ASYNC_METHODS
from algorithms.params import ALGORITHM_PARAMS
from engine.config.schema import ExecutorConfig
from engine.data.build import ON_DEMAND_PARAMS, ON_DEMAND_SCHEMES
from engine.data.partition import PARTITION_SCHEMES

METHODS = tuple(ALGORITHM_PARAMS)
EXECUTORS = typing.get_args(ExecutorConfig.model_fields["kind"].annotation)
MODES = ("sync", "async")
SOURCES = ("memory", "lazy", "disk")
CONDITIONS = ("off", "on")
SOURCE_TEXT = {"memory": "synthetic, in memory", "lazy": "synthetic, lazy", "disk": "Parquet on disk (iid)"}

ROUNDS, CLIENTS, BUFFER = 2, 4, 2
BASE = ["model.name=mlp", "model.params={hidden: [8]}", f"clients.num_clients={CLIENTS}", f"rounds={ROUNDS}",
        "clients.participation=1.0", "clients.profiles={availability: 1.0, dropout: 0.0}", "train.batch_size=32",
        "partition.public_fraction=0.1", "checkpoint.every=0", "evaluation.personalized=false"]
SYNTH = "num_features: 6, num_classes: 3, min_samples: 30, max_samples: 60"
METHOD_OVERRIDES = {"fedcspack": ["algorithm.pack_size=64"], "ascend": ["algorithm.distill_steps=2"]}
CONDITIONS_ON = ["clients.profiles.conditions={sets: {fading: {down: gilbert_elliott, compute: thermal_throttling}}}"]
ASYNC_ON = [f"asynchronous={{concurrency: {BUFFER}, buffer_size: {BUFFER}}}"]
RAY_ON = ["executor.kind=ray", "executor.num_actors=1", "ray.num_cpus=2"]


def refusal(method: str, executor: str, mode: str, source: str, conditions: str) -> str | None:
    """None if the cell is meant to work, else the text its refusal must hold (field, value, allowed)."""
    if mode == "async" and method not in ASYNC_METHODS:
        return (f"algorithm.name = {method!r} cannot run asynchronously",
                f"allowed with asynchronous: {', '.join(ASYNC_METHODS)}")
    return None


CELLS = list(itertools.product(METHODS, EXECUTORS, MODES, SOURCES, CONDITIONS))
WORKING = [c for c in CELLS if refusal(*c) is None]
REFUSED = [c for c in CELLS if refusal(*c) is not None]


def _ray_cells() -> set[tuple]:
    """One Ray cell per method, the other axes cycling (a mode a method cannot run falls back to sync)."""
    out = set()
    for i, m in enumerate(METHODS):
        mode = MODES[i % 2] if refusal(m, "ray", MODES[i % 2], "memory", "off") is None else "sync"
        out.add((m, "ray", mode, SOURCES[i % len(SOURCES)], CONDITIONS[(i // 2) % 2]))
    return out


RAY_CELLS = _ray_cells()
RUN = [c for c in WORKING if c[1] != "ray" or c in RAY_CELLS]


def overrides(cell, table: Path, cache: Path) -> list[str]:
    method, executor, mode, source, conditions = cell
    data = {
        "memory": ["dataset.name=synthetic", f"dataset.params={{{SYNTH}}}", "partition.scheme=natural"],
        "lazy": ["dataset.name=synthetic", f"dataset.params={{lazy: true, {SYNTH}}}", "partition.scheme=natural"],
        "disk": ["dataset.name=parquet", f"dataset.params={{path: {table}, on_disk: true, cache_dir: {cache}}}",
                 "partition.scheme=iid"],
    }[source]
    return [*BASE, *data, f"algorithm.name={method}", *METHOD_OVERRIDES.get(method, []),
            *(ASYNC_ON if mode == "async" else []), *(CONDITIONS_ON if conditions == "on" else []),
            *(RAY_ON if executor == "ray" else [])]


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("matrix")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    who = np.array([f"c{i}" for i in rng.integers(0, CLIENTS, len(y))])  # text: never a feature column
    pq.write_table(pa.table({"who": who, "label": y, **{f"f{i}": x[:, i] for i in range(6)}}),
                   folder / "t.parquet", row_group_size=64)
    return folder / "t.parquet", folder / "cache"


def _id(cell) -> str:
    return "-".join(cell)


@pytest.mark.parametrize("cell", [pytest.param(c, id=_id(c), marks=[pytest.mark.ray, pytest.mark.slow])
                                  if c[1] == "ray" else pytest.param(c, id=_id(c)) for c in RUN])
def test_a_cell_meant_to_work_runs(cell, table, tmp_path):
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    method, executor, mode, source, conditions = cell
    run = load_run(run_experiment(load_config(None, overrides(cell, *table)), tmp_path / "run"))
    assert run.manifest["status"] == "finished"
    assert run.config["algorithm"]["name"] == method and run.config["executor"]["kind"] == executor
    assert (run.config["asynchronous"] is not None) == (mode == "async")
    assert run.rounds["round"].tolist() == list(range(ROUNDS))
    # sync: every client every round; async (FedBuff): a step per BUFFER arrivals
    assert len(run.clients) == ROUNDS * (BUFFER if mode == "async" else CLIENTS)
    assert np.isfinite(run.rounds["global_acc"].to_numpy(dtype=float)).all()
    assert (run.clients["bytes_up"] >= 0).all() and run.clients["bytes_up"].sum() > 0  # FedCSPACK may share none
    assert ("conditions" in run.profiles.columns) == (conditions == "on")
    if conditions == "on":
        assert set(run.profiles["conditions"]) == {"fading"}
    assert run.manifest["num_clients"] == CLIENTS


@pytest.mark.parametrize("cell", REFUSED or [None], ids=[_id(c) for c in REFUSED] or ["none-refused"])
def test_a_cell_not_meant_to_work_is_refused_at_validation(cell, table, tmp_path):
    from engine.config.schema import load_config
    from engine.errors import ConfigError

    if cell is None:  # every cell runs: the refusals left are options of a method, not cells
        from algorithms.asynchronous import SYNCHRONOUS_ONLY

        assert not SYNCHRONOUS_ONLY
        base = overrides(("ascend", "inprocess", "async", "memory", "off"), *table)
        with pytest.raises(ConfigError) as err:
            load_config(None, [*base, "algorithm.reward=v1"])
        assert "algorithm.reward" in str(err.value) and "'v1'" in str(err.value), str(err.value)
        return
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides(cell, *table))
    for part in refusal(*cell):
        assert part in str(err.value), (part, str(err.value))


def test_the_matrix_covers_every_cell_and_ray_every_axis_value():
    assert len(CELLS) == len(METHODS) * len(EXECUTORS) * len(MODES) * len(SOURCES) * len(CONDITIONS)
    assert set(METHODS) >= {"fedavg", "fedprox", "fedavg_compressed", "fedcspack", "ascend"}
    assert set(EXECUTORS) == {"inprocess", "ray"}
    assert set(WORKING) | set(REFUSED) == set(CELLS) and not set(WORKING) & set(REFUSED)
    assert {c for c in RUN if c[1] == "inprocess"} == {c for c in WORKING if c[1] == "inprocess"}
    ray_only = tuple(e for e in EXECUTORS if e == "ray")
    for axis, values in enumerate((METHODS, ray_only, MODES, SOURCES, CONDITIONS)):
        seen = {c[axis] for c in RAY_CELLS}
        assert seen >= set(values) - ({"async"} if not ASYNC_METHODS else set()), (axis, seen)
    assert RAY_CELLS <= set(WORKING)


# ---------------------------------------------------------------- data sources x partition schemes
# (dataset, on demand): the data sources of a run; each with every partition scheme
DATA = (("synthetic", False), ("synthetic", True), ("parquet", False), ("parquet", True))
DATA_TEXT = {("synthetic", False): "synthetic, in memory", ("synthetic", True): "synthetic, lazy",
             ("parquet", False): "Parquet, in memory", ("parquet", True): "Parquet, on disk"}


def data_refusal(dataset: str, on_demand: bool, scheme: str) -> tuple[str, ...] | None:
    """None if the data source takes the scheme (engine.data.build.ON_DEMAND_SCHEMES), else the
    text its refusal must hold."""
    if on_demand and scheme not in ON_DEMAND_SCHEMES[dataset]:
        return (f"dataset.params.{ON_DEMAND_PARAMS[dataset]}: true", f"partition.scheme = 'natural', not {scheme!r}")
    return None


DATA_CELLS = list(itertools.product(DATA, PARTITION_SCHEMES))


def data_overrides(dataset: str, on_demand: bool, scheme: str, table: Path, cache: Path) -> list[str]:
    if dataset == "synthetic":
        params = f"dataset.params={{{'lazy: true, ' if on_demand else ''}{SYNTH}}}"
    else:
        params = f"dataset.params={{path: {table}, client_column: who, on_disk: {on_demand}, cache_dir: {cache}}}"
    return [*BASE, f"dataset.name={dataset}", params, f"partition.scheme={scheme}"]


@pytest.mark.parametrize(("source", "scheme"), DATA_CELLS,
                         ids=[f"{d}-{'ondemand' if o else 'memory'}-{s}" for (d, o), s in DATA_CELLS])
def test_each_data_source_takes_each_scheme_or_refuses_it_at_validation(source, scheme, table):
    from engine.config.schema import load_config
    from engine.data.build import build_data
    from engine.errors import ConfigError
    from engine.run.validate import validate_experiment

    cfg = load_config(None, data_overrides(*source, scheme, *table))
    why = data_refusal(*source, scheme)
    if why is not None:
        with pytest.raises(ConfigError) as err:
            validate_experiment(cfg)
        for part in why:
            assert part in str(err.value), (part, str(err.value))
        return
    validate_experiment(cfg)
    data = build_data(cfg)
    assert data.on_demand == source[1] and data.num_clients == CLIENTS
    assert (data.client_num_train() > 0).all() and data.num_global_test > 0
    x, y = data.global_test_arrays()
    assert len(y) == data.num_global_test and np.isfinite(x).all() and x.shape[1:] == (6,)


def render() -> str:
    """docs/matrix.md: the matrix as this module runs it."""
    cols = list(itertools.product(SOURCES, CONDITIONS))
    head = "| method | mode | " + " | ".join(f"{SOURCE_TEXT[s]}, conditions {c}" for s, c in cols) + " |"
    lines = [
        "# The feature matrix",
        "",
        "Generated by `tests/engine/test_matrix.py` (`render`); `test_docs_matrix_is_the_generated_table` checks",
        "that this page is what the test runs. Regenerate it with",
        "`PYTHONPATH=.:tests python tests/engine/test_matrix.py > docs/matrix.md`.",
        "",
        f"Each cell is one run of {CLIENTS} clients, {ROUNDS} rounds (or {ROUNDS} asynchronous server steps",
        f"of a FedBuff buffer of {BUFFER}), an MLP with 8 hidden units, checked to finish with {ROUNDS} rows in",
        "`rounds`, the expected rows in `clients`, a finite accuracy and, with conditions on, the",
        "conditions set in `profiles`. Conditions on: a Gilbert-Elliott downlink and thermal throttling",
        "([conditions.md](conditions.md)). Data: `synthetic` (natural clients) in memory or `lazy: true`,",
        "and a Parquet table with `on_disk: true` split `iid` ([datasets.md](datasets.md)).",
        "",
        "* **in-process ✓**: the cell runs in-process, in every test run of the file;",
        "* **Ray ✓**: the cell also runs on Ray (`executor.kind: ray`, one actor). Ray covers a",
        f"  stratified subset, {len(RAY_CELLS)} of the {sum(c[1] == 'ray' for c in WORKING)} Ray cells meant to "
        "work: every method,",
        "  data source, mode and conditions value at least once (each Ray run starts its own actors:",
        "  17-40 s a run on 2 cores at load 15). The other Ray cells are not run here; the identical-tables tests",
        "  (`tests/engine/test_async.py`, `tests/engine/data/test_ondemand.py`,",
        "  `tests/engine/ray/test_ray_executor.py`) compare the executors on the same code paths;",
        "* **refused**: validation refuses the cell on both executors, before a run folder exists;",
        "  the message names the field, the value and what is allowed (below).",
        "",
        head,
        "|" + "---|" * (2 + len(cols)),
    ]
    reasons = {}
    for m, mode in itertools.product(METHODS, MODES):
        row = []
        for s, c in cols:
            why = refusal(m, "inprocess", mode, s, c)
            if why is not None:
                reasons.setdefault(why, []).append(f"{m}/{mode}")
                row.append("refused")
            else:
                row.append("in-process ✓" + (", Ray ✓" if (m, "ray", mode, s, c) in RAY_CELLS else ""))
        lines.append(f"| {m} | {mode} | " + " | ".join(row) + " |")
    lines += ["", "## Refusals", ""]
    for why, where in reasons.items():
        lines.append(f"* {', '.join(sorted(set(where)))}: \"{' … '.join(why)}\" "
                     "(the reason is `SYNCHRONOUS_ONLY` in `algorithms/asynchronous.py`).")
    lines += [
        "",
        "## Data sources and partition schemes",
        "",
        "Each data source with each `partition.scheme` (`test_each_data_source_takes_each_scheme_or_refuses_it_at_"
        "validation`):",
        "validated as a run would be and, where it works, its data built (every client with training",
        "rows, a finite global test set). What an on-demand source takes is `ON_DEMAND_SCHEMES` in",
        "`engine/data/build.py`. The Parquet table has a client column, for `natural`.",
        "",
        "| data source | " + " | ".join(PARTITION_SCHEMES) + " |",
        "|" + "---|" * (1 + len(PARTITION_SCHEMES)),
    ]
    data_reasons = {}
    for source in DATA:
        row = []
        for scheme in PARTITION_SCHEMES:
            why = data_refusal(*source, scheme)
            row.append("✓" if why is None else "refused")
            if why is not None:
                data_reasons.setdefault(DATA_TEXT[source], why[0])
        lines.append(f"| {DATA_TEXT[source]} | " + " | ".join(row) + " |")
    lines.append("")
    for text, field in data_reasons.items():
        lines.append(f"* {text}: \"{field} generates each natural client's rows from (seed, client id), which "
                     "needs partition.scheme = 'natural'\" (use it in memory for a label scheme).")
    return "\n".join(lines) + "\n"


def test_docs_matrix_is_the_generated_table():
    page = REPO / "docs" / "matrix.md"
    assert page.read_text(encoding="utf-8") == render(), (
        "docs/matrix.md is stale: PYTHONPATH=.:tests python tests/engine/test_matrix.py > docs/matrix.md")


if __name__ == "__main__":
    print(render(), end="")
