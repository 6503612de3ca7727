"""The feature matrix: one small run for every (method x executor x sync/async x data
source x conditions) cell meant to work, and a refusal at validation, naming the field, the value
and what is allowed, for every cell that is not (the baselines run the in-memory source only:
``sources_of``).

"Meant to work" comes from the code's own constants, not from a list here: a method runs
asynchronously iff its params class says it can (:func:`algorithms.asynchronous.async_methods`),
so a method registered with asynchronous support flips its asynchronous cells to runs. Every
cell runs in-process and on Ray, and each Ray
run's tables must equal its in-process twin's (the executors promise it:
tests/engine/ray/test_ray_executor.py, tests/engine/test_async.py,
tests/engine/data/test_ondemand.py). A Ray run starting its own actors costs 15-40 s on 2
cores (process start and torch import); the Ray cells share the suite's Ray and run with
``executor.keep_warm``, so one driver and one client actor serve all of them (0.3-1 s a cell
once warm). The first Ray cell's actors are new, so equal tables in every cell also show that
a run on warm actors equals one on new actors.

``docs/matrix.md`` is :func:`render` (checked below); regenerate it with
``PYTHONPATH=.:tests python tests/engine/test_matrix.py > docs/matrix.md``.
"""
from __future__ import annotations

import itertools
import typing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import REPO

from algorithms.asynchronous import async_methods
from algorithms.params import ALGORITHM_PARAMS
from engine.config.schema import ExecutorConfig
from engine.data.build import ON_DEMAND_PARAMS, ON_DEMAND_SCHEMES
from engine.data.partition import PARTITION_SCHEMES
from hardware_profiles.deadlines import POLICIES

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
METHOD_OVERRIDES = {"fedcspack": ["algorithm.pack_size=64"], "ascend": ["algorithm.distill_steps=2"],
                    # the phone_mid half of the default fleet trains the half-width MLP
                    "heterofl": ["model.zoo=[{arch: mlp_half, model: mlp, max_gflops: 10}]",
                                 "model.arch_params={mlp_half: {hidden: [8], width: 0.5}}"]}
CONDITIONS_ON = ["clients.profiles.conditions={sets: {fading: {down: gilbert_elliott, compute: thermal_throttling}}}"]
ASYNC_ON = [f"asynchronous={{concurrency: {BUFFER}, buffer_size: {BUFFER}}}"]
RAY_ON = ["executor.kind=ray", "executor.num_actors=1", "ray.num_cpus=2", "executor.keep_warm=true"]


def refusal(method: str, executor: str, mode: str, source: str, conditions: str) -> str | None:
    """None if the cell is meant to work, else the text its refusal must hold (field, value, allowed)."""
    if mode == "async" and method not in async_methods():
        return (f"algorithm.name = {method!r} cannot run asynchronously",
                f"allowed with asynchronous: {', '.join(async_methods())}")
    return None


# Every data source hands a method the same arrays, so the other sources are the engine's, which the
# first methods show on each; the methods after them (the baselines, docs/baselines.md) run the
# in-memory source only, with conditions off and on, which keeps the matrix's time.
ALL_SOURCES = ("fedavg", "fedprox", "fedavg_compressed", "fedcspack", "ascend")


def sources_of(method: str) -> tuple[str, ...]:
    return SOURCES if method in ALL_SOURCES else SOURCES[:1]


CELLS = [c for c in itertools.product(METHODS, EXECUTORS, MODES, SOURCES, CONDITIONS) if c[3] in sources_of(c[0])]
WORKING = [c for c in CELLS if refusal(*c) is None]
REFUSED = [c for c in CELLS if refusal(*c) is not None]


RUN = [c for c in WORKING if c[1] == "inprocess"]
RAY_RUN = [c for c in WORKING if c[1] == "ray"]


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


def run_cell(cell, table: tuple[Path, Path], folder: Path):
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    return load_run(run_experiment(load_config(None, overrides(cell, *table)), folder))


def check_cell(run, cell) -> None:
    """What every cell's run must show: finished, its rows, finite accuracy, its conditions."""
    method, executor, mode, source, conditions = cell
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


