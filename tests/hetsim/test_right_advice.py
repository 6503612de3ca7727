"""Every message's advice is right: a section given as another type is a schema error naming the
section, whatever the section; a unit is converted to the field's unit, never stripped; a value
in bit/s is recognised; the field the user wrote is blamed; an option of another method names
its owner; a closed list says "did you mean"."""
import pytest

from engine.config.schema import ExperimentConfig, load_config
from engine.errors import ConfigError
from hetsim.cli import main

SECTIONS = [name for name, field in ExperimentConfig.model_fields.items() if name not in ("seed", "rounds")]
SMALL = ["--set", "dataset.name=digits", "--set", "model.name=mlp", "--set", "clients.num_clients=4",
         "--set", "rounds=1"]


def _error(overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    return str(info.value)


def test_every_top_level_section_is_a_mapping_in_the_schema():
    # the parametrisation below covers every section the schema has
    assert {"dataset", "clients", "algorithm", "clock", "asynchronous"} <= set(SECTIONS)


@pytest.mark.parametrize("value", ["5", "[1]", "null"])
@pytest.mark.parametrize("section", SECTIONS)
def test_run_with_a_section_of_another_type_exits_2_naming_the_section(section, value, tmp_path, monkeypatch,
                                                                       capsys):
    if section == "asynchronous" and value == "null":
        pytest.skip("asynchronous: null is allowed (synchronous rounds)")
    monkeypatch.chdir(tmp_path)
    assert main(["run", *SMALL, "--set", f"{section}={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetsim: invalid experiment config:\n"), err
    kind = {"5": "a number (5)", "[1]": "a list", "null": "null"}[value]
    assert f"  {section} = " in err and f"{section} is a section: a mapping of keys" in err, err
    assert err.strip().endswith(f"not {kind}"), err
    assert "This is a bug" not in err and list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("value", ["[1]", "null", "{a: 1}"])
def test_run_with_a_number_of_another_type_exits_2_naming_it(value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    no_rounds = SMALL[:-2]  # SMALL sets rounds
    for field in ("seed", "rounds"):
        assert main(["run", *no_rounds, "--set", f"{field}={value}"]) == 2
        assert f"  {field} = " in capsys.readouterr().err


def test_a_section_inside_a_section_of_another_type_is_named_with_its_keys():
    msg = _error(["clients.profiles=5"])
    assert "clients.profiles = 5: clients.profiles is a section: a mapping of keys (devices, network" in msg


@pytest.mark.parametrize("override, words", [
    ("clock.deadline_s=500ms", "clock.deadline_s = '500ms': 500ms = 0.5 seconds: give 0.5 (the field is in seconds)"),
    ("clock.deadline_s=2min", "clock.deadline_s = '2min': 2min = 120 seconds: give 120"),
    ("clock.deadline_s=1.5h", "1.5h = 5400 seconds: give 5400"),
    ("clients.profiles.overrides={0: {down_mbps: 1Gbps}}", "1Gbps = 1000 Mbps: give 1000 (the field is in Mbps)"),
    ("clients.profiles.overrides={0: {down_mbps: 500kbps}}", "500kbps = 0.5 Mbps: give 0.5"),
    ("clients.profiles.overrides={0: {up_mbps: 2MB/s}}", "2MB/s = 16 Mbps: give 16"),
    ("clients.profiles.overrides={0: {memory_gb: 512MB}}", "512MB = 0.512 GB: give 0.512"),
    ("clients.profiles.overrides={0: {memory_gb: 2GB}}", "a number with a unit ('GB'); the unit is GB already: give 2"),
    ("clients.profiles.overrides={0: {latency_s: 5 parsecs}}",
     "a number with a unit ('parsecs') that is not one of seconds; give a number in seconds"),
    ("train.lr=5x", "a number with a unit ('x'); the field takes a plain number: write it without the unit"),
])
def test_a_unit_is_converted_to_the_fields_unit_not_stripped(override, words):
    msg = _error([override])
    assert words in msg, msg
    assert "e.g." not in msg  # the old advice repeated the number without its unit


def test_a_sampled_bandwidth_in_bit_per_second_blames_the_field_given():
    msg = _error(["clients.profiles.bandwidth={distribution: loguniform, low: 5e6, high: 5e8}"])
    lines = msg.splitlines()[1:]
    assert lines == [
        "  clients.profiles.bandwidth.low = 5000000.0: 5000000 Mbps is outside the catalog range [5, 500] Mbps; "
        "5000000 looks like bit/s: 5 Mbps? give 5 (the unit is Mbps)",
        "  clients.profiles.bandwidth.high = 500000000.0: 500000000 Mbps is outside the catalog range [5, 500] "
        "Mbps; 500000000 looks like bit/s: 500 Mbps? give 500 (the unit is Mbps)"], msg
    assert "client 0" not in msg and "allow_out_of_range" not in msg


def test_a_sampled_bandwidth_outside_the_range_says_how_to_allow_it():
    msg = _error(["clients.profiles.bandwidth={low: 1, high: 500}"])
    assert ("clients.profiles.bandwidth.low = 1: 1 Mbps is outside the catalog range [5, 500] Mbps; set "
            "clients.profiles.allow_out_of_range: true") in msg
    load_config(None, ["clients.profiles.bandwidth={low: 1, high: 500}", "clients.profiles.allow_out_of_range=true"])


def test_a_client_bandwidth_in_bit_per_second_is_not_told_to_allow_out_of_range(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["validate", *SMALL, "--set", "clients.profiles.overrides={0: {down_mbps: 5000000}}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "down_mbps=5000000.0 Mbps is outside the catalog range [5, 500] Mbps; 5000000 looks like bit/s: 5 Mbps? " \
           "give 5 (the unit is Mbps)" in err
    assert "allow_out_of_range" not in err


def test_an_option_of_another_method_names_its_owner():
    msg = _error(["algorithm.mu=0.1"])
    assert ("algorithm.mu = 0.1: unknown key; allowed keys of algorithm 'fedavg': name; mu is an option of fedprox "
            "(algorithm.name: fedprox), not of fedavg") in msg
    msg = _error(["algorithm={name: fedprox, mu: 0.1, k: 0.1}"])
    assert ("algorithm.k = 0.1: unknown key; allowed keys of algorithm 'fedprox': name, mu; k is an option of "
            "ascend and fedavg_compressed and fedcspack") in msg


def test_an_unknown_algorithm_key_lists_the_methods_keys_with_the_closest():
    assert "algorithm.module = 'x': unknown key; allowed keys of algorithm 'fedavg': name" in _error(
        ["algorithm.module=x"])
    msg = _error(["algorithm={name: fedavg_compressed, compresor: topk}"])
    assert "algorithm.compresor = 'topk': unknown key; did you mean 'compressor'? allowed keys of algorithm " \
           "'fedavg_compressed': name, k," in msg


def test_algorithm_without_a_name_lists_the_methods():
    msg = _error(["algorithm={lr: 1}"])
    assert "algorithm needs a name: the method, one of ascend, fedavg, fedavg_compressed, fedcspack, fedprox" in msg


def test_a_compressor_name_gets_did_you_mean():
    msg = _error(["algorithm={name: fedavg_compressed, compressor: top_k}"])
    assert "compressor='top_k' is not allowed: did you mean 'topk'? choose one of" in msg


def test_a_seed_beyond_64_bits_is_blamed_on_seed():
    msg = _error([f"seed={2 ** 64}"])
    assert msg.splitlines()[1].startswith(f"  seed = {2 ** 64}: Input should be less than or equal to {2 ** 64 - 1}")
    assert load_config(None, [f"seed={2 ** 64 - 1}"]).seed == 2 ** 64 - 1


def test_a_set_key_typed_twice_is_said_naming_both(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", *SMALL, "--set", "train.lr=0.1", "--set", "train.lr=0.2"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines()[0] == ("hetsim: warning: --set train.lr is given twice ('train.lr=0.1' and "
                                       "'train.lr=0.2'); the last one is used")
    assert "lr: 0.2" in out.out
    # the Python API's lists are code: [*BASE, "rounds=3"] composes, the last wins
    assert load_config(None, ["rounds=2", "rounds=3"]).rounds == 3
