"""The ``report``, ``compare`` and ``whatif`` subcommands of ``hetsim`` (docs/reports.md).

Only argparse here at import time: matplotlib, pandas, Ray and torch are imported inside the
command functions, so ``hetsim --help`` stays fast.
"""
from __future__ import annotations

import sys
from pathlib import Path

from hetsim.common import TERMINAL_WIDTH, resolve_latest

EPILOG_LINES = """  hetsim report runs/fedavg-mnist5k-20261129-150000   # HTML report of a run (or a sweep folder)
  hetsim compare runs/a runs/b --target 0.8     # side by side; -o compare.html: the compare page
  hetsim whatif -c exp.yaml --fleet fast=fast.yaml --fleet slow=slow.yaml   # one run per fleet
"""


def add_commands(sub) -> None:
    p = sub.add_parser(
        "report",
        help="HTML report (figures embedded) of a run folder or a sweep folder",
        description="Write one self-contained HTML page with the figures of a run or a sweep, "
        "and the figures as PNG files beside it (docs/reports.md).",
    )
    p.add_argument("path", help="run folder or sweep folder (`latest`: the newest run under ./runs)")
    p.add_argument("-o", "--out", metavar="FILE",
                   help="HTML file to write (default: PATH/report.html); figures go to FILE_figures/")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "compare",
        help="compare runs side by side (table in the terminal, HTML with -o)",
        description="Final/best accuracy, simulated time to a target accuracy, bytes and simulated "
        "time of each run; a sweep folder stands for all its trials.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="run folders and/or sweep folders")
    p.add_argument("--target", type=float, metavar="ACC",
                   help="accuracy for the time-to-target column (default: the highest value of "
                   "--metric that every run reaches, floored to 0.01)")
    p.add_argument("--metric", default="global_acc",
                   help="rounds.parquet column for the target and the curves (default: global_acc)")
    p.add_argument("-o", "--out", metavar="FILE", help="also write an HTML page with the curves")
    p.add_argument("--wide", action="store_true", help="print the table whole (default: folded to 100 characters)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "whatif",
        help="run one experiment once per fleet (only clients.profiles changes) and compare",
        description="Run the same experiment (same seed, data, selection and training draws) once "
        "per fleet, in parallel as a Ray Tune sweep; writes one sweep folder with a `fleet` column "
        "and a compare report (docs/reports.md).",
    )
    p.add_argument("spec", nargs="?", help="what-if YAML (base, overrides, fleets, ...); optional")
    p.add_argument("-c", "--config", help="experiment YAML (default: the spec's base, or the built-in default)")
    p.add_argument("--fleet", dest="fleets", action="append", default=[], metavar="NAME=FLEET.yaml",
                   help="a fleet: its name and a YAML file with the clients.profiles mapping (repeatable)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the experiment for every fleet (repeatable)")
    p.add_argument("-o", "--storage", metavar="DIR", help="results folder (default: whatif_out/<name>)")
    p.add_argument("--target", type=float, metavar="ACC", help="accuracy for time-to-target (as in compare)")
    p.add_argument("--timing-only", action="store_true",
                   help="time the fleets without training (clock.mode: timing_only): seconds for millions of "
                   "clients; the compare page then follows num_arrived (docs/timing.md)")
    p.add_argument("--address", help="existing Ray cluster to run on")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--dry-run", action="store_true",
                   help="validate the what-if (its fleets and their files) and list the trials; start nothing")
    p.add_argument("--wide", action="store_true", help="print the table whole (default: folded to 100 characters)")
    p.set_defaults(func=cmd_whatif)


def cmd_report(args) -> int:
    from hetsim.report import build_report  # pandas and pyarrow: hetsim.cli imports this module

    out = build_report(resolve_latest(args.path), args.out)
    print(f"report: {out}")
    return 0


def cmd_compare(args) -> int:
    # pandas and pyarrow: hetsim.cli imports this module, --help must not load them
    from hetsim.compare import check_target, compare_page, compare_table, load_entries, text_table

    check_target(args.metric, args.target)  # before the runs are loaded
    entries = load_entries([resolve_latest(p) for p in args.paths])
    if not entries:
        print("hetsim compare: no run with finished rounds in the given folders", file=sys.stderr)
        return 2
    table, target = compare_table(entries, args.metric, args.target)
    print(text_table(table, args.metric, target, None if args.wide else TERMINAL_WIDTH))
    if args.out:
        page, _, _ = compare_page(entries, args.metric, target)
        print(f"\ncompare page: {page.write(args.out)}")
    return 0


def cmd_whatif(args) -> int:
    from hetsim.whatif import run_whatif_command  # pandas and pyarrow: not for --help

    return run_whatif_command(args)



def sweep_summary(path: str, wide: bool = False) -> str | None:
    """What ``hetsim show`` prints for a sweep or what-if folder: its trials by status, the best
    ones, and for a what-if whether the fleets differ; None for any other folder (a run's)."""
    if "://" in str(path):
        from engine.results import open_storage  # pyarrow's filesystems: only for a URI

        store = open_storage(path)
        if store.exists("manifest.json") or not store.exists("sweep.yaml"):  # a run's first: the usual case
            return None
    elif not (Path(path) / "sweep.yaml").is_file():  # (sweeps.results.SWEEP_FILE: not imported for a run)
        return None
    from hetsim.whatif import difference_lines  # pandas, scipy: a sweep folder only
    from sweeps.results import load_sweep, summary_table
    from sweeps.whatif import FLEET_COLUMN

    sweep = load_sweep(path)
    fleets = FLEET_COLUMN in sweep.param_columns.values()
    kind = "what-if" if fleets else "sweep"
    lines = [f"{sweep.path}: {kind} {sweep.spec.get('name') or ''}".rstrip(),
             summary_table(sweep, width=None if wide else TERMINAL_WIDTH)]
    if fleets:
        lines += difference_lines(sweep)
    if not sweep.complete:
        lines.append(f"unfinished: continue with `hetsim sweep --resume {sweep.path}`")
    lines.append(f"\n`hetsim report {sweep.path}` draws it; sweeps.load_sweep loads it into pandas")
    return "\n".join(lines)
