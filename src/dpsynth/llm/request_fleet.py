"""One API generator's requests sent from several processes (`processes:` in a generator's config).

Why: one Python process spends CPU on each request (building it, sending it, parsing the answer: about 0.3 ms
through the lean client for plain-http endpoints, 1 ms through the SDK's generic `post`, 1.4 ms with its typed
`create`, used before) under one interpreter lock, a ceiling of several hundred requests a
second whatever the concurrency (600-700 measured with `create` on a 16-core machine: docs/scale.md). An endpoint
with many replicas answers faster than that, so at the WASP paper's scale the client, not the server, set the pace.
Here the requests go to `processes` worker processes, each with its own client and its share of `max_concurrency`
threads, under the same retry rules; the parent hands out at most `max_concurrency` requests at a time (so that a
failure stops the rest quickly), every answer comes back as it arrives (the request cache keeps every paid-for
answer, also those of the other workers when one dies), and the first request that gives up stops the others from
retrying. Several threads may share the fleet (a run asks for replacements of dropped answers while its main batch
is in flight): each slot freed beside another call goes to the call that wants one and holds fewest, so the
replacements go out within the next answers instead of one at a time until the batch has sent all; a request that
gives up stops every call in flight, and each of them reports that request's error, not "cancelled".

The parent's CPU per answer matters (every answer of every generator passes through one interpreter lock), so an
answer costs it two thread wake-ups, not three, and no poll: the answers' reader blocks on its queue (a watcher
thread wakes it once the workers have exited), each request is written by the thread that sends it, to the pipe of
a worker with a free thread (no feeder thread, no lock shared with the workers), and an answer's slot goes with it
to its call, which sends its next request to the same worker without a semaphore (docs/scale.md: 0.64-0.72x the
fleet's CPU an answer).
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing as mp
import multiprocessing.connection
import pickle
import queue
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import CallStopped, GenerationRequest, GenerationResult, ResultCallback

T = TypeVar("T")
POLL_SECONDS = 1.0  # how often a waiting call checks that the fleet still works (and the start-up, its workers)
CANCELLED = "cancelled"  # a request not sent because another one gave up


@dataclass(frozen=True)
class _Answer:
    call: int  # which `generate` call sent the request
    index: int
    worker: int
    retries: int  # the worker's retries so far (cumulative, so the parent can count them once)
    result: GenerationResult | None
    error: str | None  # one line, already explained; None when `result` arrived


@dataclass(frozen=True)
class _Exited:
    """Put in the answers' queue by the parent's watcher once every worker has exited: it ends the router, which
    blocks on that queue (a read with a timeout costs a poll each answer, about a sixth of the fleet's CPU)."""


@dataclass(frozen=True)
class _Slot:
    """Put in a call's inbox by another call (or the router) that hands it a free slot: a free thread of
    `worker`."""

    worker: int


class _Call:
    """One `generate` call's share of the fleet: its inbox (its answers, and slots handed to it), and what the
    hand-out of freed slots weighs. Only the call itself writes `unsent` and `in_flight` (without the lock while
    it is the only call); `transit` is written under the router's lock."""

    __slots__ = ("inbox", "unsent", "in_flight", "transit")

    def __init__(self, unsent: int) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.unsent, self.in_flight, self.transit = unsent, 0, 0  # transit: slots handed to it, not yet read

    def wants(self) -> bool:
        return self.unsent > self.transit

    def load(self) -> int:
        return self.in_flight + self.transit


def _explained(gen: Any, err: BaseException) -> str:
    explained = gen._explain(err)
    return str(explained) if isinstance(explained, DpsynthError) else f"{type(err).__name__}: {err}"


def _work(worker: int, settings: dict[str, Any], threads: int, inbox: Any, outbox: Any, failed: Any) -> None:
    """A worker process: read a request whenever one of its threads is free (the parent sends one only then),
    answer each as it completes."""
    from dpsynth.llm.openai_backend import OpenAICompatGenerator

    gen = OpenAICompatGenerator(**settings, max_concurrency=threads)
    free = threading.Semaphore(threads)
    outbox.put(worker)  # ready: its imports and client are done

    def finish(call: int, index: int, future: Future) -> None:
        err = future.exception()
        if err is None:
            outbox.put(_Answer(call, index, worker, gen.retries, future.result(), None))
        elif isinstance(err, CallStopped):  # a retry cut short because another request gave up
            outbox.put(_Answer(call, index, worker, gen.retries, None, CANCELLED))
        else:
            failed.set()  # at once, in every worker: the parent hears of it an answer later
            outbox.put(_Answer(call, index, worker, gen.retries, None, _explained(gen, err)))
        free.release()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        while True:
            free.acquire()
            try:
                item = pickle.loads(inbox.recv_bytes())
            except EOFError:  # the parent has gone without saying stop
                return
            if item is None:
                return
            call, index, request = item
            if failed.is_set():  # another request gave up: answer without sending
                outbox.put(_Answer(call, index, worker, gen.retries, None, CANCELLED))
                free.release()
                continue
            pool.submit(gen._one, request, failed).add_done_callback(functools.partial(finish, call, index))


class _Pipes:
    """The parent's end of each worker's request pipe. Only that worker reads it, so a worker that dies cannot
    stop the others' requests, and a request sent to a dead worker fails at once (its pipe is broken) instead of
    waiting. Several calls may send to one worker at once: a lock per pipe keeps their messages whole."""

    def __init__(self, ends: list[Any]) -> None:
        self.ends = ends
        self.locks = [threading.Lock() for _ in ends]

    def send(self, worker: int, item: object) -> None:
        data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        with self.locks[worker]:
            self.ends[worker].send_bytes(data)


def _shut_down(pipes: _Pipes, failed: Any, workers: list[Any]) -> None:
    failed.set()  # what is still queued is answered without being sent, so the live workers reach their stop
    for w in range(len(workers)):
        try:
            pipes.send(w, None)
        except OSError:  # that worker has exited already
            pass
    for process in workers:
        process.join(timeout=5)
        if process.is_alive():
            process.terminate()


class _Router:
    """The parent's reader of the workers' answers (its own thread): each answer goes to the `generate` call that
    sent it, with its slot (or is dropped, freeing its slot, if that call has gone), the workers' retries are
    counted once, the first real error is kept for every call it stopped, and a dead worker (or any failure to
    read) becomes every call's error, while the other workers' answers still reach their calls. It holds no
    reference to the fleet, so that the fleet can be garbage-collected."""

    def __init__(self, outbox: Any, workers: list[Any], free: queue.SimpleQueue, failed: Any, name: str) -> None:
        self.outbox, self.workers, self.free, self.failed, self.name = outbox, workers, free, failed, name
        self.lock = threading.Lock()
        self.calls: dict[int, _Call] = {}  # call id -> its share
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
        """The watcher's thread: waits (without polling) for the workers to exit. The first exit fails every call
        and stops the other workers from sending what is queued; the router goes on routing their answers (each
        is cached) until the last has exited, then is woken to end. The wake-up goes through the answers' queue's
        feeder thread, which waits forever if a worker died holding that queue's lock: the calls, which poll
        `broken`, are told regardless, and the interpreter's exit does not wait for that thread."""
        alive = list(self.workers)
        while alive:
            exited = set(mp.connection.wait([w.sentinel for w in alive]))
            for w in [w for w in alive if w.sentinel in exited]:
                alive.remove(w)
                w.join(timeout=1)  # its exit code: the sentinel is ready a moment before the process can be reaped
                if self.broken is None:
                    self.failed.set()
                    self.stop(self.exited(w.exitcode))
        self.outbox.cancel_join_thread()
        self.outbox.put(_Exited())

    def hand_out(self, worker: int, me: _Call | None = None, received: bool = False) -> bool:
        """A slot in the hands of call `me` (an answer's, or one handed to it: `received`), or of nobody: True if
        `me` is to send on it (counted as sent), else it has gone to the call that wants one and holds fewest
        (requests in flight and slots on their way to it; `me` first on a tie), or to the free pool if none wants
        one. So a small call beside a large batch (a run's replacements) gets its slots within the next answers,
        not after the batch has sent all, and two large ones share them evenly."""
        with self.lock:
            if received and me is not None:
                me.transit -= 1
            best = self.neediest(me)
            if best is not None and best is me:
                me.unsent -= 1
                me.in_flight += 1
                return True
            self.place(worker, best)
            return False

    def neediest(self, me: _Call | None = None) -> _Call | None:
        """(Under the lock.) The call that wants a slot and holds fewest, `me` on a tie; None if none wants one."""
        best = me if me is not None and me.wants() else None
        for other in self.calls.values():
            if other is not me and other.wants() and (best is None or other.load() < best.load()):
                best = other
        return best

    def place(self, worker: int, to: _Call | None) -> None:
        """(Under the lock.) A free slot to call `to`, or to the free pool (which only a call with nothing in
        flight reads, so a slot goes there only when no call wants one)."""
        if to is None:
            self.free.put(worker)
        else:
            to.transit += 1
            to.inbox.put(_Slot(worker))

    def run(self) -> None:
        while True:
            try:
                answer = self.outbox.get()
                if isinstance(answer, _Exited):
                    return
                assert isinstance(answer, _Answer)
                with self.lock:
                    if answer.retries > self.seen[answer.worker]:
                        self.retries += answer.retries - self.seen[answer.worker]
                        self.seen[answer.worker] = answer.retries
                    if answer.error is not None and answer.error != CANCELLED and self.first_error is None:
                        self.first_error = answer.error
                    caller = self.calls.get(answer.call)
                    if caller is None:
                        self.place(answer.worker, self.neediest())
                    else:  # under the lock: a call that ends gives back the slots of the answers left in its inbox
                        caller.inbox.put(answer)
            except Exception as err:  # noqa: BLE001 - whatever stops the reading stops every call, with its reason
                self.stop(err)
                return


class RequestFleet:
    """`processes` worker processes sending one generator's requests: started with the generator (so that their
    start-up counts as loading, not as generation), kept for its life, stopped when it is garbage-collected or
    the interpreter exits. Several threads may call `generate` at once (a run asks for replacements of dropped
    answers while its main batch is in flight): together they keep at most `max_concurrency` requests out.

    A slot is a free thread of one worker: the free ones wait in `_free` (a worker's id each), a call holds those
    of its requests in flight, and each answer brings its slot back to its call (which hands it on, beside other
    calls: `_Router.hand_out`)."""

    def __init__(self, settings: dict[str, Any], processes: int, concurrency: int, name: str) -> None:
        ctx = mp.get_context("spawn")  # not fork: the parent may hold threads (torch, the engine's)
        processes = min(processes, concurrency)
        threads = [concurrency // processes + (w < concurrency % processes) for w in range(processes)]
        outbox, self._failed = ctx.Queue(), ctx.Event()  # a Queue: a worker's thread never waits for the parent
        pipes = [ctx.Pipe(duplex=False) for _ in range(processes)]
        workers = [ctx.Process(target=_work, args=(w, settings, threads[w], pipes[w][0], outbox, self._failed),
                               daemon=True, name=f"{name}-requests-{w}") for w in range(processes)]
        self._workers = workers
        for process in workers:
            process.start()
        for reader, _ in pipes:
            reader.close()  # the worker has its own copy: once it exits, nothing reads, and a send fails at once
        self._pipes = _Pipes([writer for _, writer in pipes])
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for t in range(max(threads)):
            for w in range(processes):
                if t < threads[w]:
                    self._free.put(w)
        self._router = _Router(outbox, workers, self._free, self._failed, name)
        for _ in workers:
            self._router.next(int)
        self._call_ids = itertools.count()
        threading.Thread(target=self._router.run, name=f"{name}-answers", daemon=True).start()
        threading.Thread(target=self._router.watch, name=f"{name}-watcher", daemon=True).start()
        weakref.finalize(self, _shut_down, self._pipes, self._failed, workers)

    @property
    def retries(self) -> int:
        """Requests the workers sent again, over the fleet's life."""
        return self._router.retries

    def generate(self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None = None,
                 stop: threading.Event | None = None) -> list[GenerationResult]:
        """`stop`: shared by the calls of one batch (base.Generator): set when a request gives up; a call that
        starts once it is set sends nothing."""
        router = self._router
        me = _Call(len(requests))
        with router.lock:
            if router.broken is not None:
                raise router.broken
            if stop is not None and stop.is_set():
                raise CallStopped
            if not router.calls:  # a failure stops the calls in flight with it, not the next ones
                self._failed.clear()
                router.first_error = None
            call = next(self._call_ids)
            router.calls[call] = me
            slots = self._claim_free(me)
        try:
            return self._collect(call, me, slots, requests, on_result, stop)
        finally:
            with router.lock:
                del router.calls[call]
                while not me.inbox.empty():  # answers and slots that came after the call stopped reading
                    router.place(me.inbox.get().worker, router.neediest())

    def cancel(self) -> None:
        """Stop every call in flight (an interrupted run): the workers answer what is queued without sending it
        and stop retrying; the answers in flight still come back to their calls, which then fail."""
        with self._router.lock:
            if self._router.calls:
                self._router.first_error = self._router.first_error or "the run was interrupted"
                self._failed.set()

    def _claim_free(self, me: _Call) -> list[int]:
        """(Under the router's lock.) As many free slots as `me` has requests to send, counted as sent."""
        slots: list[int] = []
        while me.unsent > 0:
            try:
                slots.append(self._free.get_nowait())
            except queue.Empty:
                break
            me.unsent -= 1
            me.in_flight += 1
        return slots

    def _collect(self, call: int, me: _Call, slots: list[int], requests: Sequence[GenerationRequest],
                 on_result: ResultCallback | None, stop: threading.Event | None) -> list[GenerationResult]:
        """Send and collect one call's requests. Each answer comes with its slot: while this is the only call it
        sends its next request on it at once (no lock, about a tenth of the fleet's CPU an answer); beside other
        calls every slot it holds goes through `hand_out`, to whichever call wants one and holds fewest. After a
        request gives up or `on_result` fails nothing more is sent, and the answers in flight still go to
        `on_result` (the request cache keeps what was paid for; its later errors are not raised)."""
        router = self._router
        results: list[GenerationResult | None] = [None] * len(requests)
        todo = list(enumerate(requests))[::-1]
        error: Any = None  # the first: a request's (as the worker reported it) or on_result's
        heard_error: BaseException | None = None
        self._send_claimed(me, slots, call, todo)
        while me.in_flight or me.unsent:
            try:
                message = me.inbox.get(timeout=POLL_SECONDS)
            except (KeyboardInterrupt, SystemExit):
                self._finish_interrupted(me, on_result)
                raise
            except queue.Empty:
                self._check_router()
                if me.unsent and not me.in_flight:  # a safety net: the hand-out leaves no free slot to a waiter
                    with router.lock:
                        slots = self._claim_free(me)
                    self._send_claimed(me, slots, call, todo)
                continue
            received = isinstance(message, _Slot)
            if not received:
                answer: _Answer = message
                me.in_flight -= 1
                if answer.error is not None:
                    self._failed.set()  # the calls beside it stop too, even after this one's callback failed
                    if stop is not None and answer.error != CANCELLED:
                        stop.set()  # while this call is in flight: a call of its batch that starts later sends nothing
                    if error is None:
                        error = answer.error
                        me.unsent = 0  # nothing more is sent; the slots it holds go to the others
                elif answer.result is not None:
                    results[answer.index] = answer.result
                    if on_result:
                        try:
                            on_result(answer.index, answer.result)
                        except BaseException as err:  # noqa: BLE001 - raised once the answers in flight are in
                            if heard_error is None:
                                heard_error, me.unsent = err, 0  # nothing more is sent
                                error = error or err
            if me.unsent and not received and len(router.calls) == 1:  # the only call: its slot, at once
                me.unsent -= 1
                me.in_flight += 1
            elif not router.hand_out(message.worker, me, received):
                continue
            self._send(me, message.worker, (call, *todo.pop()))
        if heard_error is not None and error is heard_error:
            raise heard_error
        if error is not None:
            self._check_router()  # a worker that died is the reason, not the cancellations it caused
            raise DpsynthError((router.first_error or error) if error == CANCELLED else error)
        return [r for r in results if r is not None]

    def _finish_interrupted(self, me: _Call, on_result: ResultCallback | None) -> None:
        """Ctrl-C or SIGTERM while this call waits (on the thread that reads its answers): nothing more is sent,
        and the answers already in flight, paid for, still reach `on_result` (the request cache) before the
        interruption goes on, as on the one-process path; a second Ctrl-C stops the wait."""
        self.cancel()
        me.unsent = 0
        while me.in_flight:
            try:
                message = me.inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                self._check_router()
                continue
            received = isinstance(message, _Slot)
            if not received:
                me.in_flight -= 1
                if message.result is not None and on_result is not None:
                    try:
                        on_result(message.index, message.result)
                    except Exception:  # noqa: BLE001 - the interruption is the error to raise
                        pass
            self._router.hand_out(message.worker, me, received)

    def _send_claimed(self, me: _Call, slots: list[int], call: int, todo: list) -> None:
        """Send a request on each of the slots `me` claimed (counted as sent); if one cannot be sent, the call ends
        with that error and the slots not yet used are free again."""
        for sent, worker in enumerate(slots):
            try:
                self._send(me, worker, (call, *todo.pop()))
            except BaseException:
                for unused in slots[sent + 1:]:
                    me.in_flight -= 1
                    self._router.hand_out(unused)
                raise

    def _send(self, me: _Call, worker: int, item: tuple) -> None:
        """Write a request (already counted as in flight) to a worker's pipe; if it cannot be, its slot is free."""
        try:
            self._pipes.send(worker, item)
        except BaseException as err:
            me.in_flight -= 1
            me.unsent = 0  # the call ends with this error
            self._router.hand_out(worker)
            if isinstance(err, OSError):  # that worker has exited
                self._check_router()
                raise self._router.exited(self._workers[worker].exitcode) from err
            raise

    def _check_router(self) -> None:
        if self._router.broken is not None:
            raise self._router.broken
