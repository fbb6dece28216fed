"""The persistent request cache is safe for concurrent processes, from the first open of a new file on, and
two processes that need the same generation at once pay for it once."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from dpsynth.llm.base import GenerationRequest, GenerationResult
from dpsynth.llm.cache import CachedGenerator
from dpsynth.llm.cache_writer import CacheWriteError, CacheWriter
from dpsynth.llm.request_store import HOST, STALE_AFTER, RequestCache

PROCESSES = 8
ENTRIES = 50
ROUNDS = 20  # the race on a new file is narrow: several new files make the test catch it reliably


def _path(root: str, round_: int) -> Path:
    return Path(root) / f"round{round_}" / "cache.sqlite"  # neither the file nor its directory exists yet


def _writer(root: str, worker: int, barrier, errors) -> None:
    for round_ in range(ROUNDS):
        try:
            barrier.wait(timeout=120)  # every process opens the same new file at the same moment
            cache = RequestCache(_path(root, round_))
            for j in range(ENTRIES):
                cache.put_many([(f"k-{worker}-{j}", "model", f"prompt {worker} {j}",
                                 GenerationResult(f"text {worker} {j}", 3, 4))])
            cache.close()
        except BaseException:  # noqa: BLE001 - reported to the parent test
            errors.put(f"worker {worker}, round {round_}: {traceback.format_exc()}")


def test_concurrent_processes_open_a_new_cache_and_write(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    errors = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, barrier, errors)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert not failures, "\n".join(failures)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    for round_ in range(ROUNDS):
        db = sqlite3.connect(str(_path(str(tmp_path), round_)))
        keys = {k for (k,) in db.execute("SELECT key FROM generations")}
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        db.close()
        assert len(keys) == PROCESSES * ENTRIES
        assert keys == {f"k-{w}-{j}" for w in range(PROCESSES) for j in range(ENTRIES)}
        assert mode == "wal"


def test_reopen_serves_hits_and_counts_writes(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    cache = RequestCache(path)
    cache.put_many([("a", "m", "p", GenerationResult("one", 1, 2))])
    cache.put_many([("a", "m", "p", GenerationResult("two", 1, 2))])
    cache.close()
    again = RequestCache(path)  # a second open of an existing file changes nothing
    # the first answer is kept: a run may have used it, and its resume must find it again
    assert again.get_many(["a", "b"]) == {"a": GenerationResult("one", 1, 2, cached=True)}
    again.close()


def test_answers_are_stored_under_their_payer_and_older_versions_still_share_the_file(tmp_path: Path) -> None:
    """`paid` counts a payer's answers and tokens (a killed run's spend is recovered from it); a cache file written
    before payers were stored keeps its rows and serves them, and an older dpsynth can still write it."""
    path = tmp_path / "cache.sqlite"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE generations (key TEXT PRIMARY KEY, model TEXT, prompt TEXT, text TEXT, "
                "prompt_tokens INTEGER, completion_tokens INTEGER, created REAL, writes INTEGER DEFAULT 1)")
    old.execute("INSERT INTO generations VALUES ('old', 'm', 'p', 'kept', 3, 4, 0, 1)")
    old.commit()
    old.close()
    cache = RequestCache(path)
    assert cache.get_many(["old"]) == {"old": GenerationResult("kept", 3, 4, cached=True)}
    cache.put_many([("a", "m", "p", GenerationResult("x", 5, 7)), ("b", "m", "p", GenerationResult("y", 1, 2))],
                   payer="run1/gen")
    cache.put_many([("a", "m", "p", GenerationResult("again", 9, 9))], payer="run2/gen")  # the first answer stays
    cache.put_many([("c", "m", "p", GenerationResult("z", 1, 1))])
    assert cache.paid("run1/gen") == (2, 6, 9)
    assert cache.paid("run2/gen") == (0, 0, 0)
    assert cache.paid_by_run("run1") == 2 and cache.paid_by_run("run") == 0 and cache.paid_by_run("run10") == 0
    cache.close()
    RequestCache(path).close()  # a second open finds the table there
    # a dpsynth that predates the payers still writes the file it shares (its positional insert of 8 columns)
    old = sqlite3.connect(path)
    old.execute("INSERT INTO generations VALUES ('older', 'm', 'p', 'text', 1, 1, 0, 1)")
    old.commit()
    old.close()


def test_a_generator_adds_the_answers_its_payer_paid_beyond_its_count(tmp_path: Path) -> None:
    """What the run's usage missed (a SIGKILL before it was saved) is added; what it counted is not added twice."""
    cache = RequestCache(tmp_path / "cache.sqlite")
    gen = CachedGenerator(_Counting(), cache, payer="run/counting")
    gen.generate([GenerationRequest(prompt=f"p{i}", seed=i) for i in range(3)])
    assert gen.count_unrecorded_payments() == 0
    resumed = CachedGenerator(_Counting(), cache, payer="run/counting")  # its usage was lost with the process
    assert resumed.count_unrecorded_payments() == 3
    assert resumed.usage.requests - resumed.usage.cached == 3
    assert (resumed.usage.prompt_tokens, resumed.usage.completion_tokens) == (
        gen.usage.prompt_tokens, gen.usage.completion_tokens)
    assert resumed.count_unrecorded_payments() == 0


