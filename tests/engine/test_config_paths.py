"""Paths in a config are relative to the file that names them; shipped traces by ``builtin:NAME``;
a missing file is named first (as given and as resolved); the shipped studies validate from any
folder; tests/studies/test_studies_anywhere.py runs the study scripts from one."""
import os
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from engine.config.schema import load_config
from engine.errors import ConfigError
from hardware_profiles.traces import BUILTIN_DIR, builtin_names
from hetsim.cli import main
from sweeps import whatif
from sweeps.spec import SweepSpecError

LINKS = BUILTIN_DIR / "fluctuating_links.csv"
def _trace() -> dict:
    return {"kind": "trace", "file": "traces/links.csv"}  # a new one each time: tests change theirs


def _config(folder: Path, **profiles) -> Path:
    (folder / "traces").mkdir(parents=True, exist_ok=True)
    (folder / "traces" / "links.csv").write_bytes(LINKS.read_bytes())
    raw = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "clients": {"num_clients": 4, "profiles": {
        "network": {"5mbps": 1.0}, "conditions": {"sets": {"a": {"down": _trace()}}}, **profiles}}}
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_files_paths_are_relative_to_its_folder_not_the_working_folder(tmp_path, monkeypatch):
    path = _config(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(os.path.relpath(path, elsewhere))  # ../project/exp.yaml
    down = cfg.clients.profiles.conditions.sets["a"].down
    assert down.file == str(tmp_path / "project" / "traces" / "links.csv")


def test_set_values_are_relative_to_the_working_folder_and_absolute_paths_stay(tmp_path, monkeypatch):
    path = _config(tmp_path / "project")
    monkeypatch.chdir(tmp_path / "project" / "traces")
    cfg = load_config(path, ["clients.profiles.conditions.sets.a.up={kind: trace, file: links.csv}",
                             f"clients.profiles.conditions.sets.a.down={{kind: trace, file: {LINKS}}}"])
    sets = cfg.clients.profiles.conditions.sets["a"]
    assert sets.up.file == str(tmp_path / "project" / "traces" / "links.csv")
    assert sets.down.file == str(LINKS)  # absolute: unchanged


def test_shipped_traces_by_builtin_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert builtin_names() == ["builtin:compute_throttle", "builtin:fluctuating_links", "builtin:night_phones"]
    for spelling in ("builtin:fluctuating_links", "builtin:fluctuating_links.csv"):
        cfg = load_config({"clients": {"profiles": {"conditions": {"sets": {"a": {
            "down": {"kind": "trace", "file": spelling}}}}}}})
        assert cfg.clients.profiles.conditions.sets["a"].down.file == str(LINKS)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["clients.profiles.conditions.sets.a.down={kind: trace, file: builtin:fluctuating_link}"])
    assert "did you mean 'builtin:fluctuating_links'?" in str(err.value)


def test_a_missing_file_is_named_first_as_given_and_as_resolved_without_the_section(tmp_path, monkeypatch):
    path = _config(tmp_path / "project", table="fleet/table.csv")
    (tmp_path / "project" / "traces" / "links.csv").unlink()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 2
    table = [line for line in lines if "table" in line][0].strip()
    assert table.startswith("'fleet/table.csv' does not exist (resolved against the folder of ")
    assert repr(str(tmp_path / "project" / "fleet" / "table.csv")) in table
    trace = [line for line in lines if "links.csv" in line][0].strip()
    assert trace.startswith("'traces/links.csv' does not exist")
    assert "builtin:fluctuating_links" in trace  # the shipped traces are offered
    assert "5mbps" not in str(err.value)  # no dump of the profiles


