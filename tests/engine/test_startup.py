"""What each start-up path imports (timings are in bench/bench_startup.py, not here)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

HEAVY = ("torch", "torchvision", "ray", "pandas", "numba", "pyarrow", "torch._dynamo")


def printed(code: str, *args: str):
    """The JSON value on the last line a fresh interpreter prints running ``code``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def imported_after(code: str) -> set[str]:
    """The modules among HEAVY that a fresh interpreter has imported after ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    return set(printed(probe))


def test_help_imports_nothing_heavy():
    code = "from hetsim.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    assert imported_after(code) == set()


def test_the_command_line_module_imports_neither_numpy_nor_pydantic():
    # every command pays what hetsim.cli imports: --help, show and init need neither
    # (the base of its errors is hardware_profiles.errors, light; the package's other modules are not)
    light = ("numpy", "pydantic", "hardware_profiles.clock", "hardware_profiles.sampler", "algorithms")
    probe = f"import sys\nimport hetsim.cli\nprint(sorted(m for m in {light!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_validating_every_algorithm_imports_nothing_heavy():
    code = """
from engine import load_config
from algorithms.params import ALGORITHM_PARAMS
for name in ALGORITHM_PARAMS:
    load_config(None, {"algorithm": {"name": name}, "model.name": "resnet18"})
"""
    assert imported_after(code) == set()


def test_a_ray_runs_start_up_path_imports_no_torch():
    # torch at the top of these would delay the Ray job's start by a second or so. The caller's imports, its
    # static checks, up to Ray's start (the data checks import torch beside it, in a thread)
    caller = """
from hetsim.cli import cmd_run
from engine import resume_run
from engine.ray.cluster import DriverDiedError, ExecutorError
from engine.run.api import prepare_run, resume_config, run_in_folder
from engine.run.folders import RunStateError
from engine.run.startup import validate_while_ray_starts
from engine.run.validate import static_problems
from engine.run.gpu_checks import gpu_problems
from engine import load_config
cfg = load_config(None, ["executor.kind=ray"])
assert static_problems(cfg, None) == [] and gpu_problems(cfg, False) == []
"""
    assert "torch" not in imported_after(caller)
    # what the driver actor's process imports before it requests the client actors
    driver = "import engine.ray.driver, engine.ray.executor, engine.ray.client_actor"
    assert imported_after(driver) == {"ray"}


# one fresh interpreter runs a FedAvg round, then an ASCEND round, and says what each had imported
# by its end: one torch import for the two tests below (ASCEND's set, after FedAvg's, can only be larger)
TWO_RUNS = f"""
import json, sys
from engine import load_config
from engine.loop.simulation import Simulation
def loaded(names):
    return sorted(m for m in names if m in sys.modules)
sim = Simulation(load_config(None, ["dataset.name=digits", "model.name=mlp", "clients.num_clients=4",
                                    "rounds=1", "clients.profiles={{}}"]))
sim.run()
fedavg = loaded({HEAVY!r} + ("algorithms.fedcspack", "algorithms.ascend"))
sim = Simulation(load_config(None, ["algorithm.name=ascend", "algorithm.distill_steps=2", "dataset.name=digits",
                                    "partition.public_fraction=0.1", "model.name=mlp", "clients.num_clients=4",
                                    "rounds=1", "clients.profiles={{}}"]))
