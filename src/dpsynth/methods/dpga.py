"""DPGA-TextSyn (papers/003, Sec. 3 and App. B-D), read like the paper; implemented from the paper.

iteration 0 (metadata and initial samples)                                       (Sec. 3.2)
    label histogram + Laplace (unless the user gives public proportions)
    text-length range by sparse vector (AboveThreshold twice: max, then min) and a length
        histogram over it + Laplace; lengths in whitespace words
    keywords: each PLM proposes sub-topics per label from the public label description; private
        records vote for the nearest keyword of their own label + Laplace; top keywords kept
    population_0: N samples from the metadata (label mix, a keyword, a target length), all PLMs
for t in 1..T (generations)
    votes: Poisson-subsampled records (rate q) vote for their nearest candidate of their own
        label + Gaussian noise (subsampled Gaussian on the ledger)                (Sec. 3.3.1)
    elites: candidates by noisy votes, high to low, skipping any whose cosine similarity to a
        chosen one exceeds tau; tau += 0.01 while too few are chosen              (Sec. 3.3.2)
    population_t = elites + mutate (rewrite, fill blanks) + crossover (two elites) + generate
        (fresh from the metadata)                                                  (Sec. 3.4)
output population_T

Privacy (Sec. 4): the metadata's Laplace histograms share `budget_attributes` of epsilon and the two
SVT runs `budget_svt` (pure DP, split as the paper splits them); the T vote releases take the rest,
calibrated on one PLD with everything else (the paper adds the parts up with basic composition
and applies amplification by hand; the ledger composes them tightly). Deviations, each in
docs/dpga.md: tau is public (the paper uses the private data's noisy mean similarity without
accounting it); lengths are counted in words; keyword votes are nearest-neighbour votes in the
embedding space; SVT thresholds are 0 with the query streams phrased so that AboveThreshold
halts at the bound.
"""

from __future__ import annotations

import math
import re
import time

import numpy as np
from pydantic import Field, PositiveInt, model_validator

from dpsynth.config import RunConfig, records_per_unit, vote_records_per_unit, votes_clipped_per_person
from dpsynth.data.records import TaskSpec
from dpsynth.errors import DpsynthError
from dpsynth.evaluate.distribution import mean_pairwise_cosine
from dpsynth.methods.base import Method, MethodState, SamplingOptions, StepContext
from dpsynth.methods.generation import (
    GenerationPlan,
    SyntheticSample,
    generate_samples,
    plan_counts,
    request_seed,
)
from dpsynth.methods.registry import register
from dpsynth.privacy.accountant import Adjacency
from dpsynth.privacy.schedule import (
    Knob,
    Release,
    Schedule,
    gaussian_releases,
    laplace_events,
    sparse_vector_events,
    subsampled_gaussian_events,
)
from dpsynth.privacy.sensitivity import histogram_sensitivity, pe_top1_sensitivity
from dpsynth.prompts.builder import (
    build_dpga_request,
    build_variation_request,
)
from dpsynth.voting.spec import VoteSpec

SVT, VOTES = "svt_scale", "vote_sigma"
ATTRIBUTES = ("labels", "lengths", "keywords")  # the paper's three Laplace histograms, eps_attr / 3 each


