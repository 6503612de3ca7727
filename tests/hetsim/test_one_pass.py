"""Validation collects every mistake of a file in one pass, each with its "did you mean"."""
import pytest

from hetsim.cli import main

FIVE = """\
rounds: 5
trian: {lr: 0.01}                # an unknown key (typo of train)
dataset: {name: mnist5}          # a dataset (mnist5k)
algorithm: {name: fedavgg}       # a method (fedavg)
clients:
  profiles:
    network: {5Mbps: 1.0}        # a tier (5mbps)
    conditions:
      sets:
        fading: {down: %s}
"""
EXPECTED = {
    "trian = ": "unknown key; did you mean 'train'?",
    "dataset.name = 'mnist5'": "did you mean 'mnist5k'?",
    "algorithm.name = ": "unknown algorithm 'fedavgg'; did you mean 'fedavg'?",
    "clients.profiles.network = ": "unknown network tier '5Mbps'; did you mean '5mbps'?",
}


@pytest.mark.parametrize("fifth, field, words", [
    ("gilbert_eliot", "clients.profiles.conditions.sets.fading.down", "did you mean 'gilbert_elliott'?"),
    ("{kind: markov, states: {good: 1.0}, transition: [[1.0]], slot_s: 2s}",
     "clients.profiles.conditions.sets.fading.down.slot_s",
     "a number with a unit ('s'); the unit is seconds already: give 2"),
], ids=["preset", "unit"])
def test_five_different_mistakes_are_five_lines_of_one_message(fifth, field, words, tmp_path, capsys):
    path = tmp_path / "five.yaml"
    path.write_text(FIVE % fifth)
    assert main(["validate", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetsim: invalid experiment config:\n")
    lines = err.strip().splitlines()[1:]
    assert len(lines) == 5, err
    for start, text in {**EXPECTED, f"{field} = ": words}.items():
        assert sum(line.strip().startswith(start) and text in line for line in lines) == 1, (start, err)