class _Counting:
    name = "counting"
    model_id = "counting:1"
    chat = False

    def __init__(self) -> None:
        self.retries = 0

    def generate(self, requests, on_result=None):
        self.retries += 2  # as a backend that retried twice would report
        out = []
        for i, r in enumerate(requests):
            result = GenerationResult(r.prompt.upper(), 1, 1)
            out.append(result)
            if on_result:
                on_result(i, result)
        return out


def test_cached_generator_counts_backend_retries(tmp_path: Path) -> None:
    cache = RequestCache(tmp_path / "c.sqlite")
    gen = CachedGenerator(_Counting(), cache)
    assert [r.text for r in gen.generate([GenerationRequest(prompt="x"), GenerationRequest(prompt="y")])] == ["X", "Y"]
    assert gen.usage.retries == 2 and gen.usage.requests == 2
    gen.generate([GenerationRequest(prompt="x")])  # a hit: the backend is not called
    assert gen.usage.retries == 2 and gen.usage.cached == 1


class _Slow:
    """A backend that takes a while per request and logs what it was paid for to a file (one line each)."""

    name = "slow"
    model_id = "slow:1"
    chat = False

    def __init__(self, ledger: str) -> None:
        self.ledger = ledger

    def generate(self, requests, on_result=None):
        out = []
        for i, r in enumerate(requests):
            time.sleep(0.01)
            with open(self.ledger, "a") as fh:
                fh.write(f"{os.getpid()} {r.prompt}\n")
            result = GenerationResult(r.prompt.upper(), 2, 3)
            out.append(result)
            if on_result:
                on_result(i, result)
        return out


REQUESTS = [GenerationRequest(prompt=f"request {i}", seed=i) for i in range(40)]


def _same_run(root: str, barrier, answers) -> None:
    cache = RequestCache(Path(root) / "cache.sqlite")
    gen = CachedGenerator(_Slow(str(Path(root) / "paid.txt")), cache)
    barrier.wait(timeout=120)  # both processes need the same generations at the same moment
    texts = [r.text for r in gen.generate(REQUESTS)]
    answers.put((texts, gen.usage.cached))


