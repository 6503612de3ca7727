"""What the CLI, the reports and the comparisons share: byte sizes as text, what a folder holds,
and the ``latest`` shortcut for the newest run folder."""
from __future__ import annotations

import json
import os
from pathlib import Path

from engine.results.text import TERMINAL_WIDTH  # noqa: F401 - the commands' table width (textwrap only behind it)

LATEST = "latest"
DEFAULT_RUNS = "runs"  # output.dir of the default experiment


def human_bytes(n: float) -> str:
    """``1.5 MB``: decimal units, bytes as an integer."""
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def is_sweep_folder(path: str | Path) -> bool:
    """A sweep's folder (it holds the sweep spec), not a run's."""
    from sweeps.results import SWEEP_FILE  # pandas and pyarrow: hetsim.cli imports this module

    return (Path(path) / SWEEP_FILE).is_file()


class NoRunFolderError(FileNotFoundError):
    """``latest`` asked for in a folder that holds no run."""


def resolve_latest(text: str) -> str:
    """``latest`` -> the newest run folder under ``./runs``; ``DIR/latest`` -> the newest under
    ``DIR`` (newest by its manifest's start time); anything else is returned as it is."""
    name = os.path.basename(text.rstrip("/"))
    if name != LATEST or "://" in text or os.path.exists(text):
        return text
    parent = Path(os.path.dirname(text.rstrip("/")) or DEFAULT_RUNS)

    def started(folder: Path) -> tuple[str, float]:
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, ValueError):
            manifest = {}
        when = manifest.get("started") if isinstance(manifest, dict) else None
        return (str(when or ""), folder.stat().st_mtime)

    runs = [p for p in parent.iterdir() if (p / "manifest.json").is_file()] if parent.is_dir() else []
    if not runs:
        raise NoRunFolderError(f"{text}: no run folder in {parent}/ (`latest` means the newest run folder "
                               f"there; give {parent}/<name> or DIR/latest)")
    return str(max(runs, key=started))
