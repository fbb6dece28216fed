"""Writes a batch's answers to the request store on a thread of its own, so receiving an answer costs only a
queue put (the receiver is also what sends the next request)."""

from __future__ import annotations

import queue
import threading
import time

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest, GenerationResult
from dpsynth.llm.request_store import RequestCache

# seconds the cache writer gathers answers into one commit (a commit costs more than its rows): at a large
# server's 1,000-2,000 answers a second, 10-20 rows a commit (`close` does not wait for it)
WRITE_GATHER = 0.01


class CacheWriteError(DpsynthError):
    """Answers could not be written to the request cache: the batch stops, since what it pays for would be lost."""


class CacheWriter:
    """Writes one batch's answers on its own thread, those that arrive during a commit together in the next one.

    Why: the thread that receives an answer (the SDK path's collecting loop, or a `processes:` fleet's loop, which
    also sends the next request when an answer frees a slot) used to commit each answer itself, 40-90 us under the
    cache's lock; at the thousands of answers a second of a large server that is time taken from sending. Here the
    receiver only queues the answer. Every answer is on disk when `close` returns, which the batch calls before
    its claims are released, so no other process pays for an answer this one has. The thread is not a daemon:
    once `close` has posted its end mark, an interrupted caller or an exiting interpreter still waits for the
    queued answers to be written (a SIGKILL loses them, and a later run asks for them again and pays again, which
    its spend cap does not see). The process's writers of one cache hold at most MAX_UNWRITTEN answers, queued or
    in a commit: while a commit waits on another process's lock (up to 2 x BUSY_TIMEOUT), `add` waits too, so the
    receivers stop sending and the answers at risk stay bounded. After a failed write nothing more is written, and
    the next answer's `add` raises the error, which stops the backend's sending."""

    def __init__(self, cache: RequestCache, model: str, name: str, payer: str | None) -> None:
        self._cache, self._model, self._name, self._payer = cache, model, name, payer
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._error: CacheWriteError | None = None
        self._thread = threading.Thread(target=self._write, name=f"{name}-cache-writes")
        self._thread.start()

    def add(self, key: str, request: GenerationRequest, result: GenerationResult) -> None:
        if self._error is not None:
            raise self._error
        with self._lock:
            if not self._closed:
                self._cache.reserve_unwritten(lambda: self._error is not None)
                self._queue.put((key, request, result))
                return
        # a backend that answers after its `generate` returned: written here, as nothing reads the queue now
        self._cache.put_many([(key, self._model, request.prompt_text(), result)], self._payer)

    def _write(self) -> None:
        done = False
        while not done:
            batch = [self._queue.get()]
            gathered_until = time.monotonic() + WRITE_GATHER
            while batch[-1] is not None:
                try:
                    batch.append(self._queue.get(timeout=max(gathered_until - time.monotonic(), 0.0)))
                except queue.Empty:
                    break
            answers = [item for item in batch if item is not None]
            done = len(answers) < len(batch)
            try:
                if self._error is None and answers:  # after a failure, drained until the end mark: nothing waits
                    self._cache.put_many([(key, self._model, request.prompt_text(), result)
                                          for key, request, result in answers], self._payer)
            except BaseException as err:  # noqa: BLE001 - kept for `add` and `close`, which raise it
                self._error = CacheWriteError(
                    f"{self._name}: could not write answers to the request cache {self._cache.path} "
                    f"({type(err).__name__}: {err}); stopped, so as not to pay for answers it cannot keep")
                self._error.__cause__ = err
            finally:
                self._cache.release_unwritten(len(answers))

    def close(self) -> CacheWriteError | None:
        """Post the end mark, wait until everything queued is written; the error that stopped the writes, if any."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        self._thread.join()
        return self._error