def test_two_processes_needing_the_same_generations_pay_for_them_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, answers = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_same_run, args=(str(tmp_path), barrier, answers)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [answers.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    paid = (tmp_path / "paid.txt").read_text().splitlines()
    assert sorted(line.split(" ", 1)[1] for line in paid) == sorted(r.prompt for r in REQUESTS), \
        "every generation was paid for exactly once"
    want = [r.prompt.upper() for r in REQUESTS]
    assert [texts for texts, _ in got] == [want, want]
    assert sorted(cached for _, cached in got)[1] > 0, "one process was served what the other paid for"
    db = sqlite3.connect(str(tmp_path / "cache.sqlite"))
    assert db.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0, "claims are released"


def test_a_claim_binds_only_while_its_process_lives_and_renews_it(tmp_path: Path) -> None:
    cache = RequestCache(tmp_path / "cache.sqlite")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    now = time.time()
    claims = [("dead", "x", HOST, dead.pid, now), ("alive", "x", HOST, os.getpid(), now),
              ("far-fresh", "x", "another-host", 1, now), ("far-stale", "x", "another-host", 1, now - 2 * STALE_AFTER)]
    cache._db.executemany("INSERT INTO claims VALUES (?, ?, ?, ?, ?)", claims)
    mine, theirs = cache.claim(["dead", "alive", "far-fresh", "far-stale", "free"])
    assert mine == {"dead", "far-stale", "free"}
    assert theirs == {"alive": os.getpid(), "far-fresh": 1}
    # A backend that crashes leaves no claim behind it, so nobody waits for a result that will never come.
    gen = CachedGenerator(_Counting(), cache)
    gen.inner.generate = lambda requests, on_result=None: (_ for _ in ()).throw(RuntimeError("backend died"))
    request = GenerationRequest(prompt="never answered")
    with pytest.raises(RuntimeError):
        gen.generate([request])
    key = request.cache_key(gen.model_id)
    assert RequestCache(tmp_path / "cache.sqlite").claim([key])[0] == {key}, "another owner may take it"


def test_caches_holding_synthetic_text_are_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One file-mode policy (issue 33): the request cache (every synthetic text verbatim) and the synthetic
    embedding cache are 0600 like synthetic.jsonl, whatever the umask; an empty DPSYNTH_CACHE is unset."""
    import os
    import stat

    from dpsynth.embed.sentence import CachedEmbedder
    from dpsynth.fs import cache_dir

    old = os.umask(0o022)
    try:
        RequestCache(tmp_path / "c" / "requests.sqlite")
        CachedEmbedder(type("E", (), {"name": "e"})(), tmp_path / "run" / "cache" / "embeddings.sqlite")
    finally:
        os.umask(old)
    for path in (tmp_path / "c" / "requests.sqlite", tmp_path / "run" / "cache" / "embeddings.sqlite"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE((tmp_path / "run" / "cache").stat().st_mode) == 0o700
    monkeypatch.setenv("DPSYNTH_CACHE", "")
    assert cache_dir() == Path.home() / ".cache" / "dpsynth"


def test_opening_the_cache_again_never_touches_an_existing_database_file(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench opens the shared request cache once per cell in one process. Making the file owner-only used to
    open and close a descriptor of the existing database, which drops the POSIX locks of the process's open
    connections (SQLite then failed with "disk I/O error" mid-bench): an existing file is not opened again."""
    import os

    first = RequestCache(tmp_path / "requests.sqlite")
    opened: list[str] = []
    real_open = os.open

    def watch(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", watch)
    from dpsynth.fs import create_owner_only

    create_owner_only(tmp_path / "requests.sqlite")
    assert str(tmp_path / "requests.sqlite") not in opened
    monkeypatch.setattr(os, "open", real_open)
    second = RequestCache(tmp_path / "requests.sqlite")
    first.put_many([("k", "m", "p", GenerationResult("one", 1, 1))])
    assert second.get_many(["k"])["k"].text == "one"


def test_the_embedding_cache_is_shared_by_processes_in_wal_mode(tmp_path: Path) -> None:
    """Issue 34: the second SQLite cache (embeddings) waits for another process's lock and runs in WAL, like
    the request cache: two benches on one test set no longer fail with "database is locked"."""
    import sqlite3

    import numpy as np

    from dpsynth.embed.sentence import CachedEmbedder

    class Fixed:
        name = "fixed"

        def encode(self, texts):
            return np.ones((len(texts), 3), dtype=np.float32)

    path = tmp_path / "emb.sqlite"
    first, second = CachedEmbedder(Fixed(), path), CachedEmbedder(Fixed(), path)
    holder = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process mid-write
    import threading

    threading.Timer(0.5, lambda: holder.execute("COMMIT")).start()
    assert first.encode(["a", "b"]).shape == (2, 3)  # waited for the lock instead of failing
    assert second.encode(["a"]).shape == (1, 3)
    assert sqlite3.connect(str(path)).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert first._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL: no fsync a call


def test_put_many_writes_rows_together_and_counts_rewrites(tmp_path: Path) -> None:
    cache = RequestCache(tmp_path / "c.sqlite")
    cache.put_many([("a", "m", "pa", GenerationResult("one", 1, 2)), ("b", "m", "pb", GenerationResult("two", 3, 4))])
    cache.put_many([("a", "m", "pa", GenerationResult("again", 1, 2))])
    assert cache.get_many(["a", "b"]) == {"a": GenerationResult("one", 1, 2, cached=True),
                                          "b": GenerationResult("two", 3, 4, cached=True)}
    db = sqlite3.connect(str(tmp_path / "c.sqlite"))
    assert dict(db.execute("SELECT key, writes FROM generations")) == {"a": 2, "b": 1}
    db.close()


class _Answers:
    """A backend whose answers arrive in quick succession (or every `pace` seconds) on the calling thread, as the SDK
    path and the `processes:` fleet deliver them, optionally failing after `fail_after` answers."""

    name = "answers"
    model_id = "answers:1"
    chat = False

    def __init__(self, fail_after: int | None = None, pace: float = 0.0) -> None:
        self.fail_after, self.pace = fail_after, pace
        self.delivered = 0

    def generate(self, requests, on_result=None):
        out = []
        for i, r in enumerate(requests):
            if i == self.fail_after:
                raise RuntimeError("the server went away")
            time.sleep(self.pace)
            result = GenerationResult(f"answer to {r.prompt}", 1, 1)
            out.append(result)
            if on_result:
                on_result(i, result)
            self.delivered += 1
        return out


def _stored(path: Path) -> dict[str, str]:
    db = sqlite3.connect(str(path))  # another connection: what is on disk, not in this process's queue
    rows = dict(db.execute("SELECT prompt, text FROM generations"))
    db.close()
    return rows


def test_every_answer_is_on_disk_before_the_claims_are_released(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cache = RequestCache(tmp_path / "c.sqlite")
    slow_put_many = cache.put_many

    def slow(rows, payer=None):
        time.sleep(0.02)  # writes lag behind the answers, so the order of closing and releasing is what counts
        slow_put_many(rows, payer)

    on_disk_at_release = []
    release = cache.release_claims

    def spy(keys):
        on_disk_at_release.append(len(_stored(tmp_path / "c.sqlite")))
        release(keys)

    monkeypatch.setattr(cache, "put_many", slow)
    monkeypatch.setattr(cache, "release_claims", spy)
    requests = [GenerationRequest(prompt=f"p{i}", seed=i) for i in range(2_000)]
    CachedGenerator(_Answers(), cache).generate(requests)
    assert on_disk_at_release == [2_000]
    assert _stored(tmp_path / "c.sqlite") == {f"p{i}": f"answer to p{i}" for i in range(2_000)}
    db = sqlite3.connect(str(tmp_path / "c.sqlite"))
    assert db.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0
    db.close()


def test_answers_received_before_a_backend_failure_are_on_disk(tmp_path: Path) -> None:
    cache = RequestCache(tmp_path / "c.sqlite")
    requests = [GenerationRequest(prompt=f"p{i}", seed=i) for i in range(50)]
    with pytest.raises(RuntimeError, match="went away"):
        CachedGenerator(_Answers(fail_after=30), cache).generate(requests)
    assert _stored(tmp_path / "c.sqlite") == {f"p{i}": f"answer to p{i}" for i in range(30)}


def test_a_cache_that_cannot_be_written_stops_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    cache = RequestCache(tmp_path / "c.sqlite")

    def full(rows, payer=None):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(cache, "put_many", full)
    backend = _Answers(pace=0.001)
    with pytest.raises(CacheWriteError, match="could not write answers to the request cache .*disk is full"):
        CachedGenerator(backend, cache).generate([GenerationRequest(prompt=f"p{i}", seed=i) for i in range(1_000)])
    assert backend.delivered < 1_000  # it stopped sending once the answers could not be kept
    # when the backend fails too, its error is the one raised and the cache's is logged
    with caplog.at_level("ERROR", logger="dpsynth.run"), pytest.raises(RuntimeError, match="went away"):
        CachedGenerator(_Answers(fail_after=1), cache).generate([GenerationRequest(prompt="z", seed=s) for s in (1, 2)])
    assert "disk is full" in caplog.text


def test_a_request_that_cannot_be_written_is_an_error_not_a_silent_loss(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cache = RequestCache(tmp_path / "c.sqlite")

    def broken(self):
        raise TypeError("a message without content")

    monkeypatch.setattr(GenerationRequest, "prompt_text", broken)
    with pytest.raises(CacheWriteError, match="a message without content"):
        CachedGenerator(_Answers(), cache).generate([GenerationRequest(prompt="x")])


def test_an_answer_after_the_batch_closed_is_written_at_once(tmp_path: Path) -> None:
    cache = RequestCache(tmp_path / "c.sqlite")
    writer = CacheWriter(cache, "late:1", "late", "run/late")
    writer.add("k1", GenerationRequest(prompt="first"), GenerationResult("one", 1, 1))
    assert writer.close() is None
    writer.add("k2", GenerationRequest(prompt="late"), GenerationResult("two", 1, 1))  # a backend answering late
    assert _stored(tmp_path / "c.sqlite") == {"first": "one", "late": "two"}
    assert cache.paid("run/late") == (2, 2, 2)  # the late answer is stored as paid too


def test_a_request_key_covers_every_field_and_keeps_the_keys_of_earlier_caches() -> None:
    """The key is built by hand (speed); it must equal the key of every field through `asdict`, so that a field
    added to GenerationRequest without being added to the key fails here, and the keys of caches written before
    (pinned vectors) still hit."""
    import hashlib
    import json
    from dataclasses import asdict

    requests = [
        GenerationRequest(messages=(("system", "Write reviews."), ("user", "A positive one: é")), seed=7, stop=("\n",)),
        GenerationRequest(prompt="A review:", max_tokens=32, temperature=0.7, top_p=1.0, seed=3),
    ]
    for request in requests:
        by_every_field = json.dumps({"model": "openai:x:m", **asdict(request)}, sort_keys=True)
        assert request.cache_key("openai:x:m") == hashlib.sha256(by_every_field.encode()).hexdigest()
    messages = (("system", "You write reviews. " * 10), ("user", "Write a positive review " * 20))
    chat = GenerationRequest(messages=messages, seed=0, stop=("\n\n",))
    assert chat.cache_key("openai:x:m") == "35c15729af52c9c4bdb729422acf6c8a2a70a35980a3d96d86d23ef04d983099"
    assert GenerationRequest(prompt="A review:", seed=3).cache_key("llama:y") == (
        "a1824d64c864efcae0f8eaab5957b9c2c65c7705eb5008a588522fccb1b11efc")


def test_a_block_whose_requests_another_process_holds_says_so_before_it_waits(tmp_path: Path) -> None:
    """A run builds its next block of requests once the block before is on its way (methods/generation.py); a
    block whose every request another process is paying for must not hold that up until those answers come."""
    cache = RequestCache(tmp_path / "cache.sqlite")
    gen = CachedGenerator(_Answers(), cache)
    requests = [GenerationRequest(prompt=f"p{i}", seed=i) for i in range(3)]
    now = time.time()
    cache._db.executemany("INSERT INTO claims VALUES (?, ?, ?, ?, ?)",
                          [(r.cache_key(gen.model_id), "another run", HOST, os.getpid(), now) for r in requests])
    sending = threading.Event()
    call = threading.Thread(target=gen.generate, args=(requests,), kwargs={"on_sending": sending.set})
    call.start()
    assert sending.wait(5) and call.is_alive()  # said at once, while it still waits for the other process
    cache._db.execute("DELETE FROM claims")  # the other run gave up: this one pays for them
    call.join(30)
    assert not call.is_alive() and _stored(tmp_path / "cache.sqlite") == {f"p{i}": f"answer to p{i}" for i in range(3)}


def test_the_answers_waiting_for_a_locked_cache_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a commit waits on another process's lock, a receiver waits once MAX_UNWRITTEN answers are held by all
    the writers of the cache (here two batches side by side), and so sends nothing new: a SIGKILL then loses at
    most that many paid-for answers, not the whole wait's."""
    from dpsynth.llm import request_store as store_module

    monkeypatch.setattr(store_module, "MAX_UNWRITTEN", 4)
    cache = RequestCache(tmp_path / "c.sqlite")
    locked, written = threading.Event(), []
    real_put_many = cache.put_many

    def held(rows, payer=None):
        locked.wait()  # another process holds the lock until the test lets go
        real_put_many(rows, payer)
        written.extend(key for key, *_ in rows)

    monkeypatch.setattr(cache, "put_many", held)
    writers = [CacheWriter(cache, "m:1", "m", "run/m"), CacheWriter(cache, "g:1", "g", "run/g")]
    added: list[int] = []

    def receive() -> None:
        for i in range(20):
            writers[i % 2].add(f"k{i}", GenerationRequest(prompt=f"p{i}"), GenerationResult(f"a{i}", 1, 1))
            added.append(i)

    receiver = threading.Thread(target=receive)
    receiver.start()
    deadline = time.monotonic() + 60
    while len(added) < 4 and time.monotonic() < deadline:  # however slow the machine
        time.sleep(0.01)
    receiver.join(timeout=0.5)
    assert receiver.is_alive()  # it waits for the writers instead of handing them all 20
    assert added == [0, 1, 2, 3]  # four answers held by the two writers together, the fifth waits
    locked.set()
    receiver.join()
    assert [writer.close() for writer in writers] == [None, None]
    assert len(written) == 20 and _stored(tmp_path / "c.sqlite") == {f"p{i}": f"a{i}" for i in range(20)}
    assert cache._unwritten == 0


def test_an_embedding_cache_write_that_fails_is_rolled_back_and_the_next_call_works(tmp_path: Path) -> None:
    """A failed insert used to leave the connection inside its transaction: every later call then failed with
    "cannot start a transaction within a transaction"."""
    import numpy as np

    from dpsynth.embed.sentence import CachedEmbedder

    class Fixed:
        name = "fixed"

        def encode(self, texts):
            return np.ones((len(texts), 3), dtype=np.float32)

    path = tmp_path / "emb.sqlite"
    embedder = CachedEmbedder(Fixed(), path)
    other = sqlite3.connect(str(path), isolation_level=None)
    other.executescript("CREATE TABLE refuse (x); INSERT INTO refuse VALUES (1); CREATE TRIGGER no BEFORE INSERT "
                        "ON emb WHEN (SELECT count(*) FROM refuse) > 0 BEGIN SELECT RAISE(ABORT, 'refused'); END;")
    with pytest.raises(sqlite3.IntegrityError, match="refused"):
        embedder.encode(["a", "b"])
    other.execute("DELETE FROM refuse")
    assert embedder.encode(["a", "c"]).shape == (2, 3)
    assert other.execute("SELECT count(*) FROM emb").fetchone()[0] == 2  # nothing of the failed call was kept
    embedder.close()


def test_sync_makes_the_log_durable_before_a_release(tmp_path: Path, monkeypatch) -> None:
    """`sync` fsyncs the write-ahead log holding the answers committed so far (once per release, not per answer),
    and the run's door to the data holder calls it before every request."""
    import numpy as np

    from dpsynth.private.holder import HolderRequests

    cache = RequestCache(tmp_path / "c.sqlite")
    cache.put_many([("k", "m", "p", GenerationResult("answer", 1, 1))])
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    cache.sync()
    assert synced == [f"{tmp_path / 'c.sqlite'}-wal", str(tmp_path)]  # the log, then its name in the folder
    cache.close()

    order: list[str] = []

    class Holder:
        def noisy_votes(self, *a, **k):
            order.append("release")
            return np.zeros(1)

        noisy_label_counts = noisy_length_histogram = length_bound = train_adapter = noisy_votes

    door = HolderRequests(Holder(), before=lambda: order.append("sync"))  # type: ignore[arg-type]
    door.noisy_votes(None, None, None, release=("r", 0))
    door.noisy_label_counts(["a"], release=("l", None))
    assert order == ["sync", "release", "sync", "release"]


def test_a_local_embedder_folder_changed_in_place_is_not_served_its_old_vectors(tmp_path: Path) -> None:
    """The user-wide test-set cache keys each vector by the embedder: for a local folder, by its files too, so a
    model retrained into the same folder embeds again; an unchanged folder and a named model hit the cache."""
    import numpy as np

    from dpsynth.embed.sentence import CachedEmbedder

    folder = tmp_path / "my-encoder"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights v1")

    class Counting:
        name = str(folder)
        calls = 0

        def encode(self, texts):
            Counting.calls += 1
            return np.full((len(texts), 3), float(Counting.calls), dtype=np.float32)

    path = tmp_path / "tests.sqlite"
    assert CachedEmbedder(Counting(), path).encode(["a"])[0, 0] == 1.0
    assert CachedEmbedder(Counting(), path).encode(["a"])[0, 0] == 1.0 and Counting.calls == 1  # cached
    (folder / "model.safetensors").write_bytes(b"weights v2, retrained")
    assert CachedEmbedder(Counting(), path).encode(["a"])[0, 0] == 2.0  # embedded again by the new model
    Counting.name = "all-MiniLM-L6-v2"
    named = CachedEmbedder(Counting(), path)
    named.encode(["b"])
    assert named.encode(["b"])[0, 0] == 3.0 and Counting.calls == 3
