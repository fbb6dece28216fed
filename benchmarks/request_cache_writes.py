"""What storing an answer in the request cache costs the thread that receives it: queued for a writer thread (now)
against one commit per answer on the receiving thread (before).

    .venv/bin/python benchmarks/request_cache_writes.py                     # 100,000 rows, 20,000 answers
    .venv/bin/python benchmarks/request_cache_writes.py --rows 10000 --answers 2000 --rate 1500

Why it matters: with an API generator, the thread that receives answers (the SDK path's collecting loop, or the
`processes:` fleet's loop, which also sends the next request when an answer frees a slot) stores each answer in
the request cache before it goes on. At the WASP paper's scale a server answers 1,000-2,000 requests a second, so a
40-50 us commit per answer is time taken from sending (docs/scale.md). The benchmark fills a cache with `--rows`
rows (the issue's 10^5), then lets a backend deliver `--answers` answers through `CachedGenerator`, instantly and
then paced at `--rate` answers a second, in both modes. Per mode it prints the receiving thread's time per answer
(inside the result callback: storing plus the bookkeeping), the time per answer until every one is on disk (when
`generate` returns), and the ratio of the receiving costs. The baseline is the same `CachedGenerator` with its
writer swapped for one that commits each answer on the receiving thread with the SQL of the old `put`. The
receiving thread's time leaves out what the writer thread costs it by holding the interpreter lock on a busy
core; the time until everything is on disk includes it.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

from dpsynth.llm import cache as cache_module
from dpsynth.llm.base import GenerationRequest, GenerationResult
from dpsynth.llm.cache import CachedGenerator
from dpsynth.llm.request_store import RequestCache


class _CommitPerAnswer:
    """The baseline: the receiving thread commits each answer itself, as `RequestCache.put` did before the writer
    (one autocommit INSERT under a lock, on a connection with the cache's settings)."""

    def __init__(self, cache: RequestCache, model: str, name: str, payer: str | None) -> None:
        self._model = model  # `payer`: the old put recorded no payments
        self._db = sqlite3.connect(str(cache.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.Lock()

    def add(self, key: str, request: GenerationRequest, result: GenerationResult) -> None:
        row = (key, self._model, request.prompt_text(), result.text, result.prompt_tokens, result.completion_tokens,
               time.time())
        with self._lock:
            self._db.execute("INSERT INTO generations VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT(key) DO UPDATE SET "
                             "text=excluded.text, writes=writes+1", row)

    def close(self) -> None:
        self._db.close()


class _Arrivals:
    """A backend whose answers arrive on the calling thread at `rate` a second (0: as fast as it can deliver),
    timing the result callbacks: the receiving thread's cost."""

    name = "arrivals"
    model_id = "arrivals:1"
    chat = False

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.callback_seconds = 0.0

    def generate(self, requests, on_result=None):
        start = time.perf_counter()
        out = []
        for i, r in enumerate(requests):
            if self.rate:
                wait = start + i / self.rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            result = GenerationResult(f"a synthetic review answering {r.prompt}, about as long as one", 60, 40)
            out.append(result)
            if on_result:
                began = time.perf_counter()
                on_result(i, result)
                self.callback_seconds += time.perf_counter() - began
        return out


def run(cache: RequestCache, answers: int, rate: float, offset: int) -> tuple[float, float]:
    """(us per answer on the receiving thread, us per answer until all are on disk)."""
    backend = _Arrivals(rate)
    gen = CachedGenerator(backend, cache)
    requests = [GenerationRequest(prompt=f"Write a movie review, number {offset + i}.", seed=offset + i)
                for i in range(answers)]
    start = time.perf_counter()
    gen.generate(requests)
    total = time.perf_counter() - start
    return backend.callback_seconds / answers * 1e6, total / answers * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000, help="rows in the cache before the answers arrive")
    parser.add_argument("--answers", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=1500.0, help="answers a second in the paced run")
    args = parser.parse_args()

    path = Path(tempfile.mkdtemp(prefix="cache-writes-")) / "requests.sqlite"
    cache = RequestCache(path)
    filler = GenerationResult("an earlier answer of about the same length as the ones that arrive now", 60, 40)
    for start in range(0, args.rows, 5_000):
        cache.put_many([(f"earlier-{i}", "arrivals:1", f"earlier prompt {i}", filler)
                        for i in range(start, min(args.rows, start + 5_000))])
    print(f"request cache with {args.rows} rows; {args.answers} answers per run")
    print("| arrivals | storing | receiving thread us/answer | on disk us/answer | receiving vs baseline |")
    print("|---|---|---|---|---|")
    queued_writer = cache_module.CacheWriter
    offset = 0
    for rate in (0.0, args.rate):
        figures = {}
        for mode, writer in (("one commit per answer (before)", _CommitPerAnswer), ("queued (now)", queued_writer)):
            cache_module.CacheWriter = writer  # type: ignore[misc,assignment]
            figures[mode] = run(cache, args.answers, rate, offset)
            offset += args.answers
        cache_module.CacheWriter = queued_writer  # type: ignore[misc]
        baseline = figures["one commit per answer (before)"][0]
        arrivals = "as fast as possible" if not rate else f"{rate:.0f} a second"
        for mode, (receiving, on_disk) in figures.items():
            print(f"| {arrivals} | {mode} | {receiving:.1f} | {on_disk:.1f} | {receiving / baseline:.2f}x |")
    cache.close()


if __name__ == "__main__":
    main()
