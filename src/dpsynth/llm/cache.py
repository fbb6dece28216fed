"""Persistent request cache: no generation is ever paid for twice.

Every result is written to SQLite the moment it arrives (WAL mode, one small
transaction each), keyed by model id + the full request including its seed.
Several processes may share one cache file, from its very first open on: WAL is
set once (it persists in the file), every connection waits up to
`BUSY_TIMEOUT` seconds for a lock, and what SQLite still refuses with
"database is locked" (it does not wait where waiting could deadlock, e.g. when
switching to WAL) is retried with jittered backoff, so no write is lost.
Prompts only ever contain the task description and synthetic text, so the
cache holds nothing private. Like the `llm` tool's log, it is also a record of
every prompt and response for inspection.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import (
    GenerationRequest,
    GenerationResult,
    Generator,
    ResultCallback,
    Usage,
)

BUSY_TIMEOUT = 30.0  # seconds SQLite waits for another process's lock
_T = TypeVar("_T")


def _is_locked(err: sqlite3.OperationalError) -> bool:
    message = str(err).lower()
    return "locked" in message or "busy" in message


class RequestCache:
    def __init__(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._lock = threading.Lock()
        self._db = self._retry(
            lambda: sqlite3.connect(str(path), timeout=BUSY_TIMEOUT, check_same_thread=False, isolation_level=None)
        )
        self._retry(self._set_wal)
        # In WAL mode NORMAL keeps every commit safe from a crash of the process (not of the machine's power)
        # without an fsync per result, which would serialise processes sharing the cache on the disk.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._retry(
            lambda: self._db.execute(
                "CREATE TABLE IF NOT EXISTS generations (key TEXT PRIMARY KEY, model TEXT, prompt TEXT, text TEXT, "
                "prompt_tokens INTEGER, completion_tokens INTEGER, created REAL, writes INTEGER DEFAULT 1)"
            )
        )

    def _set_wal(self) -> None:
        # WAL is a property of the file: only the first process to open it switches (an exclusive lock).
        if str(self._db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            self._db.execute("PRAGMA journal_mode=WAL")

    def _retry(self, action: Callable[[], _T]) -> _T:
        """Run `action`, retrying "database is locked" with jittered backoff for up to 2 x BUSY_TIMEOUT."""
        deadline = time.monotonic() + 2 * BUSY_TIMEOUT
        delay = 0.005
        while True:
            try:
                return action()
            except sqlite3.OperationalError as err:
                if not _is_locked(err):
                    raise
                if time.monotonic() > deadline:
                    raise DpsynthError(
                        f"request cache {self._path} stayed locked for over {2 * BUSY_TIMEOUT:.0f} s; another "
                        "process holds it: wait for it to finish, or set DPSYNTH_CACHE to another directory"
                    ) from err
                time.sleep(delay * (0.5 + random.random()))
                delay = min(2 * delay, 0.5)

    def get_many(self, keys: Sequence[str]) -> dict[str, GenerationResult]:
        found: dict[str, GenerationResult] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                query = (
                    f"SELECT key, text, prompt_tokens, completion_tokens FROM generations "
                    f"WHERE key IN ({','.join('?' * len(chunk))})"
                )
                rows = self._retry(lambda q=query, c=chunk: self._db.execute(q, c).fetchall())
                for key, text, pt, ct in rows:
                    found[key] = GenerationResult(text, pt, ct, cached=True)
        return found

    def put(self, key: str, model: str, prompt: str, result: GenerationResult) -> None:
        row = (key, model, prompt, result.text, result.prompt_tokens, result.completion_tokens, time.time())
        with self._lock:
            # One autocommit statement: a "locked" failure wrote nothing, so retrying it is exact.
            self._retry(
                lambda: self._db.execute(
                    "INSERT INTO generations VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT(key) DO UPDATE SET "
                    "text=excluded.text, writes=writes+1",
                    row,
                )
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

    def _backend_retries(self) -> int:
        """Retries the backend has made so far (API backends count them; others have none)."""
        count = getattr(self.inner, "retries", 0)
        return count if isinstance(count, int) else 0

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
            retries_before = self._backend_retries()
            try:
                self.inner.generate([requests[i] for i in missing], on_result=store)
            finally:
                self.usage.generation_seconds += time.perf_counter() - start
                self.usage.retries += self._backend_retries() - retries_before
        return [r for r in results if r is not None]
