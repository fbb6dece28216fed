"""The persistent request cache is safe for concurrent processes, from the first open of a new file on."""

from __future__ import annotations

import multiprocessing
import sqlite3
import traceback
from pathlib import Path

from dpsynth.llm.base import GenerationRequest, GenerationResult
from dpsynth.llm.cache import CachedGenerator, RequestCache

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
                cache.put(f"k-{worker}-{j}", "model", f"prompt {worker} {j}",
                          GenerationResult(f"text {worker} {j}", 3, 4))
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
    cache.put("a", "m", "p", GenerationResult("one", 1, 2))
    cache.put("a", "m", "p", GenerationResult("two", 1, 2))
    cache.close()
    again = RequestCache(path)  # a second open of an existing file changes nothing
    assert again.get_many(["a", "b"]) == {"a": GenerationResult("two", 1, 2, cached=True)}
    again.close()


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
