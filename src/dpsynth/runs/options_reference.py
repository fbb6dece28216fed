"""Every option a run config accepts, read from the config models themselves.

`dpsynth options` and docs/config.md (with the bench config's sections, `dpsynth.bench.options`) are built from
here, so the reference lists exactly what the parser accepts, with the defaults it fills in: a new option, or a
changed default, shows up without anyone remembering to document it (tests/test_options_reference.py fails when
docs/config.md is stale or an option has no description).
"""

from __future__ import annotations

import difflib
import enum
import math
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dpsynth.config import RunConfig
from dpsynth.errors import DpsynthError
from dpsynth.methods.registry import method_class, method_names

TOP_LEVEL = "run"  # the section name of the config's top-level keys (method, embedder, device, ...)


@dataclass(frozen=True)
class Option:
    key: str  # the key inside its section, e.g. "output"
    kind: str  # what it accepts, e.g. "last | all | selected" or "int > 0"
    default: str  # as YAML would write it; "required" or "unset" where there is none
    description: str


@dataclass(frozen=True)
class SectionReference:
    name: str  # as written in the config ("augpe", "generators", "privacy"; TOP_LEVEL for the top-level keys)
    summary: str
    options: tuple[Option, ...]
    heading: str = ""  # its title in docs/config.md (default: the name as a YAML key)


def reference() -> list[SectionReference]:
    """The run config's sections in the order a config is usually written, then every registered method's."""
    top, nested = _fields(RunConfig)
    out = [SectionReference(TOP_LEVEL, "Top-level keys of a run config.", tuple(top))]
    for key, model in nested:
        summary = _summary(model) + (" Required: a list of at least one generator." if key == "generators" else "")
        out.append(SectionReference(key, summary, tuple(_fields(model)[0])))
    for name in method_names():
        options = method_class(name).Options
        shared = set(options.__mro__[1].model_fields) if issubclass(options.__mro__[1], BaseModel) else set()
        own = sorted(_fields(options)[0], key=lambda o: o.key in shared)  # its own options first (stable sort)
        out.append(SectionReference(name, _summary(options), tuple(own)))
    return out


def section(name: str, sections: list[SectionReference] | None = None) -> SectionReference:
    """One section by its name (among `sections`, default the run config's); a one-line error naming them
    otherwise."""
    sections = reference() if sections is None else sections
    for s in sections:
        if s.name == name:
            return s
    raise DpsynthError(f"no config section '{name}'; sections: {', '.join(s.name for s in sections)}")


def model_section(name: str, model: type[BaseModel], heading: str = "") -> SectionReference:
    """A config model as one section; a field holding further models is listed as an option that points to the
    section of that name (`variants`: see bench.variants)."""
    options, nested = _fields(model)
    pointers = [Option(key, f"list: see {name}.{key}", "required" if model.model_fields[key].is_required()
                       else _default(model.model_fields[key]), _description(model, key)) for key, _ in nested]
    return SectionReference(name, _summary(model), tuple(options + pointers), heading)


def markdown(sections: list[SectionReference], title: str, intro: str) -> str:
    """A reference page: every section as a table."""
    lines = [f"# {title}", "", intro, ""]
    for s in sections:
        heading = s.heading or ("Top-level keys" if s.name == TOP_LEVEL else f"`{s.name}:`")
        lines += [f"## {heading}", "", s.summary, "", "| key | accepts | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{o.key}` | {_cell(o.kind)} | {_cell(o.default)} | {_cell(o.description)} |" for o in s.options]
        lines.append("")
    return "\n".join(lines)


def _fields(model: type[BaseModel]) -> tuple[list[Option], list[tuple[str, type[BaseModel]]]]:
    """The model's plain options, and its fields that are sections of their own (nested models)."""
    options: list[Option] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for key, field in model.model_fields.items():
        sub = _nested_model(field.annotation)
        if sub is not None:
            nested.append((key, sub))
            continue
        kind = _kind(field.annotation, field.metadata)
        if _nullable(field.annotation) and not field.is_required() and field.get_default() is not None:
            kind += " | null"  # null turns on a default off (e.g. a bench's baseline: none)
        options.append(Option(key, kind, _default(field), _description(model, key)))
    return options, nested


