"""What a config may name, one line each: ``hetsim list datasets|models|algorithms|compressors|
selectors|work|metrics|tiers|presets``.

Each topic reads its registry (nothing is copied here), so a newly registered dataset, model,
method, compressor, selection policy, work policy, metric, tier or preset is listed without a change to this
file; an entry that is not built in says where it came from (its plugin, package or module).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable

from engine.errors import UserError
from hardware_profiles.suggest import unknown


def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring, without reST markup."""
    text = " ".join((doc or "").strip().split("\n\n")[0].split())
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")
    m = re.search(r"(?<![A-Z0-9])[.:](\s|$)", text)  # 'e.g.' inside is rare in the first sentence
    return (text[:m.start()] if m else text).strip()


def _registered(registry, describe: Callable[[Any], str]) -> list[tuple[str, str]]:
    """One line per entry: its description (resolving it, e.g. importing a method's module for its
    docstring) and, unless built in, where it came from."""
    out = []
    for name in registry.names():
        origin = registry.origin(name)
        where = "" if origin.kind == "built-in" else f" [{origin}]"
        out.append((name, (describe(registry.get(name)) + where).strip()))
    return out


def _datasets() -> list[tuple[str, str]]:
    from engine.registry import DATASETS  # numpy only; loaders import torchvision when called

    return _registered(DATASETS, lambda fn: first_sentence(fn.__doc__))


def _models() -> list[tuple[str, str]]:
    from engine.registry import MODELS  # its entries import torch: only this topic needs it

    return _registered(MODELS, lambda cls: first_sentence(cls.__doc__))


def _algorithms() -> list[tuple[str, str]]:
    from algorithms.plugins import METHODS  # imports each method's module (torch) for its description

    return _registered(METHODS, lambda spec: spec.description or first_sentence(spec.server.__doc__)
                       or first_sentence(sys.modules[spec.server.__module__].__doc__))


def _compressors() -> list[tuple[str, str]]:
    from algorithms.plugins import COMPRESSORS  # torch: only this topic needs it

    return _registered(COMPRESSORS, lambda cls: first_sentence(cls.__doc__))


def _selectors() -> list[tuple[str, str]]:
    from algorithms.plugins import SELECTORS  # numpy: only this topic needs it

    return _registered(SELECTORS, lambda cls: first_sentence(cls.__doc__))


def _work() -> list[tuple[str, str]]:
    from algorithms.plugins import WORK_POLICIES  # numpy: only this topic needs it

    return _registered(WORK_POLICIES, lambda fn: first_sentence(fn.__doc__))


def _metrics() -> list[tuple[str, str]]:
    from algorithms.plugins import METRICS  # the built-ins import torch

    return _registered(METRICS, lambda fn: first_sentence(fn.__doc__))


def _tiers() -> list[tuple[str, str]]:
    from hardware_profiles.catalog import default_catalog  # yaml: the built-in catalog

    cat = default_catalog()
    out = [(name, f"device: {t.gflops:g} GFLOP/s, {t.memory_gb:g} GB, available {t.availability:.0%}, "
                  f"dropout {t.dropout:.0%}" + (f", battery {t.battery_wh:g} Wh" if t.battery_wh else ""))
           for name, t in cat.devices.items()]
    out += [(name, f"network: {t.down_mbps:g} Mbps down, {t.up_mbps:g} Mbps up, {t.latency_s * 1e3:g} ms latency")
            for name, t in cat.networks.items()]
    return out


def _presets() -> list[tuple[str, str]]:
    from hardware_profiles.condition_spec import PRESETS  # pydantic only

    def line(spec: dict) -> str:
        if spec["kind"] == "markov":
            states = ", ".join(f"{k} x{v:g}" for k, v in spec["states"].items())
            return f"condition preset: Markov chain ({states}), slot {spec['slot_s']:g} s"
        return f"condition preset: {spec['kind']} availability by hour of day"

    return [(name, line(spec)) for name, spec in PRESETS.items()]


TOPICS: dict[str, Callable[[], list[tuple[str, str]]]] = {
    "datasets": _datasets, "models": _models, "algorithms": _algorithms, "compressors": _compressors,
    "selectors": _selectors, "work": _work, "metrics": _metrics, "tiers": _tiers, "presets": _presets}


def load_listed_plugins(config: str | None, plugins: list[str]) -> None:
    """Import the plugins ``hetsim list`` is asked about: a config's ``plugins:`` (only that key is
    read, relative to the config file) and the ``--plugin`` entries (relative to the working folder)."""
    from engine.config.paths import resolve_paths  # yaml, pydantic: only with -c or --plugin
    from engine.config.yamlio import read_yaml_file
    from engine.plugin_sources import load_plugins, resolve_entries

    if config is not None:
        path = Path(config)
        raw = read_yaml_file(path)
        entries = resolve_paths({"plugins": raw.get("plugins", [])} if isinstance(raw, dict) else {},
                                path.resolve().parent)[0].get("plugins", [])
        if entries:
            load_plugins(entries)
    if plugins:
        load_plugins(resolve_entries(list(plugins), None))


def list_entries(topic: str) -> list[tuple[str, str]]:
    """``(name, short description)`` of each entry of ``topic`` (one of :data:`TOPICS`)."""
    if topic not in TOPICS:
        raise UserError(unknown("topic", topic, TOPICS))
    return TOPICS[topic]()
