"""The example files in configs/: each is what `hetsim init` writes (one source,
hetsim/templates.py), `hetsim validate -c` takes it as it is, and `hetsim run -c` runs it,
shortened to 2 rounds (server steps for FedBuff) with `--set rounds=2` (and less local work where
a file's rounds are long)."""
import re
from pathlib import Path

import pytest
from helpers import REPO

from engine.data.datasets import FASHION_MNIST_DEBIAN_ROOT
from engine.results import load_run
from hetsim.cli import main
from hetsim.templates import CONFIG_FILES, config_text, write_configs

CONFIGS = REPO / "configs"
FMNIST = Path(FASHION_MNIST_DEBIAN_ROOT)
EXAMPLES = sorted(p.name for p in CONFIGS.glob("*.yaml"))
SLOW = {"ascend_mnist.yaml"}  # distillation and probes: ~25 s on 2 busy cores
# the paper's 3 epochs of 6 clients on 52,000 Fashion-MNIST rows: ~16 s for 2 rounds, ~4 s with these
LIGHTER = {"fedcspack_paper.yaml": ["--set", "train.local_epochs=1", "--set", "clients.participation=0.1"]}


def test_configs_hold_the_templates_and_nothing_is_missing(tmp_path):
    assert set(CONFIG_FILES) <= set(EXAMPLES)
    for file in CONFIG_FILES:
        assert (CONFIGS / file).read_text() == config_text(file), \
            f"configs/{file} differs from its template: run `python -m hetsim.templates`"
    # the regeneration writes the same files
    assert [p.read_text() for p in write_configs(tmp_path)] == [config_text(f) for f in CONFIG_FILES]


@pytest.mark.parametrize("file", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in EXAMPLES])
def test_every_config_validates_and_runs_as_it_is(file, tmp_path, capsys):
    path = str(CONFIGS / file)
    if "fashion_mnist" in (CONFIGS / file).read_text() and not (FMNIST / "train-labels-idx1-ubyte.gz").is_file():
        pytest.skip(f"{file} needs dataset-fashion-mnist (apt-get install dataset-fashion-mnist: {FMNIST})")
    assert main(["validate", "-c", path]) == 0, capsys.readouterr().err
    capsys.readouterr()
    out = tmp_path / "run"
    assert main(["run", "-q", "-c", path, "--set", "rounds=2", *LIGHTER.get(file, []), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    run = load_run(out)
    assert run.manifest["status"] == "finished" and len(run.rounds) == 2
    label = "server steps" if run.config.get("asynchronous") else "rounds"
    assert re.search(rf"^{label}\s+2 of 2", printed, re.M), printed
    assert "energy (fleet total)" in printed
    if CONFIG_FILES.get(file) == "energy":
        assert re.search(r"^battery drops\s+\d+ client-rounds", printed, re.M)
    if CONFIG_FILES.get(file) == "async":
        assert run.manifest["asynchronous"] == "fedbuff"
    if CONFIG_FILES.get(file) == "conditions":
        assert run.clients["down_state"].notna().any()  # the link processes ran
