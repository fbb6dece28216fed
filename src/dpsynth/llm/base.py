"""The generator interface every backend implements.

A request is either a chat (list of messages, for instruct models) or a raw
completion prompt (for base models). Backends take a *batch* of requests so
they can parallelise (HTTP) or reuse the prompt prefix cache (llama.cpp), and
report token usage so runs can count and price it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) pairs
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 0.95
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a request has either a prompt or messages")

    def cache_key(self, model_id: str) -> str:
        """Stable key: the same model, prompt and sampling settings (incl. seed) give the same key.

        The fields are listed by hand, not through `dataclasses.asdict` (which deep-copies every message: 20 us a
        key, paid for every request of a batch); the JSON is the same, so caches written before still hit."""
        payload = json.dumps({
            "model": model_id, "prompt": self.prompt,
            "messages": None if self.messages is None else [list(m) for m in self.messages],
            "max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
            "stop": list(self.stop), "seed": self.seed,
        }, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    def prompt_text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(content for _, content in self.messages or ())


@dataclass(frozen=True)
class GenerationResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False


ResultCallback = Callable[[int, GenerationResult], None]


class CallStopped(Exception):
    """A call, or a request, not sent (or not retried) because another one gave up (in flight beside it, or earlier
    in the same stop group: a run's blocks of one batch) or the run was interrupted: that other error is the one
    to report."""


class Generator(Protocol):
    """A pre-trained language model that writes texts for requests."""

    name: str

    @property
    def model_id(self) -> str:
        """Identifies the weights and backend, for the persistent cache."""
        ...

    @property
    def chat(self) -> bool:
        """True for instruct models (chat requests); False for base models (completion prompts)."""
        ...

    def generate(
        self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None = None
    ) -> list[GenerationResult]:
        """Results in request order; `on_result(i, result)` is called as each one completes.

        The callback is how paid-for work is saved at once (the persistent
        cache writes each result as it arrives), so a crash mid-batch loses
        at most the requests in flight and the answers not yet committed (a
        few milliseconds' worth, never more than the cache's MAX_UNWRITTEN,
        past which the receiver waits). A backend that states `max_concurrency`
        (an API generator) also takes `stop`, a run's event shared by the calls
        of one batch: it sets it when one of its requests gives up, and a call
        that starts once it is set raises `CallStopped` without sending.
        """
        ...


@dataclass
class Usage:
    """Token counts for one generator in a run; cached results cost nothing.

    `retries` counts API requests sent again after a rate limit, server error,
    lost connection or malformed answer (they are not billed as results).
    """

    requests: int = 0
    cached: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_seconds: float = 0.0
    retries: int = 0
    prices: dict[str, float] = field(default_factory=dict)

    def add(self, result: GenerationResult) -> None:
        self.requests += 1
        if result.cached:
            self.cached += 1
            return
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens

    @property
    def cost(self) -> float | None:
        if not self.prices:
            return None
        return (
            self.prompt_tokens * self.prices.get("prompt", 0.0)
            + self.completion_tokens * self.prices.get("completion", 0.0)
        )
