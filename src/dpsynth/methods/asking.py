"""How one attempt's requests are asked of the generators (`methods/generation.py: generate_samples` decides what to
ask and cleans what comes back): API generators side by side, each one's requests in growing blocks, built once
each, the PLMs taking turns to build, each block sent while the next is built; the replacements of dropped answers
asked while the first batch is still in flight; an interrupt stops the sending, and what was paid for is kept."""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from dpsynth.llm.base import CallStopped, GenerationRequest, GenerationResult
from dpsynth.llm.cache import CachedGenerator

if TYPE_CHECKING:  # generation.py imports this module: the plan's class is only named here
    from dpsynth.methods.generation import GenerationPlan, RequestMaker

BLOCK_GROWTH = 4  # an API generator's requests go out in blocks, each this many times the requests before it


class Progress:
    """Answers per PLM, reported as they arrive (from several threads)."""

    def __init__(self, target: dict[str, int], report: Callable[[str, int, int], None] | None) -> None:
        self.target, self.report = target, report
        self.done = dict.fromkeys(target, 0)
        self.lock = threading.Lock()

    def answered(self, plm: str) -> None:
        with self.lock:
            self.done[plm] += 1
            if self.report:
                self.report(plm, self.done[plm], self.target[plm])


def _blocks(plan: GenerationPlan, make: Callable[[GenerationPlan], list[tuple[str, GenerationRequest]]],
            first: int | None) -> Iterator[list[tuple[str, int, GenerationRequest]]]:
    """`plan`'s requests as (label, j: the index among its label's, request), in blocks: about `first` of them in
    all (each label in proportion), then `BLOCK_GROWTH` times as many in all each time; `first=None`: one block.
    Each block is made from a plan of the next indices of every label's requests (`GenerationPlan.start`: a request
    depends on its index, not on how many are asked), so the first round goes out before the rest is built, and no
    request is built twice: building and looking up a request costs 50-80 us of this process's CPU, which at the
    WASP paper's scale (7,680 requests an iteration) kept every generator waiting half a second an iteration, and
    rebuilding each block's prefix (as before) doubled the building that competes with the answers for the
    interpreter lock early in an iteration (on a 16-core machine, generators then stood idle for 100-300 ms)."""
    total = sum(plan.per_label.values())
    done = dict.fromkeys(plan.per_label, 0)
    upto = total if first is None else first
    while True:
        share = min(1.0, upto / total) if total else 1.0
        prefix = {label: min(count, math.ceil(count * share)) for label, count in plan.per_label.items()}
        part = replace(plan, per_label=prefix, start=done)
        block = [(label, j, request) for (label, j), request in _build(make, part)]
        done = prefix
        yield block
        if share >= 1.0:
            return
        upto *= BLOCK_GROWTH


def _build(make: Callable[[GenerationPlan], list[tuple[str, GenerationRequest]]],
           part: GenerationPlan) -> list[tuple[tuple[str, int], GenerationRequest]]:
    """((label, j), request) for each of `part.indices()`, made by `make`, which must build exactly those, in their
    order (a maker that builds a label's requests from 0 whatever `part.start` says would ask some twice and file
    answers under the wrong index)."""
    indices = list(part.indices())
    built = make(part)
    if len(built) != len(indices) or any(label != want for (label, _), (want, _) in zip(built, indices)):
        raise ValueError(f"a request maker built {len(built)} requests for {len(indices)} wanted, or in another label "
                         "order: it must build the j-th request of a label for j in GenerationPlan.indices() only, "
                         "in that order")
    return [(index, request) for index, (_, request) in zip(indices, built)]


