"""Start-up trace: where the seconds before and after the rounds go.

With ``HETSIM_TRACE=FILE`` in the environment, every hetsim process (the CLI, the driver actor,
the client actors: Ray workers inherit the environment of a local Ray) appends one line per
:func:`mark` to FILE: ``<unix time> <pid> <event>``. ``bench/bench_startup.py`` turns the
lines into a breakdown. Without the variable :func:`mark` does nothing. No imports beyond os
and time: this module is imported before anything heavy.
"""
from __future__ import annotations

import os
import time

_PATH = os.environ.get("HETSIM_TRACE")


def mark(event: str) -> None:
    if _PATH:
        with open(_PATH, "a") as f:  # one short write per line: lines of processes do not mix
            f.write(f"{time.time():.4f} {os.getpid()} {event}\n")
