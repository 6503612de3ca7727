"""MkDocs hook: the docstrings' Sphinx roles (``:func:`x```, ``:class:`x```) shown as plain code.

The code's docstrings name other objects the Sphinx way; mkdocstrings renders the role's name as
text before the code (":func: x"). This drops the role's name and keeps the code.
"""
from __future__ import annotations

import re

ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|exc|obj|py:\w+):(?=<code>)")


def on_page_content(html, page, config, files):
    return ROLE.sub("", html)
