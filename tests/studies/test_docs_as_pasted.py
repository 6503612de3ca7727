"""The README's and docs' shell and Python blocks, run as pasted, from a folder outside the
repository.

Every fenced ``bash``/``sh``/``shell`` and ``python`` block of README.md and docs/**/*.md runs, in file
order, in one fresh folder per file (so a block may use what an earlier one wrote, as a reader
pasting them would), unless the line right before its fence is the marker

    <!-- docs-test: skip REASON -->

with a reason (a placeholder such as ``runs/<run-folder>``, a Ray cluster, a GPU, minutes of
running). The folder is outside the repository; ``hetsim``, ``python``, ``.venv/bin/hetsim``,
``.venv/bin/python`` and ``.venv/bin/activate`` there are this interpreter, and the shipped
examples the docs name by repository path (``studies/``, ``configs/``, ``sweeps/``, ``examples/``) are linked in,
as a user names them in their own checkout. A shell block runs under ``bash -e`` (every command
must succeed); a Python block as a script.

The README is read as a newcomer reads it: ``hetsim`` is not on PATH until a block has run
``source .venv/bin/activate`` (its first steps call ``.venv/bin/hetsim``). The pages under docs/
assume the environment is active, as their tutorial says.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO

README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").rglob("*.md"))]
ACTIVATE = "source .venv/bin/activate"
FENCE = re.compile(r"^```(bash|sh|shell|python|py)\s*$")
MARKER = re.compile(r"^<!--\s*docs-test:\s*skip\b\s*(.*?)\s*-->\s*$")
LINKED = ("studies", "configs", "sweeps", "examples")


@dataclass
class Block:
    file: Path
    line: int
    lang: str
    text: str
    skip: str | None  # the reason given by the marker, None: runs


def blocks(path: Path) -> list[Block]:
    lines, out, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            marker = MARKER.match(lines[i - 1]) if i else None
            out.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                             marker.group(1) if marker else None))
            i = end
        i += 1
    return out


def _user_folder(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """A folder outside the repository set up as a reader's, with the examples linked; the
    environments before and after ``source .venv/bin/activate`` (hetsim's commands on PATH)."""
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, line in (("hetsim", f'exec "{sys.executable}" -m hetsim "$@"'),
                       ("python", f'exec "{sys.executable}" "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    for name in LINKED:
        (root / name).symlink_to(REPO / name, target_is_directory=True)
    # no other hetsim on PATH either: a block that calls `hetsim` before activating fails here as for a newcomer
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "hetsim").exists()]
    before = {**os.environ, "PATH": os.pathsep.join(path), "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    return before, {**before, "PATH": os.pathsep.join([str(bin_dir), *path])}


def _run(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    if block.lang.startswith("py"):
        argv = [sys.executable, "-c", block.text]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


RUN = [p for p in DOCS if any(b.skip is None for b in blocks(p))]


def test_every_page_of_the_docs_is_read_and_the_readme_starts_without_activating():
    assert {"tutorial", "reference", "studies"} <= {p.parent.name for p in DOCS}
    runs = [b for b in blocks(README) if b.skip is None and b.lang.startswith(("bash", "sh"))]
    first = next(i for i, b in enumerate(runs) if "hetsim" in b.text)
    assert ACTIVATE not in "\n".join(b.text for b in runs[:first + 1])  # the first steps come before it


def test_every_skipped_block_says_why_and_the_quick_start_is_not_skipped():
    everything = [b for p in DOCS for b in blocks(p)]
    assert all(b.skip for b in everything if b.skip is not None), "a skip marker without a reason"
    run = "\n".join(b.text for b in everything if b.skip is None)
    for command in ("hetsim init", "hetsim validate -c experiment.yaml", "hetsim run -c experiment.yaml",
                    "hetsim report latest", "engine.simulate(", "hetsim validate -c studies/",
                    "hetsim validate -c configs/", "hetsim whatif studies/", "--grid"):
        assert command in run, f"no block that runs `{command}`"


@pytest.mark.slow  # a short run, its report, and the shipped configs' validation: minutes on 2 cores
@pytest.mark.parametrize("path", RUN, ids=lambda p: p.name)
def test_the_blocks_of_a_page_run_as_pasted_from_a_folder_outside_the_repository(path, tmp_path):
    cwd = tmp_path / "me"
    cwd.mkdir()
    before, activated = _user_folder(cwd)
    active = path != README
    for block in blocks(path):
        if block.skip is not None:
            continue
        done = _run(block, cwd, activated if active else before)
        active = active or ACTIVATE in block.text
        where = f"{path.relative_to(REPO)}:{block.line}"
        assert done.returncode == 0, f"{where} failed:\n{block.text}\n--- stderr:\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"{where}: {done.stderr[-3000:]}"