def ask_all(plans: dict[str, GenerationPlan], make: Callable[[GenerationPlan], list[tuple[str, GenerationRequest]]],
             generators: dict[str, CachedGenerator], progress: Progress, *,
             known: Callable[[str], dict[GenerationRequest, GenerationResult]] | None,
             listen: Callable[[str, str, int, GenerationResult], None] | None = None
             ) -> dict[str, list[tuple[str, GenerationResult]]]:
    """Every PLM's plan asked, its (label, answer) pairs in plan order: side by side when all of them are API
    generators, else one after another. An API generator that says how many requests it has in flight (and has no
    spend cap, which is checked per batch) gets its requests in growing blocks (`_blocks`), each block a call of
    its own, built once the block before it is being sent; after a failure no more blocks are sent (the blocks are
    calls of one generator sharing a `stop` event: a request that gives up stops those in flight and those that
    start later), and the first block's error in plan order is raised. Requests in
    `known(plm)` (replacements answered early) are not asked again; `listen(plm, label, j, result)` hears each
    answer to the j-th request of a label as it arrives."""
    side_by_side = len(plans) > 1 and all(generators[plm].remote for plm in plans)
    turns = _BuildTurns()

    def ask(plm: str) -> list[tuple[str, GenerationResult]]:
        generator, plan = generators[plm], plans[plm]
        answered = known(plm) if known is not None else {}
        stop = threading.Event()  # a block failed: no more are sent
        results: dict[tuple[str, int], GenerationResult] = {}

        def ask_block(block: list[tuple[str, int, GenerationRequest]], sending: threading.Event) -> None:
            missing: list[tuple[str, int, GenerationRequest]] = []

            def heard(k: int, result: GenerationResult) -> None:
                progress.answered(plm)
                if listen:
                    listen(plm, missing[k][0], missing[k][1], result)

            try:
                if stop.is_set():
                    raise CallStopped
                missing.extend((label, j, r) for label, j, r in block if r not in answered)
                asked = iter(generator.generate([r for *_, r in missing], on_result=heard, on_sending=sending.set,
                                                stop=stop if first is not None else None) if missing else [])
            except BaseException:
                stop.set()
                raise
            finally:
                sending.set()  # all of them cached or answered, or failed
            for label, j, r in block:
                results[(label, j)] = answered[r] if r in answered else next(asked)

        blocks_made = itertools.count()

        def make_in_turn(part: GenerationPlan) -> list[tuple[str, GenerationRequest]]:
            with turns.take(next(blocks_made)):
                return make(part)

        first = generator.concurrency if generator.remote and generator.guard is None else None
        if first is None:
            # one block, nothing sent meanwhile to build beside: no turn (it would hold the others' first blocks)
            ask_block(next(_blocks(plan, make, None)), threading.Event())
            return [(label, results[(label, j)]) for label, count in plan.per_label.items() for j in range(count)]
        futures: list[Future] = []
        pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="dpsynth-block")

        def send(block: list[tuple[str, int, GenerationRequest]]) -> threading.Event:
            sending = threading.Event()  # set once the block is with the backend
            futures.append(pool.submit(ask_block, block, sending))
            return sending

        try:
            # each block is built in a turn (`_BuildTurns`), and the next one once it is on its way
            if generator.sends_elsewhere:  # the turn lasts until the block is with the backend
                blocks = _blocks(plan, make, first)
                for number in itertools.count():
                    with turns.take(number):
                        block = next(blocks, None)
                        if block is None or stop.is_set():
                            break
                        send(block).wait()
            else:  # the turn ends with the build
                for block in _blocks(plan, make_in_turn, first):
                    if stop.is_set():
                        break
                    send(block).wait()
            pool.shutdown(wait=True)
        except BaseException as err:  # building failed, or an interrupt: no more blocks are sent
            stop.set()
            _stop_sending_if_interrupted(err, [generator])
            pool.shutdown(wait=True)
            raise
        errors = [f.exception() for f in futures if f.exception() is not None]
        error = next((e for e in errors if not isinstance(e, CallStopped)), errors[0] if errors else None)
        if error is not None:
            raise error
        return [(label, results[(label, j)]) for label, count in plan.per_label.items() for j in range(count)]

    if not side_by_side:
        return {plm: ask(plm) for plm in plans}
    pool = ThreadPoolExecutor(max_workers=len(plans), thread_name_prefix="dpsynth-plm")
    try:
        futures = {plm: pool.submit(ask, plm) for plm in plans}
        answers = {plm: f.result() for plm, f in futures.items()}
    except BaseException as err:  # the other PLMs' batches go on (and are cached), unless the run was interrupted
        _stop_sending_if_interrupted(err, [generators[plm] for plm in plans])
        pool.shutdown(wait=True)
        raise
    pool.shutdown(wait=True)
    return answers