class DPGAOptions(SamplingOptions):
    """The `dpga:` section. Defaults are the paper's (App. D) unless noted."""

    n: PositiveInt = Field(10000, description="population per generation (paper: 10,000)")
    generations: int = Field(10, ge=1, description="T: vote, select and expand rounds (paper's analysis: 10)")
    elite_fraction: float = Field(0.2, gt=0, lt=1, description="elites kept per generation (paper: 2,000)")
    mutate_fraction: float = Field(0.4, ge=0, description="rewrites + blank fills (paper: 4,000)")
    crossover_fraction: float = Field(0.2, ge=0, description="fusions of two elites (paper: 2,000)")
    generate_fraction: float = Field(0.2, ge=0, description="fresh samples from the metadata (paper: 2,000)")
    sampling_rate: float = Field(0.8, gt=0, le=1, description="q, Poisson subsampling of the votes (paper: 0.8)")
    budget_svt: float = Field(0.2, gt=0, lt=1, description="share of epsilon for the two SVT runs (App. D.3)")
    budget_attributes: float = Field(0.3, gt=0, lt=1, description="share for the label/length/keyword "
                                     "histograms (App. D.3); the votes get the rest")
    tau: float = Field(0.5, gt=-1, le=1, description="starting similarity threshold (public; see docs/dpga.md)")
    tau_step: float = Field(0.01, gt=0, description="raise of tau while too few elites are chosen (paper: 0.01)")
    length_bins: PositiveInt = Field(100, description="bins of the length histogram (paper: 100)")
    length_cap: PositiveInt = Field(256, description="longest length (words) the SVT stream asks about (public)")
    keywords_asked: PositiveInt = Field(20, description="sub-topics each PLM is asked for per label")
    keywords_kept: PositiveInt = Field(10, description="sub-topics kept per label by noisy votes")
    fill_ratio: float = Field(0.5, gt=0, lt=1, description="share of words blanked for a fill mutation (0.5)")
    use_lengths: bool = Field(True, description="ablation 'w/o Length' when false")
    use_keywords: bool = Field(True, description="ablation 'w/o Keywords' when false")
    suppression: bool = Field(True, description="ablation 'w/o Similarity Suppression' when false")
    temperature: float = Field(1.2, ge=0, description="paper: 1.2 for generation")

    @model_validator(mode="after")
    def _checks(self) -> DPGAOptions:
        total = self.elite_fraction + self.mutate_fraction + self.crossover_fraction + self.generate_fraction
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"elite, mutate, crossover and generate fractions must add up to 1 (got {total:g})")
        if self.budget_svt + self.budget_attributes >= 1:
            raise ValueError("budget_svt + budget_attributes must leave a share of epsilon for the votes")
        return self


class DPGAState(MethodState):
    population: list[SyntheticSample] = []
    initial: list[SyntheticSample] = []
    keywords: dict[str, list[str]] = {}
    keyword_weights: dict[str, list[float]] = {}
    length_edges: list[int] = []
    length_probs: list[float] = []


