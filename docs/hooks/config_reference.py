"""The configuration reference, generated from the pydantic schema when the site is built.

Every field of :class:`engine.config.schema.ExperimentConfig`, its sections and each method's
``algorithm:`` parameters, with its type, default, allowed values or range, and description, as
one Markdown page (``reference/config.md``). ``mkdocs build`` calls :func:`on_files` (an MkDocs
hook, ``hooks:`` in mkdocs.yml); ``python docs/hooks/config_reference.py`` prints the page.
tests/studies/test_docs_site.py checks that every schema field appears in it.
"""
from __future__ import annotations

import ast
import enum
import functools
import inspect
import io
import textwrap
import tokenize
import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

PAGE = "reference/config.md"
INTRO = """# Configuration reference

Every key of an experiment config, generated from the schema (`engine/config/schema.py` and the
modules it uses) when the site is built. A key is written dotted, as `--set` and sweeps take it
(`train.lr`); `hetsim validate -c FILE` prints a config fully resolved, and
`hetsim init` writes a commented starter file. Paths in a config are relative to the config file.
Unknown keys are errors; an error names the key, the value and what is allowed
([validation](../validation.md)).

**Default** is what an omitted key takes. **Allowed** is the range (`> 0`, `<= 1`, ...) or the
values a key accepts. A section whose default is `null` is off unless given.
"""


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (``Model``, ``Model | None``, ``list[Model]``, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # a tagged union (clock.deadline), or SerializeAsAny: what it wraps
        return _type(typing.get_args(annotation)[0])
    if origin is Literal:
        return "one of the allowed"
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(_type(a) for a in typing.get_args(annotation)))
    if annotation is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(_type(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def _literals(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return [v for arg in typing.get_args(annotation) for v in _literals(arg)]


def _code(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, BaseModel):
        return "(section)"
    text = (value or '""') if isinstance(value, str) else str(value)
    return "`" + text.replace("|", "\\|") + "`"


def default_text(field: FieldInfo) -> str:
    if field.default is not PydanticUndefined:
        return _code(field.default)
    if field.default_factory is not None:
        try:
            return _code(field.default_factory())
        except TypeError:  # a factory that needs the validated data
            return "(computed)"
    return "required"


def allowed_text(field: FieldInfo) -> str:
    parts = []
    literals = _literals(field.annotation)
    if literals:
        parts.append(", ".join(_code(v) for v in literals))
    for meta in field.metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "length >="),
                           ("max_length", "length <=")):
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return "; ".join(parts)


@functools.lru_cache(maxsize=None)
def source_comments(model: type) -> dict[str, str]:
    """Field name -> the comment that explains it in the class's source: on the field's own line,
    else the block of comment lines right above it (a field without ``description=``)."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text = comments.get(node.end_lineno) or comments.get(node.lineno)
            if text is None:
                above, line = [], node.lineno - 1
                while line >= 1 and line in comments and lines[line - 1].lstrip().startswith("#"):
                    above.insert(0, comments[line])
                    line -= 1
                text = " ".join(above) or None
            if text:
                out[node.target.id] = text
    return out


# For fields whose schema says nothing (no ``description=``, no comment beside them): by dotted key,
# then by the key's last part. A range a validator checks (not a pydantic bound) is said here too.
BY_KEY = {
    "seed": "seeds everything: data split, profiles, selection, training; same seed, same results",
    "rounds": "synchronous rounds (asynchronous: server steps) to run",
    "dataset.name": "a dataset's name (`hetsim list datasets`)",
    "partition.scheme": "how the samples are split over the clients",
    "partition.shards_per_client": "shards: label-sorted shards per client",
    "model.name": "a model's name (`hetsim list models`)",
    "model.params": "the model builder's parameters",
    "model.zoo[].arch": "the architecture of the clients this rule matches",
    "model.zoo[].max_gflops": "matches devices of at most this many GFLOP/s",
    "model.zoo[].max_memory_gb": "matches devices with at most this much memory",
    "model.per_client": "client id -> architecture, over the zoo's rules",
    "model.arch_params": "architecture -> its builder's parameters",
    "clients.num_clients": "clients in the fleet",
    "clients.profiles": "each client's hardware profile ([own fleet](../tutorial/own-fleet.md))",
    "clients.profiles.devices": "device tier -> share of the fleet (`hetsim list tiers`)",
    "clients.profiles.network": "network tier -> share of the fleet",
    "clients.profiles.bandwidth": "bandwidth drawn from a distribution instead of network tiers",
    "clients.profiles.overrides": "client id -> its own profile fields",
    "clients.profiles.allow_out_of_range": "accept profile values outside the catalog's plausible ranges",
    "clients.profiles.availability": "every client's probability of being online in a round",
    "clients.profiles.dropout": "every client's probability of failing during a round",
    "clients.profiles.conditions.sets": "name -> a condition set ([conditions](../conditions.md))",
    "clients.profiles.conditions.condition_of": "client id -> its condition set",
    "train.local_epochs": "local epochs a round",
    "train.batch_size": "local batch size",
    "train.lr": "local learning rate",
    "train.momentum": "local SGD momentum",
    "train.weight_decay": "local weight decay",
    "evaluation.eval_every": "evaluate every N rounds",
    "evaluation.personalized": "evaluate each selected client's model on its local test split",
    "evaluation.global_model": "evaluate the global model on the global test split",
    "evaluation.batch_size": "evaluation batch size",
    "clock.deadline_s": "round deadline in simulated seconds (> 0); clients past it are dropped",
    "clock.over_selection": "select this many times the target and keep the first arrivals (>= 1)",
    "clock.apply_availability": "draw each client's availability",
    "clock.apply_dropout": "draw each client's dropout",
    "clock.mode": "virtual: time from FLOPs and profiles; measured: host time x host_to_device_ratio; "
                  "realtime: virtual, and sleep sim_seconds x time_scale ([the clock](../clock.md))",
    "clock.host_to_device_ratio": "measured mode: device seconds per host second (> 0)",
    "clock.time_scale": "realtime mode: wall seconds slept per simulated second",
    "output.overwrite": "reuse an existing run folder of the same name",
    "executor.kind": "inprocess: one process; ray: a driver actor and client actors ([cluster](../cluster.md))",
    "executor.clients_per_actor": "clients hosted by one actor (default: spread over the actors)",
    "executor.cpus_per_actor": "CPUs Ray reserves for each client actor",
    "executor.inject_failure": "kill one client actor at a round (tests of recovery)",
    "asynchronous.mode": "fedbuff (buffered) or fedasync ([asynchronous](../async.md))",
    "asynchronous.staleness": "how an update's weight falls with its staleness",
    "asynchronous.staleness.kind": "the staleness function",
    "algorithm.name": "the method (`hetsim list algorithms`)",
}
BY_LEAF = {
    "kind": "the process's kind", "states": "Markov states: each state's rate",
    "transition": "Markov transition matrix, one row per state", "slot_s": "seconds per Markov slot",
    "unit": "the unit of the rates", "file": "a trace file (CSV/Parquet), relative to the config file",
    "offset_s": "where in the trace the run starts", "share": "share of the fleet in this set",
    "hourly": "probability of being online by hour of the local day", "tz_offset_h": "time-zone offsets",
    "low": "lowest value", "high": "highest value", "traces": "trace ids to use",
    "loop": "replay from the start at its end", "tx_w": "radio power when transmitting (W)",
    "tail_j": "tail energy per transfer (J)", "down": "the download link's process", "up": "the upload link's process",
    "compute": "the device speed's factor process", "availability": "the online/offline process",
    "distribution": "the distribution's kind", "up_ratio": "upload rate as a share of the download rate",
    "round": "the round", "client": "the client",
}
PROFILE_FIELD = ("this client's own value of the profile field "
                 "([hardware profiles](../engine.md#hardware-profiles-hardware_profiles))")


def description(model: type, name: str, field: FieldInfo, key: str = "") -> str:
    text = field.description or source_comments(model).get(name, "") or BY_KEY.get(key, "")
    if not text and ".overrides.<name>." in key:
        text = PROFILE_FIELD
    return text or BY_LEAF.get(name, "")


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _child_prefix(key: str, annotation: Any) -> str:
    """How keys inside a section are written: ``a.b`` in a section, ``a[].b`` in a list of
    sections, ``a.<name>.b`` in a mapping of them."""
    for arg in (annotation, *typing.get_args(annotation)):
        origin = typing.get_origin(arg)
        if origin in (list, tuple):
            return f"{key}[]."
        if origin is dict:
            return f"{key}.<name>."
    return f"{key}."


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, FieldInfo, str]]:
    """``(dotted key, field, description)`` of every field of ``model`` and of the sections inside
    it, in order."""
    out: list[tuple[str, FieldInfo, str]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        out.append((key, field, description(model, name, field, key)))
        subs = list(dict.fromkeys(_models(field.annotation)))
        for sub in subs:
            inner = rows(sub, _child_prefix(key, field.annotation))
            if len(subs) > 1:  # one of several kinds of section: say which each key belongs to
                inner = [(k, f, f"*{sub.__name__}*: {t}") for k, f, t in inner]
            out.extend(inner)
    return out


def table(entries: list[tuple[str, FieldInfo, str]]) -> list[str]:
    lines = ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    for key, field, text in entries:
        lines.append(f"| `{key}` | {_cell(_type(field.annotation))} | {_cell(default_text(field))} | "
                     f"{_cell(allowed_text(field))} | {_cell(text)} |")
    return lines


def page() -> str:
    """The whole reference page, as Markdown."""
    from algorithms.params import ALGORITHM_PARAMS
    from engine.config.schema import ExperimentConfig

    out = [INTRO]
    sections = list(ExperimentConfig.model_fields.items())
    top = [(k, f, description(ExperimentConfig, k, f, k)) for k, f in sections
           if not _models(f.annotation) and k != "algorithm"]
    out += ["## Top level", "", *table(top), ""]
    for name, field in sections:
        if name == "algorithm" or not _models(field.annotation):
            continue
        model = _models(field.annotation)[0]
        about = description(ExperimentConfig, name, field, name) or (model.__doc__ or "").strip().split("\n\n")[0]
        out += [f"## `{name}`", "", *([_cell(about), ""] if about else []), *table(rows(model, f"{name}.")), ""]
    out += ["## `algorithm`", "",
            "The method and its parameters: `algorithm.name` picks the method, and the other keys of the "
            "section are that method's (a key of another method is an error). "
            "[Methods](../algorithms.md) says how to write one.", ""]
    for method, params in ALGORITHM_PARAMS.items():
        doc = _cell((params.__doc__ or "").strip().split("\n\n")[0])
        out += [f"### `{method}`", "", doc, "", *table(rows(params, "algorithm.")), ""]
    out += policy_sections()
    return "\n".join(out).rstrip() + "\n"


def policy_sections() -> list[str]:
    """The options of each selection policy (``clients.selection``) and work policy (``train.work``),
    named like a method's: the section's name key picks the policy, the other keys are its own."""
    from algorithms.plugins import SELECTORS, WORK_POLICIES, selector_params, work_params

    out = []
    for section, key, registry, params_of, about in (
            ("clients.selection", "name", SELECTORS, selector_params,
             "The selection policy and its options: `clients.selection.name` picks the policy, the other keys are "
             "its own ([the toolbox](../toolbox.md), [plugins](../plugins.md))."),
            ("train.work", "policy", WORK_POLICIES, work_params,
             "The local-work policy and its options: `train.work.policy` picks the policy, the other keys are its "
             "own ([the toolbox](../toolbox.md)).")):
        out += [f"## `{section}` policies", "", about, ""]
        for name in registry.names(scan=False):
            params = params_of(name)
            own = [(k, f, t) for k, f, t in rows(params, f"{section}.") if k != f"{section}.{key}"]
            doc = _cell(first_line(registry.get(name)))
            out += [f"### `{name}`", "", doc, "", *(table(own) if own else ["No options."]), ""]
    return out


def first_line(obj) -> str:
    """The first paragraph of a policy's docstring (a class or a function)."""
    return (getattr(obj, "__doc__", None) or "").strip().split("\n\n")[0]


def on_files(files, config):
    """MkDocs hook: add the generated page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=page()))
    return files


if __name__ == "__main__":
    print(page(), end="")
