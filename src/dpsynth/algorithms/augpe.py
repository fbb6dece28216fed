"""Aug-PE (Xie et al. 2024), the single-PLM Private Evolution baseline of the WASP paper.

population_0 = RANDOM_API(N)                                   (zero-shot, no private data)
for t in 1..T-1:                                               (T-1 noisy releases)
    H = Top-1 (or L2-normalised k-NN) votes of private samples on population_{t-1},
        within their own label; + N(0, sigma^2) from the ledger; entries below the
        threshold set to 0
    parents = per label, rank (top by H, cycled) or sample (prop. to H) from population_{t-1}
    population_t = VARIATION_API(parents)                      (paraphrase / fill in the blanks)
output population_{T-1}

Sensitivity 1 either way (Top-1, or k-NN weights 1/sqrt(k)); the accounting is the
exact Gaussian-DP composition of the Aug-PE paper, done by the same ledger.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dpsynth.algorithms.common import (
    GenerationPlan,
    SyntheticSample,
    generate_samples,
    plan_counts,
    request_seed,
    zero_shot_requests,
)
from dpsynth.privacy.plans import ReleasePlan, augpe_plan
from dpsynth.prompts.builder import PromptSettings, build_variation_request
from dpsynth.runs.config import RunConfig, plan_parties, records_per_unit
from dpsynth.voting.spec import VoteSpec

if TYPE_CHECKING:
    from dpsynth.runs.run import RunContext


@dataclass
class AugPEState:
    next_iteration: int = 0
    population: list[SyntheticSample] = field(default_factory=list)
    initial: list[SyntheticSample] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "AugPEState":
        return cls(
            next_iteration=data["next_iteration"],
            population=[SyntheticSample(**s) for s in data["population"]],
            initial=[SyntheticSample(**s) for s in data["initial"]],
            history=data["history"],
        )


def vote_weights(kind: str, k: int) -> list[float]:
    """Top-1: [1]; k-NN: k weights of 1/sqrt(k), so each private sample's vote has L2 norm 1."""
    return [1.0] if kind == "top1" else [1.0 / math.sqrt(k)] * k


def select_parents(
    noisy: np.ndarray, population: list[SyntheticSample], counts: dict[str, int], how: str, rng: np.random.Generator
) -> dict[str, list[SyntheticSample]]:
    """Per label, `counts[label]` parents: the top by noisy votes (cycled), or drawn in proportion to them."""
    out: dict[str, list[SyntheticSample]] = {}
    for label, count in counts.items():
        idx = [i for i, x in enumerate(population) if x.label == label]
        if not idx or count == 0:
            out[label] = []
            continue
        h = np.clip(noisy[idx], 0.0, None)
        if how == "rank":
            order = [idx[i] for i in np.argsort(-h, kind="stable")]
            out[label] = [population[order[j % len(order)]] for j in range(count)]
        else:
            p = h / h.sum() if h.sum() > 0 else np.full(len(idx), 1.0 / len(idx))
            out[label] = [population[idx[i]] for i in rng.choice(len(idx), size=count, p=p)]
    return out


class AugPEMethod:
    name = "augpe"

    def iterations(self, config: RunConfig) -> int:
        return config.augpe.iterations

    def release_plan(self, config: RunConfig) -> ReleasePlan:
        parties, min_parties = plan_parties(config)
        return augpe_plan(config.augpe.iterations, adjacency=config.privacy.adjacency,
                          max_records_per_user=records_per_unit(config), parties=parties, min_parties=min_parties)

    def new_state(self, config: RunConfig) -> AugPEState:
        return AugPEState()

    def load_state(self, data: dict) -> AugPEState:
        return AugPEState.from_dict(data)

    def step(self, ctx: "RunContext", state: AugPEState, t: int) -> dict:
        a, seed, task = ctx.config.augpe, ctx.config.seed, ctx.data.task
        plm = ctx.config.generators[0].display_name
        settings = PromptSettings(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p)
        plans = plan_counts(a.n, {plm: 1.0}, ctx.label_shares)
        record: dict = {"iteration": t}
        if t == 0:
            make_requests = zero_shot_requests(task, settings, seed, "random_api")
        else:
            noisy = self._noisy_votes(ctx, state, t)
            rng = np.random.default_rng(request_seed(seed, "augpe.select", t))
            parents = select_parents(noisy, state.population, plans[0].per_label, a.selection, rng)
            record["parents_distinct"] = sum(len({p.id for p in ps}) for ps in parents.values())

            def make_requests(plan: GenerationPlan, attempt: int, chat: bool):
                out = []
                for label, count in plan.per_label.items():
                    for j in range(count):
                        parent = parents[label][(j + attempt * 7) % len(parents[label])]
                        kind = a.variation if a.variation != "mixed" else ("paraphrase", "fill_blank")[j % 2]
                        out.append((label, build_variation_request(
                            task, label, parent.text, chat=chat, kind=kind, fill_ratio=a.fill_ratio,
                            settings=settings, rng_seed=request_seed(seed, "variation", t, label, attempt, j))))
                return out

        t0 = time.perf_counter()
        new, stats = generate_samples(t, plans=plans, generators=ctx.generators, existing=state.population,
                                      make_requests=make_requests, max_attempts=a.max_attempts,
                                      on_progress=ctx.generation_progress(t))
        ctx.add_time("generation", t0)
        state.population = new
        if t == 0:
            state.initial = list(new)
        record.update(generated=stats, population=len(new))
        return record

    def _noisy_votes(self, ctx: "RunContext", state: AugPEState, t: int) -> np.ndarray:
        a = ctx.config.augpe
        ctx.phase(f"iteration {t}: embed + vote + noise", 0)
        synth = ctx.embed_synthetic(state.population)
        spec = VoteSpec(kind="rank", weights=tuple(vote_weights(a.votes, a.k)))
        noisy = ctx.noisy_votes(spec, synth, ctx.label_ids(state.population), t)
        noisy[noisy < a.threshold] = 0.0
        ctx.phase(f"iteration {t}: embed + vote + noise", 1)
        return noisy

    def final_samples(self, state: AugPEState) -> list[SyntheticSample]:
        return list(state.population)

    def reference_sets(self, state: AugPEState) -> dict[str, list[SyntheticSample]]:
        return {"zero_shot": list(state.initial)}
