"""The first commands a newcomer types: ``hetsim list`` (what a config may name) and ``hetsim
init`` (a commented starter config). Only argparse at import time, like :mod:`hetsim.results_cli`."""
from __future__ import annotations

from pathlib import Path

from engine import UserError  # light: the error classes
from hetsim.templates import TEMPLATES, render

TOPICS = ("datasets", "models", "algorithms", "compressors", "selectors", "work", "metrics", "tiers", "presets")
EPILOG_LINES = """  hetsim list tiers                            # device and network tiers with their figures
  hetsim init async -o exp.yaml                # a commented starter config (sync, async, energy, conditions)
"""
WIDTH = 110  # a description is cut to fit a terminal line


def add_commands(sub) -> None:
    p = sub.add_parser("list", help="list what a config may name: " + ", ".join(TOPICS),
                       description="One line per entry, with a short description.")
    p.add_argument("topic", nargs="?", metavar="TOPIC", help=" | ".join(TOPICS))
    p.add_argument("-c", "--config", help="also list what this config's plugins: register")
    add_plugin_arg(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("init", help="write a commented starter config",
                       description="Write a starter experiment that `hetsim validate -c` and `hetsim run -c` "
                       "take as it is: " + "; ".join(f"{k}: {v[0]}" for k, v in TEMPLATES.items()) + ".")
    p.add_argument("template", nargs="?", default="sync", metavar="TEMPLATE",
                   help=" | ".join(TEMPLATES) + " (default: sync)")
    p.add_argument("-o", "--out", default="experiment.yaml", help="file to write (default: experiment.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite the file if it exists")
    p.set_defaults(func=cmd_init)


def add_plugin_arg(p) -> None:
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE_OR_PATH",
                   help="import a plugin first: a module name, or a .py file or folder (relative to the working "
                   "folder); repeatable (docs/plugins.md)")


def cmd_list(args) -> int:
    if args.topic is None:
        raise UserError("which list? one of: " + ", ".join(TOPICS) + " (e.g. hetsim list algorithms)")
    from engine.run.listing import list_entries, load_listed_plugins  # the registries (torch for some topics)

    load_listed_plugins(args.config, args.plugins)
    entries = list_entries(args.topic)
    width = max(len(name) for name, _ in entries)
    for name, text in entries:
        text = text if len(text) <= WIDTH - width else text[:WIDTH - width - 3] + "..."
        print(f"{name:<{width}}  {text}".rstrip())
    return 0


def cmd_init(args) -> int:
    from hardware_profiles.suggest import unknown  # its package imports numpy and pydantic: not for every command

    if args.template not in TEMPLATES:
        raise UserError(unknown("template", args.template, TEMPLATES))
    out = Path(args.out)
    if out.exists() and not args.force:
        raise UserError(f"{out} exists; give another file with -o, or --force to overwrite it")
    out.write_text(render(args.template, str(out)))
    print(f"wrote {out} (template {args.template!r}); next: hetsim validate -c {out} && hetsim run -c {out}")
    return 0
