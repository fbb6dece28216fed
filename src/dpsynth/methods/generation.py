"""Parts every generation method shares: samples, allocation, seeded requests, the generation loop."""

from __future__ import annotations

import functools
import gc
import hashlib
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from dpsynth.data.records import TaskSpec
from dpsynth.llm.base import CallStopped, GenerationRequest, GenerationResult
from dpsynth.llm.cache import CachedGenerator
from dpsynth.prompts.builder import PromptSettings, build_request
from dpsynth.prompts.cleaning import CleaningStats, clean_generation


@dataclass(frozen=True)
class SyntheticSample:
    id: int
    text: str
    label: str
    plm: str
    iteration: int
    # a training weight for the downstream classifier (FuseGen's self-boosting weights), None when unweighted
    weight: float | None = None


def sample_weights(samples: Sequence[SyntheticSample]) -> np.ndarray | None:
    """The samples' classifier weights, or None when the set is unweighted (a partly weighted set is a bug)."""
    if all(x.weight is None for x in samples):
        return None
    if any(x.weight is None for x in samples):
        raise ValueError("some samples carry a weight and some do not")
    return np.array([x.weight for x in samples], dtype=np.float64)


@dataclass
class GenerationPlan:
    """What one PLM writes in one iteration: label -> count. `start` (label -> index): the requests of a label
    before that index are not wanted (an earlier block built them, `_blocks`); a request maker builds the j-th
    request of a label for j in `indices()` only, and a request depends on its index, never on which others are
    built."""

    plm: str
    per_label: dict[str, int]
    start: dict[str, int] = field(default_factory=dict)

    def indices(self) -> Iterator[tuple[str, int]]:
        """(label, j) of the requests to build, in plan order."""
        for label, count in self.per_label.items():
            for j in range(self.start.get(label, 0), count):
                yield label, j


RequestMaker = Callable[[GenerationPlan, int, bool], list[tuple[str, GenerationRequest]]]
BLOCK_GROWTH = 4  # an API generator's requests go out in blocks, each this many times the requests before it


def split_count(total: int, shares: Sequence[float]) -> list[int]:
    """Integers proportional to `shares` summing to `total` (largest remainder)."""
    shares_arr = np.asarray(shares, dtype=np.float64)
    shares_arr = shares_arr / shares_arr.sum()
    raw = total * shares_arr
    out = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - out), kind="stable")[: total - out.sum()]:
        out[i] += 1
    return out.tolist()


def plan_counts(total: int, weights: dict[str, float], label_shares: dict[str, float]) -> list[GenerationPlan]:
    """`total` samples split over PLMs by weight, and each PLM's share over labels."""
    plms, labels = list(weights), list(label_shares)
    per_plm = split_count(total, [weights[k] for k in plms])
    return [
        GenerationPlan(k, dict(zip(labels, split_count(count, [label_shares[c] for c in labels]))))
        for k, count in zip(plms, per_plm)
    ]