def unknown_option(model: type[BaseModel], path: tuple[str | int, ...], section: str | None = None) -> str | None:
    """What to say about an unknown key at `path` of `model` (a misspelt option is the commonest config error):
    the nearest known key, and where every key is listed. None when `path` does not lead through `model`."""
    parent = model
    for part in path[:-1]:
        if isinstance(part, int):  # an entry of a list section (generators.0.modle)
            continue
        field = parent.model_fields.get(part)
        sub = None if field is None else _nested_model(field.annotation)
        if sub is None:
            return None
        parent = sub
    key = str(path[-1])
    section = section or next((p for p in path[:-1] if isinstance(p, str)), TOP_LEVEL)
    homes = [s.name for s in reference() if s.name != section and any(o.key == key for o in s.options)]
    if homes:  # a real option, in the wrong section (wasp: {epsilon: 4}, a generator's max_tokens)
        where = "a method's section" if set(homes) <= set(method_names()) else ", ".join(f"{h}:" for h in homes)
        return f"unknown option here ({key} is an option of {where}; `dpsynth options {section}` lists this one's)"
    near = difflib.get_close_matches(key, list(parent.model_fields), n=1, cutoff=0.6)
    hint = f"did you mean {near[0]}? " if near else ""
    return f"unknown option ({hint}`dpsynth options {section}` lists them)"


def unknown_section(key: str) -> str:
    """What to say about an unknown top-level key: the nearest section or key, and where every one is listed."""
    known = [*RunConfig.model_fields, *method_names()]
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]}? " if near else ""
    return (f"unknown section ({hint}method sections are: {', '.join(method_names())}; `dpsynth options` lists "
            "every section)")


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The config model a field holds (alone, optional or as a list's items), if any."""
    candidates = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType, list) else (annotation,)
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def _description(model: type[BaseModel], key: str) -> str:
    """The field's description, or the nearest base class's when a method only changes the default (e.g. a
    method's own max_tokens)."""
    for cls in model.__mro__:
        if isinstance(cls, type) and issubclass(cls, BaseModel) and key in cls.model_fields:
            text = cls.model_fields[key].description
            if text:
                return text
    return ""


def _summary(model: type[BaseModel]) -> str:
    doc = (model.__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


_NAMES = {int: "int", float: "float", str: "text", bool: "true | false", Path: "path", Any: "any"}


def _kind(annotation: Any, metadata: list[Any]) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _kind(args[0], [*args[1:], *metadata])
    if origin is Literal:
        base = " | ".join(str(a) for a in args)
    elif origin in (Union, types.UnionType):
        base = " | ".join(_kind(a, []) for a in args if a is not type(None))
    elif origin is list:
        base = f"list of {_kind(args[0], [])}"
    elif origin is dict:
        base = f"mapping of {_kind(args[0], [])} to {_kind(args[1], [])}"
    elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        base = " | ".join(str(m.value) for m in annotation)
    else:
        base = _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))
    bounds = ", ".join(b for b in (_bound(m) for m in metadata) if b)
    return f"{base} {bounds}" if bounds else base


def _nullable(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _bound(constraint: Any) -> str:
    """A constraint as text: annotated_types' Gt(0) from PositiveInt, or a Field's own bounds (ge=..., lt=...)."""
    found = [f"{symbol} {getattr(constraint, attr)}" for attr, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"),
             ("le", "<=")) if getattr(constraint, attr, None) is not None]
    shortest = getattr(constraint, "min_length", None) or 0
    if shortest == 1:  # an empty list, mapping or text is refused
        found.append("(not empty)")
    elif shortest > 1:
        found.append(f"(at least {shortest})")
    return ", ".join(found)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    return _yaml(field.get_default(call_default_factory=True))


def _yaml(value: Any) -> str:
    if value is None:
        return "unset"
    if value == "":
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float) and math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    if isinstance(value, float) and "e" in repr(value) and "." not in repr(value):
        return repr(value).replace("e", ".0e")  # YAML 1.1 (PyYAML) reads 1e-05 as text, 1.0e-05 as a number
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_yaml(v) for v in value)}]"
    if isinstance(value, dict) and not value:
        return "{}"
    return str(value)


def _cell(text: str) -> str:
    """Markdown table cell: a pipe inside would end the cell."""
    return text.replace("|", "\\|") if text else ""
