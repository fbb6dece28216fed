"""API generators of one iteration are asked side by side; local models one after another; the samples are the
same either way (cleaned and de-duplicated in plan order, not in the order answers arrive)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from dpsynth.llm.base import GenerationRequest, GenerationResult, ResultCallback
from dpsynth.llm.cache import CachedGenerator
from dpsynth.llm.request_store import RequestCache
from dpsynth.methods.generation import GenerationPlan, generate_samples, zero_shot_requests
from dpsynth.prompts.builder import PromptSettings
from dpsynth.prompts.cleaning import clean_generation
from tests.test_fusegen import TASK


class _Recorder:
    """A backend that records when it is busy; `remote` backends meet at a barrier, which only works if they
    are asked at the same time."""

    def __init__(self, name: str, remote: bool, barrier: threading.Barrier | None, busy: list, dup: bool = False):
        self.name, self.runs_remotely, self._barrier, self._busy, self._dup = name, remote, barrier, busy, dup

    model_id = property(lambda self: f"rec:{self.name}")
    chat = True

    def generate(self, requests: Sequence[GenerationRequest],
                 on_result: ResultCallback | None = None) -> list[GenerationResult]:
        start = time.monotonic()
        if self._barrier is not None:  # the first batches only (a re-ask may be one PLM's alone)
            barrier, self._barrier = self._barrier, None
            barrier.wait()  # raises BrokenBarrierError after its timeout if the other never comes
        time.sleep(0.05)
        out = []
        for i, r in enumerate(requests):
            text = "the same words for everyone" if self._dup and i == 0 else f"{self.name} says {r.seed}"
            self._dup = self._dup and i != 0  # in the first batch only
            out.append(GenerationResult(text, 3, 5))
            if on_result:
                on_result(i, out[-1])
        self._busy.append((self.name, start, time.monotonic()))
        return out


def _generators(tmp_path: Path, remote: bool, barrier: threading.Barrier | None, busy: list,
                dup: bool = False) -> dict[str, CachedGenerator]:
    cache = RequestCache(tmp_path / "cache.sqlite")
    return {n: CachedGenerator(_Recorder(n, remote, barrier, busy, dup), cache) for n in ("a", "b")}


def _run(generators: dict[str, CachedGenerator]):
    plans = [GenerationPlan("a", {"positive": 2, "negative": 2}), GenerationPlan("b", {"positive": 2, "negative": 2})]
    return generate_samples(0, plans=plans, generators=generators, existing=[], max_attempts=3,
                            make_requests=zero_shot_requests(TASK, PromptSettings(), 0, "t"))


def test_api_generators_are_asked_side_by_side(tmp_path: Path) -> None:
    busy: list = []
    samples, stats = _run(_generators(tmp_path, True, threading.Barrier(2, timeout=10), busy))
    assert len(samples) == 8 and stats["a"]["short_by"] == 0 == stats["b"]["short_by"]


def test_local_generators_take_turns(tmp_path: Path) -> None:
    busy: list = []
    _run(_generators(tmp_path, False, None, busy))
    (_, _, end_a), (_, start_b, _) = sorted(busy, key=lambda b: b[1])
    assert start_b >= end_a, "a local model waits for the other"


def test_samples_do_not_depend_on_who_answers_first(tmp_path: Path) -> None:
    """Both PLMs write the same text once: the first plan keeps it, the second re-asks, in either mode."""
    side_by_side, _ = _run(_generators(tmp_path / "p", True, threading.Barrier(2, timeout=10), [], dup=True))
    one_by_one, _ = _run(_generators(tmp_path / "s", False, None, [], dup=True))
    key = [(x.id, x.plm, x.label, x.text) for x in side_by_side]
    assert key == [(x.id, x.plm, x.label, x.text) for x in one_by_one]
    assert sum(x.text == "the same words for everyone" for x in side_by_side) == 1
    assert [x.plm for x in side_by_side] == ["a"] * 4 + ["b"] * 4


@pytest.fixture(autouse=True)
def _tmp_dirs(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "s").mkdir()


class _Shuffled:
    """A backend whose answers arrive in a seeded random order, a seeded share of them unusable (empty) or the
    same text as another request's (one of a few shared texts); every request it is sent is recorded."""

    def __init__(self, name: str, remote: bool, seed: int, log: list, slow_last: threading.Event | None = None,
                 concurrency: int | None = None, calls: list | None = None):
        self.name, self.runs_remotely, self._seed, self._log, self._slow_last = name, remote, seed, log, slow_last
        if concurrency is not None:  # an API generator that says so: its requests go out in blocks
            self.max_concurrency = concurrency
        self._calls = calls if calls is not None else []  # the size of every call
        self.held_back: list[bool] = []  # per held-back answer: was a replacement asked while it waited

    model_id = property(lambda self: f"shuffled:{self.name}")
    chat = True

    def _text(self, request: GenerationRequest) -> str:
        draw = (request.seed * 7919 + self._seed) % 100
        if draw < 20:
            return ""
        if draw < 45:
            return f"one of the few texts everybody writes, number {draw % 3}"
        return f"{self.name} writes something of its own, {request.seed}"

    def generate(self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None = None,
                 stop: threading.Event | None = None) -> list[GenerationResult]:
        import random

        self._log.extend((self.name, r.seed, time.monotonic()) for r in requests)
        self._calls.append(len(requests))
        out = [GenerationResult(self._text(r), 3, 5) for r in requests]
        order = list(range(len(requests)))
        random.Random(self._seed + len(requests)).shuffle(order)
        for k, i in enumerate(order):
            if self._slow_last is not None and not self.held_back and k == len(order) - 1:
                # the first batch's last answer waits for a replacement to be asked
                self.held_back.append(self._slow_last.wait(10))
            time.sleep(0.001)
            if on_result:
                on_result(i, out[i])
        return out