rows = []
sim.run(callbacks=[lambda record: rows.append(record.row)])
print(json.dumps({{"fedavg": fedavg, "ascend": loaded({HEAVY!r}), "ascend_rows": rows}}))
"""


@pytest.fixture(scope="module")
def two_runs() -> dict:
    return printed(TWO_RUNS)


def test_a_fedavg_run_imports_neither_the_other_methods_nor_torchvision_nor_dynamo(two_runs):
    assert "torch" in two_runs["fedavg"]  # it trained
    assert not set(two_runs["fedavg"]) & {"torchvision", "numba", "torch._dynamo",
                                           "algorithms.fedcspack", "algorithms.ascend"}


def test_lazy_registrations_resolve_to_what_they_promise():
    # the built-ins are registered by reference with what validation needs given now (a method's
    # params class, a model's input shape, a compressor's op costs): resolving them must agree
    from algorithms import ALGORITHMS
    from algorithms.compressors import COMPRESSORS
    from algorithms.params import ALGORITHM_PARAMS, compressor_costs
    from engine.models.zoo import DEFAULT_INPUT_SHAPES, MODELS, build_model

    assert list(ALGORITHMS) == list(ALGORITHM_PARAMS)
    for name, spec in ALGORITHMS.items():
        assert spec.name == name and spec.params is ALGORITHM_PARAMS[name]
    for name, cls in COMPRESSORS.items():
        assert cls.name == name and cls.COSTS == compressor_costs()[name]
    assert set(DEFAULT_INPUT_SHAPES) == set(MODELS)
    for name in ("cnn", "mlp"):
        assert build_model(name, DEFAULT_INPUT_SHAPES[name], 10).input_shape == DEFAULT_INPUT_SHAPES[name]


def test_resnet18_built_on_first_use_pickles():
    import pickle

    import torch

    from engine.models import zoo as models

    model = models.build_model("resnet18", (3, 8, 8), 4)
    assert type(model) is models.CifarResNet18
    copy = pickle.loads(pickle.dumps(model))
    x = torch.zeros(2, 3, 8, 8)
    model.eval(), copy.eval()
    assert torch.equal(model(x), copy(x))


def test_unknown_names_still_list_the_allowed_ones():
    from engine.config.schema import load_config
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown model 'nope'; allowed: cifar_cnn, cnn, fmnist_cnn, lenet5"):
        load_config(None, {"model.name": "nope"})
    with pytest.raises(ConfigError, match="unknown algorithm 'nope'; allowed: ascend, fedavg, "
                                          "fedavg_compressed, fedcspack, fednova, fedntd, fedopt, fedprox"):
        load_config(None, {"algorithm": {"name": "nope"}})


def test_the_command_exits_with_its_code_and_a_complete_run_folder(tmp_path):
    """`python -m hetsim` ends without the interpreter's teardown: output, exit status and run
    folder must be complete all the same."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "run"
    args = ["run", "-q", "-o", str(out), "--set", "dataset.name=digits", "--set", "model.name=mlp",
            "--set", "clients.num_clients=4", "--set", "rounds=2", "--set", "clients.profiles={}"]
    proc = subprocess.run([sys.executable, "-m", "hetsim", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "status                    finished" in proc.stdout and f"results: {out}" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert (out / "rounds.parquet").exists() and not (out / "_parts").exists()
    bad = subprocess.run([sys.executable, "-m", "hetsim", "validate", "--set", "train.lr=-1"],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "train.lr" in bad.stderr


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.0, 1e-3), (0.9, 5e-4)])
def test_sgd_is_torch_optim_sgd_bit_for_bit(momentum, weight_decay):
    import torch
    import torch.nn.functional as F

    from algorithms.training import SGD
    from engine.models.zoo import build_model

    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    models, opts = [], []
    for cls in (torch.optim.SGD, SGD):
        torch.manual_seed(1)
        model = build_model("cnn", (1, 28, 28), 10)
        models.append(model)
        opts.append(cls(model.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay))
    for step in range(12):
        batch = slice(16 * (step % 4), 16 * (step % 4 + 1))
        for model, opt in zip(models, opts):
            opt.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


def test_adam_is_torch_optim_adam_bit_for_bit():
    # ASCEND's distillation optimizer: a fresh one per round, a few steps on a KL loss
    import torch
    import torch.nn.functional as F

    from algorithms.training import Adam
    from engine.models.zoo import build_model

    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    models, opts = [], []
    for cls in (torch.optim.Adam, Adam):
        torch.manual_seed(1)
        model = build_model("cnn", (1, 28, 28), 10)
        models.append(model)
        opts.append(cls(model.parameters(), lr=3e-3))
    frozen = next(iter(models[0].parameters())).numel()
    for step in range(12):
        batch = slice(16 * (step % 4), 16 * (step % 4 + 1))
        for model, opt in zip(models, opts):
            opt.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            if step < 3:  # a parameter without a gradient is skipped and its step count waits
                next(iter(model.parameters())).grad = None
            opt.step()
    assert frozen > 0
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