def test_a_what_if_fleet_resolves_against_its_file_and_a_missing_trace_is_named_first(tmp_path, monkeypatch):
    project = tmp_path / "project"
    _config(project)
    fleet_dir = project / "fleets"
    fleet_dir.mkdir()
    up_one = {"kind": "trace", "file": "../traces/links.csv"}  # relative to the fleet file's folder
    (fleet_dir / "slow.yaml").write_text(yaml.safe_dump({
        "network": {"5mbps": 1.0}, "conditions": {"sets": {"a": {"down": up_one}}}}))
    spec = {"base": "exp.yaml", "fleets": [
        {"name": "fast", "profiles": {"network": {"500mbps": 1.0}, "conditions": {"sets": {"a": {"down": _trace()}}}}},
        {"name": "slow", "file": "fleets/slow.yaml"}]}
    (project / "w.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)
    _, fleets, _ = whatif.load_whatif_file(project / "w.yaml")
    expected = str(project / "traces" / "links.csv")
    assert fleets["fast"]["conditions"]["sets"]["a"]["down"]["file"] == expected
    assert fleets["slow"]["conditions"]["sets"]["a"]["down"]["file"] == expected
    spec["fleets"][0]["profiles"]["conditions"]["sets"]["a"]["down"]["file"] = "traces/gone.csv"
    (project / "w.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(SweepSpecError) as err:
        whatif.load_whatif_file(project / "w.yaml")
    message = str(err.value)
    assert message.splitlines()[1].startswith("  fleets.fast: 'traces/gone.csv' does not exist (resolved against")
    assert len(message) < 600 and "500mbps" not in message


SHIPPED_CONFIGS = sorted(p for p in [*REPO.glob("studies/*.yaml"), *REPO.glob("configs/*.yaml")])


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates_from_a_folder_outside_the_repository(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = yaml.safe_load(path.read_text())
    is_sweep = "fleets" in spec or "space" in spec  # a what-if or a sweep spec: its trials, not run
    argv = (["whatif", str(path), "--dry-run"] if "fleets" in spec else ["sweep", str(path), "--dry-run"]
            if is_sweep else ["validate", "-c", str(path)])
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert ("trial(s)" in out) if is_sweep else yaml.safe_load(out)["seed"] == 0
    assert list(tmp_path.iterdir()) == []  # validation writes nothing


def test_a_sweep_specs_space_and_a_what_ifs_overrides_resolve_against_their_file(tmp_path, monkeypatch):
    from sweeps.spec import resolve

    project = tmp_path / "project"
    _config(project)
    conditions = {"sets": {"x": {"down": _trace()}}}
    spec = {"name": "s", "base": {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "rounds": 1,
                                  "clients": {"num_clients": 4, "profiles": {"network": {"5mbps": 1.0}}}},
            "space": {"clients.profiles.conditions": {"named": {"traced": conditions, "steady": {}}}}}
    (project / "s.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)
    r = resolve(project / "s.yaml", storage=tmp_path / "never")
    expected = str(project / "traces" / "links.csv")
    assert r.spec.space["clients.profiles.conditions"]["named"]["traced"]["sets"]["x"]["down"]["file"] == expected
    assert not (tmp_path / "never").exists()
    # a what-if's own overrides: relative to the what-if file; --set: to the working folder
    base = whatif.with_overrides({}, ["dataset.params={path: data/t.parquet}"], project)
    assert base["dataset"]["params"]["path"] == str(project / "data" / "t.parquet")
    assert whatif.with_overrides({}, ["dataset.root=d"])["dataset"]["root"] == str(tmp_path / "d")


def test_a_catalog_file_resolves_against_the_config_and_inline_catalog_text_is_left_alone(tmp_path, monkeypatch):
    tier = {"gflops": 1.0, "memory_gb": 1.0, "availability": 1.0, "dropout": 0.0, "source": "test"}
    (tmp_path / "tiers.yaml").write_text(yaml.safe_dump({"devices": {"tiny": tier}}))
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"clients": {"profiles": {"devices": {"tiny": 1.0}, "catalog": "tiers.yaml"}}}))
    monkeypatch.chdir(tmp_path.parent)
    assert load_config(path).clients.profiles.catalog == str(tmp_path / "tiers.yaml")
    inline = "{devices: {tiny: {gflops: 1.0, memory_gb: 1.0, availability: 1.0, dropout: 0.0, source: t}}}"
    cfg = load_config(None, [f"clients.profiles.catalog='{inline}'", "clients.profiles.devices={tiny: 1.0}"])
    assert cfg.clients.profiles.catalog == inline