@pytest.fixture(scope="module")
def inprocess_runs(table, tmp_path_factory):
    """Each in-process cell's run, run once: its own test checks it, its Ray twin compares with it."""
    runs = {}

    def get(cell):
        if cell not in runs:
            runs[cell] = run_cell(cell, table, tmp_path_factory.mktemp(_id(cell)))
        return runs[cell]
    return get


@pytest.fixture(scope="module")
def warm_ray(ray_session) -> dict:
    """The shared Ray; every Ray cell runs with ``executor.keep_warm``, so one driver actor and
    one client actor (torch and the methods imported once) serve them all, until the module ends
    (tests/conftest.py). What the fixture holds: the processes of the last Ray cell that passed."""
    return {}


@pytest.mark.parametrize("cell", RUN, ids=_id)
def test_a_cell_meant_to_work_runs(cell, inprocess_runs):
    check_cell(inprocess_runs(cell), cell)


@pytest.mark.ray
@pytest.mark.parametrize("cell", RAY_RUN, ids=_id)
def test_a_ray_cell_runs_on_warm_actors_and_equals_the_in_process_cell(cell, table, inprocess_runs, warm_ray,
                                                                        tmp_path):
    from engine.results.tables import WALL_COLUMNS

    previous = warm_ray.pop("processes", None)
    run = run_cell(cell, table, tmp_path / "run")
    check_cell(run, cell)
    processes = (run.manifest["loop_pid"], run.manifest["executor"]["actor_pids"])
    if previous is not None:  # keep_warm: the previous cell's driver and client actor ran this one
        assert processes == previous
    twin = inprocess_runs((cell[0], "inprocess", *cell[2:]))
    for ray_table, local_table in ((run.rounds, twin.rounds), (run.clients, twin.clients)):
        keep = [c for c in ray_table.columns if c not in WALL_COLUMNS]
        pd.testing.assert_frame_equal(ray_table[keep], local_table[keep])
    warm_ray["processes"] = processes


@pytest.mark.ray
def test_a_ray_run_asking_for_other_actors_stops_the_warm_ones(table, warm_ray, tmp_path):
    import ray

    from engine.config.schema import load_config
    from engine.ray import driver

    cell = ("fedavg", "ray", "sync", "memory", "off")
    run_cell(cell, table, tmp_path)  # on the Ray cells' warm actors (on new ones when run alone)
    warm = driver._warm[1]
    assert driver._warm_driver_for(load_config(None, overrides(cell, *table)), take=False) is warm
    other = load_config(None, [*overrides(cell, *table), "executor.num_actors=2"])
    assert driver._warm_driver_for(other) is None and driver._warm is None
    with pytest.raises(ray.exceptions.RayActorError):  # stopped, with its client actor
        ray.get(warm.poll.remote())


class _Pool:
    """What the driver actor asks of a Ray executor to hand its actors on (keep_actors, close, parked)."""

    def __init__(self):
        self.keep_actors, self.parked = False, []

    def close(self):
        self.parked = ["actor"] if self.keep_actors else []


@pytest.mark.parametrize("fails", [False, True], ids=["ended", "failed"])
def test_the_driver_actor_keeps_its_actors_warm_only_after_a_run_that_ended(fails, table, monkeypatch):
    from engine.config.schema import load_config
    from engine.ray.driver import DriverActor

    monkeypatch.setattr("engine.ray.driver.ray.get_gpu_ids", lambda: [])  # a plain object here, not an actor
    monkeypatch.setattr("engine.ray.driver.set_ray_gpu_ids", lambda ids: None)
    cfg = load_config(None, overrides(("fedavg", "ray", "sync", "memory", "off"), *table))
    loop = DriverActor()
    loop._executor = pool = _Pool()

    def body(cfg, path, callbacks, command, executor, resume, warnings):
        assert executor is pool and pool.keep_actors
        if fails:
            raise RuntimeError("client 1 failed in round 0")
        return path

    if fails:
        with pytest.raises(RuntimeError, match="client 1"):
            loop.run(body, cfg, "run", [])
    else:
        assert loop.run(body, cfg, "run", []) == "run"
    assert pool.parked == ([] if fails else ["actor"]) and (loop._warm is pool) == (not fails)
    assert not pool.keep_actors  # once handed on or failed, closing the pool stops its actors


