"""Property-based tests of sweep specs and what-if fleets (generators: tests/helpers/inputs.py):
every shipped example spec and what-if study, mutated at every depth, resolves (static checks
only: the data checks are deferred and never run here) or is refused with a ``UserError``
naming something the user wrote; never another exception, never a hang. ``make fuzz`` runs more."""
import copy
from pathlib import Path

from helpers import REPO
from helpers.inputs import assert_names_an_input_field, examples, known_fields, mutated, no_hang, values
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.config.paths import resolve_paths
from engine.config.yamlio import read_yaml_file
from engine.errors import UserError
from hardware_profiles.sampler import ProfileSpec
from sweeps.spec import SweepSpec, resolve
from sweeps.whatif import check_fleets, load_whatif_file


def _spec(path: Path) -> dict:
    raw = read_yaml_file(path)
    if isinstance(raw.get("base"), str):
        raw["base"] = str((path.parent / raw["base"]).resolve())
    elif isinstance(raw.get("base"), dict):
        raw["base"] = resolve_paths(raw["base"], path.parent, str(path))[0]
    return raw


SPECS = {p.name: _spec(p) for p in sorted((REPO / "sweeps/examples").glob("*.yaml"))}
# paths that start Ray or reach the network when the spec resolves: left alone
AVOID = ("ray", "storage", "trackers", "base.ray", "base.executor")


@settings(max_examples=examples(0.5))
@given(case=mutated(SPECS, values(long_strings=False), avoid=AVOID, schema=SweepSpec))
@example(case=({"space": 5}, []))
@example(case=({"base": {0: None}, "space": {"train.lr": {"grid": [0.1]}}}, []))
@example(case=({"space": {"train.lr": {"grid": [0.1]}}}, []))
@example(case=({"space": {"train.lr": {"grid": [0.1]}}, "objectives": [{"name": "global_acc", "mode": "max"},
                                                                      {"name": "global_acc", "mode": "max"}]}, []))
def test_a_mutated_sweep_spec_resolves_or_names_a_field(case, tmp_path_factory, monkeypatch):
    raw, _ = case
    monkeypatch.chdir(tmp_path_factory.mktemp("spec"))
    with no_hang():
        try:
            resolve(copy.deepcopy(raw), data_checks=[])
        except UserError as err:
            space = raw.get("space") if isinstance(raw.get("space"), dict) else {}
            known = known_fields(raw, extra=tuple(f"space.{k}" for k in space))
            assert_names_an_input_field(str(err), known | {f"base.{k}" for k in known})


WHATIFS = {p.name: p for p in sorted((REPO / "studies").glob("whatif_*.yaml"))}
FLEETS = {f"{name}:{fleet}": profiles for name, path in WHATIFS.items()
          for fleet, profiles in load_whatif_file(path)[1].items()}


@settings(max_examples=examples(0.5))
@given(case=mutated(FLEETS, values(long_strings=False), schema=ProfileSpec),
       name=st.one_of(st.sampled_from(["a", "fast", "slow"]), st.text(max_size=6)))
@example(case=({"network": {"5mbps": 1.0}, "bandwidth": {"low": 5}}, []), name="a")
@example(case=({"overrides": {0: {"down_mbps": 5e6}}}, []), name="a")
def test_a_mutated_whatif_fleet_is_checked_or_refused_naming_it(case, name):
    profiles, _ = case
    base = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "clients": {"num_clients": 4}}
    with no_hang():
        try:
            check_fleets(base, {name: profiles, "other": {}})
        except UserError as err:
            assert f"fleets.{name}" in str(err) or "fleets" in str(err), str(err)
