"""What a config may name, one line each: ``hetsim list datasets|models|algorithms|tiers|presets``.

Each topic reads its registry (nothing is copied here), so a newly registered dataset, model,
method, tier or preset is listed without a change to this file.
"""
from __future__ import annotations

import re
from typing import Callable

from engine.errors import UserError
from hardware_profiles.suggest import unknown


def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring, without reST markup."""
    text = " ".join((doc or "").strip().split("\n\n")[0].split())
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")
    m = re.search(r"(?<![A-Z0-9])[.:](\s|$)", text)  # 'e.g.' inside is rare in the first sentence
    return (text[:m.start()] if m else text).strip()


def _datasets() -> list[tuple[str, str]]:
    from engine.data.datasets import DATASETS  # numpy only; loaders import torchvision when called

    return [(name, first_sentence(fn.__doc__)) for name, fn in DATASETS.items()]


def _models() -> list[tuple[str, str]]:
    from engine.models.zoo import MODELS  # torch: only this topic needs it

    return [(name, first_sentence(cls.__doc__)) for name, cls in MODELS.items()]


def _algorithms() -> list[tuple[str, str]]:
    from algorithms import ALGORITHMS  # imports each method's module (torch) for its description

    return [(name, ALGORITHMS[name].description) for name in ALGORITHMS]


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
    "datasets": _datasets, "models": _models, "algorithms": _algorithms, "tiers": _tiers, "presets": _presets}


def list_entries(topic: str) -> list[tuple[str, str]]:
    """``(name, short description)`` of each entry of ``topic`` (one of :data:`TOPICS`)."""
    if topic not in TOPICS:
        raise UserError(unknown("topic", topic, TOPICS))
    return TOPICS[topic]()
