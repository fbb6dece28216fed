"""Parts every generation method shares: samples, allocation, seeded requests, the generation loop (how an
attempt's requests are asked of the generators: `asking.py`)."""

from __future__ import annotations

import functools
import gc
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from dpsynth.data.records import TaskSpec
from dpsynth.llm.base import GenerationRequest
from dpsynth.llm.cache import CachedGenerator
from dpsynth.methods.asking import Progress, Replacements, ask_all
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
    before that index are not wanted (an earlier block built them, `asking._blocks`); a request maker builds the j-th
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


@_earlier_objects_frozen()
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
    (`asking.Replacements`): the same requests as the attempts after it would send, a round of latency sooner."""
    seen = {(x.label, x.text.lower()) for x in existing}
    kept: dict[str, list[tuple[str, str]]] = {p.plm: [] for p in plans}
    cleaning = {p.plm: CleaningStats() for p in plans}
    wanted = {p.plm: dict(p.per_label) for p in plans}
    target = {p.plm: sum(p.per_label.values()) for p in plans}
    progress = Progress(target, on_progress)
    # each answer is cleaned once: as it arrives (to find drops early) and in the plan-order pass below
    clean = functools.cache(clean_generation)
    early = (Replacements(plans, generators, seen, make_requests, max_attempts, progress, clean)
             if Replacements.apply(plans, generators, max_attempts) else None)
    for attempt in range(max_attempts):
        asking = {p.plm: GenerationPlan(p.plm, dict(wanted[p.plm])) for p in plans if sum(wanted[p.plm].values()) > 0}
        if not asking:
            break

        def make(plan: GenerationPlan, attempt: int = attempt) -> list[tuple[str, GenerationRequest]]:
            return make_requests(plan, attempt, generators[plan.plm].chat)

        if early is not None and attempt == 0:
            answers = early.ask_first(asking, make)
        else:
            answers = ask_all(asking, make, generators, progress, known=early.known if early is not None else None)
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
