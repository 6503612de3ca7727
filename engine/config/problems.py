"""What is wrong with a raw config, in a user's words: pydantic's errors as lines naming the field
as the user wrote it (:func:`format_errors`), and the checks that run before pydantic on the raw
mapping (:func:`bool_problems`: a boolean where a number goes; :func:`well_shaped`: only the
sections that are mappings are walked).

A section whose options depend on a name (``algorithm``, ``clients.selection``) is walked with the
params class that name has in its registry now (:func:`registered_params`).
"""
from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Mapping, Union

from pydantic import BaseModel, ValidationError

from algorithms.base import AlgorithmParams
from algorithms.params import ALGORITHM_PARAMS
from algorithms.plugins import METHODS, SELECTORS, WORK_POLICIES, method_params, selector_params, work_params
from algorithms.selection import SelectionParams
from algorithms.work import WorkParams
from engine.config.hints import TYPE_KINDS, algorithm_key_problem, friendly, input_loc, value_at, yaml_kind
from hardware_profiles.suggest import unknown_key


def _flatten(annotation: Any) -> list[Any]:
    """The alternatives of a type: Union/Optional split, Annotated unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _flatten(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _flatten(arg)]
    return [annotation]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def bool_problems(annotation: Any, value: Any, where: str) -> list[str]:
    """``true``/``false`` given where the schema wants a number (pydantic would read 1/0)."""
    alternatives = _flatten(annotation)
    if isinstance(value, bool):
        bases = {typing.get_origin(t) or t for t in alternatives}
        if bases & {int, float} and bool not in bases:
            return [f"  {where} = {value!r}: a boolean where a number is expected; write a number"]
        return []
    out: list[str] = []
    models = [t for t in _flatten(registered_params(annotation, value)) if _is_model(t)]
    if isinstance(value, dict) and models:
        model = models[0]
        for key, sub in value.items():
            field = model.model_fields.get(key) if isinstance(key, str) else None
            if field is not None:
                out += bool_problems(field.annotation, sub, f"{where}.{key}" if where else key)
        return out
    for t in alternatives:
        origin, args = typing.get_origin(t), typing.get_args(t)
        if origin is dict and isinstance(value, dict) and len(args) == 2:
            for key, sub in value.items():
                out += bool_problems(args[1], sub, f"{where}.{key}")
        elif origin in (list, tuple) and isinstance(value, list) and args:
            for i, sub in enumerate(value):
                out += bool_problems(args[0], sub, f"{where}[{i}]")
    return out


def well_shaped(model: Any, raw: Any) -> Any:
    """``raw`` without the values where ``model`` wants a section (a pydantic model, or a mapping
    of them) and the value is not a mapping, at every depth: what the checks that walk the raw
    mapping before pydantic may rely on. Pydantic reports the values left out."""
    if not isinstance(raw, dict):
        return {}
    out = {}
    for key, value in raw.items():
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            out[key] = value
            continue
        shape = _section_shape(field.annotation)
        if shape is None:
            out[key] = value
        elif isinstance(value, dict):
            if isinstance(shape, dict):  # dict[K, Section]: each value a section
                out[key] = {k: well_shaped(shape["value"], v) for k, v in value.items() if isinstance(v, dict)}
            else:
                out[key] = well_shaped(shape, value)
    return out


def _section_shape(annotation: Any) -> Any:
    """The section class a field holds (``X | None`` unwrapped; a discriminated union's first
    member: the members share the shape), ``{"value": V}`` for ``dict[K, V]`` of sections, or None
    for a field whose value may be something other than a mapping."""
    alternatives = [a for a in _flatten(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is dict or (len(alternatives) == 1 and typing.get_origin(alternatives[0]) is dict):
        args = typing.get_args(alternatives[0] if alternatives else annotation)
        return {"value": args[1]} if len(args) == 2 and _is_model(args[1]) else None
    if alternatives and all(_is_model(a) for a in alternatives):
        return alternatives[0]
    return None


def format_errors(err: ValidationError, raw: dict[str, Any], root: type[BaseModel], problems: list[str] = (),
                  methods: Mapping[str, type] = ALGORITHM_PARAMS) -> str:
    """One line per problem: ``problems`` (the checks before pydantic), then pydantic's errors,
    each naming the field. ``methods``: every method's name and params class (the ``algorithm``
    section is the one whose options depend on a value, its ``name``)."""
    lines = list(problems)
    algorithm = raw.get("algorithm") if isinstance(raw.get("algorithm"), dict) else {}
    errors = [(e, *input_loc(e["loc"], raw)) for e in err.errors()]
    kinds: dict[str, list[str]] = {}  # a field whose union pydantic tried member by member: one line
    for e, loc, key_error in errors:
        if e["type"] in TYPE_KINDS and not key_error:
            kinds.setdefault(".".join(loc), []).append(TYPE_KINDS[e["type"]])
    said = set()
    for e, loc, key_error in errors:
        field = ".".join(loc) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if key_error:  # a mapping's key of the wrong type: the mapping is the field
            lines.append(f"  {field} = {value_at(raw, loc)!r}: key {e.get('input')!r}: "
                         f"{friendly(e, loc) or msg}")
            continue
        if len(set(kinds.get(field, ()))) > 1 and e["type"] in TYPE_KINDS:
            if field not in said:
                said.add(field)
                allowed = " or ".join(dict.fromkeys(kinds[field]))
                lines.append(f"  {field} = {e.get('input')!r}: {yaml_kind(e.get('input'))} is not allowed here; "
                             f"give {allowed}")
            continue
        if e["type"] == "missing":  # pydantic's input is the whole section it is missing from
            lines.append(f"  {field}: required; give {loc[-1] if loc else 'it'}")
            continue
        if e["type"] == "extra_forbidden" and loc[:1] == ["algorithm"] and len(loc) == 2:
            msg = algorithm_key_problem(loc[-1], algorithm.get("name"), methods)
        elif e["type"] == "extra_forbidden":
            msg = unknown_key(loc[-1], allowed_keys(root, loc[:-1], raw))
        else:
            keys = allowed_keys(root, loc, raw)
            if loc == ["algorithm"]:  # its keys depend on the method
                keys = [f"name: {' | '.join(sorted(methods))}", "the method's options"]
            msg = friendly(e, loc, keys) or msg
        lines.append(f"  {field} = {e.get('input')!r}: {msg}")
    return "invalid experiment config:\n" + "\n".join(lines)


def allowed_keys(root: type[BaseModel], loc: list[str], raw: Any = None) -> list[str]:
    """The keys the section at ``loc`` (below ``root``) allows; ``raw``: the mapping given, whose
    names pick the params class of a named section (``algorithm``, ``clients.selection``)."""
    model: Any = root
    for part in loc:
        model = _section_of(model)
        if model is None:
            return []
        if isinstance(model, dict):  # a mapping such as profiles.overrides: the part is a key
            model = model["value"]
            raw = raw.get(part) if isinstance(raw, dict) else None
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        raw = raw.get(part) if isinstance(raw, dict) else None
        model = registered_params(field.annotation, raw)
    model = _section_of(model)
    return list(model.model_fields) if model is not None and not isinstance(model, dict) else []


def registered_params(annotation: Any, value: Any) -> Any:
    """The params class a ``{name: ...}`` section validates with (a method's, a selection
    policy's), from its name; other annotations unchanged."""
    models = [t for t in _flatten(annotation) if _is_model(t)]
    for base, registry, params_of, default, key in (
            (AlgorithmParams, METHODS, method_params, "fedavg", "name"),
            (SelectionParams, SELECTORS, selector_params, "uniform", "name"),
            (WorkParams, WORK_POLICIES, work_params, "fixed", "policy")):
        if models == [base]:
            name = value.get(key) if isinstance(value, dict) else value if isinstance(value, str) else None
            name = default if name is None else name
            return params_of(name) if isinstance(name, str) and name in registry else base
    return annotation


def _section_of(t: Any) -> Any:
    """The section class in ``t`` (``X | None`` unwrapped); ``{"value": V}`` for ``dict[K, V]``."""
    if typing.get_origin(t) is dict and len(typing.get_args(t)) == 2:
        return {"value": typing.get_args(t)[1]}
    models = [a for a in _flatten(t) if _is_model(a)]
    return models[0] if len(models) == 1 else None