@pytest.mark.parametrize("cell", REFUSED or [None], ids=[_id(c) for c in REFUSED] or ["none-refused"])
def test_a_cell_not_meant_to_work_is_refused_at_validation(cell, table, tmp_path):
    from engine.config.schema import load_config
    from engine.errors import ConfigError

    if cell is None:  # every cell runs: the refusals left are options of a method, not cells
        from algorithms.asynchronous import synchronous_only
        from algorithms.params import ALGORITHM_PARAMS

        assert not [m for m in ALGORITHM_PARAMS if synchronous_only(m) is not None]
        base = overrides(("ascend", "inprocess", "async", "memory", "off"), *table)
        with pytest.raises(ConfigError) as err:
            load_config(None, [*base, "algorithm.reward=v1"])
        assert "algorithm.reward" in str(err.value) and "'v1'" in str(err.value), str(err.value)
        return
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides(cell, *table))
    for part in refusal(*cell):
        assert part in str(err.value), (part, str(err.value))


def test_the_matrix_runs_every_working_cell_on_both_executors():
    assert len(CELLS) == sum(len(sources_of(m)) for m in METHODS) * len(EXECUTORS) * len(MODES) * len(CONDITIONS)
    assert set(ALL_SOURCES) <= set(METHODS)
    assert set(METHODS) >= {"fedavg", "fedprox", "fedavg_compressed", "fedcspack", "ascend"}
    assert set(EXECUTORS) == {"inprocess", "ray"}
    assert set(WORKING) | set(REFUSED) == set(CELLS) and not set(WORKING) & set(REFUSED)
    assert sorted(RUN + RAY_RUN) == sorted(WORKING)
    # every Ray cell has its in-process twin to equal
    assert {(m, "inprocess", *rest) for m, _, *rest in RAY_RUN} == set(RUN)


# ---------------------------------------------------------------- the clock: deadline policies, timing only
# Every deadline policy (hardware_profiles.deadlines.POLICIES) with every clock mode on every executor:
# a full run (clock.mode: virtual) on Ray equals its in-process run, and a timing-only run (in this
# process only: it trains nothing) equals the full run's clock columns. Half of the 4 clients are
# phones on 5 Mbps (a round of ~0.10 s), half laptops on 500 Mbps (~0.01 s): each policy cuts.
CLOCK_FLEET = ("clients.profiles={availability: 1.0, dropout: 0.0, devices: {phone_low: 0.5, laptop_cpu: 0.5}, "
               "network: {5mbps: 0.5, 500mbps: 0.5}}")
DEADLINES = {
    "fixed": "{policy: fixed, seconds: 0.05}",
    "percentile": "{policy: percentile, percent: 50}",
    "adaptive": "{policy: adaptive, quantile: 0.5, margin: 1.0}",
    "cutoff": "{policy: cutoff, every_s: 0.05, min_reporting: 1}",
}
CLOCK_MODES = ("virtual", "timing_only")
CLOCK_CELLS = list(itertools.product(POLICIES, CLOCK_MODES, EXECUTORS))


def clock_refusal(policy: str, mode: str, executor: str) -> tuple[str, ...] | None:
    if mode == "timing_only" and executor != "inprocess":
        return (f"executor.kind = {executor!r}: clock.mode = 'timing_only' trains nothing", "allowed: inprocess")
    return None


def clock_overrides(policy: str, mode: str, executor: str, table, cache) -> list[str]:
    cell = ("fedavg", executor, "sync", "memory", "off")
    return [*overrides(cell, table, cache), CLOCK_FLEET, f"clock.deadline={DEADLINES[policy]}",
            f"clock.mode={mode}"]


