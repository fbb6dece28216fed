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
concatenated histograms (not 4); weights from each PLM's summed noisy votes
clipped at zero, normalised, floored at `min_weight` and renormalised (noisy
sums can be negative, and no PLM may starve); votes after the last generation
are not cast, because nothing would use them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import Field, PositiveInt

from dpsynth.config import records_per_unit, votes_clipped_per_person
from dpsynth.data.records import TaskSpec
from dpsynth.errors import DpsynthError, warn_user
from dpsynth.llm.base import GenerationRequest
from dpsynth.methods.base import (
    Method,
    MethodState,
    PaperFormula,
    SamplingOptions,
    StepContext,
)
from dpsynth.methods.generation import (
    GenerationPlan,
    SyntheticSample,
    generate_samples,
    plan_counts,
    request_seed,
)
from dpsynth.methods.registry import register
from dpsynth.privacy.calibrate import gaussian_sigma_closed_form
from dpsynth.privacy.schedule import Knob, Schedule, gaussian_releases
from dpsynth.privacy.sensitivity import vote_sensitivity
from dpsynth.prompts.builder import PromptSettings, build_request
from dpsynth.voting.spec import VoteSpec

VOTE_SIGMA = "vote_sigma"


class WaspOptions(SamplingOptions):
    """The `wasp:` section: WASP (Zou et al., ICLR 2025): Top-Q votes, contrastive prompts, PLM weights."""

    n: PositiveInt = Field(6000, description="total synthetic samples over all iterations")
    iterations: int = Field(5, ge=2, description="T, including zero-shot iteration 0")
    q: PositiveInt = Field(8, description="Top-Q voting: each private record votes for its Q nearest and Q "
                           "furthest samples of its label, with weights 1, 1/2, ... (Q=1: one nearest, one furthest)")
    s: int = Field(4, ge=1, description="in-context examples per prompt (and top-S selected per label)")
    contrastive: bool = Field(True, description="prompts show bad examples beside good ones (false: good only, the "
                              "paper's w/o-contrastive ablation; the furthest votes are still released and paid for)")
    plm_weighting: bool = Field(True, description="each PLM's share of the next iteration follows its noisy votes "
                                "(false: equal shares throughout)")
    min_weight: float = Field(0.05, ge=0, lt=1, description="floor on every PLM's weight, so none starves")
    samples_per_prompt: PositiveInt = Field(1, description="samples drawn per sampled prompt (prefix reuse)")


class WaspState(MethodState):
    """Everything needed to continue a run; holds only synthetic text and noisy-vote selections."""

    samples: list[SyntheticSample] = []
    weights: dict[str, float] = {}
    good: dict[str, list[int]] = {}
    bad: dict[str, list[int]] = {}


def iteration_size(n: int, iterations: int, t: int) -> int:
    """N/T per iteration; the last one takes the remainder so the run writes N in total."""
    base = n // iterations
    return base + (n - base * iterations if t == iterations - 1 else 0)


def select_top(noisy: np.ndarray, samples: Sequence[SyntheticSample], labels: Sequence[str],
               s: int) -> dict[str, list[int]]:
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
    """Eq. 8 on noisy votes, made sound: each model's summed noisy votes, clipped at 0, as a share of all models',
    divided by its share of the pool; normalised, floored at `min_weight`, renormalised.

    Why each model's sum is clipped and not each sample's vote: a sum of noisy votes is unbiased (its noise is
    sigma sqrt(n_k)), while clipping every entry at 0 adds about 0.4 sigma per sample, which at the paper's
    scale (sigma about 3.5, a pool of thousands, a vote mass of 2M) swamps the votes and flattens the weights
    toward uniform: for a model drawing 120 of 200 votes among 6 (a pool of 1,200, sigma 3.5; noiseless weight
    0.6), 0.20 against about 0.43 with the sums clipped (simulated: tests/test_wasp_algorithm.py)."""
    n_all = len(samples)
    plm_of = np.array([x.plm for x in samples])
    members = {k: plm_of == k for k in plms}
    mass = {k: max(float(np.asarray(noisy_near)[members[k]].sum()), 0.0) for k in plms}
    total = sum(mass.values())
    if total <= 0:
        return {k: 1.0 / len(plms) for k in plms}
    raw = {k: (mass[k] / total) / (members[k].sum() / n_all) if members[k].any() else 0.0 for k in plms}
    norm = sum(raw.values()) or 1.0
    floored = {k: max(v / norm, min_weight) for k, v in raw.items()}
    z = sum(floored.values())
    return {k: v / z for k, v in floored.items()}


