"""WASP (Zou et al., ICLR 2025; papers/000 Algorithms 1 and 3), read like the paper.

for t in 0..T-1:
    each PLM k writes round((N/T) w_k) samples, spread over labels      (weighted parallel generation)
        t = 0: zero-shot prompts; t > 0: contrastive prompts with S - S//2
        good and S//2 bad synthetic examples of the label, drawn per prompt
    if t < T-1:                                                           (T-1 noisy releases)
        private samples cast Top-Q nearest and furthest votes, weights 2^-i, among
        synthetic samples of their own label; Gaussian noise from the ledger
        per label: top-S by noisy nearest votes = good, by furthest = bad
        PLM weights from the noisy nearest histogram (Eq. 8)

Deviations, each documented in docs/wasp.md: the tight sensitivity of the
concatenated histograms (not 4); weights from noisy votes clipped at zero,
normalised, floored at `min_weight` and renormalised (noisy votes can be
negative, and no PLM may starve); votes after the last generation are not
made, because nothing would use them.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

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


@dataclass
class WaspState:
    """Everything needed to continue a run; holds only synthetic text and noisy statistics."""

    next_iteration: int = 0
    samples: list[SyntheticSample] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    good: dict[str, list[int]] = field(default_factory=dict)
    bad: dict[str, list[int]] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "WaspState":
        return cls(
            next_iteration=data["next_iteration"],
            samples=[SyntheticSample(**s) for s in data["samples"]],
            weights=data["weights"],
            good=data["good"],
            bad=data["bad"],
            history=data["history"],
        )


def split_count(total: int, shares: Sequence[float]) -> list[int]:
    """Integers proportional to `shares` summing to `total` (largest remainder)."""
    shares_arr = np.asarray(shares, dtype=np.float64)
    shares_arr = shares_arr / shares_arr.sum()
    raw = total * shares_arr
    out = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - out), kind="stable")[: total - out.sum()]:
        out[i] += 1
    return out.tolist()


def iteration_size(n: int, iterations: int, t: int) -> int:
    """N/T per iteration; the last one takes the remainder so the run writes N in total."""
    base = n // iterations
    return base + (n - base * iterations if t == iterations - 1 else 0)


def select_top(noisy: np.ndarray, samples: Sequence[SyntheticSample], labels: Sequence[str], s: int) -> dict[str, list[int]]:
    """Per label, the ids of the top-S samples by a noisy histogram (Eq. 7)."""
    out: dict[str, list[int]] = {}
    for label in labels:
        idx = [i for i, x in enumerate(samples) if x.label == label]
        ranked = sorted(idx, key=lambda i: -noisy[i])[:s]
        out[label] = [samples[i].id for i in ranked]
    return out


def plm_weights(
    noisy_near: np.ndarray, samples: Sequence[SyntheticSample], plms: Sequence[str], min_weight: float
) -> dict[str, float]:
    """Eq. 8 on noisy votes, made sound: clip at 0, normalise, floor at `min_weight`, renormalise."""
    votes = np.clip(noisy_near, 0.0, None)
    total = votes.sum()
    if total <= 0:
        return {k: 1.0 / len(plms) for k in plms}
    score = votes / total
    n_all = len(samples)
    raw = {}
    for k in plms:
        members = [i for i, x in enumerate(samples) if x.plm == k]
        raw[k] = score[members].sum() / (len(members) / n_all) if members else 0.0
    norm = sum(raw.values()) or 1.0
    floored = {k: max(v / norm, min_weight) for k, v in raw.items()}
    z = sum(floored.values())
    return {k: v / z for k, v in floored.items()}


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "big")


@dataclass
class GenerationPlan:
    """What one PLM writes in one iteration: label -> count."""

    plm: str
    per_label: dict[str, int]


def plan_generation(
    t: int, n: int, iterations: int, weights: dict[str, float], label_shares: dict[str, float]
) -> list[GenerationPlan]:
    plms = list(weights)
    per_plm = split_count(iteration_size(n, iterations, t), [weights[k] for k in plms])
    labels = list(label_shares)
    return [
        GenerationPlan(k, dict(zip(labels, split_count(count, [label_shares[c] for c in labels]))))
        for k, count in zip(plms, per_plm)
    ]


def build_requests(
    plan: GenerationPlan,
    *,
    t: int,
    attempt: int,
    seed: int,
    task: TaskSpec,
    chat: bool,
    state: WaspState,
    s: int,
    contrastive: bool,
    samples_per_prompt: int,
    settings: PromptSettings,
) -> list[tuple[str, GenerationRequest]]:
    """(label, request) pairs; examples are drawn at random per prompt from the selected sets."""
    by_id = {x.id: x.text for x in state.samples}
    out: list[tuple[str, GenerationRequest]] = []
    for label, count in plan.per_label.items():
        for j in range(count):
            prompt_no = j // samples_per_prompt
            rng = np.random.default_rng(_seed(seed, "examples", t, plan.plm, label, attempt, prompt_no))
            good: list[str] = []
            bad: list[str] = []
            if t > 0:
                n_bad = s // 2 if contrastive else 0
                good_pool, bad_pool = state.good.get(label, []), state.bad.get(label, [])
                good = [by_id[i] for i in rng.permutation(good_pool)[: s - n_bad]]
                bad = [by_id[i] for i in rng.permutation(bad_pool)[:n_bad]]
            request = build_request(
                task, label, chat=chat, good=good, bad=bad, settings=settings,
                seed=_seed(seed, "sample", t, plan.plm, label, attempt, j),
            )
            out.append((label, request))
    return out


def generate_iteration(
    t: int,
    *,
    plans: Sequence[GenerationPlan],
    generators: dict[str, CachedGenerator],
    state: WaspState,
    task: TaskSpec,
    seed: int,
    s: int,
    contrastive: bool,
    samples_per_prompt: int,
    settings: PromptSettings,
    max_attempts: int,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> tuple[list[SyntheticSample], dict[str, dict]]:
    """Generate, clean and de-duplicate; re-ask (new seeds) for dropped samples up to `max_attempts` times."""
    seen = {(x.label, x.text.lower()) for x in state.samples}
    next_id = max((x.id for x in state.samples), default=-1) + 1
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
            pending = GenerationPlan(plan.plm, dict(wanted))
            pairs = build_requests(
                pending, t=t, attempt=attempt, seed=seed, task=task, chat=gen.chat, state=state, s=s,
                contrastive=contrastive, samples_per_prompt=samples_per_prompt, settings=settings,
            )

            def progress(_: int, __: object) -> None:
                nonlocal done
                done += 1
                if on_progress:
                    on_progress(plan.plm, done, target)

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


def label_shares_uniform(labels: Sequence[str]) -> dict[str, float]:
    return {c: 1.0 / len(labels) for c in labels}
