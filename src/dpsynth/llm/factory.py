"""Build a generator backend from its config entry (imports each backend lazily)."""

from __future__ import annotations

from dpsynth.llm.base import Generator
from dpsynth.runs.config import GeneratorConfig


def build_generator(cfg: GeneratorConfig) -> Generator:
    if cfg.kind == "llama_cpp":
        from dpsynth.llm.llama_cpp_backend import LlamaCppGenerator
        from dpsynth.llm.local_models import resolve_local_model

        path, known_chat = resolve_local_model(cfg.model)
        chat = cfg.chat if cfg.chat is not None else known_chat
        return LlamaCppGenerator(path, name=cfg.display_name, chat=chat, n_ctx=cfg.n_ctx)
    if cfg.kind == "openai":
        from dpsynth.llm.openai_backend import OpenAICompatGenerator

        return OpenAICompatGenerator(
            cfg.model,
            base_url=cfg.base_url,
            api_key_env=cfg.api_key_env,
            name=cfg.display_name,
            chat=True if cfg.chat is None else cfg.chat,
            max_concurrency=cfg.max_concurrency,
            max_retries=cfg.max_retries,
            timeout=cfg.timeout,
        )
    from dpsynth.llm.local_models import LOCAL_MODELS, resolve_local_model
    from dpsynth.llm.transformers_backend import TransformersGenerator

    model = str(resolve_local_model(cfg.model)[0]) if cfg.model in LOCAL_MODELS else cfg.model
    return TransformersGenerator(model, name=cfg.display_name, chat=cfg.chat)