def timing_refusal(method: str, variant: str = "") -> str | None:
    """Why a method cannot be timed without training, as its own code says (Server.timing_payload)."""
    from algorithms import ALGORITHMS
    from algorithms.base import ArchShape, TimingUnsupported
    from engine.config.schema import load_config

    items = [f"algorithm.name={method}", *METHOD_OVERRIDES.get(method, []), *filter(None, [variant])]
    params = load_config(None, items).algorithm
    try:
        ALGORITHMS[method].server.timing_payload(params, {"": ArchShape(100)})
    except TimingUnsupported as err:
        return str(err)
    return None


def _clock_id(cell) -> str:
    return "-".join(cell)


def assert_clock_equal(timing, full) -> None:
    from engine.results.tables import WALL_COLUMNS

    for a, b in ((timing.rounds, full.rounds), (timing.clients, full.clients)):
        keep = [c for c in a.columns if c not in WALL_COLUMNS]
        pd.testing.assert_frame_equal(a[keep], b[keep], check_exact=True)


@pytest.fixture(scope="module")
def clock_runs(table, tmp_path_factory):
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    runs = {}

    def get(cell):
        if cell not in runs:
            cfg = load_config(None, clock_overrides(*cell, *table))
            runs[cell] = load_run(run_experiment(cfg, tmp_path_factory.mktemp(_clock_id(cell)), command=[]))
        return runs[cell]
    return get


@pytest.mark.parametrize("cell", [c for c in CLOCK_CELLS if c[2] == "inprocess"], ids=_clock_id)
def test_each_deadline_policy_cuts_rounds_alike_in_both_clock_modes(cell, clock_runs):
    policy, mode, _ = cell
    run = clock_runs(cell)
    deadline = run.rounds["sim_deadline_s"].to_numpy()
    assert np.isfinite(deadline[1:]).all() and (np.isfinite(deadline[0]) or policy == "adaptive")
    assert (run.clients["drop_reason"] == "deadline").any()  # the 5 Mbps phones are cut
    if mode == "timing_only":
        assert "global_acc" not in run.rounds
        assert_clock_equal(run, clock_runs((policy, "virtual", "inprocess")))


@pytest.mark.ray
@pytest.mark.parametrize("cell", [c for c in CLOCK_CELLS if c[2] == "ray" and clock_refusal(*c) is None],
                         ids=_clock_id)
def test_each_deadline_policy_on_ray_equals_the_in_process_run(cell, clock_runs, warm_ray):
    from engine.results.tables import WALL_COLUMNS

    run, twin = clock_runs(cell), clock_runs((*cell[:2], "inprocess"))
    for a, b in ((run.rounds, twin.rounds), (run.clients, twin.clients)):
        keep = [c for c in a.columns if c not in WALL_COLUMNS]
        pd.testing.assert_frame_equal(a[keep], b[keep])


@pytest.mark.parametrize("cell", [c for c in CLOCK_CELLS if clock_refusal(*c) is not None], ids=_clock_id)
def test_a_timing_only_run_on_ray_is_refused(cell, table):
    from engine.config.schema import load_config
    from engine.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(None, clock_overrides(*cell, *table))
    for part in clock_refusal(*cell):
        assert part in str(err.value), (part, str(err.value))


# a method's options that give it a fixed payload where its defaults do not: a row of their own
TIMING_VARIANTS = {"fedcspack": "algorithm.sharing=full"}
TIMING_ROWS = [*((m, "") for m in METHODS), *TIMING_VARIANTS.items()]
TIMING_CELLS = [(m, variant, mode) for (m, variant), mode in itertools.product(TIMING_ROWS, MODES)]


def _timing_id(cell) -> str:
    return "-".join(filter(None, cell)).replace("algorithm.", "").replace("=", "_")


@pytest.mark.parametrize("cell", TIMING_CELLS, ids=_timing_id)
def test_each_method_times_without_training_or_is_refused_with_its_reason(cell, table, inprocess_runs, tmp_path):
    from engine.config.schema import load_config
    from engine.errors import ConfigError
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    method, variant, mode = cell
    full = (method, "inprocess", mode, "memory", "off")
    items = [*overrides(full, *table), *filter(None, [variant])]
    why = refusal(*full) or timing_refusal(method, variant)
    if why is not None:
        with pytest.raises(ConfigError) as err:
            run_experiment(load_config(None, [*items, "clock.mode=timing_only"]), tmp_path / "run")
        for part in ([why] if isinstance(why, str) else why):
            assert part in str(err.value), (part, str(err.value))
        assert not (tmp_path / "run").exists()
        return
    twin = inprocess_runs(full) if not variant else load_run(
        run_experiment(load_config(None, items), tmp_path / "full", command=[]))
    timing = load_run(run_experiment(load_config(None, [*items, "clock.mode=timing_only"]), tmp_path / "run",
                                     command=[]))
    assert_clock_equal(timing, twin)


