"""``hetsim whatif``: one experiment once per fleet (sweeps.whatif), then the compare report.

    hetsim whatif -c exp.yaml --fleet fast=fast.yaml --fleet slow=slow.yaml [--set KEY=VALUE ...]
    hetsim whatif whatif.yaml          # base, overrides, fleets, target, storage in one file
    hetsim whatif whatif.yaml --dry-run   # validate it (fleets, trace files) and list the trials
    hetsim whatif whatif.yaml --timing-only   # the fleets on the clock, nothing trained (docs/timing.md)

Writes the sweep folder (``trials.parquet`` / ``rounds.parquet`` with a ``fleet`` column, one run
folder per fleet, named by a link ``fleets/<fleet>``) and ``compare.html`` in it; prints the compare
table and whether accuracy and arrivals are the same in every fleet.
"""
from __future__ import annotations

import sys
from pathlib import Path

from engine.config.schema import overrides_given_twice
from hetsim.common import TERMINAL_WIDTH
from hetsim.compare import check_target, compare_page, load_entries, text_table
from sweeps import whatif

COMPARE_FILE = "compare.html"


def run_whatif_command(args) -> int:
    spec, fleets, spec_dir = None, {}, None
    if args.spec:
        spec, fleets, spec_dir = whatif.load_whatif_file(args.spec)
    given = {name: f"fleets.{name} of {args.spec}" for name in fleets}
    for item in args.fleets:
        name, profiles = whatif.parse_fleet_arg(item)
        if name in fleets:  # both named: the second would silently replace the first
            raise whatif.SweepSpecError(f"invalid what-if:\n  --fleet {item}: fleet {name!r} is given twice "
                                        f"({given[name]} and --fleet {item}); give each fleet its own name")
        fleets[name], given[name] = profiles, f"--fleet {item}"
    base = whatif.base_experiment(args.config, None) if args.config else \
        whatif.base_experiment(spec.base if spec else None, spec_dir)
    name = (spec.name if spec else None) or (Path(args.config).stem + "-whatif" if args.config else "whatif")
    if spec and spec.overrides:  # the what-if file's own: a path in them is relative to that file
        base = whatif.with_overrides(base, spec.overrides, spec_dir)
    timing_only = getattr(args, "timing_only", False) or bool(spec and spec.timing_only)
    overrides = whatif.timing_overrides(list(args.overrides), timing_only)
    twice = overrides_given_twice(overrides, then="the last one is used")
    if twice:  # said, not silently dropped (as `hetsim run --set`)
        print(f"hetsim: warning: {twice}", file=sys.stderr)
    target = args.target if args.target is not None else (spec.target if spec else None)
    metric = (spec.metric if spec else None) or (whatif.TIMING_METRIC if timing_only else "global_acc")
    check_target(metric, target)  # before the sweep runs, not after
    storage = args.storage or (spec.storage if spec else None)
    extra = {}
    if spec:
        extra = {"max_concurrent_trials": spec.max_concurrent_trials,
                 "resources_per_trial": spec.resources_per_trial.model_dump(exclude_none=True),
                 "ray": spec.ray.model_dump()}
    if getattr(args, "dry_run", False):
        from sweeps.runner import dry_run_text  # Ray Tune: ~1 s to import, only for the sweep's checks

        spec_dict = whatif.whatif_sweep_spec(base, fleets, name=name, overrides=overrides, storage=storage,
                                             metric=metric, **extra)
        print(dry_run_text(spec_dict, address=args.address))
        return 0
    sweep = whatif.run_whatif(base, fleets, name=name, overrides=overrides, storage=storage,
                              address=args.address, quiet=args.quiet, command=sys.argv,
                              metric=metric, **extra)
    return report_whatif(sweep, metric, target, None if getattr(args, "wide", False) else TERMINAL_WIDTH)


def report_whatif(sweep, metric: str = "global_acc", target: float | None = None,
                  width: int | None = TERMINAL_WIDTH) -> int:
    """Print the compare table (folded to ``width`` characters; None: whole) and the fleets'
    differences; write compare.html in the folder."""
    errors = sweep.trials[sweep.trials["status"] == "error"]
    for _, row in errors.iterrows():
        print(f"fleet {row[whatif.FLEET_COLUMN]}: error: {row['error']}", file=sys.stderr)
    entries = load_entries([sweep.path])
    if not entries:
        print("hetsim whatif: no fleet finished a round", file=sys.stderr)
        return 1
    fleets = " vs ".join(e.label for e in entries)
    page, table, target = compare_page(entries, metric, target,
                                       title=f"hetsim whatif: {Path(sweep.path).name}: {fleets}")
    print(text_table(table, metric, target, width))
    for line in difference_lines(sweep):
        print(line)
    out = page.write(Path(sweep.path) / COMPARE_FILE)
    links = whatif.link_fleet_folders(sweep)
    print(f"\nresults: {sweep.path}  (trials.parquet, rounds.parquet with a `fleet` column)")
    if links:
        print(f"run folders by fleet: {Path(sweep.path) / whatif.FLEETS_DIR}/<fleet> "
              f"({', '.join(links)})")
    print(f"compare page: {out}  (`hetsim report {sweep.path}` draws the sweep report beside it)")
    if links and any(((e.run.config or {}).get("clock") or {}).get("mode") == "timing_only" for e in entries):
        print(f"what-if page of a fleet: hetsim report {Path(sweep.path) / whatif.FLEETS_DIR}/<fleet>")
    if not sweep.complete:
        print(f"interrupted: continue with `hetsim sweep --resume {sweep.path}`", file=sys.stderr)
        return 130
    return 1 if len(errors) == len(sweep.trials) else 0


def difference_lines(sweep) -> list[str]:
    """Per fleet against the first: "slow vs fast: the same accuracy, different arrivals from round 2"."""
    out = []
    for d in whatif.fleet_differences(sweep):
        acc = ("no accuracy (timing only)" if d["same_accuracy"] is None else "the same accuracy"
               if d["same_accuracy"] else f"different accuracy from round {d['first_round_acc']}")
        arr = ("the same arrivals" if d["same_arrivals"]
               else f"different arrivals from round {d['first_round_arrivals']}")
        out.append(f"{d['fleet']} vs {d['reference']}: {acc}, {arr}")
    return out
