"""Round-loop callbacks: the one seam for everything that is not the round itself.

The round loop (:class:`engine.loop.simulation.Simulation`) only selects, runs, times, aggregates and
evaluates. Writing Parquet, the progress bar, Tune reporting and checkpoints are callbacks with
three hooks, modelled on pfl-research's ``TrainingProcessCallback``:

* ``on_run_begin(run)``: once, before the first round this process runs (``run.first_round``
  is 0, or the round a resumed run continues from);
* ``on_round_end(run, record)``: after every round, in list order. A callback whose class
  sets ``adds_metrics = True`` may add columns to the round's row with
  ``record.add_metrics``; :func:`engine.run.body.execute_run` runs such callbacks *before* the
  Parquet recorder (so the columns are written) and every other callback *after* it (so what
  it observes, reports to Tune or checkpoints is already on disk). Any callback may ask the
  loop to stop after this round by returning ``True`` or a :class:`Stop`;
* ``on_run_end(run, status)``: once, with the run's final status (``finished``, ``stopped``,
  ``interrupted``, ``failed``, ...), also when the loop raised.

A plain function ``f(record)`` is accepted wherever a callback is and is called as
``on_round_end``. Under the Ray executor the loop runs in a driver actor; callbacks passed by
the caller run in the caller's process on relayed records, with ``run.simulation`` = ``None``
(the round is already written there, so metrics they add are not recorded; a stop request is
forwarded to the driver actor and takes effect after the round in flight).

Not here: the Parquet writer itself (:mod:`engine.results.tables`) and checkpoint files
(:mod:`engine.checkpoint`); this module only defines the hooks and the dispatch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Union

from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.config.schema import ExperimentConfig


@dataclass(frozen=True)
class Stop:
    """Returned by ``on_round_end`` to end the run after this round.

    ``status`` becomes the run's status in ``manifest.json`` (``stopped`` for a plain request,
    ``diverged`` for the divergence policy, ...); ``message`` is recorded as its reason.
    """

    message: str
    status: str = "stopped"


@dataclass
class RoundRecord:
    """One finished round, as handed to callbacks (here, not with the loop: the caller of a Ray
    run unpickles relayed records without importing torch)."""

    round: int
    row: dict[str, Any]  # the rounds.parquet row
    client_rows: list[dict[str, Any]] | Any  # the clients.parquet rows (clock.mode: timing_only: an Arrow table)
    extra_tables: dict[str, Any] = field(default_factory=dict)  # method traces by table name
    diverged: str | None = None  # why the run must stop under train.on_nonfinite: stop

    def add_metrics(self, metrics: dict[str, Any]) -> None:
        """Add columns to this round's rounds.parquet row (from a callback)."""
        self.row.update(metrics)


@dataclass
class RunContext:
    """What a callback knows about the run it is attached to."""

    cfg: "ExperimentConfig"
    path: Path | None  # the run folder (None for a bare Simulation without one)
    first_round: int = 0  # 0, or the round a resumed run continues from
    # the engine.loop.simulation.Simulation running the loop (not imported here: it imports this
    # module); None where the callback runs outside the loop's process
    simulation: Any = None
    info: dict[str, Any] = field(default_factory=dict)  # free-form, e.g. the manifest being written


class RunCallback:
    """Base class: override the hooks you need; the defaults do nothing."""

    adds_metrics = False  # True: runs before the Parquet recorder (see the module docstring)

    def on_run_begin(self, run: RunContext) -> None:
        pass

    def on_round_end(self, run: RunContext, record: RoundRecord) -> Union[bool, Stop, None]:
        return None

    def on_run_end(self, run: RunContext, status: str) -> None:
        pass


class FunctionCallback(RunCallback):
    """Adapts a plain ``f(record)`` to the interface (it is called after every round)."""

    def __init__(self, fn: Callable[[RoundRecord], Any]):
        self.fn = fn

    def on_round_end(self, run, record):
        out = self.fn(record)
        return out if isinstance(out, Stop) or out is True else None


CallbackLike = Union[RunCallback, Callable[[RoundRecord], Any]]


def around_recorder(items: Iterable[CallbackLike] | None, recorder: RunCallback) -> list[RunCallback]:
    """Callbacks that add metrics, then ``recorder``, then the rest (each group in order)."""
    cbs = as_callbacks(items)
    return [*(c for c in cbs if c.adds_metrics), recorder, *(c for c in cbs if not c.adds_metrics)]


def as_callbacks(items: Iterable[CallbackLike] | None) -> list[RunCallback]:
    """``callbacks=`` of the API as callback objects; anything else is a ``ConfigError`` (the
    API checks them so before a run folder is made)."""
    if items is None:
        return []
    if isinstance(items, (RunCallback, str, bytes, dict)) or callable(items) or not hasattr(items, "__iter__"):
        raise ConfigError(f"callbacks = {items!r}: give a list of callbacks (RunCallback objects or functions "
                          "f(record)), e.g. callbacks=[my_callback]")
    out = []
    for i, cb in enumerate(items):
        if isinstance(cb, RunCallback):
            out.append(cb)
        elif isinstance(cb, type) and issubclass(cb, RunCallback):
            raise ConfigError(f"callbacks[{i}] = {cb.__name__}: a RunCallback class; give an instance, "
                              f"{cb.__name__}(...)")
        elif callable(cb):
            out.append(FunctionCallback(cb))
        else:
            raise ConfigError(f"callbacks[{i}] = {cb!r}: neither a RunCallback nor callable; give a RunCallback "
                              "object or a function f(record)")
    return out


class CallbackList:
    """Calls every callback's hook in order; collects stop requests."""

    def __init__(self, callbacks: Iterable[CallbackLike] | None = None):
        self.callbacks = as_callbacks(callbacks)

    def run_begin(self, run: RunContext) -> None:
        for cb in self.callbacks:
            cb.on_run_begin(run)

    def round_end(self, run: RunContext, record: RoundRecord) -> Stop | None:
        """Every callback sees the round, even after one asked to stop; the first request wins."""
        stop: Stop | None = None
        for cb in self.callbacks:
            out = cb.on_round_end(run, record)
            if stop is None and out is not None and out is not False:
                stop = out if isinstance(out, Stop) else Stop(
                    f"stopped by {type(cb).__name__} after round {record.round}")
        return stop

    def run_end(self, run: RunContext, status: str) -> None:
        """Every callback's ``on_run_end`` runs even if one raises; the first error is re-raised."""
        first: BaseException | None = None
        for cb in self.callbacks:
            try:
                cb.on_run_end(run, status)
            except BaseException as err:  # noqa: BLE001 - re-raised below
                first = first or err
        if first is not None:
            raise first
