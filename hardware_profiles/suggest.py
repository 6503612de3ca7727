""""Did you mean" for unknown names: config keys, tiers, presets, datasets, models, methods.

In the lowest layer (``hardware_profiles``) so that every layer above, and the tier catalog
itself, words an unknown name the same way: ``unknown <what> 'x'; did you mean 'y'? allowed: ...``.
"""
from __future__ import annotations

import difflib
from typing import Iterable


def did_you_mean(name: object, allowed: Iterable[object]) -> str | None:
    """The allowed name closest to ``name`` (None if none is close); case is ignored first."""
    options = [str(a) for a in allowed]
    text = str(name)
    for option in options:  # '5Mbps' for '5mbps': a case slip is the likeliest mistake
        if option.lower() == text.lower():
            return option
    lowered = {o.lower(): o for o in options}
    close = difflib.get_close_matches(text.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def suggestion(name: object, allowed: Iterable[object]) -> str:
    """``"did you mean 'y'? "`` or ``""``: to put before the list of allowed names."""
    best = did_you_mean(name, allowed)
    return f"did you mean {best!r}? " if best is not None else ""


def unknown(what: str, name: object, allowed: Iterable[object], label: str = "allowed") -> str:
    """``unknown <what> <name>; did you mean <closest>? <label>: a, b, c`` (allowed sorted)."""
    options = sorted(str(a) for a in allowed)
    return f"unknown {what} {name!r}; {suggestion(name, options)}{label}: {', '.join(options)}"


def unknown_key(key: object, allowed: Iterable[object]) -> str:
    """``unknown key; did you mean 'lr'? allowed keys: ...`` (allowed in schema order)."""
    options = [str(a) for a in allowed]
    if not options:
        return "unknown key"
    return f"unknown key; {suggestion(key, options)}allowed keys: {', '.join(options)}"


def given_twice(names: Iterable[object], where: str, what: str = "named",
                advice: str = "give each its own name") -> str | None:
    """``fleets[0] and fleets[2] are both named 'a'; give each its own name``, for the first name
    given twice in ``names`` (None if each is given once): a list of named things keeps both, or
    says so; it never keeps one silently."""
    first: dict[object, int] = {}
    for i, name in enumerate(names):
        try:
            if name in first:
                both = f"{what} {name!r}" if what else repr(name)
                return f"{where}[{first[name]}] and {where}[{i}] are both {both}; {advice}"
            first[name] = i
        except TypeError:  # an unhashable name: its own validation refuses it
            continue
    return None