def _shuffled_run(tmp_path: Path, remote: bool, seed: int, existing=(), slow_last=None, concurrency=None,
                  calls=None):
    log: list = []
    cache = RequestCache(tmp_path / f"cache-{remote}-{seed}-{concurrency}.sqlite")
    gens = {n: CachedGenerator(_Shuffled(n, remote, seed, log, slow_last, concurrency, calls), cache)
            for n in ("a", "b")}
    plans = [GenerationPlan("a", {"positive": 6, "negative": 5}), GenerationPlan("b", {"positive": 5, "negative": 6})]
    samples, stats = generate_samples(1, plans=plans, generators=gens, existing=list(existing), max_attempts=4,
                                      make_requests=zero_shot_requests(TASK, PromptSettings(), seed, "t"))
    return samples, stats, log


@pytest.mark.parametrize("concurrency", [None, 2])
@pytest.mark.parametrize("seed", range(6))
def test_early_replacements_ask_the_same_requests_and_keep_the_same_samples(tmp_path: Path, seed: int,
                                                                            concurrency: int | None) -> None:
    """API generators ask the replacements of dropped answers while the first batch is in flight; answers arrive
    in any order, with empty ones and duplicates across PLMs and attempts; with a stated concurrency each
    attempt's requests go out in blocks of their own calls. The requests sent (none more, none fewer), the samples
    and the stats equal those of the plain pass, attempt after attempt, one call a batch."""
    from dpsynth.methods.generation import SyntheticSample

    earlier = [SyntheticSample(0, "one of the few texts everybody writes, number 1", "positive", "a", 0)]
    calls: list[int] = []
    early, early_stats, early_log = _shuffled_run(tmp_path, True, seed, earlier, concurrency=concurrency, calls=calls)
    if concurrency is not None:  # each PLM's first batch (11 requests) went out in blocks of 3, 6 and 2
        assert calls.count(3) >= 2 and calls.count(6) >= 2 and 11 not in calls
    plain, plain_stats, plain_log = _shuffled_run(tmp_path, False, seed, earlier)
    assert sorted((n, s) for n, s, _ in early_log) == sorted((n, s) for n, s, _ in plain_log)
    assert [(x.id, x.plm, x.label, x.text) for x in early] == [(x.id, x.plm, x.label, x.text) for x in plain]
    assert early_stats == plain_stats
    assert sum(sum(s["dropped"].values()) for s in plain_stats.values()) > 0, "the case re-asks"


