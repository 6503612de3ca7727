"""Property-based tests of the config surface (generators: tests/helpers/inputs.py): whatever a
user writes, loading and validating it ends in a valid config or a ``ConfigError`` naming a
field the user wrote; never another exception, never a hang. Training never runs here.

``make fuzz`` (``HYPOTHESIS_PROFILE=long``) runs the same properties on thousands of random
examples; a case it finds becomes an ``@example`` below.
"""
import copy

import pytest
from helpers.inputs import (
    SMALL,
    as_override,
    assert_names_an_input_field,
    base_configs,
    examples,
    known_fields,
    light_values,
    mutated,
    no_hang,
    schema_paths,
    values,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.config.schema import apply_overrides, load_config
from engine.errors import ConfigError
from engine.run.validate import static_problems

BASES = base_configs()


def _loads_or_names_a_field(raw, overrides=None, known=None):
    with no_hang():
        try:
            return load_config(copy.deepcopy(raw), overrides)
        except ConfigError as err:
            assert_names_an_input_field(str(err), known or known_fields(raw))
    return None


def test_the_bases_are_the_shipped_configs_and_they_validate_at_the_schema_level():
    assert {"engine/config/default.yaml", "configs/ascend_mnist.yaml", "template:async"} <= set(BASES)
    for raw in BASES.values():
        load_config(copy.deepcopy(raw))


@settings(max_examples=examples(2.5))
@given(mutated(BASES))
@example(({"clients": 5}, [("clients",)]))
@example(({"clients": {"profiles": 5}}, [("clients", "profiles")]))
@example(({"clients": {"profiles": {"conditions": {"sets": 5}}}}, [("clients",)]))
@example(({"clients": {"profiles": {"catalog": 5}}}, [("clients",)]))
@example(({"algorithm": {"name": "fedavg_compressed", "k": "x"}}, [("algorithm",)]))
@example(({"clients": {"profiles": {"conditions": {"sets": {"a": {"availability": {"preset": []}}}}}}}, []))
@example(({"clients": {"profiles": {"conditions": {"sets": {"a": {"down": {"kind": "trace", "file": "x" * 300}}}}}}},
          []))
@example(({"clients": {"profiles": {"catalog": "\x1f"}}}, []))
@example(({"clients": {"profiles": {"catalog": {"devices": 1}}}}, []))
@example(({"output": {"dir": "x" * 300}}, []))
def test_a_mutated_config_loads_or_names_a_field_it_holds(case):
    raw, _ = case
    _loads_or_names_a_field(raw)


@settings(max_examples=examples(2.5))
@given(st.lists(st.tuples(st.sampled_from(schema_paths()), values()), min_size=1, max_size=3),
       st.sampled_from(sorted(BASES)))
@example([(("clients",), 5)], "engine/config/default.yaml")
@example([(("clients", "profiles", "conditions", "sets", "a", "down", "file"), "x" * 300)], "configs/ascend_mnist.yaml")
@example([(("clients", "profiles", "network"), {"5mbps": 1.0}), (("clients",), [1])], "engine/config/default.yaml")
def test_overrides_in_set_form_load_or_name_a_field(items, base):
    overrides = [as_override(path, value) for path, value in items]
    keys = tuple(o.split("=", 1)[0] for o in overrides)
    try:
        merged = apply_overrides(BASES[base], overrides)
    except ConfigError as err:  # e.g. a key below a value: the override is named
        assert any(k in str(err) for k in keys), str(err)
        return
    _loads_or_names_a_field(BASES[base], overrides, known_fields(BASES[base], merged, extra=keys))


@settings(max_examples=examples(1.0))
@given(st.lists(st.text(max_size=30), min_size=1, max_size=3))
@example(["=5"])
@example(["clients"])
@example(["a..b=1"])
@example(["rounds.x=1"])
@example(["rounds=[1"])
def test_any_set_text_loads_or_is_refused_naming_it(overrides):
    with no_hang():
        try:
            load_config(None, overrides)
        except ConfigError as err:
            text = str(err)
            named = [o for o in overrides if any(part in text for part in (
                o.split("=", 1)[0].strip(), repr(o), repr(o.split("=", 1)[0].strip())))]
            assert named or "invalid experiment config" in text, text


@settings(max_examples=examples(1.0))
@given(mutated(BASES, avoid=("ray.address", "executor.kind")))
@example(({"clients": {"profiles": {"catalog": "\x1f"}}}, []))
@example(({"clients": {"profiles": {"catalog": "devices: [1"}}}, []))
@example(({"clients": {"profiles": {"catalog": {"devices": 1, "networks": [2]}}}}, []))
@example(({"output": {"dir": "x" * 300}}, []))
@example(({"output": {"dir": "a\x00b"}}, []))
def test_the_static_checks_of_a_loaded_config_name_a_field(case):
    raw, _ = case
    cfg = _loads_or_names_a_field(raw)
    if cfg is not None:
        with no_hang():
            for line in static_problems(cfg, None):
                assert_names_an_input_field("invalid experiment config:\n" + line,
                                            known_fields(raw, extra=("output.dir", "clients.profiles")))


# ---------------------------------------------------------------- hetsim validate, in-process

# paths whose values size the work (a model's width, the fleet) or reach the network: the data
# level takes light values there, or leaves them alone
HEAVY = ("dataset", "model", "clients.num_clients", "ray.address", "executor.kind", "executor.num_actors",
         "partition.min_samples", "partition.shards_per_client")


@pytest.fixture(scope="module")
def small_config(tmp_path_factory):
    return tmp_path_factory.mktemp("validate")


@settings(max_examples=examples(0.3))
@given(case=mutated({"small": SMALL}, light_values(), avoid=HEAVY))
@example(case=({**SMALL, "clients": 5}, [("clients",)]))
@example(case=({**SMALL, "clients": {"num_clients": 4, "profiles": {"overrides": {0: {"down_mbps": 5e6}}}}},
               [("clients",)]))
def test_hetsim_validate_exits_0_or_2_naming_a_field(case, small_config, capsys, monkeypatch):
    import yaml

    from hetsim.cli import main

    raw, _ = case
    monkeypatch.chdir(small_config)
    path = small_config / "exp.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    with no_hang():
        code = main(["validate", "-c", str(path)])
    err = capsys.readouterr().err
    assert code in (0, 2), err
    if code == 2:
        assert err.startswith("hetsim: ") and "This is a bug" not in err, err
        assert_names_an_input_field(err.removeprefix("hetsim: "), known_fields(raw, extra=(str(path),)))


# ---------------------------------------------------------------- engine.simulate's arguments


class _Reached(Exception):
    """The run would start here: every argument was accepted."""


SMALL_FILE = "small.yaml"
CONFIGS = st.one_of(
    mutated({"small": SMALL}, light_values(), avoid=HEAVY).map(lambda case: case[0]),
    st.sampled_from([SMALL_FILE, "missing.yaml", "", 5, [1], b"x", ("a",)]), st.just("object"))
OVERRIDES = st.one_of(st.none(), st.just("rounds=1"), st.lists(st.sampled_from(
    ["rounds=1", "train.lr=0.1", "clients=5", "x=1", "=", "rounds", 3]), max_size=3),
    st.dictionaries(st.sampled_from(["rounds", "train.lr", 3, ""]), light_values(), max_size=2), st.integers())
RUN_DIRS = st.one_of(st.none(), st.sampled_from(["out", "afile", "afile/sub", "", 5, b"out", "s3"]))
CALLBACKS = st.one_of(st.none(), st.sampled_from([[], [print], [42], "print", 7, ["x"], "class", "instance"]))


@settings(max_examples=examples(0.4))
@given(config=CONFIGS, overrides=OVERRIDES, run_dir=RUN_DIRS, callbacks=CALLBACKS)
@example(config="object", overrides=None, run_dir="out", callbacks=[print])  # accepted: the run would start
@example(config=SMALL_FILE, overrides={"rounds": 1}, run_dir=None, callbacks="instance")  # accepted too
@example(config=5, overrides=None, run_dir=None, callbacks=None)
@example(config=SMALL_FILE, overrides="rounds=1", run_dir=None, callbacks=None)
@example(config=SMALL_FILE, overrides=None, run_dir="afile", callbacks=None)
@example(config=SMALL_FILE, overrides=None, run_dir=None, callbacks=[42])
@example(config=SMALL, overrides={"seed": 2 ** 64}, run_dir=None, callbacks=None)
def test_simulate_accepts_or_refuses_its_arguments_before_anything_is_written(config, overrides, run_dir, callbacks,
                                                                            tmp_path_factory, monkeypatch):
    import yaml

    import engine
    import engine.run.api as api
    from engine.errors import UserError
    from engine.run.folders import release_run_folder

    folder = tmp_path_factory.mktemp("simulate")
    monkeypatch.chdir(folder)
    (folder / SMALL_FILE).write_text(yaml.safe_dump(SMALL))
    (folder / "afile").write_text("x")
    before = sorted(p.name for p in folder.iterdir())

    def reached(cfg, path, *args, **kwargs):
        release_run_folder(path)
        raise _Reached

    monkeypatch.setattr(api, "_dispatch", reached)  # nothing trains: the run would start here
    if config == "object":
        config = load_config(copy.deepcopy(SMALL))
    if callbacks in ("class", "instance"):
        callbacks = [engine.RunCallback] if callbacks == "class" else [engine.RunCallback()]
    with no_hang():
        try:
            engine.simulate(copy.deepcopy(config), copy.deepcopy(overrides), run_dir=run_dir, callbacks=callbacks)
        except _Reached:
            return
        except (UserError, FileExistsError, NotADirectoryError) as err:  # the CLI's exit-2 family
            assert str(err).strip()
    assert sorted(p.name for p in folder.iterdir()) == before  # a refusal writes nothing