# ---------------------------------------------------------------- work and selection policies
# Every local-work policy (train.work) and client-selection policy of the toolbox (docs/toolbox.md)
# with FedAvg on every executor, synchronous and asynchronous: the 4 clients above, half phones on
# 5 Mbps and half laptops on 500 Mbps, online 3 rounds in 4, with fading links and throttling;
# 2 clients a round (asynchronously: 2 in flight), 4 local steps, a 0.15 s deadline. A Ray run
# equals its in-process run, and a timing-only run equals the full run's clock (or is refused,
# naming the policy and why).
POLICY_FLEET = ("clients.profiles={availability: 0.75, dropout: 0.0, devices: {phone_low: 0.5, laptop_cpu: 0.5}, "
                "network: {5mbps: 0.5, 500mbps: 0.5}}")
TOOLBOX_POLICIES = {("work", "deadline"): "train.work={policy: deadline}", ("work", "per_tier"): "train.work=per_tier",
            ("selection", "pow_d"): "clients.selection={name: pow_d, d: 3}",
            ("selection", "oort"): "clients.selection={name: oort, exploration_min: 0.5}",
            ("selection", "available_first"): "clients.selection=available_first"}
POLICY_CELLS = [(*policy, ex, mode) for policy, ex, mode in itertools.product(TOOLBOX_POLICIES, EXECUTORS, MODES)]


def _policy_id(cell) -> str:
    return "-".join(cell)


def policy_overrides(kind: str, name: str, executor: str, mode: str, table, cache) -> list[str]:
    cell = ("fedavg", executor, mode, "memory", "on")
    return [*overrides(cell, table, cache), POLICY_FLEET, *CONDITIONS_ON, "clients.participation=0.5",
            "train.local_steps=4", "clock.deadline_s=0.15", TOOLBOX_POLICIES[(kind, name)]]


def policy_timing_refusal(kind: str, name: str) -> str | None:
    """Why a policy cannot run without training, as its own class says (SelectionPolicy.reads_training)."""
    from algorithms.plugins import SELECTORS

    return SELECTORS.get(name).reads_training if kind == "selection" else None


@pytest.fixture(scope="module")
def policy_runs(table, tmp_path_factory):
    from engine.config.schema import load_config
    from engine.results.tables import load_run
    from engine.run.api import run_experiment

    runs = {}

    def get(cell, *extra):
        key = (*cell, *extra)
        if key not in runs:
            cfg = load_config(None, [*policy_overrides(*cell, *table), *extra])
            runs[key] = load_run(run_experiment(cfg, tmp_path_factory.mktemp(_policy_id(key)), command=[]))
        return runs[key]
    return get


def check_policy_cell(run, cell) -> None:
    kind, name, executor, mode = cell
    assert run.manifest["status"] == "finished" and run.rounds["round"].tolist() == list(range(ROUNDS))
    assert (run.config["asynchronous"] is not None) == (mode == "async")
    ran = run.clients[run.clients["sim_total_s"].notna()]
    if kind == "work":
        assert run.config["train"]["work"]["policy"] == name
        steps = ran["local_steps"].to_numpy()
        assert ((steps >= 1) & (steps <= 4)).all()
        if name == "per_tier":  # the laptops do the 4 configured steps, the phones 1
            assert set(zip(ran["tier"], steps)) <= {("laptop_cpu", 4), ("phone_low", 1)}
    else:
        assert run.config["clients"]["selection"]["name"] == name
        assert run.clients["selection_reason"].notna().all()
        if name == "available_first" and mode == "sync":  # online at the start: never unavailable
            assert not (run.clients["drop_reason"] == "unavailable").any()
    if "global_acc" in run.rounds:
        assert np.isfinite(run.rounds["global_acc"].to_numpy(dtype=float)).all()


