"""What the CLI, the reports and the comparisons share: byte sizes as text, what a folder holds."""
from __future__ import annotations

from pathlib import Path


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