def test_a_replacement_is_asked_before_the_first_batch_is_answered(tmp_path: Path) -> None:
    """The first batch's last answer is held back until a replacement has been sent (for at most 10 s): the
    replacement must go out while the batch is still in flight, not after it. (Only the backend's first call,
    the first batch, holds an answer back.)"""
    release = threading.Event()

    class Watching(list):
        def extend(self, items) -> None:
            if self:  # a call after the first batch's: a replacement
                release.set()
            super().extend(items)

    log = Watching()
    cache = RequestCache(tmp_path / "cache.sqlite")
    backend = _Shuffled("a", True, 3, log, release)
    generate_samples(0, plans=[GenerationPlan("a", {"positive": 6, "negative": 6})],
                     generators={"a": CachedGenerator(backend, cache)}, existing=[], max_attempts=3,
                     make_requests=zero_shot_requests(TASK, PromptSettings(), 3, "t"))
    assert backend.held_back == [True]


def test_a_replacement_that_fails_stops_the_others_and_is_the_error(tmp_path: Path) -> None:
    """Half the first batch's answers are empty; the API then refuses everything (a spent quota): the refusal is
    the error, after the first batch (all of whose answers are kept), and no more than a few replacement calls
    go out before it stops them (one per PLM in a gathered batch, not one per drop)."""
    calls: list[int] = []

    class Quota:
        runs_remotely, chat, name, model_id = True, True, "p", "quota"

        def generate(self, requests, on_result=None):
            calls.append(len(requests))
            if len(calls) > 1:
                raise RuntimeError("quota exhausted")
            out = [GenerationResult("" if i % 2 else f"a review long enough to keep, {r.seed}", 1, 1)
                   for i, r in enumerate(requests)]
            for i, result in enumerate(out):
                if on_result:
                    on_result(i, result)
            return out

    with pytest.raises(RuntimeError, match="quota exhausted"):
        generate_samples(0, plans=[GenerationPlan("p", {"positive": 100, "negative": 100})],
                         generators={"p": CachedGenerator(Quota(), RequestCache(tmp_path / "c.sqlite"))}, existing=[],
                         max_attempts=3, make_requests=zero_shot_requests(TASK, PromptSettings(), 0, "t"))
    assert calls[0] == 200 and 2 <= len(calls) <= 4 and sum(calls[1:]) <= 100


def test_blocks_are_the_plans_requests_once_each_in_growing_prefixes() -> None:
    from dpsynth.methods.asking import _blocks

    make = zero_shot_requests(TASK, PromptSettings(), 0, "t")
    plan = GenerationPlan("a", {"positive": 10, "negative": 7})
    whole = make(plan, 0, True)
    blocks = list(_blocks(plan, lambda p: make(p, 0, True), 3))
    assert [len(b) for b in blocks] == [4, 9, 4]  # ceil(10 x 3/17) + ceil(7 x 3/17), then up to 12, then the rest
    got = sorted((label, j, r.seed) for b in blocks for label, j, r in b)
    js = {"positive": iter(range(10)), "negative": iter(range(7))}
    assert got == sorted((label, next(js[label]), r.seed) for label, r in whole)
    assert [[(label, r) for label, _, r in b] for b in _blocks(plan, lambda p: make(p, 0, True), None)] == [whole]


def test_blocks_build_each_request_once() -> None:
    """Each block builds only the requests after the last block's (rebuilding each prefix doubled the building
    that competes with the answers for the interpreter lock)."""
    from dpsynth.methods.asking import _blocks

    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")
    built: list[int] = []

    def make(plan: GenerationPlan) -> list:
        out = zero_shot(plan, 0, True)
        built.append(len(out))
        return out

    blocks = list(_blocks(GenerationPlan("a", {"positive": 640, "negative": 640}), make, 64))
    assert built == [len(b) for b in blocks] == [64, 192, 768, 256] and sum(built) == 1280


def test_a_request_maker_that_ignores_the_plans_start_is_refused() -> None:
    from dpsynth.methods.asking import _blocks

    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")

    def whole_prefix(plan: GenerationPlan) -> list:  # builds from index 0 whatever plan.start says
        return zero_shot(GenerationPlan(plan.plm, plan.per_label), 0, True)

    with pytest.raises(ValueError, match="GenerationPlan.indices"):
        list(_blocks(GenerationPlan("a", {"positive": 10, "negative": 7}), whole_prefix, 3))