def test_an_ascend_run_imports_no_dynamo(two_runs):
    # torch.optim's first optimizer imports torch._dynamo (1.5-3 s of CPU per process): ASCEND's
    # server distils with algorithms.training.Adam instead
    rows = two_runs["ascend_rows"]
    assert rows[0]["server_distill_loss"] > 0, rows  # the server distilled (two Adam steps)
    assert "torch._dynamo" not in two_runs["ascend"]


# FLOP counts into an empty disk cache (counted, not read back), first with the shim that keeps
# torch._dynamo out, then, in the same process, with torch._dynamo imported and its own wrapper
# restored: one torch import instead of two
FLOPS = """
import json, os, sys
import engine.models.flops as flops
import engine.models.zoo as m
m.torch.set_num_threads(1)  # the counts do not depend on it; 2 threads spin on 2 busy cores

def count(cache):
    os.environ["HETSIM_CACHE_DIR"] = cache
    flops._training_flops_cached.cache_clear()
    names = [n for n in m.MODELS if n != "resnet18"]  # torchvision's import brings torch._dynamo
    counts = {n: flops.training_flops_per_sample(n, m.DEFAULT_INPUT_SHAPES[n], 10) for n in names}
    dynamo = "torch._dynamo" in sys.modules
    counts["resnet18"] = flops.training_flops_per_sample("resnet18", (3, 32, 32), 10)
    return [counts, dynamo]

without = count(sys.argv[1])
import torch._dynamo
from torch.utils.flop_counter import _FlopCounterMode
flops._count_without_dynamo = lambda: None
dispatch = _FlopCounterMode.__dict__["__torch_dispatch__"].__wrapped__
setattr(dispatch, "__dynamo_disable", None)  # the shim's: torch builds dynamo's own wrapper again
print(json.dumps({"without": without, "with": count(sys.argv[2]), "shim_undone": [
    getattr(dispatch, "__dynamo_disable") is not dispatch, os.listdir(sys.argv[1]), os.listdir(sys.argv[2])]}))
"""


def test_flop_counts_without_dynamo_equal_the_counts_with_it(tmp_path):
    runs = printed(FLOPS, str(tmp_path / "without"), str(tmp_path / "with"))
    assert runs["with"][1] is True and runs["without"][1] is False
    assert runs["with"][0] == runs["without"][0]
    undone, *caches = runs["shim_undone"]
    assert undone and all(caches)  # dynamo's wrapper counted the second time; both caches written


# ------------------------------------------- data checks overlap Ray's start (a Ray run, a sweep)
def test_the_check_runs_in_another_thread_while_ray_starts_and_its_error_wins():
    import threading

    from engine.errors import ConfigError
    from engine.ray.cluster import check_while_ray_starts

    started = threading.Event()
    threads = {}

    def check():
        threads["check"] = threading.get_ident()
        assert started.wait(10), "the start did not run while the check did"
        return "checked"

    def start():
        threads["start"] = threading.get_ident()
        started.set()
        return "started"

    assert check_while_ray_starts(check, start) == ("checked", "started")
    assert threads["start"] == threading.get_ident() != threads["check"]

    def bad_check():
        raise ConfigError("invalid experiment config:\n  a user mistake")

    def bad_start():
        raise RuntimeError("Ray failed too")

    with pytest.raises(ConfigError, match="a user mistake"):
        check_while_ray_starts(bad_check, bad_start)
    with pytest.raises(RuntimeError, match="Ray failed too"):
        check_while_ray_starts(lambda: None, bad_start)


