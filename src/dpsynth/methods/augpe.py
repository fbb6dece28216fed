"""Aug-PE (Xie et al. 2024), the single-PLM Private Evolution baseline of the WASP paper (or several PLMs sharing one
population with `fuse: true`).

population_0 = RANDOM_API(N)                                   (zero-shot, no private data)
for t in 1..T-1:                                               (T-1 noisy releases)
    H = Top-1 (or L2-normalised k-NN) votes of private samples on population_{t-1},
        within their own label; + N(0, sigma^2) from the ledger; max(H - threshold, 0)
    parents = per label, rank (the top 1/rank_fold by H, each varied rank_fold times) or sample
        (prop. to H) from population_{t-1}
    population_t = VARIATION_API(parents)                      (paraphrase / fill in the blanks)
output population_{T-1} (or, with `output: all`, every population: N*T samples for N*T calls; or, with
`output: selected`, the parents the last vote selected, as Aug-PE's code saves them, without generating
population_{T-1}: N*(T-1) calls for the same T-1 releases)

Sensitivity 1 either way (Top-1, or k-NN weights 1/sqrt(k)); the accounting is the
exact Gaussian-DP composition of the Aug-PE paper, done by the same ledger.
"""

from __future__ import annotations

import math
import time
from typing import Literal

import numpy as np
from pydantic import Field, PositiveInt

from dpsynth.config import records_per_unit, vote_records_per_unit, votes_clipped_per_person
from dpsynth.data.records import TaskSpec
from dpsynth.errors import DpsynthError
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
    request_seed,
    split_count,
    zero_shot_requests,
)
from dpsynth.methods.registry import register
from dpsynth.privacy.calibrate import gaussian_sigma_closed_form
from dpsynth.privacy.schedule import Knob, Schedule, gaussian_releases
from dpsynth.privacy.sensitivity import pe_top1_sensitivity
from dpsynth.prompts.builder import build_variation_request
from dpsynth.voting.spec import VoteSpec

VOTE_SIGMA = "vote_sigma"


class AugPEOptions(SamplingOptions):
    """The `augpe:` section: Aug-PE / Private Evolution (Xie et al. 2024) with one PLM, or several with `fuse`."""

    n: PositiveInt = Field(600, description="population size (each iteration's requests)")
    iterations: int = Field(5, ge=2, description="T, including the initial random-API population")
    votes: Literal["top1", "knn"] = Field("top1", description="top1: each private record votes for its nearest "
                                          "sample of its label; knn: for its k nearest, 1/sqrt(k) each")
    k: PositiveInt = Field(1, description="neighbours per private sample for knn votes (normalised to norm 1)")
    threshold: float = Field(0.0, ge=0, description="H, subtracted from every noisy count (then floored at 0), as "
                             "in DPSDA and Aug-PE's code")
    selection: Literal["rank", "sample"] = Field("sample", description="sample: parents drawn in proportion to the "
                                                 "thresholded noisy votes; rank: the top of each label, see rank_fold")
    rank_fold: int = Field(3, ge=2, description="selection: rank keeps the top 1/rank_fold of each label's "
                           "population as parents, each varied rank_fold times (DPSDA's next_variation_api_fold)")
    variation: Literal["paraphrase", "fill_blank", "mixed"] = Field(
        "mixed", description="how a parent is varied: paraphrased, its masked words filled in, or the two "
        "alternating (request by request; under rank, each parent's children alternate)")
    fill_ratio: float = Field(0.3, gt=0, lt=1, description="fill_blank: each word of the parent is blanked "
                              "with this probability")
    output: Literal["last", "all", "selected"] = Field(
        "last", description="last: the final population (N samples, variations no vote has judged); all: every "
        "population, N*T samples for the same N*T generator calls (each population is public prompts plus earlier "
        "noisy releases, so keeping them costs no privacy); selected: the distinct parents chosen by the last vote "
        "(what the Aug-PE authors' code saves, save_syn_mode='selected'; under rank the top 1/rank_fold of each "
        "label), and the last population is not generated: N*(T-1) calls, the same T-1 releases")
    fuse: bool = Field(False, description="several generators share one population: each writes an equal share of "
                       "every population (any of them may vary any parent), and the votes and the selection run over "
                       "them all; false: Aug-PE's one generator per run")