@pytest.mark.parametrize("cell", [c for c in POLICY_CELLS if c[2] == "inprocess"], ids=_policy_id)
def test_each_policy_runs_and_times_without_training_alike_or_is_refused(cell, policy_runs, table, tmp_path):
    from engine.config.schema import load_config
    from engine.errors import ConfigError
    from engine.run.api import run_experiment

    check_policy_cell(policy_runs(cell), cell)
    why = policy_timing_refusal(*cell[:2])
    if why is not None:
        with pytest.raises(ConfigError) as err:
            run_experiment(load_config(None, [*policy_overrides(*cell, *table), "clock.mode=timing_only"]),
                           tmp_path / "run")
        assert f"clients.selection.name = {cell[1]!r} cannot choose in clock.mode = 'timing_only'" in str(err.value)
        assert why in str(err.value)
        return
    timing = policy_runs(cell, "clock.mode=timing_only")
    check_policy_cell(timing, cell)
    assert_clock_equal(timing, policy_runs(cell))


@pytest.mark.ray
@pytest.mark.parametrize("cell", [c for c in POLICY_CELLS if c[2] == "ray"], ids=_policy_id)
def test_each_policy_on_ray_equals_the_in_process_run(cell, policy_runs, warm_ray):
    from engine.results.tables import WALL_COLUMNS

    run, twin = policy_runs(cell), policy_runs((*cell[:2], "inprocess", cell[3]))
    check_policy_cell(run, cell)
    for a, b in ((run.rounds, twin.rounds), (run.clients, twin.clients)):
        keep = [c for c in a.columns if c not in WALL_COLUMNS]
        pd.testing.assert_frame_equal(a[keep], b[keep])


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
    no_public = ["partition.public_fraction=0"] if scheme == "pfllib" else []  # PFLlib gives every row to a client
    return [*BASE, f"dataset.name={dataset}", params, f"partition.scheme={scheme}", *no_public]


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
        "* **in-process ✓, Ray ✓**: the cell runs in-process and on Ray (`executor.kind: ray`, one client",
        "  actor), in every test run of the file, and the Ray run's `rounds` and `clients` tables equal the",
        "  in-process run's (wall-clock columns aside). The Ray cells run with `executor.keep_warm: true`: one",
        "  driver actor and one client actor, started by the first Ray cell, run every Ray cell after it",
        "  (checked by their process ids), each building its clients afresh ([engine.md](engine.md#the-ray-executor));",
        "  since the first cell's actors are new and every cell equals its in-process run, a run on warm",
        "  actors equals one on new actors;",
        "* **refused**: validation refuses the cell on both executors, before a run folder exists;",
        "  the message names the field, the value and what is allowed (below);",
        "* **—**: not in the matrix: every data source hands a method the same arrays, so the methods",
        f"  after {', '.join(ALL_SOURCES)} (the baselines, [baselines.md](baselines.md)) run the in-memory",
        "  source only.",
        "",
        head,
        "|" + "---|" * (2 + len(cols)),
    ]
    reasons = {}
    for m, mode in itertools.product(METHODS, MODES):
        row = []
        for s, c in cols:
            why = refusal(m, "inprocess", mode, s, c)
            if s not in sources_of(m):
                row.append("—")
            elif why is not None:
                reasons.setdefault(why, []).append(f"{m}/{mode}")
                row.append("refused")
            else:
                row.append("in-process ✓" + (", Ray ✓" if (m, "ray", mode, s, c) in RAY_RUN else ""))
        lines.append(f"| {m} | {mode} | " + " | ".join(row) + " |")
    lines += ["", "## Refusals", ""]
    for why, where in reasons.items():
        lines.append(f"* {', '.join(sorted(set(where)))}: \"{' … '.join(why)}\" "
                     "(the reason is the method's `AlgorithmParams.synchronous_only`).")
    lines += [
        "",
        "## Deadline policies and clock modes",
        "",
        "Each deadline policy of `clock.deadline` ([engine.md](engine.md#deadline-policies)) in a full run",
        "(`clock.mode: virtual`) and a timing-only run (`clock.mode: timing_only`, [timing.md](timing.md)), FedAvg",
        f"on the {CLIENTS} clients above, half of them phones on 5 Mbps and half laptops on 500 Mbps, so that every",
        "policy drops the phones (`test_each_deadline_policy_cuts_rounds_alike_in_both_clock_modes`): each round",
        "logs its deadline (`sim_deadline_s`; the adaptive policy has none before its first arrivals), the Ray",
        "run equals the in-process run, and the timing-only run's tables equal the full run's clock columns bit",
        "for bit.",
        "",
        "| policy | " + " | ".join(f"{mode}, {ex}" for mode, ex in itertools.product(CLOCK_MODES, EXECUTORS)) + " |",
        "|" + "---|" * (1 + len(CLOCK_MODES) * len(EXECUTORS)),
    ]
    for policy in POLICIES:
        row = ["refused" if clock_refusal(policy, mode, ex) else ("✓, equals in-process" if ex != "inprocess" else
               "✓, equals the full run" if mode == "timing_only" else "✓")
               for mode, ex in itertools.product(CLOCK_MODES, EXECUTORS)]
        lines.append(f"| {policy}: `{DEADLINES[policy]}` | " + " | ".join(row) + " |")
    ray_refusal = clock_refusal(POLICIES[0], "timing_only", "ray")
    lines += ["", f"* refused: \"{' … '.join(ray_refusal)}\".", "",
              "Timing only, each method (`test_each_method_times_without_training_or_is_refused_with_its_reason`):",
              "✓ where its tables equal the clock columns of the full run in the table above (synthetic in memory,",
              "conditions off), refused where its payload depends on training (the reason its",
              "`Server.timing_payload` gives):", "",
              "| method | " + " | ".join(MODES) + " |", "|" + "---|" * (1 + len(MODES))]
    timing_reasons = {}
    for m, variant in TIMING_ROWS:
        row = []
        for mode in MODES:
            why = refusal(m, "inprocess", mode, "memory", "off") or timing_refusal(m, variant)
            row.append("✓" if why is None else "refused")
            if why is not None and isinstance(why, str):
                timing_reasons[m] = why
        name = f"{m}, `{variant.removeprefix('algorithm.').replace('=', ': ')}`" if variant else m
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines.append("")
    for m, why in timing_reasons.items():
        lines.append(f"* {m} (its defaults): \"{why}\".")
    lines += [
        "",
        "## Work and selection policies",
        "",
        "Each local-work policy (`train.work`) and client-selection policy of the toolbox",
        "([toolbox.md](toolbox.md)) with FedAvg, synchronous and asynchronous",
        "(`test_each_policy_runs_and_times_without_training_alike_or_is_refused`,",
        "`test_each_policy_on_ray_equals_the_in_process_run`): the clients above, half phones on 5 Mbps and half",
        "laptops on 500 Mbps, online 3 rounds in 4, fading links and throttling, 2 clients a round, 4 local",
        "steps, a 0.15 s deadline; each run checked (the steps each client did, each pick's reason), the Ray",
        "run equal to the in-process run, and a timing-only run equal to the full run's clock, or refused:",
        "",
        "| policy | " + " | ".join(f"{mode}: in-process, Ray" for mode in MODES) + " | timing only |",
        "|" + "---|" * (2 + len(MODES)),
    ]
    for kind, name in TOOLBOX_POLICIES:
        why = policy_timing_refusal(kind, name)
        lines.append(f"| {kind}: `{TOOLBOX_POLICIES[(kind, name)].split('=', 1)[1]}` | "
                     + " | ".join("✓, Ray ✓ (equal)" for _ in MODES) + f" | {'refused' if why else '✓, equal'} |")
    lines.append("")
    for (kind, name) in TOOLBOX_POLICIES:
        why = policy_timing_refusal(kind, name)
        if why:
            lines.append(f"* {name}, timing only: \"clients.selection.name = {name!r} cannot choose in clock.mode = "
                         f"'timing_only': {why}\".")
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
