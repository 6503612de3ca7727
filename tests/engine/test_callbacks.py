"""Round-loop callbacks: hooks in order, metrics that reach Parquet, stop requests, end status."""
import pytest

from engine.config.schema import load_config
from engine.errors import ConfigError
from engine.loop.callbacks import CallbackList, RunCallback, Stop
from engine.results.tables import load_run
from engine.run.api import run_experiment

TINY = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=6", "rounds=4"]


class Recorder(RunCallback):
    def __init__(self):
        self.events = []

    def on_run_begin(self, run):
        self.events.append(("begin", run.first_round, run.simulation is not None))

    def on_round_end(self, run, record):
        self.events.append(("round", record.round))

    def on_run_end(self, run, status):
        self.events.append(("end", status))


class AddsMetrics(RunCallback):
    adds_metrics = True

    def on_round_end(self, run, record):
        record.add_metrics({"double_round": 2 * record.round})


class StopAt(RunCallback):
    def __init__(self, round, status="stopped"):
        self.round, self.status = round, status

    def on_round_end(self, run, record):
        if record.round == self.round:
            return Stop(f"enough after round {record.round}", self.status)


def test_hooks_run_in_order_and_added_metrics_are_written(tmp_path):
    rec = Recorder()
    run = load_run(run_experiment(load_config(None, TINY), tmp_path / "r", callbacks=[rec, AddsMetrics()]))
    assert rec.events == [("begin", 0, True), ("round", 0), ("round", 1), ("round", 2), ("round", 3),
                          ("end", "finished")]
    assert list(run.rounds["double_round"]) == [0, 2, 4, 6]
    assert run.manifest["status"] == "finished"


def test_a_stop_request_ends_the_run_after_that_round_with_its_status(tmp_path):
    rec = Recorder()
    run = load_run(run_experiment(load_config(None, TINY), tmp_path / "s",
                                  callbacks=[StopAt(1, "diverged"), rec]))
    assert list(run.rounds["round"]) == [0, 1]
    assert rec.events[-1] == ("end", "diverged")
    # the recorder ran before the observer: the stopped round is on disk
    assert run.manifest["status"] == "diverged"
    assert run.manifest["error"] == "enough after round 1"


def test_plain_functions_are_callbacks_and_true_means_stop(tmp_path):
    seen = []
    run = load_run(run_experiment(load_config(None, TINY), tmp_path / "f",
                                  callbacks=[lambda r: seen.append(r.round) or r.round == 2]))
    assert seen == [0, 1, 2]
    assert run.manifest["status"] == "stopped"


def test_run_end_sees_failed_and_every_callback_still_ends(tmp_path):
    ended = []

    class Boom(RunCallback):
        def on_round_end(self, run, record):
            raise RuntimeError("boom")

    class Ends(RunCallback):
        def on_run_end(self, run, status):
            ended.append(status)

    with pytest.raises(RuntimeError, match="boom"):
        run_experiment(load_config(None, TINY), tmp_path / "b", callbacks=[Boom(), Ends()])
    assert ended == ["failed"]
    assert load_run(tmp_path / "b").manifest["status"] == "failed"


def test_callback_list_rejects_non_callables():
    with pytest.raises(ConfigError, match=r"callbacks\[0\] = 42: neither a RunCallback nor callable"):
        CallbackList([42])