@register
class DPGA(Method[DPGAOptions, DPGAState]):
    name = "dpga"
    Options = DPGAOptions
    State = DPGAState
    summary = "DPGA-TextSyn: DP metadata, subsampled votes, similarity suppression, genetic operators (papers/003)"
    prompt_examples = 2

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        if config.federated is not None:
            raise ValueError("dpga has no federated mode yet (its metadata would need federated histograms)")
        options = config.options(cls.name)
        if options.sampling_rate < 1 and records_per_unit(config) > 1:
            # Poisson sampling is per record; a user's records would be sampled separately, which the
            # subsampled-Gaussian event (one unit kept or dropped whole) does not cover.
            raise ValueError("dpga.sampling_rate < 1 needs record-level privacy (max_records_per_user: 1)")
        if options.keywords_kept > options.keywords_asked:
            raise ValueError(f"dpga.keywords_kept={options.keywords_kept} exceeds keywords_asked="
                             f"{options.keywords_asked}: it cannot keep more sub-topics than it asks for")

    def iterations(self) -> int:
        return self.options.generations + 1

    def planned_requests(self, labels: int) -> int:
        """Keyword requests (one per label and PLM), the first population, then each generation's new samples."""
        o = self.options
        elites = max(1, round(o.n * o.elite_fraction))
        return labels * len(self.config.generators) + o.n + o.generations * (o.n - elites)

    def check_task(self, task: TaskSpec) -> None:
        if round(self.options.n * self.options.elite_fraction) < len(task.labels):
            raise DpsynthError(f"dpga.n x elite_fraction keeps fewer elites than there are labels "
                               f"({len(task.labels)}); raise dpga.n")

    # -- privacy -------------------------------------------------------------------
    def assumptions(self) -> dict[str, str]:
        o = self.options
        votes = ("every record votes in every generation" if o.sampling_rate >= 1 else
                 f"Poisson sampling of the records at rate {o.sampling_rate:g}, drawn afresh each generation")
        released = [name for name, used in (("label", self.label_release() is not None), ("length", o.use_lengths),
                                            ("keyword", o.use_keywords)) if used]
        histograms = f"; {', '.join(released)} histogram(s): every record" if released else ""
        return {"sampler": f"votes: {votes}{histograms}"}

    def label_schedule(self) -> Schedule:
        return Schedule((), ())  # the label histogram is one of this method's own Laplace releases

    def label_release(self) -> tuple[str, int | None] | None:
        private_labels = self.config.privacy.label_proportions in (None, "dp")
        return self.release("labels") if private_labels else None

    def schedule(self) -> Schedule:
        o, p = self.options, self.config.privacy
        m = records_per_unit(self.config)
        l1 = histogram_sensitivity(p.adjacency, norm=1, max_records_per_user=m)
        used = {"labels": self.label_release() is not None, "lengths": o.use_lengths, "keywords": o.use_keywords}
        # each histogram keeps its third of budget_attributes; a disabled one leaves its share to the votes
        attributes = [what for what in ATTRIBUTES if used[what]]
        releases = [Release(f"{self.name}.{what}", None, f"{what}_scale", laplace_events(l1), l1)
                    for what in attributes]
        knobs = [Knob(f"{what}_scale", share=o.budget_attributes / len(ATTRIBUTES),
                      description=f"Laplace scale of the {what} histogram") for what in attributes]
        if o.use_lengths:
            # AboveThreshold: count queries change by at most m records, under add/remove or replacement
            releases += [Release(f"{self.name}.length_{which}", None, SVT, sparse_vector_events(float(m)), float(m))
                         for which in ("max", "min")]
            knobs.append(Knob(SVT, share=o.budget_svt, description="sparse vector's threshold scale (length range)"))
        generations = range(1, o.generations + 1)
        if o.sampling_rate < 1:
            # the PLD of a subsampled Gaussian applies the adjacency itself: give it one unit's own norm
            vote_sens = pe_top1_sensitivity(Adjacency.ADD_REMOVE,
                                            max_records_per_user=vote_records_per_unit(self.config))
            votes = subsampled_gaussian_events(o.sampling_rate, vote_sens)
            releases += [Release(f"{self.name}.votes", t, VOTES, votes, vote_sens) for t in generations]
            note = f"Poisson-subsampled Top-1 votes, q={o.sampling_rate}"
        else:
            # every record votes: a plain Gaussian at the adjacency's own sensitivity (under replace sqrt(2) per
            # record for one-hot votes, where the subsampled event's shift model would charge 2)
            releases += gaussian_releases(f"{self.name}.votes", list(generations), VOTES,
                                          pe_top1_sensitivity(p.adjacency,
                                                              max_records_per_user=vote_records_per_unit(self.config)))
            note = "Top-1 votes of every record (q=1)"
        subsampled = "subsampled " if o.sampling_rate < 1 else ""
        knobs.append(Knob(VOTES, guess=None if math.isinf(p.epsilon) else 5.0,
                          description=f"Gaussian noise on each {subsampled}vote release"))
        return Schedule(tuple(releases), tuple(knobs), notes=(note,))

    # -- the algorithm -------------------------------------------------------------
    def step(self, ctx: StepContext, state: DPGAState, t: int) -> dict:
        if t == 0:
            return self._initial(ctx, state)
        return self._generation(ctx, state, t)

    def _initial(self, ctx: StepContext, state: DPGAState) -> dict:
        o = self.options
        ctx.phase("iteration 0: DP metadata", 0)
        if o.use_lengths:
            top = ctx.holder.length_bound("max", o.length_cap, release=self.release("length_max"))
            low = ctx.holder.length_bound("min", top, release=self.release("length_min"))
            edges = length_edges(low, top, o.length_bins)
            noisy = ctx.holder.noisy_length_histogram(edges, release=self.release("lengths"))
            state.length_edges, state.length_probs = edges, _probabilities(noisy)
        if o.use_keywords:
            self._select_keywords(ctx, state)
        ctx.phase("iteration 0: DP metadata", 1)
        new, stats = self._expand(ctx, state, 0, elites={}, count=o.n, operators={"generate": 1.0})
        state.population, state.initial = new, list(new)
        return {"iteration": 0, "generated": stats, "population": len(new),
                "length_range": [state.length_edges[0], state.length_edges[-1]] if state.length_edges else None,
                "keywords": state.keywords, "self_similarity": self_similarity(ctx.embed_synthetic(new))}

    def _select_keywords(self, ctx: StepContext, state: DPGAState) -> None:
        """Sub-topics from the public label descriptions, kept by the private records' noisy votes."""
        o, labels = self.options, ctx.task.label_names
        proposed: dict[str, list[str]] = {c: [] for c in labels}
        for name, gen in ctx.generators.items():
            settings = o.prompt_settings(max_tokens=max(o.max_tokens, 8 * o.keywords_asked))
            requests = [build_dpga_request(ctx.task, c, "keywords", chat=gen.chat, count=o.keywords_asked,
                                           settings=settings, seed=request_seed(self.config.seed, "keywords", name, c))
                        for c in labels]
            for c, result in zip(labels, gen.generate(requests)):
                proposed[c] += [k for k in parse_keywords(result.text) if k not in proposed[c]]
        for c in labels:
            proposed[c] = proposed[c] or [c]  # a label no PLM could describe votes on its own name
        flat = [(c, k) for c in labels for k in proposed[c]]
        emb = ctx.embed([f"{ctx.task.labels[c]}: {k}" for c, k in flat])
        ids = np.array([labels.index(c) for c, _ in flat], dtype=np.int64)
        noisy = ctx.holder.noisy_votes(VoteSpec(kind="rank", weights=(1.0,)), emb, ids,
                                       release=self.release("keywords"))
        if len(noisy) != len(flat):  # a resumed run re-asked the PLMs and got other proposals (cache lost)
            raise DpsynthError("the keyword proposals differ from those the saved keyword release voted on (was "
                               "the request cache cleared?); the run cannot resume safely: start a new run")
        for c in labels:
            idx = [i for i, (label, _) in enumerate(flat) if label == c]
            kept = sorted(idx, key=lambda i: -noisy[i])[: o.keywords_kept]
            state.keywords[c] = [flat[i][1] for i in kept]
            state.keyword_weights[c] = _probabilities(np.array([noisy[i] for i in kept]))  # share of votes

    def vote_spec(self) -> VoteSpec:
        """The Top-1 votes each `dpga.votes` release asks (the data holder checks them against its charge)."""
        return VoteSpec(kind="rank", weights=(1.0,), sampling_rate=self.options.sampling_rate,
                        clip_per_unit=votes_clipped_per_person(self.config))

    def _generation(self, ctx: StepContext, state: DPGAState, t: int) -> dict:
        o = self.options
        pop = state.population
        noisy = ctx.noisy_votes_on(pop, self.vote_spec(), self.release("votes", t),
                                   f"iteration {t}: embed + vote + noise")
        emb = ctx.embed_synthetic(pop)  # cached: the embeddings the votes were computed on
        elite_total = max(1, round(o.n * o.elite_fraction))
        elites: dict[str, list[SyntheticSample]] = {}
        taus = {}
        labels = ctx.task.label_names
        for c, want in zip(labels, _split(elite_total, [ctx.label_shares[c] for c in labels])):
            idx = [i for i, x in enumerate(pop) if x.label == c]
            if o.suppression:
                chosen, taus[c] = select_distinct(noisy[idx], emb[idx], want, o.tau, o.tau_step)
            else:
                chosen = list(np.argsort(-noisy[idx], kind="stable")[:want])
            elites[c] = [pop[idx[i]] for i in chosen]
        keep = [x for c in ctx.task.label_names for x in elites[c]]
        operators = {"paraphrase": o.mutate_fraction / 2, "fill_blank": o.mutate_fraction / 2,
                     "crossover": o.crossover_fraction, "generate": o.generate_fraction}
        new, stats = self._expand(ctx, state, t, elites=elites, count=o.n - len(keep), operators=operators,
                                  existing=keep)
        state.population = keep + new
        return {"iteration": t, "elites": len(keep), "tau": taus, "generated": stats,
                "population": len(state.population),
                "self_similarity": self_similarity(ctx.embed_synthetic(state.population))}

    def _expand(self, ctx: StepContext, state: DPGAState, t: int, *, elites: dict[str, list[SyntheticSample]],
                count: int, operators: dict[str, float], existing: list[SyntheticSample] | None = None,
                ) -> tuple[list[SyntheticSample], dict]:
        """`count` new samples over labels (label shares) and PLMs (equal), each made by one operator."""
        o, seed, task = self.options, self.config.seed, ctx.task
        settings = o.prompt_settings()
        plans = plan_counts(count, {g.display_name: 1.0 for g in self.config.generators}, ctx.label_shares)

        def make_requests(plan: GenerationPlan, attempt: int, chat: bool):
            out = []
            names = list(operators)
            probs = np.array([operators[k] for k in names]) / sum(operators.values())
            for label, j in plan.indices():
                parents = elites.get(label) or []
                rng = np.random.default_rng(request_seed(seed, "dpga", t, plan.plm, label, attempt, j))
                op = names[int(rng.choice(len(names), p=probs))] if parents else "generate"
                s = request_seed(seed, "dpga.sample", t, plan.plm, label, attempt, j)
                if op in ("paraphrase", "fill_blank"):
                    parent = parents[int(rng.integers(len(parents)))].text
                    request = build_variation_request(task, label, parent, chat=chat, kind=op, rng_seed=s,
                                                      fill_ratio=o.fill_ratio, settings=settings)
                elif op == "crossover":
                    a, b = rng.choice(len(parents), size=2, replace=len(parents) < 2)
                    request = build_dpga_request(task, label, "crossover", chat=chat, seed=s, settings=settings,
                                                 first=parents[a].text, second=parents[b].text,
                                                 words=self._words(state, rng))
                else:
                    request = build_dpga_request(task, label, "generate", chat=chat, seed=s, settings=settings,
                                                 keyword=self._keyword(state, label, rng),
                                                 words=self._words(state, rng))
                out.append((label, request))
            return out

        t0 = time.perf_counter()
        new, stats = generate_samples(t, plans=plans, generators=ctx.generators, existing=existing or [],
                                      make_requests=make_requests, max_attempts=o.max_attempts,
                                      on_progress=ctx.generation_progress(t))
        ctx.add_time("generation", t0)
        return new, stats

    def _keyword(self, state: DPGAState, label: str, rng: np.random.Generator) -> str:
        words = state.keywords.get(label)
        if not words:
            return label
        return words[int(rng.choice(len(words), p=state.keyword_weights[label]))]

    def _words(self, state: DPGAState, rng: np.random.Generator) -> int:
        """A target length drawn from the noisy length histogram (uniform within its bin)."""
        if not state.length_probs:
            return 0  # the prompt then asks for at least 3 words and lets the model choose
        b = int(rng.choice(len(state.length_probs), p=state.length_probs))
        low, high = state.length_edges[b], state.length_edges[b + 1]
        return int(rng.integers(low, max(low + 1, high)))

    def final_samples(self, state: DPGAState) -> list[SyntheticSample]:
        return list(state.population)

    def reference_sets(self, state: DPGAState) -> dict[str, list[SyntheticSample]]:
        return {"initial": list(state.initial)}