class _BuildTurns:
    """The PLMs of one `ask_all` build their blocks of requests one at a time, the lowest block number waiting
    first (so every first block asked for goes before any second block then waiting; in order of asking among
    equals). The PLMs that build their whole plan in one block (a spend cap, no stated concurrency) build outside
    the turns, so as not to hold the others' first blocks. Why: building is CPU under the run's one interpreter
    lock, so PLMs building side by side only slowed each other, and each PLM's first request went out only once
    all of them had built their first blocks (and begun their second): 31-50 ms into an iteration at K=6 in
    `benchmarks/generation_overhead.py`, where one PLM's first block takes 2-3 ms.
    Where a turn ends depends on where the backend sends from (`CachedGenerator.sends_elsewhere`). From request
    processes (`processes:` 2 or more), it lasts until the block has been looked up in the request cache, claimed
    and handed over: the block's database calls, on a thread of their own, otherwise waited for the lock behind
    the next PLM's building (each call gives the lock up and waits to take it back), so no request went out
    before every PLM had built (the first request 10-12 -> 4-5 ms into an iteration at K=6 with 20 requests each;
    generation 1.30-1.33x -> 1.28-1.31x its bound in `api_scale.py` with 2 request processes on 2 cores). From
    this process's own threads, it ends with the build: those threads need the same lock to send, and a build
    beside them slowed the first round (held to the hand-over, its last request 49 -> 61 ms into an iteration,
    generation 1.30-1.34x -> 1.35-1.40x). In turns, the first PLM's first block goes out after its own build, the
    last one's after the K first blocks. Held to the hand-over, a turn also covers the request cache's waits for
    another process's lock on a shared cache file (up to a minute): the other PLMs' builds wait with it."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._building = False
        self._waiting: list[tuple[int, int]] = []  # (block number, ticket): a heap, the next builder first
        self._tickets = itertools.count()

    @contextmanager
    def take(self, block: int) -> Iterator[None]:
        with self._changed:
            me = (block, next(self._tickets))
            heapq.heappush(self._waiting, me)
            try:
                self._changed.wait_for(lambda: not self._building and self._waiting[0] == me)
            except BaseException:  # never left in the heap, where it would hold every later builder
                self._waiting.remove(me)
                heapq.heapify(self._waiting)
                self._changed.notify_all()
                raise
            heapq.heappop(self._waiting)
            self._building = True
        try:
            yield
        finally:
            with self._changed:
                self._building = False
                self._changed.notify_all()


def _stop_sending_if_interrupted(err: BaseException, generators: Sequence[CachedGenerator]) -> None:
    """After an interrupt (Ctrl-C reaches the run's main thread, not the threads that send), the generators stop
    sending before the run waits for those threads: the answers in flight still come back and are cached, nothing
    more is paid for."""
    if not isinstance(err, Exception):
        for generator in generators:
            generator.cancel()


class Replacements:
    """Replacements for dropped answers, asked while the first batch is still in flight (API generators).

    Which answers the plan-order pass of `generate_samples` drops is known as the answers arrive: an answer that
    cleaning refuses is dropped wherever it stands, and of two with the same text the one later in that order
    (attempt, PLM, label, index) is. So the drops of each PLM, label and attempt only ever grow, and the j-th of
    them is replaced by exactly the request that pass makes for it: make_requests' j-th request of the next
    attempt for that PLM and label (every method's requests depend on their index, not on how many are asked).
    Asked at once, it is answered about when the first batch is, a round of latency sooner; the samples, the
    requests and their count are the same. Replacements found within `GATHER` seconds of each other go out as
    one batch (one cache claim, one call); each label's requests are built in doubling blocks, not one call of
    make_requests per drop. The first replacement that fails stops the others from being sent, and is the error
    (after the first batch, whose answers are all kept). Not with spend caps: they are checked before each
    batch is sent."""

    GATHER = 0.01  # seconds a replacement waits for others to go with it (a small share of any API's latency)

    @staticmethod
    def apply(plans: Sequence[GenerationPlan], generators: dict[str, CachedGenerator], max_attempts: int) -> bool:
        return max_attempts > 1 and all(generators[p.plm].remote and generators[p.plm].guard is None for p in plans)

    def __init__(self, plans: Sequence[GenerationPlan], generators: dict[str, CachedGenerator],
                 earlier: set[tuple[str, str]], make_requests: RequestMaker, max_attempts: int,
                 progress: Progress, clean: Callable[[str], tuple[str | None, str]]) -> None:
        self.plms = [p.plm for p in plans]
        self.plan_of = {p.plm: p for p in plans}
        self.labels = {p.plm: list(p.per_label) for p in plans}
        self.generators, self.make_requests, self.max_attempts = generators, make_requests, max_attempts
        self.progress, self.clean = progress, clean
        # (label, text) -> the position of the answer that keeps it: (attempt, PLM, label, index); (-1,): earlier
        self.holder: dict[tuple[str, str], tuple[int, ...]] = dict.fromkeys(earlier, (-1,))
        self.drops: dict[tuple[str, str, int], int] = {}
        self.built: dict[tuple[str, str, int], list[GenerationRequest]] = {}  # requests made so far, by index
        self.answers: dict[tuple[str, GenerationRequest], GenerationResult] = {}  # (PLM, request) -> answer
        self.waiting: dict[str, list[tuple[str, int, int, GenerationRequest]]] = {plm: [] for plm in self.plms}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=4 * len(self.plms), thread_name_prefix="dpsynth-replacements")
        self.futures: list[Future] = []
        self.failed: BaseException | None = None  # the first replacement that could not be had
        self.stopped = False  # the first attempt is over: nothing more is sent

    def known(self, plm: str) -> dict[GenerationRequest, GenerationResult]:
        """The answers to `plm`'s replacements, by request."""
        return {request: result for (owner, request), result in self.answers.items() if owner == plm}

    def ask_first(self, plans: dict[str, GenerationPlan],
                  make: Callable[[GenerationPlan], list[tuple[str, GenerationRequest]]]) -> dict[str, list]:
        """The first attempt's answers; the replacements it needs (and theirs) asked and answered meanwhile."""

        def listen(plm: str, label: str, j: int, result: GenerationResult) -> None:
            self.heard(plm, label, 0, j, result)

        try:
            answers = ask_all(plans, make, self.generators, self.progress, known=None, listen=listen)
            self.wait()
        finally:
            with self.lock:  # after an error nothing more is sent; what is in flight finishes (and is cached)
                self.stopped = True
            self.pool.shutdown(wait=True, cancel_futures=True)
        return answers

    def heard(self, plm: str, label: str, attempt: int, j: int, result: GenerationResult) -> None:
        text, _ = self.clean(result.text)
        with self.lock:
            if text is None:
                self.dropped(plm, label, attempt)
                return
            key, mine = (label, text.lower()), (attempt, self.plms.index(plm), self.labels[plm].index(label), j)
            held = self.holder.get(key)
            if held is None:
                self.holder[key] = mine
            elif held < mine:
                self.dropped(plm, label, attempt)
            else:  # this answer comes first in plan order: the one that held the text is the duplicate
                self.holder[key] = mine
                self.dropped(self.plms[held[1]], label, held[0])

    def dropped(self, plm: str, label: str, attempt: int) -> None:
        """Count a drop (under the lock) and queue its replacement, unless the attempts are spent."""
        j = self.drops.get((plm, label, attempt), 0)
        self.drops[(plm, label, attempt)] = j + 1
        if attempt + 1 >= self.max_attempts or self.stopped or self.failed is not None:
            return
        if not self.waiting[plm]:  # the first of a batch: a sender will take it and whatever joins it
            self.futures.append(self.pool.submit(self.send, plm))
        self.waiting[plm].append((label, attempt + 1, j, self.request(plm, label, attempt + 1, j)))

    def request(self, plm: str, label: str, attempt: int, j: int) -> GenerationRequest:
        made = self.built.setdefault((plm, label, attempt), [])
        if j >= len(made):
            count = max(j + 1, 2 * len(made), 4)
            part = replace(self.plan_of[plm], per_label={label: count}, start={label: len(made)})
            made.extend(r for _, r in _build(lambda p: self.make_requests(p, attempt, self.generators[plm].chat), part))
        return made[j]

    def send(self, plm: str) -> None:
        time.sleep(self.GATHER)
        with self.lock:
            batch, self.waiting[plm] = self.waiting[plm], []
            if self.stopped or self.failed is not None:
                return
        try:
            results = self.generators[plm].generate([request for *_, request in batch])
        except BaseException as err:
            with self.lock:
                self.failed = self.failed or err
            raise
        for (label, attempt, j, request), result in zip(batch, results):
            self.progress.answered(plm)
            with self.lock:
                self.answers[(plm, request)] = result
            self.heard(plm, label, attempt, j, result)

    def wait(self) -> None:
        """Until every replacement is answered, the ones its answers asked for included; the first error."""
        while True:
            with self.lock:
                pending = [f for f in self.futures if not f.done()]
                failed = next((f.exception() for f in self.futures if f.done() and f.exception() is not None), None)
            if failed is not None:
                raise failed
            if not pending:
                return
            futures_wait(pending, return_when=FIRST_EXCEPTION)
