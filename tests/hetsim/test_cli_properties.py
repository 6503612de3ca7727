"""Property-based tests of the ``hetsim`` sub-commands' arguments (generators:
tests/helpers/inputs.py): any arguments to validate, show, report, compare, list, init, a
what-if or sweep ``--dry-run`` and ``run --resume`` end with exit status 0 or 2 and one message,
never 1 ("This is a bug"), never a hang. Nothing here trains: the commands that would are given
``--dry-run``, or a folder that holds no run. ``make fuzz`` runs more examples."""
import pytest
from helpers.inputs import examples, no_hang, scalars
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hetsim.cli import main

FILES = {
    "exp.yaml": "dataset: {name: digits}\nmodel: {name: mlp}\nclients: {num_clients: 4}\nrounds: 1\n",
    "empty.yaml": "",
    "list.yaml": "- 1\n- 2\n",
    "bad.yaml": "a: [1\n",
    "fleet.yaml": "network: {wifi: 1.0}\n",
    "spec.yaml": "base: exp.yaml\nspace: {train.lr: {grid: [0.01, 0.1]}}\n",
    "whatif.yaml": ("base: exp.yaml\nfleets:\n  - {name: a, profiles: {}}\n"
                    "  - {name: b, profiles: {network: {wifi: 1.0}}}\n"),
    "notes.txt": "hello\n",
    "binary.bin": b"\x00\xff\xfe",
    "run/manifest.json": "{\"status\": \"runn",
    "run/config.yaml": "rounds: 1\n",
    "emptydir/.keep": "",
}
PATHS = [*FILES, "run", "emptydir", "missing", "latest", "run/latest", "", "-", "s3://", "\u00e9"]


def _text(value) -> str:
    return value if isinstance(value, str) else str(value)


ARGS = st.one_of(st.sampled_from(PATHS), scalars(long_strings=False).map(_text))
SETS = st.one_of(st.sampled_from(["rounds=2", "train.lr=x", "clients=5", "a..b=1", "=", "rounds", "seed=-1"]),
                 st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["rounds", "clients.num_clients", "algorithm",
                                                                    "clock.deadline_s"]), ARGS))


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(["validate", "show", "report", "compare", "list", "init", "whatif", "sweep",
                                    "resume", "nothing"]))
    if command == "validate":
        args = ["validate", "-c", draw(ARGS)] if draw(st.booleans()) else ["validate"]
        for item in draw(st.lists(SETS, max_size=2)):
            args += ["--set", item]
        return args
    if command == "show":
        return ["show", draw(ARGS), *draw(st.sampled_from([[], ["--wide"]]))]
    if command == "report":
        return ["report", draw(ARGS), "-o", draw(st.sampled_from(["out.html", "run", "missing/x.html"]))]
    if command == "compare":
        args = ["compare", *draw(st.lists(ARGS, min_size=1, max_size=3))]
        if draw(st.booleans()):
            args += ["--target", draw(ARGS)]
        if draw(st.booleans()):
            args += ["--metric", draw(ARGS)]
        return args
    if command == "list":
        return ["list", draw(st.one_of(st.sampled_from(["datasets", "models", "methods", "tiers", "presets"]), ARGS))]
    if command == "init":
        return ["init", draw(st.one_of(st.sampled_from(["sync", "async", "energy", "conditions"]), ARGS)),
                "-o", draw(st.sampled_from(["new.yaml", "exp.yaml", "emptydir", "missing/new.yaml"]))]
    if command == "whatif":
        args = ["whatif", "--dry-run"]
        if draw(st.booleans()):
            args.append(draw(ARGS))
        for item in draw(st.lists(st.sampled_from(["a=fleet.yaml", "b=missing.yaml", "a", "=x", "c=list.yaml"]),
                                  max_size=2)):
            args += ["--fleet", item]
        return args
    if command == "sweep":
        args = ["sweep", draw(ARGS), "--dry-run"]
        for item in draw(st.lists(st.sampled_from(["train.lr=0.5,0.6", "x", "train.lr=", "rounds=1,2"]), max_size=1)):
            args += ["--grid", item]
        return args
    if command == "resume":
        return ["run", "--resume", draw(ARGS), *draw(st.sampled_from([[], ["-o", "x"], ["--set", "rounds=3"]]))]
    return draw(st.lists(ARGS, max_size=3))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


@settings(max_examples=examples(0.75))
@given(argv=command_lines())
@example(argv=["run", "--resume", "run"])
@example(argv=["compare", "run", "--target", "nan"])
@example(argv=["sweep", "spec.yaml", "--dry-run", "--grid", "train.lr=0.5,0.6"])
@example(argv=["whatif", "--dry-run", "--fleet", "a=fleet.yaml", "--fleet", "a=fleet.yaml"])
@example(argv=["validate", "-c", "binary.bin"])
@example(argv=["sweep", "$UNSET_VAR_X", "--dry-run"])
@example(argv=["validate", "-c", "$UNSET_VAR_X/exp.yaml"])
def test_a_command_line_exits_0_or_2_with_one_message(argv, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    with no_hang():
        code = main(list(argv))
    out = capsys.readouterr()
    assert code in (0, 2), (argv, out.err)
    assert "This is a bug" not in out.err and "Traceback" not in out.err, out.err
    if code == 2:
        assert out.err.strip(), argv