@pytest.mark.ray
def test_a_ray_run_whose_data_checks_fail_says_so_and_leaves_no_folder_and_no_ray(tmp_path):
    from engine.config.schema import load_config
    from engine.errors import ConfigError
    from engine.ray.cluster import ray_is_up, shutdown_ray
    from engine.run.api import run_experiment
    from engine.run.validate import validate_experiment

    if ray_is_up():  # the suite's shared Ray, up from an earlier module: this run starts its own
        shutdown_ray()
    assert not ray_is_up()
    cfg = load_config(None, ["dataset.name=digits", "model.name=mlp", "clients.num_clients=5000",
                             "executor.kind=ray", "ray.num_cpus=2", f"output.dir={tmp_path / 'runs'}"])
    with pytest.raises(ConfigError) as sequential:
        validate_experiment(cfg)
    with pytest.raises(ConfigError) as overlapped:
        run_experiment(cfg)
    assert str(overlapped.value) == str(sequential.value)
    assert "clients.num_clients = 5000" in str(overlapped.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert not ray_is_up(), "the Ray started for the run was left running"


def test_a_sweep_defers_exactly_the_data_checks():
    from sweeps.spec import SweepSpecError, resolve

    spec = {"name": "s", "base": {"dataset": {"name": "digits"}, "model": {"name": "mlp"},
                                  "clients": {"num_clients": 10}, "rounds": 2},
            "space": {"clients.num_clients": {"grid": [10, 5000]}}}  # 5000 > the samples: data only
    with pytest.raises(SweepSpecError) as direct:
        resolve(spec)
    checks = []
    resolved = resolve(spec, data_checks=checks)  # the schema is fine: nothing raised yet
    assert resolved.num_trials == 2 and len(checks) == 3  # the base and the two probed values
    checks[0]()
    checks[1]()
    with pytest.raises(SweepSpecError) as deferred:
        checks[2]()
    assert str(deferred.value) == str(direct.value)
    assert "space.clients.num_clients.grid" in str(direct.value) and "5000" in str(direct.value)


@pytest.mark.ray
def test_with_ray_up_the_driver_starts_during_the_validation_and_is_stopped_if_it_fails(tmp_path, ray_session):
    """Attached to a running Ray (the suite's shared one: no Ray start of its own), the driver
    actor (and through it the client actors) is started while the data checks run; a config that
    fails them leaves no actor behind, one that passes is run by that same driver."""
    import time

    import ray._private.state as ray_state

    from engine.config.schema import load_config
    from engine.errors import ConfigError
    from engine.run.api import run_experiment

    earlier = set(ray_state.actors())  # actors of earlier modules on the shared Ray (all stopped)

    def actors(state=None, kind=("DriverActor", "ClientActor")):
        # class names read '_driver_actor_class.<locals>.DriverActor'
        return [a for key, a in ray_state.actors().items()
                if key not in earlier and a["ActorClassName"].rsplit(".", 1)[-1] in kind
                and (state is None or a["State"] == state)]

    # one client actor: what is checked is the driver's start and stop, not a pool's size
    base = ["dataset.name=digits", "model.name=mlp", "executor.kind=ray", "rounds=1", "executor.num_actors=1",
            f"output.dir={tmp_path / 'runs'}"]
    with pytest.raises(ConfigError, match="clients.num_clients = 5000"):
        run_experiment(load_config(None, [*base, "clients.num_clients=5000"]))
    assert actors(kind=("DriverActor",)), "no driver was started early"
    deadline = time.time() + 30
    while actors("ALIVE") and time.time() < deadline:
        time.sleep(0.2)
    assert not actors("ALIVE"), "the driver started for a failing config was left running"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

    drivers_before = len(actors(kind=("DriverActor",)))
    path = run_experiment(load_config(None, [*base, "clients.num_clients=4"]))
    assert json.loads((Path(path) / "manifest.json").read_text())["status"] == "finished"
    assert len(actors(kind=("DriverActor",))) == drivers_before + 1
    assert ray_session.is_initialized()  # a run attached to a running Ray leaves it running