def selected_texts(state: WaspState) -> dict[int, str]:
    """The texts of the samples selected as good or bad examples, by id (a few per label, from a pool that
    grows to N: looked up once, not per batch)."""
    wanted = {i for ids in (*state.good.values(), *state.bad.values()) for i in ids}
    return {x.id: x.text for x in state.samples if x.id in wanted}


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
    texts: Mapping[int, str] | None = None,
) -> list[tuple[str, GenerationRequest]]:
    """(label, request) pairs; examples are drawn at random per prompt from the selected sets. `texts`: the
    selected samples' texts by id (`selected_texts`), when the caller builds many batches from one state."""
    if texts is None:
        texts = selected_texts(state) if t > 0 else {}
    out: list[tuple[str, GenerationRequest]] = []
    for label, j in plan.indices():
        prompt_no = j // samples_per_prompt
        rng = np.random.default_rng(request_seed(seed, "examples", t, plan.plm, label, attempt, prompt_no))
        good: list[str] = []
        bad: list[str] = []
        if t > 0:
            n_bad = s // 2 if contrastive else 0
            good = [texts[i] for i in rng.permutation(state.good.get(label, []))[: s - n_bad]]
            bad = [texts[i] for i in rng.permutation(state.bad.get(label, []))[:n_bad]]
        request = build_request(
            task, label, chat=chat, good=good, bad=bad, settings=settings,
            seed=request_seed(seed, "sample", t, plan.plm, label, attempt, j),
        )
        out.append((label, request))
    return out


