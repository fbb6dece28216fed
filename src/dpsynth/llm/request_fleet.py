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

The parent's CPU per answer matters (every answer of every generator passes through one interpreter lock), so an
answer costs it two thread wake-ups, not three, and no poll: the answers' reader blocks on its queue (a watcher
thread wakes it when a worker exits), a request is written by the thread that sends it (no feeder thread), and an
answer's slot goes with it to its call, which sends its next request without a semaphore (docs/scale.md: 0.7x the
fleet's CPU an answer).
"""

from __future__ import annotations

import functools
import itertools
import math
import multiprocessing as mp
import multiprocessing.connection
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


def _shut_down(inbox: Any, failed: Any, workers: list[Any]) -> None:
    failed.set()  # what is still queued is answered without being sent, so the live workers reach their stop
    for w in workers:
        if w.is_alive():  # the inbox's puts wait for a reader once its pipe is full: only a live worker is one
            inbox.put(None)
    for w in workers:
        w.join(timeout=5)
        if w.is_alive():
            w.terminate()


@dataclass(frozen=True)
class _Exited:
    """Put in the answers' queue by the parent's watcher when a worker process has exited: it wakes the router,
    which blocks on that queue (a read with a timeout costs a poll each answer, about a sixth of the parent's CPU
    for one)."""

    exitcode: int | None


class _Router:
    """The parent's reader of the workers' answers (its own thread): each answer goes to the `generate` call that
    sent it, with its slot (or is dropped, freeing its slot, if that call has gone), the workers' retries are
    counted once, the first real error is kept for every call it stopped, and a dead worker (or any failure to
    read) becomes every call's error. It holds no reference to the fleet, so that the fleet can be garbage-collected."""

    def __init__(self, outbox: Any, workers: list[Any], slots: threading.BoundedSemaphore, name: str) -> None:
        self.outbox, self.workers, self.slots, self.name = outbox, workers, slots, name
        self.lock = threading.Lock()
        self.calls: dict[int, queue.SimpleQueue] = {}  # call id -> its answers
        self.seen = [0] * len(workers)
        self.retries = 0
        self.first_error: str | None = None  # the first request that gave up (not one cancelled because of it)
        self.broken: DpsynthError | None = None

    def next(self, kind: type[T]) -> T:
        """The next message from the workers, checking every POLL_SECONDS that they are alive (used for their
        ready signals, before the watcher starts)."""
        while True:
            try:
                message = self.outbox.get(timeout=POLL_SECONDS)
                assert isinstance(message, kind)
                return message
            except queue.Empty:
                dead = [w for w in self.workers if not w.is_alive()]
                if dead:
                    raise self.exited(dead[0].exitcode) from None

    def exited(self, exitcode: int | None) -> DpsynthError:
        return DpsynthError(f"{self.name}: a request process exited (code {exitcode}); the answers received are "
                            "cached, run again to resume")

    def stop(self, err: BaseException) -> None:
        """Every call in flight and every later one fails with `err` (the first reason wins)."""
        with self.lock:
            if self.broken is None:
                self.broken = err if isinstance(err, DpsynthError) else DpsynthError(
                    f"{self.name}: lost the request processes' answers ({type(err).__name__}: {err}); the "
                    "answers received are cached, run again to resume")

    def watch(self) -> None:
        """The watcher's thread: waits (without polling) for a worker to exit, then fails the calls and wakes the
        router. The wake-up is a put into the answers' queue, which waits forever if the worker died holding
        that queue's lock; the calls, which poll `broken`, are told regardless."""
        exited = mp.connection.wait([w.sentinel for w in self.workers])
        worker = next(w for w in self.workers if w.sentinel in exited)
        worker.join()
        self.stop(self.exited(worker.exitcode))
        self.outbox.cancel_join_thread()  # that wait must not hold up the interpreter's exit either
        self.outbox.put(_Exited(worker.exitcode))

    def run(self) -> None:
        while True:
            try:
                answer = self.outbox.get()
                if isinstance(answer, _Exited):
                    raise self.exited(answer.exitcode)
                assert isinstance(answer, _Answer)
            except Exception as err:  # noqa: BLE001 - whatever stops the reading stops every call, with its reason
                self.stop(err)
                return
            with self.lock:
                if answer.retries > self.seen[answer.worker]:
                    self.retries += answer.retries - self.seen[answer.worker]
                    self.seen[answer.worker] = answer.retries
                if answer.error is not None and answer.error != CANCELLED and self.first_error is None:
                    self.first_error = answer.error
                caller = self.calls.get(answer.call)
                if caller is None:
                    self.slots.release()
                else:  # under the lock: a call that ends gives back the slots of the answers left in its queue
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
        # The requests go out through a SimpleQueue, written by the calling thread (a Queue's feeder thread costs
        # the parent a thread switch each request); the answers come back through a Queue, so that a worker's
        # thread never waits for the parent to read.
        self._inbox, outbox, self._failed = ctx.SimpleQueue(), ctx.Queue(), ctx.Event()
        workers = [ctx.Process(target=_work, args=(w, settings, threads, self._inbox, outbox, self._failed),
                               daemon=True, name=f"{name}-requests-{w}") for w in range(processes)]
        self._workers = workers
        for w in workers:
            w.start()
        self._router = _Router(outbox, workers, self._slots, name)
        for _ in workers:
            self._router.next(int)
        self._call_ids = itertools.count()
        self._waiting, self._waiting_lock = 0, threading.Lock()  # calls waiting for a slot
        threading.Thread(target=self._router.run, name=f"{name}-answers", daemon=True).start()
        threading.Thread(target=self._router.watch, name=f"{name}-watcher", daemon=True).start()
        weakref.finalize(self, _shut_down, self._inbox, self._failed, workers)

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
            while not answers.empty():  # answers that came after the call stopped reading: their slots
                answers.get()
                self._slots.release()

    def _collect(self, call: int, answers: queue.SimpleQueue, requests: Sequence[GenerationRequest],
                 on_result: ResultCallback | None) -> list[GenerationResult]:
        """Send and collect one call's requests. Each answer comes with its slot, which the call uses for its next
        request (no semaphore for it, about a tenth of the fleet's CPU an answer) unless another call is waiting
        for one: then the freed slots go to the semaphore, where the waiting call takes them."""
        results: list[GenerationResult | None] = [None] * len(requests)
        todo = list(enumerate(requests))[::-1]
        in_flight, owned, error = 0, 0, None
        try:
            while True:
                while error is None and todo:
                    if owned and self._waiting:
                        self._give_back(owned)
                        owned = 0
                    if owned:
                        owned -= 1
                    elif in_flight:  # a free slot if there is one (not one another call is waiting for)
                        if self._waiting or not self._slots.acquire(blocking=False):
                            break
                    elif not self._wait_for_slot():  # no answer to wait for: wait for a slot
                        self._check_router()
                        continue
                    index, request = todo.pop()
                    try:
                        self._inbox.put((call, index, request))
                    except BaseException:
                        self._give_back(1)  # not sent: its slot is free
                        raise
                    in_flight += 1
                self._give_back(owned)  # nothing more to send for now: the other calls may use them
                owned = 0
                if in_flight == 0:
                    break
                try:
                    answer = answers.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    self._check_router()
                    continue
                in_flight -= 1
                owned += 1
                if answer.error is not None:
                    if error is None:
                        error = answer.error
                        self._failed.set()
                    continue
                results[answer.index] = answer.result
                if on_result and answer.result is not None:
                    on_result(answer.index, answer.result)
        finally:
            self._give_back(owned)
        if error is not None:
            raise DpsynthError((self._router.first_error or error) if error == CANCELLED else error)
        return [r for r in results if r is not None]

    def _wait_for_slot(self) -> bool:
        """A slot within POLL_SECONDS; meanwhile the calls in flight give their freed slots to the semaphore."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            return self._slots.acquire(timeout=POLL_SECONDS)
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    def _give_back(self, slots: int) -> None:
        if slots:
            self._slots.release(slots)

    def _check_router(self) -> None:
        if self._router.broken is not None:
            raise self._router.broken
