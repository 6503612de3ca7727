"""Comments and docstrings say why, not when: no issue numbers, dates, commit hashes or paths outside
the repository in the code. History lives in CHANGELOG.md and measurements in docs/studies/.

Only comments and docstrings are read (a test's data may hold a date); string literals that are
not docstrings are left alone.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from helpers import REPO

FOLDERS = ("engine", "algorithms", "hardware_profiles", "sweeps", "hetsim", "bench", "studies", "tests")
# an upstream bug (owner/repo#N) is a reason and may stay; the project's own issue numbers may not
FORBIDDEN = {
    "an issue number": re.compile(r"\bissues?\s*#?\d+|(?<![\w/-])#\d{2,}\b|\bissue-\d+", re.IGNORECASE),
    "a date": re.compile(r"\b20\d{2}-\d{2}-\d{2}\b"),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "a path outside the repository": re.compile(r"/work/|shared/specs|\bspecs/\w+\.md"),
}


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    source = path.read_text()
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    return out


def findings(paths) -> list[str]:
    found = []
    for path in paths:
        for line, text in prose(path):
            for what, pattern in FORBIDDEN.items():
                m = pattern.search(text)
                if m:
                    found.append(f"{path.relative_to(REPO)}:{line}: {what} ({m.group(0)!r})")
    return found


def test_comments_and_docstrings_say_why_not_when():
    paths = sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py") if p != Path(__file__))
    assert len(paths) > 200  # the check reads the whole code base
    found = findings(paths)
    assert not found, "history belongs in CHANGELOG.md, measurements in docs/studies/:\n" + "\n".join(found)


@pytest.mark.parametrize("text", ["# slower since issue 34", '"""Fixed in #39."""', "# measured 2026-12-04",
                                  "# faster than df2cd35", '"""Spec: /work/shared/specs/ascend.md"""'])
def test_the_check_finds_each_kind(tmp_path, monkeypatch, text):
    monkeypatch.setattr("test_code_comments.REPO", tmp_path)
    path = tmp_path / "m.py"
    path.write_text(f"{text}\nx = '2026-12-04'  # a date in data is fine\n")
    assert len(findings([path])) == 1
