"""The method registry: methods register themselves; the CLI, budget, bench and config read it.

Built-in methods are the modules of `dpsynth.methods` that call `@register` (found by
walking the package, so adding one touches only its own module); other packages can add
methods through the `dpsynth.methods` entry-point group, as simonw/llm's plugins add models.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, TypeVar

from dpsynth.errors import DpsynthError

if TYPE_CHECKING:
    from dpsynth.methods.base import Method

M = TypeVar("M", bound="type[Method]")
_METHODS: dict[str, type[Method]] = {}
_loaded = False


def register(cls: M) -> M:
    """Class decorator: make a method available by its `name`."""
    existing = _METHODS.get(cls.name)
    if existing is not None and existing is not cls:
        raise DpsynthError(f"two methods are named '{cls.name}': {existing.__module__} and {cls.__module__}")
    _METHODS[cls.name] = cls
    return cls


def _load() -> None:
    global _loaded
    if _loaded:
        return
    import dpsynth.methods as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    for ep in entry_points(group="dpsynth.methods"):
        ep.load()
    _loaded = True


def method_names() -> list[str]:
    _load()
    return sorted(_METHODS)


def method_class(name: str) -> type[Method]:
    _load()
    if name not in _METHODS:
        raise DpsynthError(f"unknown method '{name}'; choose one of {', '.join(sorted(_METHODS))}")
    return _METHODS[name]
