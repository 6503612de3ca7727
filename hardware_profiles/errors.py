"""The base of every error a user can cause and fix, and the user's own part of a traceback.

In the lowest layer so that every layer raises the same base (a plugin's registration in
``algorithms``, a config in ``engine``); :mod:`engine.errors` re-exports :class:`UserError`, and
the command line prints such an error's message and exits with status 2, without a traceback.

:func:`user_frames` keeps the frames of a traceback that are the user's code (a plugin's file), not
hetsim's, the standard library's or an installed package's: what a user needs to fix their plugin.
"""
from __future__ import annotations

import os
import sysconfig
import traceback
from functools import cache


class UserError(Exception):
    """A mistake in the user's input or environment; its message says how to fix it."""


class PluginError(UserError, ValueError):
    """A plugin (a user's method, model, dataset, compressor, selection policy or metric) that cannot
    be registered, imported or used; the message names the plugin's file or hook."""


@cache
def _not_the_users() -> tuple[str, ...]:
    """Folders whose files are never a user's: hetsim's packages, the standard library, installed packages."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder of hetsim's packages
    ours = [os.path.join(here, p) for p in ("hardware_profiles", "algorithms", "engine", "sweeps", "hetsim")]
    paths = sysconfig.get_paths()  # hetsim's 5 folders, then the standard library's 2, then installed packages'
    lib = [paths.get(k) or "/nonexistent" for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    return tuple(os.path.join(os.path.realpath(p), "") for p in [*ours, *lib])


def is_users_file(filename: str, installed: bool = False) -> bool:
    """Whether ``filename`` (of a traceback frame) is user code rather than hetsim's or Python's;
    an installed package's file counts only with ``installed`` (a plugin package's own frames)."""
    if not filename or filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    real = os.path.realpath(filename)
    ours = _not_the_users()
    if installed:
        return not real.startswith(ours[:5]) and not real.startswith(ours[5:7])  # not hetsim's, not the stdlib
    return not real.startswith(ours) and "site-packages" not in real.split(os.sep)


def user_frames(err: BaseException, limit: int = 8, installed: bool = False) -> str:
    """The user's frames of ``err``'s traceback (file, line, function, code), innermost last;
    a syntax error's file and line; "" when no frame is the user's (``installed``: see
    :func:`is_users_file`)."""
    lines = []
    if isinstance(err, SyntaxError) and err.filename and is_users_file(err.filename, installed):
        lines.append(f'  File "{err.filename}", line {err.lineno}\n    {(err.text or "").strip()}')
    frames = [f for f in traceback.extract_tb(err.__traceback__) if is_users_file(f.filename, installed)]
    for f in frames[-limit:]:
        code = f"\n    {f.line.strip()}" if f.line else ""
        lines.append(f'  File "{f.filename}", line {f.lineno}, in {f.name}{code}')
    return "\n".join(lines)
