"""The request store: every answer a generator was paid for, in one SQLite file shared by processes.

Every result is written as it arrives (WAL mode), keyed by model id + the full request including its seed.
Several processes may share one cache file, from its very first open on: WAL is set once (it persists in the
file), every connection waits up to `BUSY_TIMEOUT` seconds for a lock, and what SQLite still refuses with
"database is locked" (it does not wait where waiting could deadlock, e.g. when switching to WAL) is retried with
jittered backoff, so no write is lost.
Two processes that need the same generation at once (two identical runs, two grids sharing cells) pay for it
once: a process claims the requests it is about to send, and another that needs them waits for their results
instead of sending them again. A claim is void once its process has died (same machine) or has not been renewed
for `STALE_AFTER` seconds, so a crash never blocks anyone.
A run's answers are also written to the `payments` table under the run's id and the generator, so that what a
killed run paid for counts in its spend caps when it resumes (`CachedGenerator.count_unrecorded_payments`).
Prompts only ever contain the task description and synthetic text, so the store holds nothing private. Like the
`llm` tool's log, it is also a record of every prompt and response for inspection.
"""

from __future__ import annotations

import os
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
from dpsynth.fs import create_owner_only, sync_file
from dpsynth.llm.base import GenerationResult

BUSY_TIMEOUT = 30.0  # seconds SQLite waits for another process's lock
STALE_AFTER = 120.0  # seconds without renewal after which another process's claim on a request is void
# answers received and not yet committed in one process (every writer of a cache together), at most: a receiver
# waits past it (and so sends nothing new) while a commit waits on another process's lock, so a SIGKILL then loses
# at most this many paid-for answers (plus one a receiving thread) beside the requests in flight; about a second
# of a large server's answers, many commits' worth at its usual pace
MAX_UNWRITTEN = 2048
HOST = socket.gethostname()
_T = TypeVar("_T")


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

    def sync(self) -> None:
        """Make every answer committed so far survive a power loss, not only a crash of the process: called before
        a private release that may depend on them (`runs/engine.py`). Why: under `synchronous=NORMAL` the last
        commits can be lost with the machine's power, while the release is fsynced; the resumed run would then ask
        again, get other answers (an API at temperature > 0), and be refused by the saved release's request check,
        leaving the user to start over and spend again. One fsync of the write-ahead log per release, not per
        answer."""
        with self._lock:  # no log file: the last checkpoint folded it into the database file, fsynced then
            sync_file(Path(f"{self._path}-wal"))

    def close(self) -> None:
        self._db.close()
