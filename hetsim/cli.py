"""The ``hetsim`` command line: the layer above ``engine`` and ``sweeps`` (neither imports it)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from engine.callbacks import RunCallback  # light: no torch, no Ray
from engine.trace import mark

EPILOG = """examples:
  hetsim run                                   # the built-in default experiment
  hetsim run -c exp.yaml --set train.lr=0.01 --set clients.num_clients=50
  hetsim validate -c exp.yaml                  # check a config without running it
  hetsim show runs/fedavg-digits-20261129-120000
  hetsim sweep sweeps/examples/fedavg_lr.yaml  # a Ray Tune sweep (docs/sweeps.md)
  hetsim sweep --resume sweeps_out/fedavg_lr   # continue an interrupted sweep
"""


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="experiment YAML (default: the built-in default experiment)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field by dotted key, value parsed as YAML (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetsim",
        description="Simulate resource-constrained, heterogeneous federated learning.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run one experiment and write its run folder")
    _add_config_args(p)
    p.add_argument("-o", "--out", help="run folder (default: <output.dir>/<algorithm>-<dataset>-<time>)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="validate a config and print it resolved")
    _add_config_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("show", help="summarise a run folder")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "sweep",
        help="run a Ray Tune sweep over experiment configs (docs/sweeps.md)",
        description="Run every configuration of a sweep spec as one Tune trial; results in "
        "<storage>/trials.parquet and rounds.parquet (load with sweeps.load_sweep).",
    )
    p.add_argument("spec", nargs="?", help="sweep spec YAML (not with --resume)")
    p.add_argument("--resume", metavar="PATH", help="continue the interrupted sweep in folder PATH")
    p.add_argument("--retry-errored", action="store_true", help="with --resume: rerun errored trials")
    p.add_argument("--address", help="existing Ray cluster to run on (overrides ray.address)")
    p.add_argument("--storage", metavar="DIR", help="sweep folder (default: spec storage or sweeps_out/<name>)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)
    return parser


def _load(args):
    from engine.config import load_config

    return load_config(args.config, args.overrides)


def cmd_validate(args) -> int:
    import yaml

    cfg = _load(args)
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


class ProgressBar(RunCallback):
    """A run callback: one tqdm bar over rounds, showing the latest accuracies and simulated time."""

    def __init__(self, total: int):
        self.total = total
        self.bar = None
        self.postfix: dict[str, str] = {}

    def on_run_begin(self, run) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=self.total, initial=run.first_round, unit="round",
                        dynamic_ncols=True, file=sys.stderr)

    def on_round_end(self, run, rec) -> None:
        row = rec.row
        for key, label in (("global_acc", "acc"), ("pers_acc", "pers")):
            if not math.isnan(row.get(key, float("nan"))):
                self.postfix[label] = f"{row[key]:.3f}"
        self.postfix["sim"] = f"{row['sim_time_s']:.0f}s"
        self.bar.set_postfix(self.postfix, refresh=False)
        self.bar.update(1)

    def on_run_end(self, run, status) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_run(args) -> int:
    from engine.run import run_experiment

    cfg = _load(args)
    mark("cli: config loaded")
    rows: list[dict] = []  # every round's row, for the summary (no pandas needed to print it)
    callbacks = [lambda record: rows.append(record.row)] + ([] if args.quiet else [ProgressBar(cfg.rounds)])
    path = run_experiment(cfg, run_dir=args.out, callbacks=callbacks, command=sys.argv)
    mark("cli: run returned")
    print(summary_table(path, rows))
    print(f"\nresults: {path}")
    return 0


def cmd_sweep(args) -> int:
    from sweeps import runner

    mark("cli: sweep modules imported")
    if bool(args.spec) == bool(args.resume):
        print("hetsim sweep: give a spec file or --resume PATH (one of them)", file=sys.stderr)
        return 2
    if args.resume:
        if args.storage:
            print("hetsim sweep: --storage does not apply to --resume", file=sys.stderr)
            return 2
        sweep = runner.resume_sweep(args.resume, address=args.address, quiet=args.quiet,
                                    retry_errored=args.retry_errored)
    else:
        sweep = runner.run_sweep(args.spec, storage=args.storage, address=args.address,
                                 quiet=args.quiet, command=sys.argv)
    print(runner.summary_table(sweep))
    print(f"\nresults: {sweep.path}  (trials.parquet, rounds.parquet; sweeps.load_sweep)")
    if not runner.is_complete(sweep):
        print(f"interrupted: continue with `hetsim sweep --resume {sweep.path}`", file=sys.stderr)
        return 130
    return 1 if len(sweep.trials) and (sweep.trials["status"] == "error").all() else 0


def cmd_show(args) -> int:
    print(summary_table(Path(args.run_dir)))
    return 0


def summary_table(path: Path, rows: list[dict] | None = None) -> str:
    """The run's summary; ``rows`` (its rounds.parquet rows, as relayed to the caller's callbacks)
    spare reading the Parquet tables with pandas."""
    import json

    path = Path(path)
    if rows is None:
        from engine.results import load_run

        rows = load_run(path).rounds.to_dict("records")
    manifest = json.loads((path / "manifest.json").read_text())
    if not rows:
        return f"{path}: no finished rounds (status: {manifest.get('status')})"
    last = rows[-1]

    def isnan(v):
        return v is None or (isinstance(v, float) and math.isnan(v))

    def pct(v):
        return "n/a" if isnan(v) else f"{100 * v:.2f}%"

    evaluated = [r["global_acc"] for r in rows if not isnan(r.get("global_acc"))]
    lines = [
        ("status", manifest.get("status", "?")),
        ("algorithm / dataset", f"{manifest.get('algorithm')} / {manifest.get('dataset')}"),
        ("rounds", f"{len(rows)}"),
        ("global accuracy (final)", pct(last.get("global_acc"))),
        ("global accuracy (best)", pct(max(evaluated) if evaluated else None)),
        ("personalized acc (mean)", pct(last.get("pers_acc"))),
        ("personalized acc (weighted)", pct(last.get("pers_acc_weighted"))),
        ("personalized acc (worst client)", pct(last.get("pers_acc_worst"))),
        ("upload total", _human_bytes(sum(r["bytes_up"] for r in rows))),
        ("download total", _human_bytes(sum(r["bytes_down"] for r in rows))),
        ("simulated time", f"{last['sim_time_s']:.1f} s"),
        ("wall time", f"{manifest.get('wall_s', sum(r['wall_s'] for r in rows)):.1f} s"),
    ]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return str(n)


def main(argv: list[str] | None = None) -> int:
    mark("cli: main")
    args = build_parser().parse_args(argv)
    from engine.config import ConfigError  # after parsing: `--help` imports nothing more

    ray_before = _ray_initialized()
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"hetsim: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, FileExistsError) as err:
        print(f"hetsim: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hetsim: interrupted; finished rounds are saved", file=sys.stderr)
        return 130
    finally:
        if not ray_before:  # the command started Ray (or joined a cluster): end that now
            from engine.ray_executor import shutdown_ray

            shutdown_ray()


def _ray_initialized() -> bool:
    if "ray" not in sys.modules:  # never imported here: not initialised (and not worth importing)
        return False
    import ray

    return ray.is_initialized()


def console_main() -> None:
    """The ``hetsim`` command: :func:`main`, then end the process without the interpreter's
    teardown.

    When ``main`` returns, everything is written, the output is printed and a Ray started by the
    command is shut down; what the interpreter would still do is free memory and tear down
    torch's and Ray's modules and threads (0.5-0.9 s on 2 busy cores). An uncaught exception
    still ends the normal way, with its traceback.
    """
    import logging
    import os

    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
