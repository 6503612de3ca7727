"""A newcomer's first hour: "did you mean" for unknown names, units in values,
`network` replacing the default's `bandwidth`, `hetsim list` and `hetsim init`."""
import pytest

from engine.config.schema import apply_overrides, load_config
from engine.errors import ConfigError
from engine.run.validate import tier_problems
from hardware_profiles.sampler import ProfileSpec
from hardware_profiles.suggest import did_you_mean, unknown
from hetsim.cli import main


def _error(overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    return str(info.value)


def test_the_closest_name_is_suggested_case_first():
    assert did_you_mean("5Mbps", ["50mbps", "5mbps", "wifi"]) == "5mbps"
    assert did_you_mean("fedavgg", ["fedavg", "fedprox"]) == "fedavg"
    assert did_you_mean("zzz", ["fedavg", "fedprox"]) is None
    assert unknown("tier", "zzz", ["b", "a"]) == "unknown tier 'zzz'; allowed: a, b"


@pytest.mark.parametrize("override, words", [
    ("trian.lr=1", ["trian = ", "unknown key; did you mean 'train'? allowed keys: plugins, seed, rounds"]),
    ("train.lrr=1", ["train.lrr = 1: unknown key; did you mean 'lr'?"]),
    ("clients.profiles.overrides={0: {memory: 2}}", ["overrides.0.memory", "did you mean 'memory_gb'?"]),
    ("dataset.name=mnist5", ["unknown dataset 'mnist5'; did you mean 'mnist5k'? allowed: cifar10"]),
    ("model.name=cn", ["unknown model 'cn'; did you mean 'cnn'? allowed:"]),
    ("algorithm.name=fedavgg", ["unknown algorithm 'fedavgg'; did you mean 'fedavg'? allowed: ascend"]),
    ("partition.scheme=dirichelt", ["Input should be 'iid', 'dirichlet', 'shards', 'natural' or 'pfllib'; did you mean "
                                    "'dirichlet'?"]),
    ("clients.profiles.conditions={sets: {a: {down: gilbert_eliot}}}",
     ["unknown preset 'gilbert_eliot'; did you mean 'gilbert_elliott'? presets:"]),
])
def test_unknown_names_get_a_suggestion(override, words):
    msg = _error([override])
    for w in words:
        assert w in msg, (w, msg)


def test_unknown_tiers_get_a_suggestion_naming_the_field():
    expected = [
        "  clients.profiles.devices = {'phone_mdi': 1}: unknown device tier 'phone_mdi'; did you mean "
        "'phone_mid'? allowed: edge_gpu, laptop_cpu, phone_high, phone_low, phone_mid, rpi4",
        "  clients.profiles.network = {'5Mbps': 1.0}: unknown network tier '5Mbps'; did you mean '5mbps'? "
        "allowed: 4g, 500mbps, 50mbps, 5mbps, wifi"]
    with pytest.raises(ConfigError) as err:  # the schema stage, with the file's other mistakes
        load_config(None, ["clients.profiles.network={5Mbps: 1.0}", "clients.profiles.devices={phone_mdi: 1}"])
    assert str(err.value).splitlines()[1:] == expected
    # a spec built without load_config meets the same check in the validation pass
    spec = ProfileSpec(devices={"phone_mdi": 1}, network={"5Mbps": 1.0})
    assert tier_problems(spec) == [expected[0].replace("1}", "1.0}"), expected[1]]


def test_an_unknown_tier_is_a_user_error_of_the_command(capsys):
    assert main(["validate", "--set", "clients.profiles.network={5Mbps: 1.0}"]) == 2
    assert "did you mean '5mbps'?" in capsys.readouterr().err


@pytest.mark.parametrize("override, words", [
    ("clients.profiles.bandwidth=5Mbps", ["bandwidth = '5Mbps': bandwidth is a distribution of per-client Mbps",
                                          "network: {5mbps: 1.0}"]),
    ("clients.profiles.bandwidth.low=5Mbps", ["a number with a unit ('Mbps'); the unit is Mbps already: give 5"]),
    ("clients.profiles.overrides={0: {memory_gb: 2GB}}", ["memory_gb = '2GB': a number with a unit ('GB'); "
                                                          "the unit is GB already: give 2"]),
    # a unit other than the field's is converted, never stripped (20 ms is not 20 s)
    ("clients.profiles.overrides={0: {latency_s: 20ms}}", ["20ms = 0.02 seconds: give 0.02"]),
    ("rounds=ten", ["rounds = 'ten': not a number; give an integer"]),
])
def test_a_unit_in_a_number_names_the_unit_expected(override, words):
    msg = _error([override])
    assert "Input should be" not in msg and "BandwidthDist" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)


