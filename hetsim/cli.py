"""The ``hetsim`` command line: the layer above ``engine`` and ``sweeps`` (neither imports it).

Exit status: 0 success; 2 a mistake the user can fix (one message, no traceback: a bad config,
a missing file, an unreachable cluster, a full or read-only disk, a damaged run folder, ...);
3 the run diverged (``train.on_nonfinite: stop``); 130 interrupted; 1 an unexpected error,
i.e. a bug: a short message, and the traceback in ``error.log`` inside the run folder (or a
temporary file) whose path is printed; ``--debug`` also prints it; 141 the output's reader
stopped early (``| head``).

Over 400 lines because it is the one error boundary and the parser of the run, validate, show
and sweep commands with their summaries; report, compare and what-if are :mod:`hetsim.results_cli`,
list and init :mod:`hetsim.start_cli`.
"""
from __future__ import annotations

import argparse
import errno
import logging
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from engine import RunCallback, UserError  # light: no torch, no Ray
from engine.trace import mark
from hetsim import results_cli, start_cli
from hetsim.common import TERMINAL_WIDTH, resolve_latest  # report / compare / whatif: argparse only

EPILOG = """examples:
  hetsim run                                   # the built-in default experiment
  hetsim run -c exp.yaml --set train.lr=0.01 --set clients.num_clients=50
  hetsim run --resume runs/fedavg-digits-20261129-120000   # continue an unfinished run
  hetsim validate -c exp.yaml                  # check a config without running it
  hetsim show runs/fedavg-digits-20261129-120000
  hetsim sweep sweeps/examples/fedavg_lr.yaml  # a Ray Tune sweep (docs/sweeps.md)
  hetsim sweep sweeps/examples/fedavg_lr.yaml --grid train.lr=0.01,0.1 --dry-run   # a smaller grid
  hetsim sweep --resume sweeps_out/fedavg_lr   # continue an interrupted sweep
""" + results_cli.EPILOG_LINES + start_cli.EPILOG_LINES


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="experiment YAML (default: the built-in default experiment)")
    start_cli.add_plugin_arg(p)
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field by dotted key, value parsed as YAML (repeatable)",
    )


def _add_wide(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wide", action="store_true",
                   help="print tables whole (default: columns folded to fit 100 characters)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetsim",
        description="Simulate resource-constrained, heterogeneous federated learning.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="print tracebacks of unexpected errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="print tracebacks of unexpected errors")

    p = sub.add_parser("run", help="run one experiment and write its run folder", parents=[common])
    _add_config_args(p)
    p.add_argument("-o", "--out", help="run folder, a path or a URI such as s3://bucket/runs/x "
                   "(default: <output.dir>/<method>-<dataset>-<time>; method: the algorithm or the "
                   "asynchronous mode, e.g. fedbuff)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an unfinished run from its newest checkpoint; -c/--set may change "
                   "only fields that cannot change results (docs/checkpoints.md)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="check a config (and its data) without running it; print it resolved",
                       parents=[common])
    _add_config_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("show", help="summarise a run folder; a sweep or what-if folder: its trials",
                       parents=[common])
    p.add_argument("run_dir", help="a run, sweep or what-if folder: a path or a URI (s3://bucket/runs/x); "
                   "`latest` = the newest run under ./runs, DIR/latest the newest under DIR")
    _add_wide(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "sweep",
        help="run a Ray Tune sweep over experiment configs (docs/sweeps.md)",
        description="Run every configuration of a sweep spec as one Tune trial; results in "
        "<storage>/trials.parquet and rounds.parquet (load with sweeps.load_sweep).",
        parents=[common],
    )
    p.add_argument("spec", nargs="?", help="sweep spec YAML (not with --resume)")
    p.add_argument("--resume", metavar="PATH", help="continue the interrupted sweep in folder PATH")
    p.add_argument("--retry-errored", action="store_true", help="with --resume: rerun errored trials")
    p.add_argument("--address", help="existing Ray cluster to run on (overrides ray.address)")
    p.add_argument("-o", "--storage", metavar="DIR", help="sweep folder, a path or a URI such as s3://bucket/sweeps/x "
                   "(default: spec storage or sweeps_out/<name>)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the base experiment, after the spec's overrides (repeatable)")
    _add_wide(p)
    p.add_argument("--grid", dest="grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="replace the space's dimension KEY by a grid of these values (YAML scalars; a named "
                   "or cases dimension: the entries named); repeatable")
    p.add_argument("--dry-run", action="store_true",
                   help="validate the spec (and its data) and print the trials; start nothing, write nothing")
    p.set_defaults(func=cmd_sweep)

    results_cli.add_commands(sub)
    start_cli.add_commands(sub)
    return parser


