"""Generation through the request store: no generation is ever paid for twice.

`CachedGenerator` wraps a backend: it serves what the store holds (`llm/request_store.py`), claims the misses so
that another process needing them waits instead of paying again, sends them, and has every answer written as it
arrives (`llm/cache_writer.py`) before its claims are released.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import (
    GenerationRequest,
    GenerationResult,
    Generator,
    ResultCallback,
    Usage,
)
from dpsynth.llm.cache_writer import CacheWriter
from dpsynth.llm.request_store import RequestCache
from dpsynth.llm.spend import SpendGuard

HEARTBEAT = 15.0  # how often a process renews its claims while its backend generates
POLL = 0.25  # seconds between looks for results another process is paying for
log = logging.getLogger("dpsynth.run")


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
        """Send the claimed requests, storing each result as it arrives (`CacheWriter`); claims renewed meanwhile."""
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
        writer = CacheWriter(self.cache, self.model_id, self.name, self.payer)

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
