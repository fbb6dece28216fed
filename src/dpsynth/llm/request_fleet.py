"""One API generator's requests sent from several processes (`processes:` in a generator's config).

Why: one Python process spends about 1.4 ms of CPU on each request (the OpenAI SDK building it, httpx, parsing
the answer) under one interpreter lock, a ceiling of roughly 600-700 requests a second whatever the concurrency
(measured on a 16-core machine: docs/scale.md). An endpoint with many replicas answers faster than that, so at the
WASP paper's scale the client, not the server, set the pace. Here the requests go to `processes` worker processes,
each with its own client and its share of `max_concurrency` threads, under the same retry rules; the parent hands
out at most `max_concurrency` requests at a time (so that a failure stops the rest quickly), every answer comes
back as it arrives (the request cache keeps every paid-for answer), and the first request that gives up stops
the others from retrying, as in the one-process path.
"""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
import queue
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest, GenerationResult, ResultCallback

T = TypeVar("T")
POLL_SECONDS = 1.0  # how often the parent checks that its workers are alive while it waits for answers


@dataclass(frozen=True)
class _Answer:
    index: int
    worker: int
    retries: int  # the worker's retries so far (cumulative, so the parent can count them once)
    result: GenerationResult | None
    error: str | None  # one line, already explained; None when `result` arrived


def _explained(gen: Any, err: BaseException) -> str:
    explained = gen._explain(err)
    return str(explained) if isinstance(explained, DpsynthError) else f"{type(err).__name__}: {err}"


def _work(worker: int, settings: dict[str, Any], threads: int, inbox: Any, outbox: Any, failed: Any) -> None:
    """A worker process: take a request whenever one of its threads is free, answer each as it completes."""
    from dpsynth.llm.openai_backend import OpenAICompatGenerator

    gen = OpenAICompatGenerator(**settings, max_concurrency=threads)
    free = threading.Semaphore(threads)
    outbox.put(worker)  # ready: its imports and client are done

    def finish(index: int, future: Future) -> None:
        err = future.exception()
        if err is None:
            outbox.put(_Answer(index, worker, gen.retries, future.result(), None))
        else:
            outbox.put(_Answer(index, worker, gen.retries, None, _explained(gen, err)))
        free.release()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        while True:
            free.acquire()
            item = inbox.get()
            if item is None:
                return
            index, request = item
            if failed.is_set():  # another request gave up: answer without sending
                outbox.put(_Answer(index, worker, gen.retries, None, "cancelled"))
                free.release()
                continue
            pool.submit(gen._one, request, failed).add_done_callback(functools.partial(finish, index))


def _shut_down(inbox: Any, workers: list[Any]) -> None:
    for _ in workers:
        inbox.put(None)
    for w in workers:
        w.join(timeout=5)
        if w.is_alive():
            w.terminate()


class RequestFleet:
    """`processes` worker processes sending one generator's requests: started with the generator (so that their
    start-up counts as loading, not as generation), kept for its life, stopped when it is garbage-collected or
    the interpreter exits."""

    def __init__(self, settings: dict[str, Any], processes: int, concurrency: int, name: str) -> None:
        ctx = mp.get_context("spawn")  # not fork: the parent may hold threads (torch, the engine's)
        threads = max(1, math.ceil(concurrency / processes))
        self._limit = threads * processes
        self._name = name
        self._inbox, self._outbox, self._failed = ctx.Queue(), ctx.Queue(), ctx.Event()
        self._workers = [ctx.Process(target=_work, args=(w, settings, threads, self._inbox, self._outbox,
                                                           self._failed), daemon=True, name=f"{name}-requests-{w}")
                         for w in range(processes)]
        for w in self._workers:
            w.start()
        for _ in self._workers:
            self._next(int)
        self._seen = [0] * processes
        self.retries = 0
        weakref.finalize(self, _shut_down, self._inbox, self._workers)

    def generate(self, requests: Sequence[GenerationRequest],
                 on_result: ResultCallback | None = None) -> list[GenerationResult]:
        self._failed.clear()
        results: list[GenerationResult | None] = [None] * len(requests)
        todo = iter(enumerate(requests))
        in_flight, error = 0, None
        while True:
            while error is None and in_flight < self._limit and (item := next(todo, None)) is not None:
                self._inbox.put(item)
                in_flight += 1
            if in_flight == 0:
                break
            answer = self._next(_Answer)
            in_flight -= 1
            if answer.retries > self._seen[answer.worker]:
                self.retries += answer.retries - self._seen[answer.worker]
                self._seen[answer.worker] = answer.retries
            if answer.error is not None:
                if error is None:
                    error = answer.error
                    self._failed.set()
                continue
            results[answer.index] = answer.result
            if on_result and answer.result is not None:
                on_result(answer.index, answer.result)
        if error is not None:
            raise DpsynthError(error)
        return [r for r in results if r is not None]

    def _next(self, kind: type[T]) -> T:
        """The next message from the workers (a ready signal or an answer), checking that they are alive."""
        while True:
            try:
                message = self._outbox.get(timeout=POLL_SECONDS)
                assert isinstance(message, kind)
                return message
            except queue.Empty:
                dead = [w for w in self._workers if not w.is_alive()]
                if dead:
                    raise DpsynthError(
                        f"{self._name}: a request process exited (code {dead[0].exitcode}); the answers received are "
                        "cached, run again to resume") from None
