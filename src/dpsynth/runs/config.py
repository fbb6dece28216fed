"""Read, validate and write run configs: shared sections (`dpsynth.config`) plus method sections.

Each method section (`wasp:`, `augpe:`, ...) is validated by the registered method's own
options model; the run's method gets its defaults when its section is absent, and any other
top-level key that is not a registered method is an error. A section for another method is refused in a
config a user gives (its settings would be silently ignored: `method: wasp` beside an `augpe: {n: 12}` section
planned wasp's default 6,000 requests); configs saved by a run or assembled by a bench drop it instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ValidationError

from dpsynth.config import RunConfig
from dpsynth.data.loaders import SUPPORTED as DATA_FORMATS
from dpsynth.errors import DpsynthError
from dpsynth.llm.registry import backend_names
from dpsynth.methods.registry import method_class, method_names
from dpsynth.runs.options_reference import unknown_option, unknown_section

OtherMethods = Literal["refuse", "drop"]


def load_config(path: Path, other_methods: OtherMethods = "refuse") -> RunConfig:
    return parse_config(read_config(path), str(path), other_methods=other_methods)


def read_config(path: Path) -> dict:
    """A config file's YAML mapping, unvalidated (one-line errors for a missing file, bad YAML, or a data file
    given in its place: `dpsynth run notes.csv` said "not valid YAML (mapping values are not allowed here)")."""
    if Path(path).suffix.lower() in DATA_FORMATS and Path(path).is_file():
        raise DpsynthError(f"{path}: a data file, not a run config; write a YAML config whose data.private names it "
                           "(README, \"Use it on your data\"), and give that config")
    raw = read_yaml_mapping(path, "run config", "sections (data, generators, ...)")
    if {"base", "variants"} <= set(raw):  # it said "generators: Field required"
        raise DpsynthError(f"{path} is a bench config (base, variants): run or plan its cells with dpsynth bench, "
                           "or give a run config")
    return raw


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (YAML keeps the last one silently: a second
    `privacy:` section would replace the first without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                continue  # a complex key: left to the loader's own rules
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"'{key}' is written twice in one mapping "
                                                        f"(line {key_node.start_mark.line + 1})", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml_mapping(path: Path, what: str, holding: str) -> dict:
    """The YAML mapping in the file at `path` (a `what`, a mapping of `holding`), with one-line errors for a
    folder, a missing file, text that is not UTF-8, YAML that does not parse, or YAML that is not a mapping."""
    path = Path(path)
    if path.is_dir():
        raise DpsynthError(f"{path}: a folder; give the {what} file (YAML) itself")
    if not path.is_file():
        raise DpsynthError(f"{path}: {what} file not found")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}  # noqa: S506 - a SafeLoader
    except UnicodeDecodeError as err:
        raise DpsynthError(f"{path}: not UTF-8 text (byte {err.start}); save the {what} as UTF-8 YAML") from err
    except yaml.YAMLError as err:
        raise DpsynthError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(raw, dict):
        raise DpsynthError(f"{path}: a {what} is a YAML mapping of {holding}")
    return raw


def parse_config(raw: dict, where: str = "config", *, other_methods: OtherMethods = "refuse") -> RunConfig:
    """`other_methods`: "refuse" a section for a method other than the run's (a user's config), or "drop" it (a
    run directory's saved config: runs before 2026-11-27 saved every section a bench's base held)."""
    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as err:
        raise DpsynthError(f"{where}: {first_error(err, RunConfig)}") from err
    names = method_names()
    if config.method not in names:
        raise DpsynthError(f"{where}: method: unknown method '{config.method}'; choose one of {', '.join(names)}")
    extra = config.__pydantic_extra__ if config.__pydantic_extra__ is not None else {}
    for key in list(extra):
        if key not in names:
            raise DpsynthError(f"{where}: {key}: {unknown_section(key)}")
        if key != config.method and other_methods == "drop":
            del extra[key]
        elif key != config.method:
            raise DpsynthError(f"{where}: {key}: a section for another method (this run's method is "
                               f"{config.method}), so its settings would be ignored; rename it to {config.method}: "
                               f"or remove it")
    extra.setdefault(config.method, {})
    for key in list(extra):
        cls = method_class(key)
        try:
            extra[key] = cls.Options.model_validate(extra[key] or {})
        except ValidationError as err:
            raise DpsynthError(f"{where}: {key}{_nested(err, cls.Options, key)}") from err
    known = backend_names()
    for i, g in enumerate(config.generators):
        if g.kind not in known:
            raise DpsynthError(f"{where}: generators.{i}.kind: unknown backend '{g.kind}'; "
                               f"choose one of {', '.join(known)}")
    try:
        method_class(config.method).check_config(config)
    except ValueError as err:
        raise DpsynthError(f"{where}: {err}") from err
    return config


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _nested(err: ValidationError, model: type[BaseModel], section: str) -> str:
    """A section's first error placed under the section's name: `.field: why`, or `: why` for the section itself."""
    located = bool(err.errors()[0]["loc"])
    return f"{'.' if located else ': '}{first_error(err, model, section)}"


def first_error(err: ValidationError, model: type[BaseModel] | None = None, section: str | None = None) -> str:
    """A validation error as one line: where (dotted path) and what, or only what for the whole config or section
    (a check across its fields). With the run config's `model` (and the `section` it was validated for), an
    unknown key names the nearest known one and `dpsynth options`."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "model_type":  # "... or instance of RelabelConfig": the class is no user's word
        msg = "should be a mapping of its options (key: value lines under it)"
    elif first["type"] == "path_type":  # "... for <class 'pathlib.Path'>"
        msg = f"should be a file or folder path (got {first['input']!r})"
    if first["type"] == "extra_forbidden" and model is not None:
        msg = unknown_option(model, tuple(first["loc"]), section) or msg
    return f"{loc}: {msg}" if loc else msg