class AugPEState(MethodState):
    population: list[SyntheticSample] = []
    initial: list[SyntheticSample] = []
    earlier: list[SyntheticSample] = []  # populations before the current one (kept with `output: all`)
    selected: list[SyntheticSample] = []  # the last vote's distinct parents (the output with `output: selected`)
    output: str | None = None  # augpe.output when the run began: a resume under another one is refused


def vote_weights(kind: str, k: int) -> list[float]:
    """Top-1: [1]; k-NN: k weights of 1/sqrt(k), so each private sample's vote has L2 norm 1."""
    return [1.0] if kind == "top1" else [1.0 / math.sqrt(k)] * k


def apply_threshold(noisy: np.ndarray, threshold: float) -> np.ndarray:
    """max(count - H, 0), as DPSDA, Aug-PE's and PrE-Text's code do: a cut at H that left the counts above it
    whole would keep weak, noise-driven candidates more often (counts 2.1, 5, 10 at H=2: sampled 0.12, 0.29, 0.58
    of the time, against 0.009, 0.27, 0.72)."""
    return np.maximum(np.asarray(noisy, dtype=np.float64) - threshold, 0.0)


def shared_population_plans(n: int, plms: list[str], label_shares: dict[str, float]) -> list[GenerationPlan]:
    """N split over the labels first (as one PLM would write them), then each label's requests dealt to the PLMs in
    turn (`dealt_position`): splitting over PLMs first rounds twice, and a label can get no request at all (N=6, 4
    labels, 2 PLMs). Each label's deal starts at another PLM, so a label's leftover request does not always go to
    the first PLM and every PLM's total is within one of an equal share."""
    per_label = dict(zip(label_shares, split_count(n, list(label_shares.values()))))
    p = len(plms)
    return [GenerationPlan(plm, {label: len(range((k - i) % p, count, p))
                                 for i, (label, count) in enumerate(per_label.items())})
            for k, plm in enumerate(plms)]


def dealt_position(plm: int, label: int, j: int, plms: int) -> int:
    """The place among all PLMs' requests of the `label`-th label of the `plm`-th PLM's j-th one, when the label's
    requests are dealt in turn starting at PLM `label` mod `plms`. Dealt, not in runs: with runs, PLM k varied only
    the k-th child of each parent (under rank), so with as many PLMs as `rank_fold` each wrote one variation kind,
    and the zero-vote ties of the next selection, broken by place, went to the first PLM's samples."""
    return (plm - label) % plms + j * plms


def in_dealt_order(samples: list[SyntheticSample], plms: list[str], labels: list[str]) -> list[SyntheticSample]:
    """A fused population label by label, each label's samples in the order their requests were dealt (a sample
    whose answer was re-asked takes its PLM's next place), so that ties in the votes are broken by the parents' rank
    and not by which PLM wrote the sample."""
    own: dict[tuple[str, str], list[SyntheticSample]] = {}
    for x in samples:
        own.setdefault((x.label, x.plm), []).append(x)
    out: list[SyntheticSample] = []
    for i, label in enumerate(labels):
        placed = [(dealt_position(k, i, j, len(plms)), x)
                  for k, plm in enumerate(plms) for j, x in enumerate(own.get((label, plm), []))]
        out += [x for _, x in sorted(placed, key=lambda pair: pair[0])]
    return out


def distinct_in_order(parents: dict[str, list[SyntheticSample]]) -> list[SyntheticSample]:
    """Each selected parent once, label by label in selection order (rank: by votes). Aug-PE's code saves a
    parent drawn twice twice; a released dataset gains nothing from repeated rows, so dpsynth keeps one."""
    return [p for chosen in parents.values() for p in {p.id: p for p in chosen}.values()]


def select_parents(
    noisy: np.ndarray, population: list[SyntheticSample], counts: dict[str, int], how: str, rng: np.random.Generator,
    fold: int = 3,
) -> dict[str, list[SyntheticSample]]:
    """Per label, `counts[label]` parents: the top 1/`fold` of the label's population by noisy votes, each
    repeated in turn (rank), or drawn in proportion to the votes (sample). Rank must keep fewer parents than the
    population holds: the population is as large as the count, so keeping all of them, cycled, would make every
    sample a parent once, whatever the votes (DPSDA selects N of L x N candidates the same way)."""
    out: dict[str, list[SyntheticSample]] = {}
    for label, count in counts.items():
        idx = [i for i, x in enumerate(population) if x.label == label]
        if not idx or count == 0:
            out[label] = []
            continue
        h = np.clip(noisy[idx], 0.0, None)
        if how == "rank":
            # no vote above 0: a random third, as sample mode falls back to uniform (not the first by index)
            order = np.argsort(-h, kind="stable") if h.any() else rng.permutation(len(idx))
            kept = [idx[i] for i in order[:max(1, math.ceil(len(idx) / fold))]]
            out[label] = [population[kept[j % len(kept)]] for j in range(count)]
        else:
            p = h / h.sum() if h.sum() > 0 else np.full(len(idx), 1.0 / len(idx))
            out[label] = [population[idx[i]] for i in rng.choice(len(idx), size=count, p=p)]
    return out


