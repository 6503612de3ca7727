"""Config validation: every error names the field, the value and what is allowed."""
import pytest

from engine.config.schema import ExperimentConfig, apply_overrides, load_config
from engine.errors import ConfigError


def test_default_config_loads():
    cfg = load_config()
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.algorithm.name == "fedavg"
    assert cfg.dataset.name == "mnist5k"


def test_overrides_are_parsed_as_yaml_and_validated():
    cfg = load_config(None, ["train.lr=0.01", "algorithm.name=fedprox", "algorithm.mu=0.1"])
    assert cfg.train.lr == 0.01
    assert cfg.algorithm.name == "fedprox" and cfg.algorithm.mu == 0.1


def test_apply_overrides_creates_sections_and_keeps_input():
    raw = {"train": {"lr": 1}}
    out = apply_overrides(raw, ["evaluation.eval_every=5"])
    assert out["evaluation"]["eval_every"] == 5 and raw == {"train": {"lr": 1}}


@pytest.mark.parametrize(
    "override, field, words",
    [
        ("train.lr=-1", "train.lr", ["-1", "greater than 0"]),
        ("clients.participation=1.5", "clients.participation", ["1.5", "less than or equal to 1"]),
        ("rounds=abc", "rounds", ["'abc'", "integer"]),
        ("train.learning_rate=0.1", "train.learning_rate", ["unknown key", "allowed keys", "lr"]),
        ("dataset.name=imagenet", "dataset.name", ["imagenet", "allowed", "mnist5k"]),
        ("model.name=vgg", "model.name", ["vgg", "allowed", "lenet5"]),
        ("algorithm.name=fedfoo", "algorithm.name", ["fedfoo", "fedavg"]),
        ("algorithm.mu=0.1", "algorithm.mu", ["unknown key"]),
        ("partition.scheme=random", "partition.scheme", ["random", "dirichlet"]),
        ("executor.kind=gpu", "executor.kind", ["gpu", "ray"]),
    ],
)
def test_invalid_values_name_field_value_and_allowed(override, field, words):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    assert f"{field} =" in msg, msg
    for w in words:
        assert w in msg, (w, msg)


def test_several_errors_are_reported_together():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["train.lr=0", "rounds=0"])
    msg = str(info.value)
    assert "train.lr" in msg and "rounds" in msg


def test_missing_file_and_bad_override_syntax(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(None, ["train.lr"])
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_a_time_of_day_stays_a_string_not_a_base_60_number(tmp_path):
    # YAML 1.1 reads 22:30 as 1350 and 11:59:58 as 43198; clock.start needs the text
    assert load_config(None, ["clock.start=22:30"]).clock.start_s == 22 * 3600 + 30 * 60
    path = tmp_path / "c.yaml"
    path.write_text("clock:\n  start: 11:59:58\nrounds: 1_0\n")
    cfg = load_config(path)
    assert cfg.clock.start == "11:59:58" and cfg.rounds == 10
