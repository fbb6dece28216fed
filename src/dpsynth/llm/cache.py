"""Persistent request cache: no generation is ever paid for twice.

Every result is written to SQLite the moment it arrives (WAL mode, one small
transaction each), keyed by model id + the full request including its seed.
Prompts only ever contain the task description and synthetic text, so the
cache holds nothing private. Like the `llm` tool's log, it is also a record of
every prompt and response for inspection.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Sequence

from dpsynth.llm.base import (
    GenerationRequest,
    GenerationResult,
    Generator,
    ResultCallback,
    Usage,
)


class RequestCache:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS generations (key TEXT PRIMARY KEY, model TEXT, prompt TEXT, text TEXT, "
            "prompt_tokens INTEGER, completion_tokens INTEGER, created REAL, writes INTEGER DEFAULT 1)"
        )

    def get_many(self, keys: Sequence[str]) -> dict[str, GenerationResult]:
        found: dict[str, GenerationResult] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                rows = self._db.execute(
                    f"SELECT key, text, prompt_tokens, completion_tokens FROM generations "
                    f"WHERE key IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
                for key, text, pt, ct in rows:
                    found[key] = GenerationResult(text, pt, ct, cached=True)
        return found

    def put(self, key: str, model: str, prompt: str, result: GenerationResult) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO generations VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT(key) DO UPDATE SET "
                "text=excluded.text, writes=writes+1",
                (key, model, prompt, result.text, result.prompt_tokens, result.completion_tokens, time.time()),
            )

    def close(self) -> None:
        self._db.close()


class CachedGenerator:
    """Wraps a backend: serves hits from the cache, sends only misses, records usage."""

    def __init__(self, inner: Generator, cache: RequestCache, usage: Usage | None = None) -> None:
        self.inner = inner
        self.cache = cache
        self.usage = usage or Usage()
        self.name = inner.name

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def chat(self) -> bool:
        return self.inner.chat

    def generate(
        self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None = None
    ) -> list[GenerationResult]:
        keys = [r.cache_key(self.model_id) for r in requests]
        hits = self.cache.get_many(keys)
        results: list[GenerationResult | None] = [hits.get(k) for k in keys]
        for i, result in enumerate(results):
            if result is not None:
                self.usage.add(result)
                if on_result:
                    on_result(i, result)
        missing = [i for i, r in enumerate(results) if r is None]

        def store(j: int, result: GenerationResult) -> None:
            i = missing[j]
            self.cache.put(keys[i], self.model_id, requests[i].prompt_text(), result)
            results[i] = result
            self.usage.add(result)
            if on_result:
                on_result(i, result)

        if missing:
            start = time.perf_counter()
            self.inner.generate([requests[i] for i in missing], on_result=store)
            self.usage.generation_seconds += time.perf_counter() - start
        return [r for r in results if r is not None]
