"""Parts every generation method shares: samples, allocation, seeded requests, the generation loop."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dpsynth.data.records import TaskSpec
from dpsynth.llm.base import GenerationRequest
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
    """What one PLM writes in one iteration: label -> count."""

    plm: str
    per_label: dict[str, int]


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
            for label, count in plan.per_label.items()
            for j in range(count)
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
    de-duplicated in plan order afterwards, so the samples do not depend on which server answered first."""
    seen = {(x.label, x.text.lower()) for x in existing}
    kept: dict[str, list[tuple[str, str]]] = {p.plm: [] for p in plans}
    cleaning = {p.plm: CleaningStats() for p in plans}
    wanted = {p.plm: dict(p.per_label) for p in plans}
    target = {p.plm: sum(p.per_label.values()) for p in plans}
    done = dict.fromkeys(target, 0)
    for attempt in range(max_attempts):
        asking = [p.plm for p in plans if sum(wanted[p.plm].values()) > 0]
        if not asking:
            break
        batches = {plm: make_requests(GenerationPlan(plm, dict(wanted[plm])), attempt, generators[plm].chat)
                   for plm in asking}
        answers = _ask_all(batches, generators, done, target, on_progress)
        for plm in asking:
            for (label, _), result in zip(batches[plm], answers[plm]):
                text, reason = clean_generation(result.text)
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


def _ask_all(batches: dict[str, list[tuple[str, GenerationRequest]]], generators: dict[str, CachedGenerator],
             done: dict[str, int], target: dict[str, int],
             on_progress: Callable[[str, int, int], None] | None) -> dict[str, list]:
    """Every PLM's batch: side by side when all of them are API generators, else one after another."""

    def ask(plm: str) -> list:
        def progress(_: int, __: object) -> None:
            done[plm] += 1
            if on_progress:
                on_progress(plm, done[plm], target[plm])

        return generators[plm].generate([r for _, r in batches[plm]], on_result=progress)

    if len(batches) > 1 and all(generators[plm].remote for plm in batches):
        with ThreadPoolExecutor(max_workers=len(batches), thread_name_prefix="dpsynth-plm") as pool:
            futures = {plm: pool.submit(ask, plm) for plm in batches}
            return {plm: f.result() for plm, f in futures.items()}
    return {plm: ask(plm) for plm in batches}
