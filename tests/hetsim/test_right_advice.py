"""Every message's advice is right: a section given as another type is a schema error naming the
section, whatever the section; a unit is converted to the field's unit, never stripped; a value
in bit/s is recognised; the field the user wrote is blamed; an option of another method names
its owner; a closed list says "did you mean"."""
import pytest

from engine.config.schema import ExperimentConfig, load_config
from engine.errors import ConfigError
from hetsim.cli import main

SECTIONS = [name for name, field in ExperimentConfig.model_fields.items() if name not in ("plugins", "seed", "rounds")]
SMALL = ["--set", "dataset.name=digits", "--set", "model.name=mlp", "--set", "clients.num_clients=4",
         "--set", "rounds=1"]


def _error(overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    return str(info.value)


def test_every_top_level_section_is_a_mapping_in_the_schema():
    # the parametrisation below covers every section the schema has
    assert {"dataset", "clients", "algorithm", "clock", "asynchronous"} <= set(SECTIONS)


# every section and wrong type but asynchronous: null, which is allowed (synchronous rounds)
@pytest.mark.parametrize("section,value", [(s, v) for s in SECTIONS for v in ("5", "[1]", "null")
                                           if (s, v) != ("asynchronous", "null")])
def test_run_with_a_section_of_another_type_exits_2_naming_the_section(section, value, tmp_path, monkeypatch,
                                                                       capsys):
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
            "and moon (algorithm.name: fedprox), not of fedavg") in msg
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
    assert "algorithm needs a name: the method, one of ascend, fedavg, fedavg_compressed, fedcspack, fednova" in msg


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


# ---------------------------------------------------------------- the summary's and the sweep's figures


def test_the_wall_time_counts_from_the_commands_start_with_the_start_up_apart():
    import pandas as pd

    from hetsim.summary import wall_text

    rounds = pd.DataFrame({"wall_s": [0.4, 0.5]})
    ray = {"wall_s": 0.9, "command_wall_s": 9.9, "executor": {"kind": "ray"}}
    assert wall_text(ray, rounds) == ("9.9 s from the command's start: start-up 9.0 s (validation and Ray's "
                                      "start), then the run 0.9 s")
    assert wall_text({"wall_s": 2.0, "command_wall_s": 2.5}, rounds) == (
        "2.5 s from the command's start: start-up 0.5 s (validation start), then the run 2.0 s")
    assert wall_text({"wall_s": 0.9}, rounds) == "0.9 s"  # a run folder written before the figure existed
    assert wall_text({}, rounds) == "0.9 s"  # the rounds' own


@pytest.mark.ray
def test_a_ray_runs_summary_counts_ray_start_up(tmp_path, monkeypatch, capsys, ray_session):
    import re
    import time

    from engine.results import read_manifest

    monkeypatch.chdir(tmp_path)
    before = time.time()
    assert main(["run", "-q", *SMALL, "--set", "executor.kind=ray", "--set", "executor.num_actors=1",
                 "--set", "ray.num_cpus=2", "-o", "r"]) == 0
    took = time.time() - before
    printed = capsys.readouterr().out
    m = read_manifest(tmp_path / "r")
    assert m["wall_s"] < m["command_wall_s"] <= took
    line = re.search(r"^wall time\s+(.+)$", printed, re.M).group(1)
    assert line == (f"{m['command_wall_s']:.1f} s from the command's start: start-up "
                    f"{m['command_wall_s'] - m['wall_s']:.1f} s (validation and Ray's start), then the run "
                    f"{m['wall_s']:.1f} s")


def test_within_noise_of_best_is_missing_without_an_interval():
    import pandas as pd

    from sweeps.stats import within_noise

    once = pd.DataFrame({"acc_mean": [0.8, 0.9, 0.7], "acc_ci_low": [float("nan")] * 3,
                         "acc_ci_high": [float("nan")] * 3})
    out = within_noise(once, "acc", "max")
    assert str(out.dtype) == "boolean" and out.tolist() == [pd.NA, True, pd.NA]
    repeated = pd.DataFrame({"acc_mean": [0.8, 0.9, 0.5, 0.85], "acc_ci_low": [0.75, 0.85, 0.45, float("nan")],
                             "acc_ci_high": [0.86, 0.95, 0.55, float("nan")]})
    assert within_noise(repeated, "acc", "max").tolist() == [True, True, False, pd.NA]