class _Blocked:
    """An API generator that says it has `max_concurrency` requests in flight, answering at once; `first_call`:
    set when the first call arrives."""

    runs_remotely, chat, name, model_id = True, True, "p", "blocked"

    def __init__(self, max_concurrency: int) -> None:
        self.max_concurrency = max_concurrency
        self.calls: list[int] = []
        self.first_call = threading.Event()

    def generate(self, requests, on_result=None, stop=None):
        self.calls.append(len(requests))
        self.first_call.set()
        out = [GenerationResult(f"a review long enough to keep, {r.seed}", 1, 1) for r in requests]
        for i, result in enumerate(out):
            if on_result:
                on_result(i, result)
        return out


def test_the_first_round_goes_out_before_the_rest_is_built(tmp_path: Path) -> None:
    """An API generator with 4 requests in flight gets its first 4 requests in a call of their own while the rest
    of the batch is still being built (the build of the whole plan waits, for at most 10 s, for that call)."""
    backend = _Blocked(4)
    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")
    before_first_call: list[bool] = []

    def make(plan: GenerationPlan, attempt: int, chat: bool):
        if sum(plan.per_label.values()) == 200:  # the whole plan: built only once the first round is out
            before_first_call.append(not backend.first_call.wait(10))
        return zero_shot(plan, attempt, chat)

    samples, _ = generate_samples(0, plans=[GenerationPlan("p", {"positive": 100, "negative": 100})],
                                  generators={"p": CachedGenerator(backend, RequestCache(tmp_path / "c.sqlite"))},
                                  existing=[], max_attempts=1, make_requests=make)
    assert before_first_call == [False] and backend.calls == [4, 12, 48, 136] and len(samples) == 200


def test_a_generation_leaves_earlier_objects_out_of_full_collections_and_gives_them_back(tmp_path: Path) -> None:
    """A full collection during a generation scans only what the generation made (a whole-heap one held the
    interpreter lock 150-190 ms in benchmarks/generation_overhead.py); afterwards, and after a failure, nothing
    stays frozen."""
    import gc

    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")
    frozen_while_building: list[int] = []

    def make(plan: GenerationPlan, attempt: int, chat: bool):
        frozen_while_building.append(gc.get_freeze_count())
        return zero_shot(plan, attempt, chat)

    before = gc.get_freeze_count()
    generate_samples(0, plans=[GenerationPlan("p", {"positive": 3, "negative": 3})],
                     generators={"p": CachedGenerator(_Blocked(2), RequestCache(tmp_path / "c.sqlite"))},
                     existing=[], max_attempts=1, make_requests=make)
    assert frozen_while_building and min(frozen_while_building) > 0 and gc.get_freeze_count() == before

    def broken(plan: GenerationPlan, attempt: int, chat: bool):
        raise RuntimeError("no prompts today")

    with pytest.raises(RuntimeError, match="no prompts today"):
        generate_samples(0, plans=[GenerationPlan("p", {"positive": 3})],
                         generators={"p": CachedGenerator(_Blocked(2), RequestCache(tmp_path / "d.sqlite"))},
                         existing=[], max_attempts=1, make_requests=broken)
    assert gc.get_freeze_count() == before


def _generate_beside(tmp_path: Path, name: str, make) -> None:
    generate_samples(0, plans=[GenerationPlan("p", {"positive": 3, "negative": 3})],
                     generators={"p": CachedGenerator(_Blocked(2), RequestCache(tmp_path / f"{name}.sqlite"))},
                     existing=[], max_attempts=1, make_requests=make)


def test_a_generation_leaves_a_freeze_made_before_it_alone(tmp_path: Path) -> None:
    """gc.unfreeze has no nesting: a generation that froze and unfroze blindly undid a host application's freeze."""
    import gc

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        _generate_beside(tmp_path, "a", zero_shot_requests(TASK, PromptSettings(), 0, "t"))
        assert gc.get_freeze_count() >= frozen > 0
    finally:
        gc.unfreeze()


