"""`hetsim sweep --grid KEY=v1,v2`: a spec's dimension shrunk or replaced from the command line."""

import pytest
from helpers import REPO

from hetsim.cli import main
from sweeps.grid import GridError, apply_grid, parse_grid_item

SPEC = REPO / "sweeps" / "examples" / "fedavg_lr.yaml"  # train.lr grid of 3 x clients.participation grid of 2
SPACE = {"train.lr": {"grid": [0.02, 0.05, 0.2]}, "algorithm.k": {"loguniform": [1e-3, 0.1]},
         "cell": {"cases": {"a": {"seed": 1}, "b": {"seed": 2}, "c": {"seed": 3}}}}


def test_values_are_yaml_scalars_split_at_commas():
    assert parse_grid_item("train.lr=0.01, 1e-3,0.1") == ("train.lr", [0.01, 0.001, 0.1])
    assert parse_grid_item("a.b=true,null,topk,3") == ("a.b", [True, None, "topk", 3])


def test_a_grid_replaces_any_kind_and_a_cases_dimension_keeps_the_entries_named():
    out = apply_grid(SPACE, ["train.lr=0.01", "algorithm.k=0.01,0.05", "cell=c,a"])
    assert out == {"train.lr": {"grid": [0.01]}, "algorithm.k": {"grid": [0.01, 0.05]},
                   "cell": {"cases": {"c": {"seed": 3}, "a": {"seed": 1}}}}
    assert SPACE["train.lr"] == {"grid": [0.02, 0.05, 0.2]}  # the spec's own space is not changed


@pytest.mark.parametrize("items, words", [
    (["train.lrr=0.1"], "--grid train.lrr: unknown key of the space 'train.lrr'; did you mean 'train.lr'?"),
    (["cell=d"], "--grid cell: unknown case 'd'; allowed: a, b, c"),
    (["cell=A"], "--grid cell: unknown case 'A'; did you mean 'a'?"),
    (["train.lr"], "expected KEY=v1,v2"),
    (["train.lr=0.1,,0.2"], "an empty value between commas"),
    (["train.lr={a: 1}"], "'{a: 1}' is a dict; --grid takes scalars"),
    (["train.lr=0.1,0.1"], "0.1 is given twice"),
    (["train.lr=0.1", "train.lr=0.2"], "the key is given twice"),
])
def test_bad_grid_items_name_the_item_and_what_is_allowed(items, words):
    with pytest.raises(GridError) as err:
        apply_grid(SPACE, items)
    assert words in str(err.value)


def test_the_command_line_shrinks_the_grid_and_validates_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(SPEC), "--grid", "train.lr=0.01,0.1", "--grid", "clients.participation=0.5",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sweep fedavg_lr: 2 trial(s) of 3 round(s)")
    assert "    0  lr=0.01, participation=0.5\n    1  lr=0.1, participation=0.5" in out
    # a value the experiment refuses is refused like the spec's own, before anything starts
    assert main(["sweep", str(SPEC), "--grid", "train.lr=-1", "--dry-run"]) == 2
    assert "space.train.lr.grid = [-1]: value -1 is rejected" in capsys.readouterr().err
    assert main(["sweep", str(SPEC), "--grid", "train.lrr=1", "--dry-run"]) == 2
    assert "did you mean 'train.lr'?" in capsys.readouterr().err
    assert main(["sweep", "--resume", str(tmp_path), "--grid", "train.lr=1"]) == 2
    assert "--grid" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