def _load(args):
    from engine import load_config  # pydantic, numpy, yaml: not for --help
    from engine.plugin_sources import load_plugins, resolve_entries  # (as load_config)

    _warn_twice(args.overrides)
    extra = resolve_entries(list(getattr(args, "plugins", [])), None)
    load_plugins(extra)  # first: the config may name what they register
    cfg = load_config(args.config, args.overrides)
    if extra:  # the run's other processes import them too
        cfg = load_config(cfg.to_dict(), {"plugins": list(dict.fromkeys([*cfg.plugins, *extra]))})
    return cfg


def _warn_twice(overrides: list[str]) -> None:
    from engine.config.schema import overrides_given_twice  # pydantic behind it: not for --help

    twice = overrides_given_twice(overrides, then="the last one is used")
    if twice:  # said, not silently dropped
        print(f"hetsim: warning: {twice}", file=sys.stderr)


def cmd_validate(args) -> int:
    # yaml, and torch behind validate_experiment: only validate needs them
    import yaml

    from engine import validate_experiment
    from engine.clients.device import check_device_request
    from engine.run.gpu_checks import check_gpu_requests

    cfg = _load(args)
    check_device_request(cfg)  # e.g. device: cuda on a machine without CUDA
    check_gpu_requests(cfg)  # a Ray run's GPUs, as `run` checks them
    warnings = validate_experiment(cfg)
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    for text in warnings:
        print(f"hetsim: warning: {text}", file=sys.stderr)
    return 0


