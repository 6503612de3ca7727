"""The one base class of errors a user can cause and fix.

The command line (:mod:`hetsim.cli`) prints the message of a :class:`UserError` (and of a few
built-in ones: a missing file, a folder that exists) and exits with status 2, without a
traceback; anything else is a bug and exits 1 with the traceback written to a log file.
Every message names the field (or file and line), the value and what is allowed.

Not here: the errors themselves live next to the code that raises them (``ConfigError`` in
:mod:`engine.errors`, ``RayConnectError`` in :mod:`engine.ray.cluster`, ...).
"""
from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input or environment; its message says how to fix it."""


class ConfigError(UserError, ValueError):
    """An invalid experiment configuration; the message lists every problem found."""