def request_seed(*parts: object) -> int:
    """A stable 32-bit seed from named parts, so reruns ask exactly the same questions."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "big")


def zero_shot_requests(task: TaskSpec, settings: PromptSettings, *seed_parts: object) -> RequestMaker:
    """Zero-shot requests (no examples) seeded by `seed_parts` + PLM, label, attempt and index."""
    return shared_example_requests(task, settings, (), *seed_parts)


def shared_example_requests(task: TaskSpec, settings: PromptSettings, examples: Sequence[str], *seed_parts: object,
                            templates: str = "wasp") -> RequestMaker:
    """Requests that show every PLM and label the same plain `examples` (none: zero-shot), seeded like
    `zero_shot_requests` (FuseGen's cross-model feedback uses `templates="fusegen"`)."""

    def make(plan: GenerationPlan, attempt: int, chat: bool) -> list[tuple[str, GenerationRequest]]:
        return [
            (label, build_request(task, label, chat=chat, good=examples, settings=settings, templates=templates,
                                  seed=request_seed(*seed_parts, plan.plm, label, attempt, j)))
            for label, j in plan.indices()
        ]

    return make


def generate_samples(
    t: int,
    *,
    plans: Sequence[GenerationPlan],
    generators: dict[str, CachedGenerator],
    existing: Sequence[SyntheticSample],
    make_requests: RequestMaker,
    max_attempts: int,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> tuple[list[SyntheticSample], dict[str, dict]]:
    """Generate, clean and de-duplicate; re-ask (new seeds) for dropped samples up to `max_attempts` times.

    Each attempt asks every PLM its batch; API generators are asked side by side (each keeps its own
    concurrency limit), local models one after another (they share the cores). Answers are cleaned and
    de-duplicated in plan order afterwards, so the samples do not depend on which server answered first. With
    API generators the replacements of dropped answers are asked while the first batch is still in flight
    (`_Replacements`): the same requests as the attempts after it would send, a round of latency sooner."""
    with _earlier_objects_frozen():
        return _generate_samples(t, plans=plans, generators=generators, existing=existing, make_requests=make_requests,
                                 max_attempts=max_attempts, on_progress=on_progress)


_freezing = threading.Lock()
_generations = 0  # generations running (in any thread); the first one in freezes, the last one out unfreezes
_froze = False  # whether the running generations froze the heap themselves (not when something else had)


@contextmanager
def _earlier_objects_frozen() -> Iterator[None]:
    """The objects alive before a generation (the models, the samples so far, the caches: millions once torch is
    loaded) are left out of the garbage collector's full collections while it runs (`gc.freeze`), and given back
    when the last generation running ends (`gc.unfreeze`). Why: a full collection scans the whole heap holding the
    interpreter lock, so no answer is routed and no request sent meanwhile: in `benchmarks/generation_overhead.py`
    (K=6, 7,680 requests) three fell inside the generations, 153-191 ms each; with the freeze they take 3-10 ms
    (docs/scale.md). The pause is moved, not removed: after the unfreeze the next full collection scans the whole
    heap again (between generations, where nothing waits on it), and cyclic garbage among the frozen objects is
    freed then. Generations side by side (threads) share one freeze, and a freeze made by someone else before
    (a host application's, before it forks) is left alone: `gc.unfreeze` has no nesting of its own."""
    global _generations, _froze
    entered = False
    try:
        with _freezing:
            if _generations == 0:
                _froze = gc.get_freeze_count() == 0
                if _froze:
                    gc.freeze()
            _generations += 1
            entered = True
        yield
    finally:
        if entered:
            with _freezing:
                _generations -= 1
                if _generations == 0 and _froze:
                    gc.unfreeze()


def _generate_samples(
    t: int,
    *,
    plans: Sequence[GenerationPlan],
    generators: dict[str, CachedGenerator],
    existing: Sequence[SyntheticSample],
    make_requests: RequestMaker,
    max_attempts: int,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> tuple[list[SyntheticSample], dict[str, dict]]:
    """`generate_samples` itself, inside `_earlier_objects_frozen`."""
    seen = {(x.label, x.text.lower()) for x in existing}
    kept: dict[str, list[tuple[str, str]]] = {p.plm: [] for p in plans}
    cleaning = {p.plm: CleaningStats() for p in plans}
    wanted = {p.plm: dict(p.per_label) for p in plans}
    target = {p.plm: sum(p.per_label.values()) for p in plans}
    progress = _Progress(target, on_progress)
    # each answer is cleaned once: as it arrives (to find drops early) and in the plan-order pass below
    clean = functools.cache(clean_generation)
    early = (_Replacements(plans, generators, seen, make_requests, max_attempts, progress, clean)
             if _Replacements.apply(plans, generators, max_attempts) else None)
    for attempt in range(max_attempts):
        asking = {p.plm: GenerationPlan(p.plm, dict(wanted[p.plm])) for p in plans if sum(wanted[p.plm].values()) > 0}
        if not asking:
            break

        def make(plan: GenerationPlan, attempt: int = attempt) -> list[tuple[str, GenerationRequest]]:
            return make_requests(plan, attempt, generators[plan.plm].chat)

        if early is not None and attempt == 0:
            answers = early.ask_first(asking, make)
        else:
            answers = _ask_all(asking, make, generators, progress, known=early.known if early is not None else None)
        for plm in asking:
            for label, result in answers[plm]:
                text, reason = clean(result.text)
                if text is not None and (label, text.lower()) in seen:
                    text, reason = None, "duplicate"
                if text is None:
                    cleaning[plm].dropped[reason] += 1
                    continue
                seen.add((label, text.lower()))
                cleaning[plm].kept += 1
                wanted[plm][label] -= 1
                kept[plm].append((text, label))
    next_id = max((x.id for x in existing), default=-1) + 1
    new = [SyntheticSample(next_id + i, text, label, plm, t)
           for i, (plm, text, label) in enumerate((plm, text, label) for plm in kept for text, label in kept[plm])]
    stats = {p.plm: {**cleaning[p.plm].as_dict(), "requested": target[p.plm], "short_by": sum(wanted[p.plm].values())}
             for p in plans}
    return new, stats


class _Progress:
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
        part = GenerationPlan(plan.plm, prefix, start=done)
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


def _ask_all(plans: dict[str, GenerationPlan], make: Callable[[GenerationPlan], list[tuple[str, GenerationRequest]]],
             generators: dict[str, CachedGenerator], progress: _Progress, *,
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
        blocks_made = itertools.count()

        def make_in_turn(part: GenerationPlan) -> list[tuple[str, GenerationRequest]]:
            with turns.take(next(blocks_made)):
                return make(part)

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

        first = generator.concurrency if generator.remote and generator.guard is None else None
        if first is None:
            # one block, nothing sent meanwhile to build beside: no turn (it would hold the others' first blocks)
            ask_block(next(_blocks(plan, make, None)), threading.Event())
            return [(label, results[(label, j)]) for label, count in plan.per_label.items() for j in range(count)]
        futures: list[Future] = []
        pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="dpsynth-block")
        try:
            for block in _blocks(plan, make_in_turn, first):
                if stop.is_set():
                    break
                sending = threading.Event()
                futures.append(pool.submit(ask_block, block, sending))
                # the next block is built once this one is on its way: its look-ups and claims would
                # otherwise wait for the interpreter lock behind the building
                sending.wait()
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
    """The PLMs of one `_ask_all` build their blocks of requests one at a time, the lowest block number waiting
    first (so every first block asked for goes before any second block then waiting; in order of asking among
    equals). The PLMs that build their whole plan in one block (a spend cap, no stated concurrency) build outside
    the turns, so as not to hold the others' first blocks. Why: building is CPU under
    the run's one interpreter lock, so PLMs building side by side only slowed each other, and each PLM's first
    request went out only once all of them had built their first blocks (and begun their second): 31-50 ms into an
    iteration at K=6 in `benchmarks/generation_overhead.py`, where one PLM's first block takes 2-3 ms. In turns,
    the first PLM's first block goes out after its own build, the last one's after the K first blocks."""

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


class _Replacements:
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
                 progress: _Progress, clean: Callable[[str], tuple[str | None, str]]) -> None:
        self.plms = [p.plm for p in plans]
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
            answers = _ask_all(plans, make, self.generators, self.progress, known=None, listen=listen)
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
            part = GenerationPlan(plm, {label: count}, start={label: len(made)})
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
