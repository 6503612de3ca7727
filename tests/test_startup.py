"""What each start-up path imports (timings are in bench/bench_startup.py, not here)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "torchvision", "ray", "pandas", "numba", "pyarrow")


def imported_after(code: str) -> set[str]:
    """Top-level packages among HEAVY that a fresh interpreter has imported after ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_help_imports_nothing_heavy():
    code = "from hetsim.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    assert imported_after(code) == set()


def test_validating_every_algorithm_imports_nothing_heavy():
    code = """
from engine.config import load_config
from algorithms.params import ALGORITHM_PARAMS
for name in ALGORITHM_PARAMS:
    load_config(None, {"algorithm": {"name": name}, "model.name": "resnet18"})
"""
    assert imported_after(code) == set()


def test_a_fedavg_run_does_not_import_the_other_methods_or_torchvision():
    code = """
from engine.config import load_config
from engine.simulation import Simulation
sim = Simulation(load_config(None, ["dataset.name=digits", "model.name=mlp", "clients.num_clients=4",
                                    "rounds=1", "clients.profiles={}"]))
sim.run()
import sys
assert "algorithms.fedcspack" not in sys.modules and "algorithms.ascend" not in sys.modules
"""
    assert not imported_after(code) & {"torchvision", "numba"}


def test_light_registries_match_the_heavy_ones():
    from algorithms import ALGORITHMS
    from algorithms.params import ALGORITHM_PARAMS
    from engine.model_names import MODEL_NAMES
    from engine.models import MODELS

    assert tuple(MODELS) == MODEL_NAMES
    assert list(ALGORITHMS) == list(ALGORITHM_PARAMS)
    for name, spec in ALGORITHMS.items():
        assert spec.name == name and spec.params is ALGORITHM_PARAMS[name]


def test_resnet18_built_on_first_use_pickles():
    import pickle

    import torch

    from engine import models

    model = models.build_model("resnet18", (3, 8, 8), 4)
    assert type(model) is models.CifarResNet18
    copy = pickle.loads(pickle.dumps(model))
    x = torch.zeros(2, 3, 8, 8)
    model.eval(), copy.eval()
    assert torch.equal(model(x), copy(x))


def test_unknown_names_still_list_the_allowed_ones():
    from engine.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="unknown model 'nope'; allowed: cifar_cnn, cnn, lenet5"):
        load_config(None, {"model.name": "nope"})
    with pytest.raises(ConfigError, match="'nope'.*'fedavg', 'fedprox', 'fedavg_compressed', "
                                          "'fedcspack', 'ascend'"):
        load_config(None, {"algorithm": {"name": "nope"}})