def test_generations_side_by_side_share_the_freeze_until_the_last_ends(tmp_path: Path) -> None:
    import gc

    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")
    a_in, b_done, frozen_after_b = threading.Event(), threading.Event(), []

    def a_make(plan, attempt, chat):
        if not a_in.is_set():
            a_in.set()
            assert b_done.wait(10)
            frozen_after_b.append(gc.get_freeze_count())
        return zero_shot(plan, attempt, chat)

    a = threading.Thread(target=_generate_beside, args=(tmp_path, "a", a_make))
    a.start()
    assert a_in.wait(10)
    _generate_beside(tmp_path, "b", zero_shot)
    b_done.set()
    a.join(10)
    assert frozen_after_b and frozen_after_b[0] > 0 and gc.get_freeze_count() == 0


def test_early_replacements_refuse_a_maker_that_ignores_the_plans_start() -> None:
    """The replacements' requests are built in growing parts too; a maker that builds from 0 whatever the part's
    start would have given the j-th replacement another request's prompt."""
    from types import SimpleNamespace

    from dpsynth.methods.asking import Progress, Replacements

    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")

    def whole_prefix(plan: GenerationPlan, attempt: int, chat: bool) -> list:
        return zero_shot(GenerationPlan(plan.plm, plan.per_label), attempt, chat)

    for maker, ok in ((zero_shot, True), (whole_prefix, False)):
        replacements = Replacements([GenerationPlan("p", {"positive": 10})], {"p": SimpleNamespace(chat=True)},
                                    set(), maker, 3, Progress({"p": 10}, None), clean_generation)
        try:
            if ok:
                got = [replacements.request("p", "positive", 1, j).seed for j in range(6)]
                assert got == [r.seed for _, r in zero_shot(GenerationPlan("p", {"positive": 6}), 1, True)]
            else:
                with pytest.raises(ValueError, match="GenerationPlan.indices"):
                    [replacements.request("p", "positive", 1, j) for j in range(6)]
        finally:
            replacements.pool.shutdown()


def test_plms_build_their_blocks_one_at_a_time_every_first_block_first(tmp_path: Path) -> None:
    """Building holds the interpreter lock: PLMs building side by side only delayed each other's first requests."""
    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")
    order: list[tuple[str, bool]] = []  # (plm, a first block)
    building = [0]
    overlapped = []

    def make(plan: GenerationPlan, attempt: int, chat: bool):
        building[0] += 1
        overlapped.append(building[0] > 1)
        if attempt == 0:
            order.append((plan.plm, not any(plan.start.values())))
        time.sleep(0.002)  # long enough for another PLM's thread to try building meanwhile
        out = zero_shot(plan, attempt, chat)
        building[0] -= 1
        return out

    cache = RequestCache(tmp_path / "c.sqlite")
    plms = ("a", "b", "c", "d")
    generate_samples(0, plans=[GenerationPlan(p, {"positive": 20, "negative": 20}) for p in plms],
                     generators={p: CachedGenerator(_Blocked(4), cache) for p in plms},
                     existing=[], max_attempts=1, make_requests=make)
    firsts = [first for _, first in order]
    assert sorted(p for p, first in order if first) == sorted(plms) and firsts[:len(plms)] == [True] * len(plms)
    assert not any(overlapped)


class _FromElsewhere(_Blocked):
    """As `_Blocked`, sending from request processes (as a `processes:` fleet)."""

    sends_elsewhere = True


def test_a_fleet_s_first_block_is_claimed_before_the_next_plm_builds(tmp_path: Path) -> None:
    """A builder holds the interpreter lock: the block thread that looks up and claims the block built before it
    waited behind it, so no PLM's first request went out before every PLM had built (found with
    benchmarks/generation_overhead.py). For backends that send from other processes the turn now lasts until the
    block is handed over."""
    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")
    events: list[tuple[str, str]] = []

    def make(plan: GenerationPlan, attempt: int, chat: bool):
        events.append(("built", plan.plm))
        return zero_shot(plan, attempt, chat)

    class _Recording(RequestCache):
        def claim(self, keys):
            events.append(("claimed", self.plm))
            return super().claim(keys)

    plms = ("a", "b", "c")
    generators = {}
    for plm in plms:
        cache = _Recording(tmp_path / f"{plm}.sqlite")
        cache.plm = plm
        generators[plm] = CachedGenerator(_FromElsewhere(64), cache)
    generate_samples(0, plans=[GenerationPlan(p, {"positive": 5}) for p in plms], generators=generators,
                     existing=[], max_attempts=1, make_requests=make)
    # whichever PLM's thread asks for its turn first builds first: each build is followed by its own claim
    assert [kind for kind, _ in events] == ["built", "claimed"] * len(plms)
    assert all(events[i][1] == events[i + 1][1] for i in range(0, len(events), 2))
    assert sorted(plm for _, plm in events[::2]) == sorted(plms)