# -- parts (pure functions, tested on their own) -----------------------------------------
def select_distinct(noisy: np.ndarray, emb: np.ndarray, k: int, tau: float, step: float) -> tuple[list[int], float]:
    """Similarity suppression (Sec. 3.3.2): by noisy votes, high to low, skip candidates more similar than
    tau to one already chosen; raise tau by `step` until k are chosen. Returns (indices, final tau)."""
    k = min(k, len(noisy))
    if k <= 0:
        return [], tau
    unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    sims = unit @ unit.T  # once per call; each pass only compares with a threshold
    order = np.argsort(-np.asarray(noisy), kind="stable")
    while True:
        chosen: list[int] = []
        blocked = np.zeros(len(order), dtype=bool)
        for i in order:
            if blocked[i]:
                continue
            chosen.append(int(i))
            if len(chosen) == k:
                return chosen, tau
            blocked |= sims[i] > tau
        if tau >= 1.0:
            return chosen, tau
        tau = min(1.0, tau + step)


def length_edges(low: int, high: int, bins: int) -> list[int]:
    """Integer bin edges covering [low, high] with at most `bins` bins (public post-processing of SVT)."""
    low, high = min(low, high), max(low, high)
    return sorted({int(round(x)) for x in np.linspace(low, high + 1, min(bins, high - low + 1) + 1)})


def parse_keywords(text: str) -> list[str]:
    """Sub-topics from a PLM's list: one per line, bullets and numbering stripped, 1-6 words."""
    out: list[str] = []
    for line in re.split(r"[\n;]|,(?![^()]*\))", text):
        k = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s*", "", line).strip(" .\"'`*:")
        if k and 1 <= len(k.split()) <= 6 and k.lower() not in {x.lower() for x in out}:
            out.append(k)
    return out


def self_similarity(emb: np.ndarray) -> float | None:
    """Mean pairwise cosine similarity of a synthetic set (the paper's Fig. 3); public: synthetic only. The
    evaluation's O(n d) closed form over the whole set (an n x n matrix here was capped at 2,000 samples)."""
    return None if len(emb) < 2 else mean_pairwise_cosine(emb)


def _split(total: int, shares: list[float]) -> list[int]:
    from dpsynth.methods.generation import split_count

    return split_count(total, shares)


def _probabilities(noisy: np.ndarray) -> list[float]:
    clipped = np.clip(np.asarray(noisy, dtype=np.float64), 0.0, None)
    if clipped.sum() <= 0:
        clipped = np.ones_like(clipped)
    return (clipped / clipped.sum()).tolist()
