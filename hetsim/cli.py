"""The ``hetsim`` command line: the layer above ``engine`` and ``sweeps`` (neither imports it)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from engine.callbacks import RunCallback  # light: no torch, no Ray
from engine.trace import mark
from hetsim import results_cli  # report / compare / whatif: argparse only at import

EPILOG = """examples:
  hetsim run                                   # the built-in default experiment
  hetsim run -c exp.yaml --set train.lr=0.01 --set clients.num_clients=50
  hetsim run --resume runs/fedavg-digits-20261129-120000   # continue an unfinished run
  hetsim validate -c exp.yaml                  # check a config without running it
  hetsim show runs/fedavg-digits-20261129-120000
  hetsim sweep sweeps/examples/fedavg_lr.yaml  # a Ray Tune sweep (docs/sweeps.md)
  hetsim sweep --resume sweeps_out/fedavg_lr   # continue an interrupted sweep
""" + results_cli.EPILOG_LINES


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
    p.add_argument("-o", "--out", help="run folder, a path or a URI such as s3://bucket/runs/x "
                   "(default: <output.dir>/<algorithm>-<dataset>-<time>)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an unfinished run from its newest checkpoint; -c/--set may change "
                   "only fields that cannot change results (docs/checkpoints.md)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="validate a config and print it resolved")
    _add_config_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("show", help="summarise a run folder")
    p.add_argument("run_dir", help="a run folder: a path or a URI (s3://bucket/runs/x)")
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
    p.add_argument("--storage", metavar="DIR", help="sweep folder, a path or a URI such as s3://bucket/sweeps/x "
                   "(default: spec storage or sweeps_out/<name>)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    results_cli.add_commands(sub)
    return parser


def _load(args):
    from engine.config import load_config

    return load_config(args.config, args.overrides)


def cmd_validate(args) -> int:
    import yaml

    from engine.device import check_device_request

    cfg = _load(args)
    check_device_request(cfg)  # e.g. device: cuda on a machine without CUDA
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
    from engine.driver_actor import DriverDiedError
    from engine.ray_executor import ExecutorError
    from engine.run import RunStateError, make_run_dir, resume_config, resume_run, run_experiment

    if args.resume:
        if args.out:
            print("hetsim run: --out does not apply to --resume (the run stays in its folder)", file=sys.stderr)
            return 2
        path = Path(args.resume)
        cfg = resume_config(path, args.config, args.overrides)
    else:
        cfg = _load(args)
        path = Path(args.out) if args.out else make_run_dir(cfg)
    mark("cli: config loaded")
    callbacks = [] if args.quiet else [ProgressBar(cfg.rounds)]
    try:
        if args.resume:
            resume_run(path, cfg, callbacks=callbacks, command=sys.argv)
        else:
            run_experiment(cfg, run_dir=path, callbacks=callbacks, command=sys.argv)
    except KeyboardInterrupt:
        print(f"hetsim: interrupted; finished rounds are saved. Continue with: hetsim run --resume {path}",
              file=sys.stderr)
        return 130
    except RunStateError as err:
        print(f"hetsim: {err}", file=sys.stderr)
        return 2
    except (ExecutorError, DriverDiedError) as err:  # their messages say how to continue
        print(f"hetsim: {err}", file=sys.stderr)
        return 1
    mark("cli: run returned")
    print(summary_table(path))
    print(f"\nresults: {path}")
    return 0


def cmd_sweep(args) -> int:
    from sweeps import runner

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
    print(summary_table(args.run_dir))  # a path or a URI (s3://...)
    return 0


def summary_table(path: Path | str) -> str:
    from engine.results import load_run

    run = load_run(path)
    r = run.rounds
    if r.empty:
        return f"{path}: no finished rounds (status: {run.manifest.get('status')})"
    last = r.iloc[-1]
    evaluated = r.dropna(subset=["global_acc"]) if "global_acc" in r else r.iloc[0:0]

    def pct(v):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}%"

    lines = [
        ("status", run.manifest.get("status", "?")),
        ("algorithm / dataset", f"{run.manifest.get('algorithm')} / {run.manifest.get('dataset')}"),
        ("rounds", f"{len(r)}"),
        ("global accuracy (final)", pct(last.get("global_acc"))),
        ("global accuracy (best)", pct(evaluated["global_acc"].max() if len(evaluated) else None)),
        ("personalized acc (mean)", pct(last.get("pers_acc"))),
        ("personalized acc (weighted)", pct(last.get("pers_acc_weighted"))),
        ("personalized acc (worst client)", pct(last.get("pers_acc_worst"))),
        ("upload total", _human_bytes(r["bytes_up"].sum())),
        ("download total", _human_bytes(r["bytes_down"].sum())),
        ("simulated time", f"{last['sim_time_s']:.1f} s"),
        ("wall time", f"{run.manifest.get('wall_s', r['wall_s'].sum()):.1f} s"),
    ]
    if run.manifest.get("resumes"):
        froms = ", ".join(str(e.get("from_round")) for e in run.manifest["resumes"])
        lines.append(("resumed", f"{len(run.manifest['resumes'])}x (from round {froms})"))
    if run.manifest.get("faults"):
        lines.append(("client hosts replaced", f"{run.manifest['faults']} (faults.parquet)"))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return str(n)


def main(argv: list[str] | None = None) -> int:
    from engine.config import ConfigError
    from engine.storage import StorageError

    mark("cli: main")
    args = build_parser().parse_args(argv)
    from engine.config import ConfigError  # after parsing: `--help` imports nothing more

    try:
        return args.func(args)
    except ConfigError as err:
        print(f"hetsim: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, FileExistsError, StorageError) as err:
        print(f"hetsim: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hetsim: interrupted; finished rounds are saved", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