@register
class AugPE(Method[AugPEOptions, AugPEState]):
    name = "augpe"
    Options = AugPEOptions
    State = AugPEState
    summary = "Aug-PE / Private Evolution with one PLM, or several sharing one population (Pre-Text when federated)"
    prompt_examples = 1
    one_generator_per_run = True
    several_plms_hint = ", or set augpe.fuse: true to let them share one population"

    def iterations(self) -> int:
        return self.options.iterations

    @classmethod
    def runs_alone(cls, options: AugPEOptions) -> bool:
        return not options.fuse

    def planned_requests(self, labels: int) -> int:
        return self.options.n * self._generated_populations()

    def _generated_populations(self) -> int:
        """T populations, or T-1 with `output: selected` (the last vote's parents are the output, not varied)."""
        return self.options.iterations - (self.options.output == "selected")

    def min_private_records(self) -> tuple[int, str]:
        """A noisy count above the threshold needs more records than the threshold (checked by the holder,
        whose message never states the count): below that every vote would be zeroed, budget spent for
        nothing."""
        t = self.options.threshold
        return int(math.floor(t)) + 1, f"augpe.threshold={t:g} (every vote would be zeroed); lower augpe.threshold"

    def check_task(self, task: TaskSpec) -> None:
        if self.options.n < len(task.labels):
            raise DpsynthError(f"augpe.n={self.options.n} is smaller than the number of labels "
                               f"({len(task.labels)}); raise augpe.n")
        plms = len(self.config.generators)
        if self.options.fuse and self.options.n < plms:
            raise DpsynthError(f"augpe.n={self.options.n} is smaller than the {plms} generators sharing the "
                               "population (augpe.fuse), so one would write nothing; raise augpe.n")

    def schedule(self) -> Schedule:
        """Votes on population t-1, cast in iterations 1..T-1 (iteration 0 is the random API)."""
        sens = pe_top1_sensitivity(self.config.privacy.adjacency,
                                   max_records_per_user=vote_records_per_unit(self.config))
        p, t_max = self.config.privacy, self.options.iterations
        guess = None if math.isinf(p.epsilon) else gaussian_sigma_closed_form(p.epsilon, p.delta, [sens] * (t_max - 1))
        return Schedule(
            releases=gaussian_releases(self.release("votes")[0], range(1, t_max), VOTE_SIGMA, sens),
            knobs=(Knob(VOTE_SIGMA, guess=guess, description="Gaussian noise on each vote release (total)"),),
            notes=("Top-1 (or L2-normalised k-NN) votes",),
        )

    def step(self, ctx: StepContext, state: AugPEState, t: int) -> dict:
        a, seed, task = self.options, self.config.seed, ctx.task
        settings = a.prompt_settings()
        plans = shared_population_plans(a.n, [g.display_name for g in self.config.generators], ctx.label_shares)
        totals = {label: sum(p.per_label[label] for p in plans) for label in plans[0].per_label}
        plm_index = {p.plm: k for k, p in enumerate(plans)}
        label_index = {label: i for i, label in enumerate(totals)}
        record: dict = {"iteration": t}
        if t == 0:
            state.output = a.output
            make_requests = zero_shot_requests(task, settings, seed, "random_api")
        else:
            self._check_output_unchanged(state)  # before this step's vote or requests
            empty = [label for label, count in totals.items()
                     if count > 0 and not any(x.label == label for x in state.population)]
            if empty:  # checked before the votes are released: nothing to vary, and nothing spent on it
                raise DpsynthError(f"augpe: iteration {t - 1} kept no sample of label(s) {', '.join(empty)} (every "
                                   "answer was empty, too long or a duplicate), so there is nothing to vary; check "
                                   "the generator's answers in run.log, or raise augpe.max_attempts")
            noisy = self._noisy_votes(ctx, state, t)
            rng = np.random.default_rng(request_seed(seed, "augpe.select", t))
            parents = select_parents(noisy, state.population, totals, a.selection, rng, a.rank_fold)
            record["parents_distinct"] = sum(len({p.id for p in ps}) for ps in parents.values())
            if t == self._generated_populations():  # `output: selected`: the last vote's parents are the output
                state.selected = distinct_in_order(parents)
                record.update(population=len(state.population), selected=len(state.selected))
                return record

            # under rank, parent j % K's children alternate kinds by round (j // K), so that a parent's rank_fold
            # children are not all of one kind when K is even
            distinct = {label: len({p.id for p in ps}) or 1 for label, ps in parents.items()}

            def make_requests(plan: GenerationPlan, attempt: int, chat: bool):
                out = []
                for label, j in plan.indices():
                    g = dealt_position(plm_index[plan.plm], label_index[label], j, len(plans))
                    parent = parents[label][(g + attempt * 7) % len(parents[label])]
                    turn = g // distinct[label] if a.selection == "rank" else g
                    kind = a.variation if a.variation != "mixed" else ("paraphrase", "fill_blank")[turn % 2]
                    out.append((label, build_variation_request(
                        task, label, parent.text, chat=chat, kind=kind, fill_ratio=a.fill_ratio,
                        settings=settings, rng_seed=request_seed(seed, "variation", t, label, attempt, g))))
                return out

        t0 = time.perf_counter()
        keep_all = a.output == "all"
        if keep_all and t > 0:
            state.earlier = state.earlier + state.population
        new, stats = generate_samples(t, plans=plans, generators=ctx.generators,
                                      existing=state.earlier + state.population if keep_all else state.population,
                                      make_requests=make_requests, max_attempts=a.max_attempts,
                                      on_progress=ctx.generation_progress(t))
        ctx.add_time("generation", t0)
        state.population = in_dealt_order(new, list(plm_index), list(totals)) if len(plans) > 1 else new
        if t == 0:
            state.initial = list(state.population)
        record.update(generated=stats, population=len(new))
        return record

    def vote_spec(self) -> VoteSpec:
        """The votes each `augpe.votes` release asks (the schedule charges pe_top1_sensitivity: exactly their
        norm, 1; the data holder checks the two agree)."""
        a = self.options
        return VoteSpec(kind="rank", weights=tuple(vote_weights(a.votes, a.k)),
                        clip_per_unit=votes_clipped_per_person(self.config))

    def _noisy_votes(self, ctx: StepContext, state: AugPEState, t: int) -> np.ndarray:
        noisy = ctx.noisy_votes_on(state.population, self.vote_spec(), self.release("votes", t),
                                   f"iteration {t}: embed + vote + noise")
        return apply_threshold(noisy, self.options.threshold)

    def _check_output_unchanged(self, state: AugPEState) -> None:
        """`selected` never generates the last population and `last` never keeps the last vote's parents: a run
        resumed under the other one would pay for requests or a release its output then cannot use."""
        if state.output not in (None, self.options.output):
            raise DpsynthError(f"augpe.output is {self.options.output} but this run began with {state.output}; "
                               f"restore augpe.output: {state.output} to resume it")

    def final_samples(self, state: AugPEState) -> list[SyntheticSample]:
        self._check_output_unchanged(state)
        if self.options.output == "selected":
            return list(state.selected)
        return state.earlier + state.population if self.options.output == "all" else list(state.population)

    def reference_sets(self, state: AugPEState) -> dict[str, list[SyntheticSample]]:
        return {"zero_shot": list(state.initial)}

    def paper_formula(self, epsilon: float, delta: float) -> PaperFormula:
        m = records_per_unit(self.config)
        sens = pe_top1_sensitivity(self.config.privacy.adjacency, max_records_per_user=m)
        per_person = f" x{m} records per person (a person's votes unclipped; ours clips them)" if m > 1 else ""
        return PaperFormula(
            description=f"Aug-PE/PE: Top-1 sensitivity{per_person}, exact Gaussian-DP composition (same as ours)",
            sensitivity=sens,
            knob=VOTE_SIGMA,
            value=gaussian_sigma_closed_form(epsilon, delta, [sens] * (self.options.iterations - 1)))
