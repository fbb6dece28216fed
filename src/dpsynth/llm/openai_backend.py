"""Any OpenAI-compatible endpoint: OpenAI, vLLM, llama.cpp server, Ollama.

Requests of a batch run concurrently (a thread pool of `max_concurrency`).
Timeouts, 429 and 5xx answers are retried with exponential backoff and jitter
by the official client (`max_retries`); what still fails becomes one clear
error, and every result that did arrive has already been handed to the cache.
The API key is read from the environment variable named in the config, never
from a file in the project.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Sequence

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest, GenerationResult, ResultCallback


class OpenAICompatGenerator:
    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        name: str | None = None,
        chat: bool = True,
        max_concurrency: int = 4,
        max_retries: int = 5,
        timeout: float = 120.0,
    ) -> None:
        try:
            import openai
        except ImportError as err:
            raise DpsynthError("the OpenAI-compatible backend needs openai: pip install 'dpsynth[openai]'") from err
        key = os.environ.get(api_key_env)
        if key is None and base_url is None:
            raise DpsynthError(f"environment variable {api_key_env} is not set; export your API key there")
        self._openai = openai
        self._client = openai.OpenAI(
            api_key=key or "not-needed", base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        self._model = model
        self._base_url = base_url or "https://api.openai.com/v1"
        self.name = name or model
        self._chat = chat
        self._max_concurrency = max_concurrency

    @property
    def model_id(self) -> str:
        return f"openai:{self._base_url}:{self._model}"

    @property
    def chat(self) -> bool:
        return self._chat

    def generate(
        self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None = None
    ) -> list[GenerationResult]:
        results: list[GenerationResult | None] = [None] * len(requests)
        error: BaseException | None = None
        with ThreadPoolExecutor(max_workers=self._max_concurrency) as pool:
            futures = {pool.submit(self._one, r): i for i, r in enumerate(requests)}
            for future in as_completed(futures):
                if future.cancelled():
                    continue
                if future.exception() is not None:
                    # Stop sending new requests, but keep (and cache) those already in flight.
                    error = error or future.exception()
                    for other in futures:
                        other.cancel()
                    continue
                i = futures[future]
                results[i] = future.result()
                if on_result:
                    on_result(i, results[i])
        if error is not None:
            raise self._explain(error) from error
        return [r for r in results if r is not None]

    def _one(self, request: GenerationRequest) -> GenerationResult:
        params: dict[str, Any] = dict(
            model=self._model,
            max_tokens=request.max_tokens,  # llama.cpp's server ignores max_completion_tokens
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
        )
        if request.stop:
            params["stop"] = list(request.stop)
        if request.messages is not None:
            out = self._client.chat.completions.create(
                messages=[{"role": role, "content": content} for role, content in request.messages], **params
            )
            text = out.choices[0].message.content or ""
        else:
            out = self._client.completions.create(prompt=request.prompt, **params)
            text = out.choices[0].text
        usage = out.usage
        return GenerationResult(
            text, usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0
        )

    def _explain(self, err: BaseException) -> BaseException:
        o = self._openai
        where = f"{self._base_url} (model {self._model})"
        if isinstance(err, o.AuthenticationError):
            return DpsynthError(f"{where}: API key rejected; check the key in the environment")
        if isinstance(err, o.NotFoundError):
            return DpsynthError(f"{where}: model or endpoint not found; check model and base_url")
        if isinstance(err, o.APIConnectionError):
            return DpsynthError(f"{where}: unreachable after retries ({err}); check base_url and that the server runs")
        if isinstance(err, o.APIStatusError):
            return DpsynthError(f"{where}: request failed after retries with HTTP {err.status_code}")
        return err
