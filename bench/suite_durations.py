"""Seconds per test file, from a pytest junit report; writes ``tests/file_seconds.json``.

``make test`` hands whole files to its processes longest first (tests/conftest.py reads the
file); refresh it after a suite run that wrote a report::

    make test ARGS=--junitxml=/tmp/suite.xml
    .venv/bin/python bench/suite_durations.py /tmp/suite.xml --write

``--compare OLD.xml`` prints both runs' seconds per file side by side (before/after a change).
"""
from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "file_seconds.json"


def file_seconds(report: Path) -> dict[str, float]:
    """File name -> the summed time of its test cases (setup, call and teardown)."""
    out: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = _file_name(case.get("classname", ""))
        out[name] = out.get(name, 0.0) + float(case.get("time", 0.0))
    return out


def _file_name(classname: str) -> str:
    # "tests.engine.test_x.TestClass" -> "test_x.py": the last part that names a test module
    parts = classname.split(".")
    module = next((p for p in reversed(parts) if p.startswith("test_")), parts[-1])
    return f"{module}.py"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="a pytest --junitxml report")
    ap.add_argument("--compare", type=Path, metavar="OLD.xml", help="an earlier report, shown beside it")
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(REPO)}")
    ap.add_argument("--top", type=int, default=25, help="files shown (default 25)")
    args = ap.parse_args(argv)
    for path in filter(None, (args.report, args.compare)):
        if not path.is_file():
            print(f"suite_durations: no report at {path}", file=sys.stderr)
            return 2
    new = file_seconds(args.report)
    old = file_seconds(args.compare) if args.compare else {}
    print(f"{'file':<40} {'before s':>9} {'after s':>9}" if old else f"{'file':<40} {'s':>9}")
    for name in sorted(new, key=new.get, reverse=True)[: args.top]:
        before = f"{old[name]:9.1f} " if name in old else (" " * 10 if old else "")
        print(f"{name:<40} {before}{new[name]:9.1f}")
    total_old = f"{sum(old.values()):9.1f} " if old else ""
    print(f"{'all files':<40} {total_old}{sum(new.values()):9.1f}")
    if args.write:
        OUT.write_text(json.dumps({k: round(v, 1) for k, v in sorted(new.items())}, indent=0) + "\n",
                       encoding="utf-8")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