@register
class Wasp(Method[WaspOptions, WaspState]):
    name = "wasp"
    reweights_plms = True
    Options = WaspOptions
    State = WaspState
    summary = "weighted multi-PLM generation with Top-Q near/far votes and contrastive prompts (papers/000)"
    prompt_examples = "s"

    def iterations(self) -> int:
        return self.options.iterations

    def planned_requests(self, labels: int) -> int:
        return self.options.n

    def check_task(self, task: TaskSpec) -> None:
        need = len(task.labels) * self.options.iterations
        if self.options.n < need:
            raise DpsynthError(f"wasp.n={self.options.n} leaves an iteration without a sample for some label: "
                               f"it needs at least labels x iterations = {need}; raise wasp.n")
        # the fewest samples a label gets in one iteration (uniform label mix); skewed mixes get fewer
        per_label = self.options.n // self.options.iterations // len(task.labels)
        for option in ("q", "s"):
            value = getattr(self.options, option)
            if value > per_label:
                warn_user(f"wasp.{option}={value} exceeds the samples each label gets per iteration (about "
                          f"{per_label} = n / iterations / labels), so it acts as {per_label}; lower wasp.{option} "
                          "or raise wasp.n")

    def vote_spec(self) -> VoteSpec:
        return VoteSpec(kind="wasp", q=self.options.q, clip_per_unit=votes_clipped_per_person(self.config))

    def sensitivity(self) -> float:
        return vote_sensitivity(self.vote_spec(), self.config.privacy.adjacency,
                                max_records_per_user=records_per_unit(self.config))

    def schedule(self) -> Schedule:
        """Votes cast after generating in iterations 0..T-2 (the last iteration's would be unused)."""
        sens, p = self.sensitivity(), self.config.privacy
        releases = self.options.iterations - 1
        guess = None if math.isinf(p.epsilon) else gaussian_sigma_closed_form(p.epsilon, p.delta, [sens] * releases)
        kind = self.release("votes")[0]
        return Schedule(
            releases=gaussian_releases(kind, range(releases), VOTE_SIGMA, sens),
            knobs=(Knob(VOTE_SIGMA, guess=guess, description="Gaussian noise on each vote release (total)"),),
            notes=(f"Top-{self.options.q} nearest+furthest votes, weights 1..2^-{self.options.q - 1}",),
        )

    def min_private_records(self) -> tuple[int, str]:
        return self.options.q, f"Q={self.options.q}; lower wasp.q"

    def new_state(self) -> WaspState:
        return WaspState(weights={g.display_name: 1.0 / len(self.config.generators) for g in self.config.generators})

    def step(self, ctx: StepContext, state: WaspState, t: int) -> dict:
        w, cfg = self.options, self.config
        settings = w.prompt_settings()
        t0 = time.perf_counter()
        plans = plan_counts(iteration_size(w.n, w.iterations, t), state.weights, ctx.label_shares)

        texts = selected_texts(state) if t > 0 else {}

        def make_requests(plan: GenerationPlan, attempt: int, chat: bool):
            return build_requests(plan, t=t, attempt=attempt, seed=cfg.seed, task=ctx.task, chat=chat,
                                  state=state, s=w.s, contrastive=w.contrastive,
                                  samples_per_prompt=w.samples_per_prompt, settings=settings, texts=texts)

        new, stats = generate_samples(t, plans=plans, generators=ctx.generators, existing=state.samples,
                                      make_requests=make_requests, max_attempts=w.max_attempts,
                                      on_progress=ctx.generation_progress(t))
        ctx.add_time("generation", t0)
        state.samples.extend(new)
        record = {"iteration": t, "weights_used": dict(state.weights), "generated": stats,
                  "pool_size": len(state.samples)}
        if t < w.iterations - 1:
            near, far = self._noisy_votes(ctx, state, t)
            labels = ctx.task.label_names
            state.good = select_top(near, state.samples, labels, w.s)
            state.bad = select_top(far, state.samples, labels, w.s) if w.contrastive else {}
            if w.plm_weighting:
                state.weights = plm_weights(near, state.samples, list(state.weights), w.min_weight)
            record["weights_next"] = dict(state.weights)
        return record

    def _noisy_votes(self, ctx: StepContext, state: WaspState, t: int) -> tuple[np.ndarray, np.ndarray]:
        noisy = ctx.noisy_votes_on(state.samples, self.vote_spec(), self.release("votes", t),
                                   f"iteration {t}: embed + vote + noise")
        n = len(state.samples)
        return noisy[:n], noisy[n:]

    def final_samples(self, state: WaspState) -> list[SyntheticSample]:
        return list(state.samples)

    def reference_sets(self, state: WaspState) -> dict[str, list[SyntheticSample]]:
        return {"zero_shot": [x for x in state.samples if x.iteration == 0]}

    def paper_formula(self, epsilon: float, delta: float) -> PaperFormula:
        # Paper (Alg. 1/2 line 2): sigma = 4 sqrt(2 ln(1.25/delta_iter)) sqrt(T-1) / (eps sqrt(L)) per party,
        # with delta_iter = delta as in the paper's experiments and Delta = 4 (times m at user level: 32 for m=8).
        m = records_per_unit(self.config)
        paper_sensitivity = 4.0 * m
        sigma = paper_sensitivity * math.sqrt(2 * math.log(1.25 / delta)) * math.sqrt(self.iterations() - 1) / epsilon
        return PaperFormula(
            description=(f"WASP paper: Delta=4 per record (L1 bound; x{m} records per user), classical Gaussian "
                         "formula sigma = Delta*sqrt(2 ln(1.25/delta_iter))*sqrt(T-1)/eps with delta_iter = delta"),
            sensitivity=paper_sensitivity, knob=VOTE_SIGMA, value=sigma)

