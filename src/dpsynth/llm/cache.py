"""Persistent request cache: no generation is ever paid for twice.

Every result is written to SQLite as it arrives (WAL mode; answers that arrive
while a write commits share the next transaction), keyed by model id + the full
request including its seed.
Several processes may share one cache file, from its very first open on: WAL is
set once (it persists in the file), every connection waits up to
`BUSY_TIMEOUT` seconds for a lock, and what SQLite still refuses with
"database is locked" (it does not wait where waiting could deadlock, e.g. when
switching to WAL) is retried with jittered backoff, so no write is lost.
Two processes that need the same generation at once (two identical runs, two
grids sharing cells) pay for it once: a process claims the requests it is about
to send, and another that needs them waits for their results instead of sending
them again. A claim is void once its process has died (same machine) or has not
renewed it for `STALE_AFTER` seconds, so a crash never blocks anyone.
A run's answers are also written to the `payments` table under the run's id and the generator, so that what a
killed run paid for counts in its spend caps when it resumes (`CachedGenerator.count_unrecorded_payments`).
Prompts only ever contain the task description and synthetic text, so the
cache holds nothing private. Like the `llm` tool's log, it is also a record of
every prompt and response for inspection.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from dpsynth.errors import DpsynthError
from dpsynth.fs import create_owner_only
from dpsynth.llm.base import (
    GenerationRequest,
    GenerationResult,
    Generator,
    ResultCallback,
    Usage,
)
from dpsynth.llm.spend import SpendGuard

BUSY_TIMEOUT = 30.0  # seconds SQLite waits for another process's lock
STALE_AFTER = 120.0  # seconds without renewal after which another process's claim on a request is void
HEARTBEAT = 15.0  # how often a process renews its claims while its backend generates
POLL = 0.25  # seconds between looks for results another process is paying for
# seconds the cache writer gathers answers into one commit (a commit costs more than its rows): at a large
# server's 1,000-2,000 answers a second, 10-20 rows a commit (`close` does not wait for it)
WRITE_GATHER = 0.01
# answers received and not yet committed in one process (every writer of a cache together), at most: a receiver
# waits past it (and so sends nothing new) while a commit waits on another process's lock, so a SIGKILL then loses
# at most this many paid-for answers (plus one a receiving thread) beside the requests in flight; about a second
# of a large server's answers, many commits' worth at its usual pace
MAX_UNWRITTEN = 2048
HOST = socket.gethostname()
_T = TypeVar("_T")
log = logging.getLogger("dpsynth.run")


def _claim_is_void(host: str, pid: int, renewed: float, now: float) -> bool:
    """A claim whose process died (checked on this machine) or stopped renewing it binds no one."""
    if now - renewed > STALE_AFTER:
        return True
    if host != HOST:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _is_locked(err: sqlite3.OperationalError) -> bool:
    message = str(err).lower()
    return "locked" in message or "busy" in message


class RequestCache:
    def __init__(self, path: Path) -> None:
        path = create_owner_only(Path(path))  # every synthetic text verbatim: owner only, like synthetic.jsonl
        self._path = path
        self._lock = threading.Lock()
        self._unwritten = 0  # answers its writers hold, queued or in a commit (MAX_UNWRITTEN)
        self._unwritten_lock = threading.Lock()
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
        # who paid for each answer, in a table of its own: a dpsynth that predates it, sharing the file, writes
        # `generations` as before and ignores this one
        for statement in ("CREATE TABLE IF NOT EXISTS payments (key TEXT PRIMARY KEY, payer TEXT)",
                          "CREATE INDEX IF NOT EXISTS payments_by_payer ON payments (payer)"):
            self._retry(lambda q=statement: self._db.execute(q))  # type: ignore[misc]
        self._retry(
            lambda: self._db.execute(
                "CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT, host TEXT, pid INTEGER, "
                "renewed REAL)"
            )
        )
        self.owner = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    @property
    def path(self) -> Path:
        return self._path

    def reserve_unwritten(self, give_up: Callable[[], bool]) -> None:
        """Count one more answer held for writing; first wait while MAX_UNWRITTEN are held by all of this cache's
        writers (the calls of one batch, the PLMs side by side, their replacement requests), unless `give_up`."""
        while self._unwritten >= MAX_UNWRITTEN and not give_up():
            time.sleep(0.001)  # only while a commit waits on another process's lock
        with self._unwritten_lock:
            self._unwritten += 1

    def release_unwritten(self, count: int) -> None:
        """`count` answers held for writing are committed (or given up after a failed write)."""
        with self._unwritten_lock:
            self._unwritten -= count

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
                rows: list = self._retry(lambda q=query, c=chunk: self._db.execute(q, c).fetchall())  # type: ignore[misc]
                for key, text, pt, ct in rows:
                    found[key] = GenerationResult(text, pt, ct, cached=True)
        return found

    def put_many(self, rows: Sequence[tuple[str, str, str, GenerationResult]], payer: str | None = None) -> None:
        """Store (key, model, prompt, result) rows in one transaction: answers that arrive together share a
        commit, which is most of a write's cost. `payer` names who paid for them (a run's generator: `paid`)."""
        now = time.time()
        values = [(key, model, prompt, r.text, r.prompt_tokens, r.completion_tokens, now)
                  for key, model, prompt, r in rows]

        def write() -> None:
            with self._transaction() as db:
                # a request answered twice (two processes past a stale claim) keeps its first answer: a run may
                # already have used it, and its resume must find the same text again
                db.executemany(
                    "INSERT INTO generations VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT(key) DO UPDATE SET "
                    "writes=writes+1",
                    values,
                )
                if payer is not None:  # the first payer stays, as the first answer does
                    db.executemany("INSERT OR IGNORE INTO payments VALUES (?, ?)",
                                   [(key, payer) for key, *_ in rows])

        # A transaction that fails is rolled back whole (the rows are all written or none), so one refused as
        # "locked" at any statement, COMMIT included, is retried exactly.
        self._retry(write)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT under the connection's lock (rolled back on any error)."""
        with self._lock:
            self._retry(lambda: self._db.execute("BEGIN IMMEDIATE"))
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def paid(self, payer: str) -> tuple[int, int, int]:
        """(answers, prompt tokens, completion tokens) stored as paid for by `payer`. Each answer is written as it
        arrives, so this survives what a run's own count does not (a SIGKILL between checkpoints); it misses
        only answers lost with the process before their write, and a request two payers answered counts for the
        first payer to store it (with the tokens of the answer the cache kept)."""
        with self._lock:
            count, prompt, completion = self._retry(lambda: self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(g.prompt_tokens), 0), COALESCE(SUM(g.completion_tokens), 0) "
                "FROM payments p JOIN generations g ON g.key = p.key WHERE p.payer = ?", (payer,)).fetchone())
        return int(count), int(prompt), int(completion)

    def paid_by_run(self, run_id: str) -> int:
        """Answers stored as paid for by any generator of the run `run_id` (payers `<run_id>/<generator>`)."""
        with self._lock:  # the payers between '<id>/' and '<id>0' ('0' follows '/'): a range the index serves
            (count,) = self._retry(lambda: self._db.execute(
                "SELECT COUNT(*) FROM payments WHERE payer >= ? AND payer < ?", (f"{run_id}/", f"{run_id}0")
            ).fetchone())
        return int(count)

    def claim(self, keys: Sequence[str]) -> tuple[set[str], dict[str, int]]:
        """Claim the keys no live process has claimed and nobody has answered yet; returns them and {key: pid}
        of the others' claims. Keys answered meanwhile are in neither (the caller reads them from the cache):
        looking them up inside the same transaction closes the gap in which another process could store a
        result and release its claim between the caller's lookup and this claim."""
        now = time.time()
        mine: set[str] = set()
        theirs: dict[str, int] = {}
        unique = list(dict.fromkeys(keys))
        with self._transaction() as db:
            for start in range(0, len(unique), 500):
                chunk = unique[start : start + 500]
                rows = db.execute(
                    f"SELECT key, owner, host, pid, renewed FROM claims WHERE key IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
                held = {key: (owner, host, pid, renewed) for key, owner, host, pid, renewed in rows}
                answered = {key for (key,) in db.execute(
                    f"SELECT key FROM generations WHERE key IN ({','.join('?' * len(chunk))})", chunk)}
                for key in chunk:
                    if key in answered:
                        continue
                    claim = held.get(key)
                    if claim is None or claim[0] == self.owner or _claim_is_void(*claim[1:], now):
                        mine.add(key)
                    else:
                        theirs[key] = claim[2]
            db.executemany("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)",
                           [(key, self.owner, HOST, os.getpid(), now) for key in mine])
        return mine, theirs

    def renew_claims(self) -> None:
        with self._lock:
            self._retry(lambda: self._db.execute("UPDATE claims SET renewed=? WHERE owner=?",
                                                 (time.time(), self.owner)))

    def release_claims(self, keys: Sequence[str]) -> None:
        unique = list(dict.fromkeys(keys))
        with self._lock:
            for start in range(0, len(unique), 500):
                chunk = unique[start : start + 500]
                self._retry(lambda c=chunk: self._db.execute(  # type: ignore[misc]
                    f"DELETE FROM claims WHERE owner=? AND key IN ({','.join('?' * len(c))})", [self.owner, *c]))

    def close(self) -> None:
        self._db.close()


class CacheWriteError(DpsynthError):
    """Answers could not be written to the request cache: the batch stops, since what it pays for would be lost."""


class _CacheWriter:
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


class CachedGenerator:
    """Wraps a backend: serves hits from the cache, sends only misses, records usage."""

    def __init__(self, inner: Generator, cache: RequestCache, usage: Usage | None = None,
                 guard: SpendGuard | None = None, payer: str | None = None) -> None:
        """`guard`: the generator's spend caps; a batch that could cross one is sent only up to the cap, and
        then `SpendCapReached` stops the caller (what was paid is cached). `payer`: the name its answers are
        stored under as paid (a run's id and the generator's name), from which `count_unrecorded_payments`
        recovers what a killed run paid for."""
        self.inner = inner
        self.cache = cache
        self.usage = usage or Usage()
        self.guard = guard
        self.payer = payer
        self.name = inner.name
        # Threads may call `generate` at once (replacements asked while a batch is in flight): usage is counted
        # under a lock, and generation time is the time at least one call was sending, not the calls' sum.
        self._lock = threading.Lock()
        self._sending = 0
        self._sending_since = 0.0
        self._retries_before = 0

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def _started_sending(self) -> None:
        with self._lock:
            if self._sending == 0:
                self._sending_since = time.perf_counter()
                self._retries_before = self._backend_retries()
            self._sending += 1

    def _stopped_sending(self) -> None:
        with self._lock:
            self._sending -= 1
            if self._sending == 0:
                self.usage.generation_seconds += time.perf_counter() - self._sending_since
                self.usage.retries += self._backend_retries() - self._retries_before

    def count_unrecorded_payments(self) -> int:
        """Add to `usage` the answers the cache holds as paid by this generator's payer beyond what `usage`
        counts, and return how many. A run's usage is saved at each checkpoint and at any stop it sees; a SIGKILL
        (the OOM killer, a preempted machine) between them loses the count of the step's paid answers, though
        not the answers, and the resumed step finds them cached for free, so its spend caps would count them
        nowhere. Both counts only ever miss payments, never invent them, so the larger is kept."""
        if self.payer is None:
            return 0
        answers, prompt, completion = self.cache.paid(self.payer)
        with self._lock:
            missing = answers - (self.usage.requests - self.usage.cached)
            if missing > 0:
                self.usage.requests += missing
            self.usage.prompt_tokens = max(self.usage.prompt_tokens, prompt)
            self.usage.completion_tokens = max(self.usage.completion_tokens, completion)
        return max(missing, 0)

    def _backend_retries(self) -> int:
        """Retries the backend has made so far (API backends count them; others have none)."""
        count = getattr(self.inner, "retries", 0)
        return count if isinstance(count, int) else 0

    @property
    def chat(self) -> bool:
        return self.inner.chat

    def cancel(self) -> None:
        """Stop the backend's sending if it can (API generators; an interrupted run): its calls in flight send
        nothing more, and the answers already in flight still come back and are cached."""
        cancel = getattr(self.inner, "cancel", None)
        if callable(cancel):
            cancel()

    @property
    def concurrency(self) -> int | None:
        """Requests the backend has in flight at most, if it says (API generators): a run sends that many first
        and builds the rest meanwhile (methods/generation.py)."""
        value = getattr(self.inner, "max_concurrency", None)
        return value if isinstance(value, int) and value > 0 else None

    @property
    def remote(self) -> bool:
        """The backend computes elsewhere (an API server), so it can run beside other generators; local models
        share this machine's cores and run one at a time."""
        return bool(getattr(self.inner, "runs_remotely", False))

    @property
    def sends_elsewhere(self) -> bool:
        """The backend's requests go out from other processes (a `processes:` fleet): the HTTP work is done
        there, so handing it a batch costs this process little CPU (the hand-out to the processes and their
        answers still pass through it), and a run builds its next block once this one is handed over
        (methods/asking.py: `_BuildTurns`)."""
        return bool(getattr(self.inner, "sends_elsewhere", False))

    def generate(
        self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None = None,
        on_sending: Callable[[], None] | None = None, stop: threading.Event | None = None,
    ) -> list[GenerationResult]:
        """Hits from the cache; misses claimed and sent; misses another process is sending, waited for.
        `on_sending()` is called (perhaps more than once) when the claimed misses are handed to the backend, or
        when another process holds them all: a run then builds its next block of requests (methods/generation.py).
        `stop` goes to a backend that states its concurrency (base.Generator: the calls of one batch stop together)."""
        keys = [r.cache_key(self.model_id) for r in requests]
        results: list[GenerationResult | None] = [None] * len(requests)

        def deliver(i: int, result: GenerationResult) -> None:
            results[i] = result
            with self._lock:
                self.usage.add(result)
            if on_result:
                on_result(i, result)

        pending = list(range(len(requests)))
        waiting_for: set[int] = set()
        while True:
            hits = self.cache.get_many([keys[i] for i in pending])
            for i in pending:
                if keys[i] in hits:
                    deliver(i, hits[keys[i]])
            pending = [i for i in pending if results[i] is None]
            if not pending:
                break
            mine, theirs = self.cache.claim([keys[i] for i in pending])
            ours = [i for i in pending if keys[i] in mine]
            if ours:
                self._pay(ours, keys, requests, deliver, on_sending, batch_stop=stop)
                unanswered = [i for i in ours if results[i] is None]
                if unanswered:
                    raise DpsynthError(f"{self.name}: the backend returned no result for {len(unanswered)} request(s)")
            elif theirs:
                if on_sending is not None:
                    on_sending()  # nothing of ours to send here: the caller need not wait for the other process
                pids = set(theirs.values())
                if not waiting_for >= pids:
                    log.info("%s: waiting for %d generation(s) that process(es) %s are paying for", self.name,
                             len(theirs), sorted(pids))
                    waiting_for |= pids
                time.sleep(POLL)
            pending = [i for i in pending if results[i] is None]
        return [r for r in results if r is not None]

    def _pay(self, indices: list[int], keys: list[str], requests: Sequence[GenerationRequest],
             deliver: ResultCallback, on_sending: Callable[[], None] | None = None,
             batch_stop: threading.Event | None = None) -> None:
        """Send the claimed requests, storing each result as it arrives (`_CacheWriter`); claims renewed meanwhile."""
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(HEARTBEAT):
                try:
                    self.cache.renew_claims()
                except Exception as err:  # noqa: BLE001 - a missed renewal only risks another process paying too
                    log.warning("%s: could not renew the claims on requests being generated (%s)", self.name, err)

        renewer = threading.Thread(target=renew, name="dpsynth-claims", daemon=True)
        renewer.start()
        self._started_sending()
        failed: BaseException | None = None
        allowed = len(indices)
        writer = _CacheWriter(self.cache, self.model_id, self.name, self.payer)

        def store(j: int, result: GenerationResult) -> None:
            i = indices[j]
            writer.add(keys[i], requests[i], result)
            deliver(i, result)

        try:
            if self.guard is not None:
                allowed = self.guard.admit([requests[i] for i in indices])
            if on_sending is not None:
                on_sending()
            batch = [requests[i] for i in indices[:allowed]]
            if batch_stop is not None:
                self.inner.generate(batch, on_result=store, stop=batch_stop)  # type: ignore[call-arg]
            else:
                self.inner.generate(batch, on_result=store)
        except BaseException as err:
            failed = err
            raise
        finally:
            write_error = writer.close()  # before the claims go: another process would pay for them again
            stop.set()
            renewer.join()
            self.cache.release_claims([keys[i] for i in indices])
            self._stopped_sending()
            if write_error is not None:
                if failed is None:
                    raise write_error  # noqa: B012 - only when nothing else is being raised
                if failed is not write_error:  # the generation's own error is raised; this one is not lost
                    log.error("%s", write_error)
        if allowed < len(indices) and self.guard is not None:
            raise self.guard.reached()
