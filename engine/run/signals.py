"""Ctrl+C and SIGTERM during a run: the first stops it after the round in flight (so it is
checkpointed and resumable), a second one aborts at once."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

from engine.loop.callbacks import RunCallback, Stop
from engine.run.folders import release_thread_folders


class InterruptRequest(RunCallback):
    """Set by the first SIGINT/SIGTERM: the loop stops after the round in flight (its state is
    then complete, so the run is checkpointed); a second signal aborts at once."""

    def __init__(self):
        self.signal_name: str | None = None
        self.stopped = False

    def on_round_end(self, run, record):
        if self.signal_name is not None and record.round < run.cfg.rounds - 1:  # else: it is done
            self.stopped = True
            return Stop(f"interrupted ({self.signal_name}) after round {record.round}", "interrupted")
        return None


@contextlib.contextmanager
def interrupt_signals(request: InterruptRequest | None):
    """The caller's scope of one run: route SIGINT/SIGTERM to ``request`` (None: SIGTERM raises
    KeyboardInterrupt, as Ctrl+C does), only in the main thread and only where the default
    handlers are installed; on the way out, the run folder locks this thread took to claim or
    resume the run are released (:func:`engine.run.folders.release_thread_folders`)."""
    try:
        if threading.current_thread() is not threading.main_thread():
            yield
        else:
            with _routed(request):
                yield
    finally:
        release_thread_folders()


@contextlib.contextmanager
def _routed(request: InterruptRequest | None):

    def handler(signum, frame):
        if request is None or request.signal_name is not None:
            raise KeyboardInterrupt
        request.signal_name = signal.Signals(signum).name
        print(f"\nhetsim: {request.signal_name}: stopping after the round in flight "
              "(again to abort at once)", file=sys.stderr)

    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    if request is None:
        defaults.pop(signal.SIGINT)  # Ctrl+C already raises KeyboardInterrupt
    previous = {}
    for sig, default in defaults.items():
        if signal.getsignal(sig) is default:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
