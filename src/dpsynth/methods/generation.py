"""Parts every generation method shares: samples, allocation, seeded requests, the generation loop."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
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

    def make(plan: GenerationPlan, attempt: int, chat: bool) -> list[tuple[str, GenerationRequest]]:
        return [
            (label, build_request(task, label, chat=chat, settings=settings,
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
    """Generate, clean and de-duplicate; re-ask (new seeds) for dropped samples up to `max_attempts` times."""
    seen = {(x.label, x.text.lower()) for x in existing}
    next_id = max((x.id for x in existing), default=-1) + 1
    new: list[SyntheticSample] = []
    stats: dict[str, dict] = {}
    for plan in plans:
        gen = generators[plan.plm]
        cleaning = CleaningStats()
        wanted = dict(plan.per_label)
        target = sum(wanted.values())
        done = 0
        for attempt in range(max_attempts):
            if sum(wanted.values()) == 0:
                break
            pairs = make_requests(GenerationPlan(plan.plm, dict(wanted)), attempt, gen.chat)

            def progress(_: int, __: object) -> None:
                nonlocal done
                done += 1
                if on_progress:
                    on_progress(plan.plm, done, target)  # noqa: B023 - called within this iteration only

            results = gen.generate([r for _, r in pairs], on_result=progress)
            for (label, _), result in zip(pairs, results):
                text, reason = clean_generation(result.text)
                if text is not None and (label, text.lower()) in seen:
                    text, reason = None, "duplicate"
                if text is None:
                    cleaning.dropped[reason] += 1
                    continue
                seen.add((label, text.lower()))
                cleaning.kept += 1
                wanted[label] -= 1
                new.append(SyntheticSample(next_id, text, label, plan.plm, t))
                next_id += 1
        stats[plan.plm] = {**cleaning.as_dict(), "requested": target, "short_by": sum(wanted.values())}
    return new, stats
