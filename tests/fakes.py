"""A fake generator registered through the real backend registry (as simonw/llm's tests register a mock
model), so engine and CLI tests run without GGUF files. The end-to-end tests use the real local models."""

from __future__ import annotations

import hashlib
from typing import Sequence

from dpsynth.config import GeneratorConfig
from dpsynth.llm.base import GenerationRequest, GenerationResult, ResultCallback
from dpsynth.llm.registry import register_backend

WORDS = ("quiet bright film plot actor scene story music ending moment dialogue camera pacing humour "
         "tension character warm dull clever slow sharp tender messy bold").split()


class FakeGenerator:
    """Deterministic texts from each request's seed and prompt; counts the requests it answers."""

    calls: list[GenerationRequest] = []
    fail_after: int | None = None  # raise after answering this many requests (a crash mid-run)

    def __init__(self, cfg: GeneratorConfig) -> None:
        self.name = cfg.display_name
        self._chat = True if cfg.chat is None else cfg.chat

    @property
    def model_id(self) -> str:
        return f"fake:{self.name}"

    @property
    def chat(self) -> bool:
        return self._chat

    def generate(self, requests: Sequence[GenerationRequest],
                 on_result: ResultCallback | None = None) -> list[GenerationResult]:
        out = []
        for i, r in enumerate(requests):
            if FakeGenerator.fail_after is not None and len(FakeGenerator.calls) >= FakeGenerator.fail_after:
                raise KeyboardInterrupt("fake crash")
            FakeGenerator.calls.append(r)
            digest = hashlib.sha256(f"{self.name}:{r.seed}:{r.prompt_text()}".encode()).digest()
            text = " ".join(WORDS[b % len(WORDS)] for b in digest[:8]) + "."
            result = GenerationResult(text, prompt_tokens=len(r.prompt_text().split()), completion_tokens=9)
            out.append(result)
            if on_result:
                on_result(i, result)
        return out


register_backend("fake")(FakeGenerator)