class ProgressBar(RunCallback):
    """A run callback: one tqdm bar over rounds (an asynchronous run's server steps), showing the
    latest accuracies and simulated time."""

    def __init__(self, total: int, unit: str = "round"):
        self.total, self.unit = total, unit
        self.bar = None
        self.postfix: dict[str, str] = {}

    def on_run_begin(self, run) -> None:
        from tqdm import tqdm  # ~50 ms: only a run with a progress bar needs it

        self.bar = tqdm(total=self.total, initial=run.first_round, unit=self.unit,
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
    from engine.gcpause import imports_without_gc  # stdlib only behind it

    if args.resume and args.out:
        print("hetsim run: --out does not apply to --resume (the run stays in its folder)", file=sys.stderr)
        return 2
    # the config's checks and Ray's start run with the collector paused (engine.gcpause)
    with imports_without_gc():  # torch, pandas and Ray behind these: only a run needs them
        from engine import resume_run
        from engine.errors import PluginError
        from engine.ray.cluster import DriverDiedError, ExecutorError
        from engine.results import load_run, run_status
        from engine.run.api import prepare_run, resume_config, run_in_folder
        from engine.run.folders import RunStateError

        if args.resume:
            path = Path(args.resume)
            cfg = resume_config(path, args.config, args.overrides)
            warnings: list[str] = []
        else:
            cfg = _load(args)
            prepared = prepare_run(cfg, args.out)
            path, warnings, parts = prepared.path, prepared.warnings, prepared.parts
    args.run_path = path  # for the error log and the interruption message
    mark("cli: config loaded")
    callbacks = [] if args.quiet else [ProgressBar(cfg.rounds, "step" if cfg.asynchronous else "round")]
    try:
        if args.resume:
            resume_run(path, cfg, callbacks=callbacks, command=sys.argv)
        else:
            run_in_folder(cfg, path, callbacks, sys.argv, warnings, started=args.started, parts=parts)
    except KeyboardInterrupt:
        print(f"{_interrupted(args)}. Continue with: hetsim run --resume {path}", file=sys.stderr)
        return 130
    except RunStateError as err:
        print(f"hetsim: {err}", file=sys.stderr)
        return 2
    except PluginError as err:  # the run folder is marked failed; fixed, the run continues from it
        print(f"hetsim: {err}\nthe run in {path} is marked failed; once your plugin is fixed, continue it with: "
              f"hetsim run --resume {path}", file=sys.stderr)
        return 2
    except (ExecutorError, DriverDiedError) as err:  # their messages say how to continue
        if isinstance(err, UserError):
            raise
        print(f"hetsim: {err}", file=sys.stderr)
        return 1
    mark("cli: run returned")
    run = load_run(path)  # once: the summary and the status read the same tables
    print(run_summary(run))
    print(f"\nresults: {path}")
    if run_status(run.manifest) == "diverged":
        print(f"hetsim: the run diverged: {run.manifest.get('error')}", file=sys.stderr)
        return 3
    return 0


def cmd_sweep(args) -> int:
    from sweeps import runner  # Ray Tune: ~1 s to import, only for sweeps

    mark("cli: sweep modules imported")
    if bool(args.spec) == bool(args.resume):
        raise UserError("sweep: give a spec file or --resume PATH (one of them)")
    if args.resume and (args.overrides or args.dry_run or args.grid):
        raise UserError("sweep: --set, --grid and --dry-run do not apply to --resume (a sweep continues as it began)")
    _warn_twice(args.overrides)
    if args.dry_run:
        print(runner.dry_run_text(args.spec, storage=args.storage, address=args.address, overrides=args.overrides,
                                  grid=args.grid))
        return 0
    if args.resume:
        if args.storage:
            raise UserError("sweep: --storage does not apply to --resume")
        sweep = runner.resume_sweep(args.resume, address=args.address, quiet=args.quiet,
                                    retry_errored=args.retry_errored)
    else:
        sweep = runner.run_sweep(args.spec, storage=args.storage, address=args.address,
                                 quiet=args.quiet, command=sys.argv, overrides=args.overrides, grid=args.grid)
    print(runner.summary_table(sweep, width=None if args.wide else TERMINAL_WIDTH))
    print(f"\nresults: {sweep.path}  (trials.parquet, rounds.parquet; sweeps.load_sweep)")
    if not runner.is_complete(sweep):
        print(f"interrupted: continue with `hetsim sweep --resume {sweep.path}`", file=sys.stderr)
        return 130
    return 1 if len(sweep.trials) and (sweep.trials["status"] == "error").all() else 0


def cmd_show(args) -> int:
    path = resolve_latest(args.run_dir)  # a path or a URI (s3://...)
    trials = results_cli.sweep_summary(path, args.wide)  # a sweep or what-if folder: its trial table
    print(trials if trials is not None else summary_table(path))
    return 0


def summary_table(path: Path | str) -> str:
    from engine.results import load_run  # pandas and pyarrow: not for --help

    return run_summary(load_run(path))


def run_summary(run) -> str:
    """The summary table of a loaded run (``engine.results.Run``)."""
    from engine.results import run_status  # pandas and pyarrow: not for --help
    from hetsim.summary import format_rows, summary_rows  # the lines the report's table shows too

    path, m = run.path, run.manifest
    status = run_status(m)
    if status == "crashed":
        status += (f" (its process {m.get('pid')} on {m.get('host')} is gone; last heartbeat "
                   f"{m.get('heartbeat', 'never')})")
    if run.rounds.empty:
        return f"{path}: no finished rounds (status: {status})"
    lines = [("status", status), *summary_rows(run)]
    if m.get("resumes"):
        froms = ", ".join(str(e.get("from_round")) for e in m["resumes"])
        lines.append(("resumed", f"{len(m['resumes'])}x (from round {froms})"))
    if m.get("faults"):
        lines.append(("client hosts replaced", f"{m['faults']} (faults.parquet)"))
    if m.get("error") and status != "finished":
        lines.append(("reason", str(m["error"]).splitlines()[-1][:200]))
    for text in m.get("warnings") or []:
        lines.append(("warning", text[:200]))
    return format_rows(lines)


def _user_errors() -> tuple[type[BaseException], ...]:
    return (UserError, FileNotFoundError, FileExistsError, NotADirectoryError,
            IsADirectoryError, PermissionError)


def _environment_message(err: Exception) -> str | None:
    """The message of an OSError the machine caused (full disk, read-only, name too long)
    outside a run folder's own writes, which raise a ``StorageFault`` themselves; None for a bug."""
    if not isinstance(err, OSError):
        return None
    from engine.errors import storage_fault  # stdlib only behind it

    where = Path(err.filename).parent if err.filename else Path.cwd()  # if it names a temporary
    fault = storage_fault(err, "a file", where)
    if fault is not None:
        return str(fault)
    if err.errno == errno.ENAMETOOLONG:
        return f"{err.filename}: the file name is too long ({err.strerror}); give a shorter one"
    return None


def _interrupted(args) -> str:
    path = getattr(args, "run_path", None)
    if path is None:
        return "hetsim: interrupted; nothing was written"
    from engine.results import read_table  # pandas and pyarrow: not for --help

    try:
        rounds = read_table(path, "rounds")
    except Exception:  # noqa: BLE001 - the message must not fail
        rounds = None
    done = 0 if rounds is None else len(rounds)
    if done == 0:
        return f"hetsim: interrupted before a round finished; {path} holds the config only"
    return f"hetsim: interrupted; {done} finished round(s) are saved in {path}"


def _unexpected(err: BaseException, args, argv) -> int:
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    run_path = getattr(args, "run_path", None)
    log_path = None
    try:
        if run_path is not None and Path(run_path).is_dir():
            log_path = Path(run_path) / "error.log"
        else:
            fd, name = tempfile.mkstemp(prefix="hetsim-error-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        log_path.write_text(f"hetsim {' '.join(argv)}\n\n{text}")
    except OSError:
        log_path = None
    if getattr(args, "debug", False):
        print(text, file=sys.stderr, end="")
    where = f"the traceback is in {log_path.resolve()}" if log_path else "the traceback could not be saved"
    print(f"hetsim: unexpected error ({type(err).__name__}: {str(err).strip()[:300]}). This is a "
          f"bug: {where}" + ("" if getattr(args, "debug", False) else "; --debug prints it"),
          file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    mark("cli: main")
    started = time.time()  # the run summary's wall time counts from here
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # argparse: usage message already printed, status 2
        return int(stop.code or 0)
    args.started = started
    # the engine's warnings (logger "hetsim") go to this command's stderr, as bare messages
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("hetsim")
    logger.addHandler(handler)
    logger.propagate = False
    ray_before = _ray_initialized()
    try:
        return args.func(args)
    except BrokenPipeError:  # `hetsim show ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail too
        return 141  # 128 + SIGPIPE, as a shell reports a process a pipe stopped
    except KeyboardInterrupt:
        print(_interrupted(args), file=sys.stderr)
        return 130
    except _user_errors() as err:
        message = str(err) if not isinstance(err, OSError) or not err.filename else (
            f"{err.filename}: {err.strerror or err}")
        print(f"hetsim: {message}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - the error boundary
        message = _environment_message(err)
        if message is None:
            return _unexpected(err, args, argv)
        print(f"hetsim: {message}", file=sys.stderr)
        return 2
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        if not ray_before:  # the command started Ray (or joined a cluster): end that now
            from engine.ray.cluster import shutdown_ray

            shutdown_ray()


def _ray_initialized() -> bool:
    from engine.ray.cluster import ray_is_up  # only stdlib behind it: Ray itself is not imported to ask

    return ray_is_up()


def console_main() -> None:
    """The ``hetsim`` command: :func:`main`, then end the process without the interpreter's
    teardown.

    When ``main`` returns, everything is written, the output is printed and a Ray started by the
    command is shut down; what the interpreter would still do is free memory and tear down
    torch's and Ray's modules and threads (0.5-0.9 s on 2 busy cores). An uncaught exception
    still ends the normal way, with its traceback.
    """
    from engine.gcpause import own_process  # stdlib only behind it

    own_process()  # this process is the command's own: its start-up may pause the collector
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
