"""FuseGen (Zou et al., EMNLP 2024, arXiv 2406.12527): zero-shot multi-PLM fusion with cross-model feedback.

No private data is touched (epsilon 0). The K PLMs write equal shares of N samples over R + 1 rounds:
round 0 is zero-shot (the `zero-shot` method's own requests, so it is that method's first samples);
after each round the STMs judge every sample across models and S of them go back to every PLM as
unlabelled in-context examples (Cross-model Dataset Generation, `cross_model_feedback.py`); after the
last round the self-boosting weights of the whole set are computed (Cross-model Data Quality
Improvement, `evaluate/self_boosting.py`) and written with the samples, so that the downstream
classifier trains on them. docs/fusegen.md lists every deviation from the paper and its code.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Literal

import numpy as np
from pydantic import Field, NonNegativeInt, PositiveInt

from dpsynth.config import RunConfig
from dpsynth.errors import DpsynthError
from dpsynth.evaluate.self_boosting import self_boosting_weights
from dpsynth.methods.base import Method, MethodState, SamplingOptions, StepContext
from dpsynth.methods.cross_model_feedback import FeedbackSettings, cross_model_feedback
from dpsynth.methods.generation import (
    SyntheticSample,
    generate_samples,
    plan_counts,
    request_seed,
    shared_example_requests,
    split_count,
    zero_shot_requests,
)
from dpsynth.methods.registry import register


class FuseGenOptions(SamplingOptions):
    """The `fusegen:` section (defaults: the authors' run.sh; only `n` is scaled down, the selection sizes are
    not: docs/fusegen.md says what that does at small `n`)."""

    n: PositiveInt = Field(600, description="samples in all over the rounds, split equally among the PLMs")
    rounds: NonNegativeInt = Field(4, description="feedback rounds after the zero-shot round (--steps)")
    examples: PositiveInt = Field(8, description="in-context examples S every PLM sees (--gen_few_shot_k)")
    pool_factor: PositiveInt = Field(5, description="candidates = S x pool_factor (--gen_few_shot_pool_size)")
    ambiguous_share: float = Field(0.5, ge=0, le=1, description="share of the most variable candidates")
    validation_size: PositiveInt = Field(100, description="synthetic validation samples for the influence")
    swa_iterations: PositiveInt = Field(30, description="self-boosting iterations E (--max_outer_iter)")
    influence: Literal["largest", "most_helpful"] = Field(
        "largest", description="which end of the influence ranking becomes examples: the code's largest "
                               "I_up,loss, or the most helpful (most negative)")

    def feedback(self) -> FeedbackSettings:
        return FeedbackSettings(examples=self.examples, pool_factor=self.pool_factor,
                                ambiguous_share=self.ambiguous_share, validation_size=self.validation_size,
                                swa_iterations=self.swa_iterations, influence=self.influence)


class FuseGenState(MethodState):
    samples: list[SyntheticSample] = []
    examples: list[str] = []  # the in-context examples of the next round (synthetic texts)


@register
class FuseGen(Method[FuseGenOptions, FuseGenState]):
    name = "fusegen"
    Options = FuseGenOptions
    State = FuseGenState
    uses_private_data = False
    prompt_examples = "examples"
    summary = "FuseGen: multi-PLM zero-shot with cross-model feedback and self-boosting weights (no private data)"

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        if len(config.generators) < 2:
            raise ValueError("fusegen fuses several PLMs (its STMs judge samples across models): give at least "
                             "two generators, or use method: zero-shot for one")

    def iterations(self) -> int:
        return self.options.rounds + 1

    def planned_requests(self, labels: int) -> int:
        return self.options.n

    def round_sizes(self) -> list[int]:
        return split_count(self.options.n, [1.0] * self.iterations())

    def check_task(self, task) -> None:
        smallest = min(self.round_sizes())
        if smallest < len(task.labels):
            raise DpsynthError(f"fusegen.n={self.options.n} over {self.iterations()} rounds gives a round {smallest} "
                               f"samples, fewer than the {len(task.labels)} labels; raise fusegen.n or lower "
                               "fusegen.rounds")

    def step(self, ctx: StepContext, state: FuseGenState, t: int) -> dict:
        f, seed = self.options, self.config.seed
        settings = f.prompt_settings()
        plms = [g.display_name for g in self.config.generators]
        if t == 0:  # the zero-shot method's requests (its seed tag), so this round is its first samples
            make_requests = zero_shot_requests(ctx.task, settings, seed, "fusegen")
        else:
            # every PLM and label sees the same unlabelled examples (templates/fusegen.yaml)
            make_requests = shared_example_requests(ctx.task, settings, state.examples, seed, "fusegen-cdg", t,
                                                    templates="fusegen")
        t0 = time.perf_counter()
        plans = plan_counts(self.round_sizes()[t], dict.fromkeys(plms, 1.0), ctx.label_shares)
        new, stats = generate_samples(t, plans=plans, generators=ctx.generators, existing=state.samples,
                                      make_requests=make_requests, max_attempts=f.max_attempts,
                                      on_progress=ctx.generation_progress(t))
        ctx.add_time("generation", t0)
        state.samples = state.samples + new
        record: dict = {"iteration": t, "generated": stats, "examples_shown": len(state.examples) if t else 0}

        emb = ctx.embed_synthetic(state.samples)
        t0 = time.perf_counter()
        y, classes = ctx.label_ids(state.samples), len(ctx.task.label_names)
        if t < self.options.rounds:
            plm_of = np.array([plms.index(x.plm) for x in state.samples])
            rng = np.random.default_rng(request_seed(seed, "fusegen-split", t))
            fb = cross_model_feedback(emb, y, plm_of, len(plms), classes, f.feedback(), rng, seed=seed)
            state.examples = [state.samples[i].text for i in fb.chosen]
            record["feedback"] = {
                "pool": len(fb.pool), "validation": len(fb.validation),
                "variability_mean": float(fb.variability.mean()) if len(fb.variability) else 0.0,
                "examples_per_plm": {k: sum(state.samples[i].plm == k for i in fb.chosen) for k in plms},
            }
        else:
            boosted = self_boosting_weights(emb, y, classes, f.swa_iterations, seed=seed)
            state.samples = [replace(x, weight=round(float(w), 6)) for x, w in zip(state.samples, boosted.weights)]
            record["weights"] = {"min": float(boosted.weights.min()), "max": float(boosted.weights.max()),
                                 "below_half": int((boosted.weights < 0.5).sum())}
        ctx.add_time("judging", t0)
        return record

    def final_samples(self, state: FuseGenState) -> list[SyntheticSample]:
        return list(state.samples)

    def reference_sets(self, state: FuseGenState) -> dict[str, list[SyntheticSample]]:
        """The same samples without the self-boosting weights: what CDI adds."""
        return {"unweighted": [replace(x, weight=None) for x in state.samples]}
