"""Generation methods; each supplies a release plan, a state and one step per iteration."""

from __future__ import annotations

from typing import Any

from dpsynth.errors import DpsynthError


def method_for(name: str) -> Any:
    from dpsynth.algorithms.augpe import AugPEMethod
    from dpsynth.algorithms.fusegen import FuseGenMethod
    from dpsynth.algorithms.wasp import WaspMethod

    methods = {"wasp": WaspMethod, "augpe": AugPEMethod, "fusegen": FuseGenMethod}
    if name not in methods:
        raise DpsynthError(f"unknown method '{name}'; choose one of {', '.join(methods)}")
    return methods[name]()