def test_a_one_process_backend_s_turn_ends_with_the_build(tmp_path: Path) -> None:
    """A backend that sends from this process's threads needs the interpreter lock to send: the next PLM builds
    while the block before it is claimed and sent (held to the hand-over, the first round went out later,
    docs/scale.md). Here each PLM's claim waits until the other has built (whichever builds first): held to the
    hand-over, the first one's claim would wait 10 s."""
    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")
    built = {"a": threading.Event(), "b": threading.Event()}

    def make(plan: GenerationPlan, attempt: int, chat: bool):
        out = zero_shot(plan, attempt, chat)
        built[plan.plm].set()
        return out

    class _WaitsForTheOther(RequestCache):
        def __init__(self, path: Path, other: str) -> None:
            super().__init__(path)
            self.other = other

        def claim(self, keys):
            assert built[self.other].wait(10), "a turn lasted until its block was claimed"
            return super().claim(keys)

    generators = {plm: CachedGenerator(_Blocked(64), _WaitsForTheOther(tmp_path / f"{plm}.sqlite", other))
                  for plm, other in (("a", "b"), ("b", "a"))}
    generate_samples(0, plans=[GenerationPlan(p, {"positive": 5}) for p in ("a", "b")], generators=generators,
                     existing=[], max_attempts=1, make_requests=make)
    assert all(event.is_set() for event in built.values())


def test_build_turns_go_to_the_lowest_block_waiting() -> None:
    from dpsynth.methods.asking import _BuildTurns

    turns, order, release = _BuildTurns(), [], threading.Event()

    def take(name: str, block: int, hold: threading.Event | None = None) -> None:
        with turns.take(block):
            order.append(name)
            if hold is not None:
                assert hold.wait(10)

    def waiting(n: int) -> None:
        deadline = time.monotonic() + 10
        while len(turns._waiting) < n:
            assert time.monotonic() < deadline
            time.sleep(0.001)

    threads = [threading.Thread(target=take, args=("holder", 0, release))]
    threads[0].start()
    while not order:
        time.sleep(0.001)
    for name, block in (("second", 1), ("first", 0)):
        threads.append(threading.Thread(target=take, args=(name, block)))
        threads[-1].start()
        waiting(len(threads) - 1)
    release.set()
    for thread in threads:
        thread.join(10)
    assert order == ["holder", "first", "second"]


def test_a_request_maker_that_builds_the_labels_in_another_order_is_refused() -> None:
    from dpsynth.methods.asking import _blocks

    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")

    def reversed_labels(plan: GenerationPlan) -> list:
        return list(reversed(zero_shot(plan, 0, True)))

    with pytest.raises(ValueError, match="label order"):
        list(_blocks(GenerationPlan("a", {"positive": 3, "negative": 2}), reversed_labels, None))


def test_a_plm_that_builds_its_whole_plan_at_once_does_not_hold_the_others_first_blocks(tmp_path: Path) -> None:
    """A spend cap or an unstated concurrency means one block, built outside the turns."""
    zero_shot = zero_shot_requests(TASK, PromptSettings(), 0, "t")
    whole_started, others_built = threading.Event(), threading.Event()

    def make(plan: GenerationPlan, attempt: int, chat: bool):
        if plan.plm == "whole":
            whole_started.set()
            assert others_built.wait(10), "the one-block PLM held the turn"
        elif whole_started.is_set():
            others_built.set()
        return zero_shot(plan, attempt, chat)

    cache = RequestCache(tmp_path / "c.sqlite")
    whole, blocked = _Blocked(4), _Blocked(4)
    whole.max_concurrency = None  # states none: its plan is built and sent in one call
    generate_samples(0, plans=[GenerationPlan("whole", {"positive": 8}), GenerationPlan("b", {"positive": 8})],
                     generators={"whole": CachedGenerator(whole, cache), "b": CachedGenerator(blocked, cache)},
                     existing=[], max_attempts=1, make_requests=make)
    assert others_built.is_set()
