"""One API generator's requests sent from several processes (`processes:` in a generator's config).

Why: one Python process spends about 1 ms of CPU on each request (building it, httpx, parsing the answer; 1.4 ms
with the SDK's typed `create`, used before) under one interpreter lock, a ceiling of several hundred requests a
second whatever the concurrency (600-700 measured with `create` on a 16-core machine: docs/scale.md). An endpoint
with many replicas answers faster than that, so at the WASP paper's scale the client, not the server, set the pace.
Here the requests go to `processes` worker processes, each with its own client and its share of `max_concurrency`
threads, under the same retry rules; the parent hands out at most `max_concurrency` requests at a time (so that a
failure stops the rest quickly), every answer comes back as it arrives (the request cache keeps every paid-for
answer), and the first request that gives up stops the others from retrying. Several threads may share the fleet (a
run asks for replacements of dropped answers while its main batch is in flight): a request that gives up stops every
call in flight, and each of them reports that request's error, not "cancelled".
"""

from __future__ import annotations

import functools
import itertools
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
CANCELLED = "cancelled"  # a request not sent because another one gave up


@dataclass(frozen=True)
class _Answer:
    call: int  # which `generate` call sent the request
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

    def finish(call: int, index: int, future: Future) -> None:
        err = future.exception()
        if err is None:
            outbox.put(_Answer(call, index, worker, gen.retries, future.result(), None))
        else:
            outbox.put(_Answer(call, index, worker, gen.retries, None, _explained(gen, err)))
        free.release()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        while True:
            free.acquire()
            item = inbox.get()
            if item is None:
                return
            call, index, request = item
            if failed.is_set():  # another request gave up: answer without sending
                outbox.put(_Answer(call, index, worker, gen.retries, None, CANCELLED))
                free.release()
                continue
            pool.submit(gen._one, request, failed).add_done_callback(functools.partial(finish, call, index))


def _shut_down(inbox: Any, workers: list[Any]) -> None:
    for _ in workers:
        inbox.put(None)
    for w in workers:
        w.join(timeout=5)
        if w.is_alive():
            w.terminate()


class _Router:
    """The parent's reader of the workers' answers (its own thread): each answer frees its slot and goes to the
    `generate` call that sent it (dropped if that call has gone), the workers' retries are counted once, the
    first real error is kept for every call it stopped, and a dead worker (or any failure to read) becomes every
    call's error. It holds no reference to the fleet, so that the fleet can be garbage-collected."""

    def __init__(self, outbox: Any, workers: list[Any], slots: threading.BoundedSemaphore, name: str) -> None:
        self.outbox, self.workers, self.slots, self.name = outbox, workers, slots, name
        self.lock = threading.Lock()
        self.calls: dict[int, queue.SimpleQueue] = {}  # call id -> its answers
        self.seen = [0] * len(workers)
        self.retries = 0
        self.first_error: str | None = None  # the first request that gave up (not one cancelled because of it)
        self.broken: DpsynthError | None = None

    def next(self, kind: type[T]) -> T:
        """The next message from the workers (a ready signal or an answer), checking that they are alive."""
        while True:
            try:
                message = self.outbox.get(timeout=POLL_SECONDS)
                assert isinstance(message, kind)
                return message
            except queue.Empty:
                dead = [w for w in self.workers if not w.is_alive()]
                if dead:
                    raise DpsynthError(
                        f"{self.name}: a request process exited (code {dead[0].exitcode}); the answers received are "
                        "cached, run again to resume") from None

    def run(self) -> None:
        while True:
            try:
                answer = self.next(_Answer)
            except Exception as err:  # noqa: BLE001 - whatever stops the reading stops every call, with its reason
                with self.lock:
                    self.broken = err if isinstance(err, DpsynthError) else DpsynthError(
                        f"{self.name}: lost the request processes' answers ({type(err).__name__}: {err}); the "
                        "answers received are cached, run again to resume")
                return
            self.slots.release()
            with self.lock:
                if answer.retries > self.seen[answer.worker]:
                    self.retries += answer.retries - self.seen[answer.worker]
                    self.seen[answer.worker] = answer.retries
                if answer.error is not None and answer.error != CANCELLED and self.first_error is None:
                    self.first_error = answer.error
                caller = self.calls.get(answer.call)
            if caller is not None:
                caller.put(answer)


class RequestFleet:
    """`processes` worker processes sending one generator's requests: started with the generator (so that their
    start-up counts as loading, not as generation), kept for its life, stopped when it is garbage-collected or
    the interpreter exits. Several threads may call `generate` at once (a run asks for replacements of dropped
    answers while its main batch is in flight): together they keep at most `max_concurrency` requests out."""

    def __init__(self, settings: dict[str, Any], processes: int, concurrency: int, name: str) -> None:
        ctx = mp.get_context("spawn")  # not fork: the parent may hold threads (torch, the engine's)
        threads = max(1, math.ceil(concurrency / processes))
        self._slots = threading.BoundedSemaphore(threads * processes)
        self._inbox, outbox, self._failed = ctx.Queue(), ctx.Queue(), ctx.Event()
        workers = [ctx.Process(target=_work, args=(w, settings, threads, self._inbox, outbox, self._failed),
                               daemon=True, name=f"{name}-requests-{w}") for w in range(processes)]
        self._workers = workers
        for w in workers:
            w.start()
        self._router = _Router(outbox, workers, self._slots, name)
        for _ in workers:
            self._router.next(int)
        self._call_ids = itertools.count()
        threading.Thread(target=self._router.run, name=f"{name}-answers", daemon=True).start()
        weakref.finalize(self, _shut_down, self._inbox, workers)

    @property
    def retries(self) -> int:
        """Requests the workers sent again, over the fleet's life."""
        return self._router.retries

    def generate(self, requests: Sequence[GenerationRequest],
                 on_result: ResultCallback | None = None) -> list[GenerationResult]:
        router = self._router
        answers: queue.SimpleQueue = queue.SimpleQueue()
        with router.lock:
            if router.broken is not None:
                raise router.broken
            if not router.calls:  # a failure stops the calls in flight with it, not the next ones
                self._failed.clear()
                router.first_error = None
            call = next(self._call_ids)
            router.calls[call] = answers
        try:
            return self._collect(call, answers, requests, on_result)
        finally:
            with router.lock:
                del router.calls[call]

    def _collect(self, call: int, answers: queue.SimpleQueue, requests: Sequence[GenerationRequest],
                 on_result: ResultCallback | None) -> list[GenerationResult]:
        results: list[GenerationResult | None] = [None] * len(requests)
        todo = list(enumerate(requests))[::-1]
        in_flight, error = 0, None
        while True:
            while error is None and todo:
                # a free slot for the next request; waited for only while this call has no answer to wait for
                if not self._slots.acquire(timeout=POLL_SECONDS if in_flight == 0 else 0):
                    if in_flight:
                        break
                    self._check_router()
                    continue
                index, request = todo.pop()
                self._inbox.put((call, index, request))
                in_flight += 1
            if in_flight == 0:
                break
            try:
                answer = answers.get(timeout=POLL_SECONDS)
            except queue.Empty:
                self._check_router()
                continue
            in_flight -= 1
            if answer.error is not None:
                if error is None:
                    error = answer.error
                    self._failed.set()
                continue
            results[answer.index] = answer.result
            if on_result and answer.result is not None:
                on_result(answer.index, answer.result)
        if error is not None:
            raise DpsynthError((self._router.first_error or error) if error == CANCELLED else error)
        return [r for r in results if r is not None]

    def _check_router(self) -> None:
        if self._router.broken is not None:
            raise self._router.broken
