"""Generator backends by `kind`: built-ins and plugins register a factory; runs build from config.

A factory takes the generator's config entry and returns a `Generator`; each imports its
heavy library lazily. Plugins (and tests, which register a fake model the same way as
simonw/llm's tests register a mock model) call `register_backend`, or expose a function in
the `dpsynth.backends` entry-point group that registers theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from dpsynth.config import GeneratorConfig
from dpsynth.errors import DpsynthError
from dpsynth.hub import check_hub_model
from dpsynth.llm.base import Generator

Factory = Callable[[GeneratorConfig], Generator]
_BACKENDS: dict[str, Factory] = {}
_plugins_loaded = False


def register_backend(kind: str) -> Callable[[Factory], Factory]:
    def add(factory: Factory) -> Factory:
        _BACKENDS[kind] = factory
        return factory

    return add


def backend_names() -> list[str]:
    global _plugins_loaded
    if not _plugins_loaded:
        for ep in entry_points(group="dpsynth.backends"):
            ep.load()
        _plugins_loaded = True
    return sorted(_BACKENDS)


def build_generator(cfg: GeneratorConfig) -> Generator:
    if cfg.kind not in backend_names():
        raise DpsynthError(f"generator {cfg.display_name}: unknown backend '{cfg.kind}'; "
                           f"choose one of {', '.join(backend_names())}")
    return _BACKENDS[cfg.kind](cfg)


def check_generator(cfg: GeneratorConfig) -> None:
    """What can be found wrong with a generator without building it (no model loads, no process starts, nothing is
    asked): a model file that does not exist, a hosted API's key missing from the environment. A run checks this
    before its directory exists, and `--dry-run` with it."""
    import os

    from dpsynth.llm.local_models import LOCAL_MODELS, resolve_local_model

    if cfg.kind == "llama_cpp" and cfg.model not in LOCAL_MODELS:
        resolve_local_model(cfg.model)
    if cfg.kind == "transformers" and cfg.model not in LOCAL_MODELS and not cfg.model.endswith(".gguf"):
        check_hub_model(cfg.model, f"generator {cfg.display_name}: transformers model",
                        "give a local model folder, a known local model or a .gguf file")
    if cfg.kind == "openai" and cfg.base_url is None and os.environ.get(cfg.api_key_env) is None:
        raise DpsynthError(f"generator {cfg.display_name}: environment variable {cfg.api_key_env} is not set; export "
                           "your API key there (or give base_url for a server that needs none)")


@register_backend("llama_cpp")
def _llama_cpp(cfg: GeneratorConfig) -> Generator:
    from dpsynth.llm.llama_cpp_backend import LlamaCppGenerator
    from dpsynth.llm.local_models import resolve_local_model

    path, known_chat = resolve_local_model(cfg.model)
    chat = cfg.chat if cfg.chat is not None else known_chat
    return LlamaCppGenerator(path, name=cfg.display_name, chat=chat, n_ctx=cfg.n_ctx, n_threads=cfg.threads)


@register_backend("openai")
def _openai(cfg: GeneratorConfig) -> Generator:
    from dpsynth.llm.openai_backend import OpenAICompatGenerator
    from dpsynth.llm.spend import RatePacer, SpendLimits

    limits = SpendLimits.of(cfg)
    return OpenAICompatGenerator(
        cfg.model,
        base_url=cfg.base_url,
        api_key_env=cfg.api_key_env,
        name=cfg.display_name,
        chat=True if cfg.chat is None else cfg.chat,
        max_concurrency=cfg.max_concurrency,
        max_retries=cfg.max_retries,
        timeout=cfg.timeout,
        pacer=RatePacer(limits) if limits.paced else None,
        processes=cfg.processes,
        transport=cfg.transport,
    )


@register_backend("transformers")
def _transformers(cfg: GeneratorConfig) -> Generator:
    from dpsynth.llm.local_models import LOCAL_MODELS, resolve_local_model
    from dpsynth.llm.transformers_backend import TransformersGenerator

    model = str(resolve_local_model(cfg.model)[0]) if cfg.model in LOCAL_MODELS else cfg.model
    return TransformersGenerator(model, name=cfg.display_name, chat=cfg.chat)
