"""The docs site's sources: the configuration reference generated from the schema holds every
field with its default and range, and the site's navigation (mkdocs.yml) reaches every page.

The site itself is built by `make docs` (``mkdocs build --strict``, in CI); these checks need
neither MkDocs nor a build.
"""
from __future__ import annotations

import importlib.util
import re
import typing

import pytest
import yaml
from helpers import REPO
from pydantic import BaseModel

from algorithms.params import ALGORITHM_PARAMS
from engine.config.schema import ExperimentConfig


def _generator():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "docs/hooks/config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page() -> str:
    return _generator().page()


def _sections(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _sections(arg)]


def _fields(model: type[BaseModel], seen=()) -> list[tuple[type[BaseModel], str]]:
    """Every (model, field name) reachable from ``model``, sections inside sections too."""
    out = []
    for name, field in model.model_fields.items():
        out.append((model, name))
        for sub in _sections(field.annotation):
            if sub not in seen:
                out.extend(_fields(sub, (*seen, model)))
    return out


def _rows(page: str) -> dict[str, list[str]]:
    """Key -> the cells of each table row naming it (a key may repeat under several kinds of section)."""
    rows: dict[str, list[str]] = {}
    for line in page.splitlines():
        m = re.match(r"\| `([^`]+)` \|(.*)\|$", line)
        if m:
            rows.setdefault(m.group(1), []).append(m.group(2))
    return rows


def test_every_schema_field_is_in_the_configuration_reference_with_its_default(page):
    rows = _rows(page)
    every = _fields(ExperimentConfig) + [f for params in ALGORITHM_PARAMS.values() for f in _fields(params)]
    assert len(every) > 150
    for model, name in every:
        if model is ExperimentConfig and _sections(model.model_fields[name].annotation):
            assert f"## `{name}`" in page  # a top-level section is a heading, its keys the rows under it
            continue
        keys = [k for k in rows if k == name or k.endswith("." + name)]
        assert keys, f"{model.__name__}.{name} is not in the configuration reference"
        default = model.model_fields[name].default
        if isinstance(default, (bool, int, float)) or default is None:
            shown = str(default).lower() if isinstance(default, bool) else ("null" if default is None else str(default))
            assert any(f"`{shown}`" in cells for k in keys for cells in rows[k]), (name, default)


def test_the_reference_gives_ranges_allowed_values_and_every_method(page):
    rows = _rows(page)
    assert "> 0" in rows["train.lr"][0] and "`0.05`" in rows["train.lr"][0]
    assert "`iid`, `dirichlet`, `shards`, `natural`" in rows["partition.scheme"][0]
    assert ">= 1" in rows["clients.num_clients"][0]
    for method in ALGORITHM_PARAMS:
        assert f"### `{method}`" in page
    described = sum(bool(cells[-1].strip()) for cells_list in rows.values() for cells in [cells_list[0].split("|")])
    assert described == len(rows)  # every key says what it is for


def test_the_site_navigation_reaches_every_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def pages(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from (pages(value) if isinstance(value, list) else [value])

    listed = set(pages(config["nav"]))
    on_disk = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert on_disk - listed == set(), "pages the navigation does not reach"
    assert listed - on_disk == {"reference/config.md"}  # generated when the site is built