def test_setting_network_replaces_the_defaults_bandwidth_and_the_reverse():
    cfg = load_config(None, ["clients.profiles.network={5mbps: 1.0}"])  # the default gives bandwidth
    assert cfg.clients.profiles.network == {"5mbps": 1.0} and cfg.clients.profiles.bandwidth is None
    raw = {"clients": {"profiles": {"network": {"4g": 1.0}}}}
    cfg = load_config(raw, ["clients.profiles.bandwidth={low: 5, high: 50}"])
    assert cfg.clients.profiles.network is None and cfg.clients.profiles.bandwidth.high == 50
    assert apply_overrides(raw, {"clients.profiles.bandwidth.low": 5})["clients"]["profiles"] == {
        "bandwidth": {"low": 5}}


def test_both_in_the_same_overrides_or_file_are_still_refused(tmp_path):
    msg = _error(["clients.profiles.network={5mbps: 1.0}", "clients.profiles.bandwidth={low: 5, high: 50}"])
    assert "not both" in msg
    both = tmp_path / "both.yaml"
    both.write_text("clients:\n  profiles:\n    network: {5mbps: 1.0}\n    bandwidth: {low: 5, high: 50}\n")
    with pytest.raises(ConfigError, match="not both"):
        load_config(both)


@pytest.mark.parametrize("topic, lines", [
    ("tiers", ["phone_mid   device: 8 GFLOP/s, 4 GB", "5mbps       network: 5 Mbps down, 5 Mbps up, 50 ms latency"]),
    ("datasets", ["mnist5k ", "offline"]),
    ("models", ["cnn ", "resnet18 "]),
    ("algorithms", ["fedavg ", "fedcspack ", "ascend "]),
    ("presets", ["gilbert_elliott ", "night_charging "]),
])
def test_list_prints_one_line_per_entry_with_a_description(topic, lines, capsys):
    assert main(["list", topic]) == 0
    out = capsys.readouterr().out
    for line in lines:
        assert line in out, (line, out)
    assert all(len(row.split(None, 1)) == 2 for row in out.splitlines()), out


def test_list_of_an_unknown_topic_suggests_one(capsys):
    assert main(["list", "tier"]) == 2
    err = capsys.readouterr().err
    assert "unknown topic 'tier'; did you mean 'tiers'? allowed: algorithms, compressors, datasets" in err
    assert main(["list"]) == 2  # no topic: the topics, not argparse's "required"
    assert capsys.readouterr().err == ("hetsim: which list? one of: datasets, models, algorithms, compressors, "
                                       "selectors, work, metrics, tiers, presets (e.g. hetsim list algorithms)\n")


@pytest.mark.parametrize("template", ["sync", "async", "energy", "conditions"])
def test_every_init_template_validates_as_it_is(template, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", template, "-o", "exp.yaml"]) == 0
    text = (tmp_path / "exp.yaml").read_text()
    assert text.startswith(f"# Template {template!r}") and "hetsim list" in text
    assert main(["validate", "-c", "exp.yaml"]) == 0, capsys.readouterr().err


def test_init_writes_experiment_yaml_refuses_to_overwrite_and_the_result_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0 and "template 'sync'" in capsys.readouterr().out
    assert main(["init", "async"]) == 2
    assert "experiment.yaml exists" in capsys.readouterr().err
    assert "Template 'sync'" in (tmp_path / "experiment.yaml").read_text()
    assert main(["init", "async", "--force"]) == 0
    assert main(["init", "energie", "-o", "x.yaml"]) == 2
    assert "did you mean 'energy'?" in capsys.readouterr().err
    assert main(["run", "-c", "experiment.yaml", "--set", "rounds=2", "-q", "-o", "r"]) == 0
    assert (tmp_path / "r" / "rounds.parquet").exists()
