"""Tables as text that fit a terminal (``hetsim sweep``, ``show``, ``whatif``, ``compare``).

:func:`fold_table` prints a DataFrame in blocks of columns, each at most ``width`` characters wide
and each repeating the key columns (the trial, the run) so every row stays named; ``width=None``
prints it whole (the commands' ``--wide``). :func:`wrap` folds prose lines at spaces.
"""
from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pandas is the caller's: this module imports nothing heavy
    import pandas as pd

TERMINAL_WIDTH = 100  # the commands' tables and notes, unless --wide


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def fold_table(df: "pd.DataFrame", width: int | None = TERMINAL_WIDTH, keep: int = 1,
               float_format: Callable[[float], str] | None = None) -> str:
    """``df`` without its index, its columns in blocks that fit ``width`` (blank line between
    blocks, the first ``keep`` columns in each); a single column wider than ``width`` gets a block
    of its own."""
    def text(columns: list) -> str:
        return df[columns].to_string(index=False, float_format=float_format)

    whole = text(list(df.columns))
    if width is None or _widest(whole) <= width or len(df.columns) <= keep + 1:
        return whole
    key, blocks, current = list(df.columns[:keep]), [], []
    for column in df.columns[keep:]:
        if current and _widest(text(key + current + [column])) > width:
            blocks.append(current)
            current = []
        current.append(column)
    blocks.append(current)
    return "\n\n".join(text(key + block) for block in blocks)


def wrap(line: str, width: int | None = TERMINAL_WIDTH, indent: str = "  ") -> str:
    """``line`` folded at spaces to ``width`` (continuation lines indented); words are never cut."""
    if width is None or len(line) <= width:
        return line
    return textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
