"""The engine's public face: one import for users, sweeps and the CLI; one call for a notebook."""
import json
import subprocess
import sys
import threading

import pandas as pd
import pytest

import engine
from engine.results import WALL_COLUMNS, load_run, read_manifest
from engine.results.manifest import update_manifest, write_manifest

TINY = {"dataset.name": "digits", "model.name": "mlp", "clients.num_clients": 6, "rounds": 2,
        "clients.profiles": {}}


def test_every_exported_name_resolves_to_what_its_module_defines():
    import importlib

    import engine.results

    for face in (engine, engine.results):  # both faces are lazy (PEP 562)
        for name, module in face._EXPORTS.items():
            assert getattr(face, name) is getattr(importlib.import_module(module), name), name
        with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
            face.not_a_name  # noqa: B018 - the lookup is the test


def test_the_face_holds_the_names_a_user_needs_and_no_plumbing():
    assert len(engine._EXPORTS) <= 15
    assert {"simulate", "run_experiment", "resume_run", "load_run", "Run", "load_config", "ExperimentConfig",
            "RunCallback", "Stop", "UserError", "ConfigError"} <= set(engine._EXPORTS)
    # plumbing comes from its own module, not from the face
    for name in ("execute_run", "Simulation", "init_ray", "RayExecutor", "write_checkpoint", "apply_overrides"):
        with pytest.raises(AttributeError, match=name):
            getattr(engine, name)


def test_the_results_face_holds_what_a_user_reads_results_with_and_no_plumbing():
    import engine.results

    assert set(engine.results._EXPORTS) == {
        "Run", "load_run", "read_table", "RunFolderError", "read_manifest", "run_status", "SCHEMA_VERSION",
        "ROUND_COLUMNS", "CLIENT_COLUMNS", "PROFILE_COLUMNS", "FAULT_COLUMNS", "WALL_COLUMNS",
        "open_storage", "Storage", "StorageError", "StorageUnreachable"}
    # plumbing comes from its own module
    for name in ("RunWriter", "update_manifest", "write_manifest", "fold_table", "is_uri", "redact"):
        with pytest.raises(AttributeError, match=name):
            getattr(engine.results, name)
    assert {"RunWriter", "load_run"} <= set(dir(engine.results.tables))


def test_the_results_face_reads_a_run_folder(tmp_path):
    from engine.results import ROUND_COLUMNS, Run, RunFolderError, read_table, run_status

    run = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY)
    again = load_run(run.path)
    assert isinstance(again, Run) and run_status(again.manifest) == "finished"
    assert set(ROUND_COLUMNS) <= set(again.rounds.columns)
    pd.testing.assert_frame_equal(read_table(run.path, "rounds"), again.rounds)
    with pytest.raises(RunFolderError):
        load_run(tmp_path / "not-a-run")


def test_importing_the_face_imports_neither_torch_nor_ray():
    code = "import sys, engine; print(json.dumps(sorted(m for m in ('torch', 'ray', 'pandas') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_simulate_runs_a_dict_config_and_returns_its_tables(tmp_path):
    run = engine.simulate({"output": {"dir": str(tmp_path)}}, TINY)
    assert len(run.rounds) == 2 and set(run.clients["round"]) == {0, 1}
    assert run.manifest["status"] == "finished" and run.path.parent == tmp_path
    # a dict is a whole config, as a YAML file is (over the schema's defaults, not the default experiment)
    again = engine.simulate(engine.load_config({"output": {"dir": str(tmp_path)}}, TINY), run_dir=tmp_path / "again")
    keep = [c for c in run.rounds.columns if c not in WALL_COLUMNS]
    pd.testing.assert_frame_equal(run.rounds[keep], again.rounds[keep])  # same seed, same run
    assert load_run(again.path).rounds.shape == again.rounds.shape


def test_manifest_updates_keep_other_fields_and_never_show_half_a_file(tmp_path):
    write_manifest(tmp_path, {"status": "running", "seed": 3})
    update_manifest(tmp_path, status="failed", error="boom")
    assert read_manifest(tmp_path) == {"status": "failed", "seed": 3, "error": "boom"}
    (tmp_path / "manifest.json").write_text("{trunc")  # an unreadable one starts over
    assert update_manifest(tmp_path, status="interrupted") == {"status": "interrupted"}
    # writers in threads take turns: every field written survives, the file always parses
    threads = [threading.Thread(target=update_manifest, args=(tmp_path,), kwargs={f"k{i}": i})
               for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    manifest = read_manifest(tmp_path)
    assert all(manifest[f"k{i}"] == i for i in range(20))
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temporary file left
