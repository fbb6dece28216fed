"""Equal-share zero-shot generation: every PLM writes an equal share of N zero-shot samples.

No private data is touched (epsilon 0). This is the simplest no-private-data reference
(what the models write on their own); FuseGen as published (`fusegen`) adds cross-model
feedback and sample weights on top of it, and both are the bars a DP method must beat.
"""

from __future__ import annotations

import time

from pydantic import Field, PositiveInt

from dpsynth.errors import DpsynthError
from dpsynth.methods.base import Method, MethodState, SamplingOptions, StepContext
from dpsynth.methods.generation import (
    SyntheticSample,
    generate_samples,
    plan_counts,
    zero_shot_requests,
)
from dpsynth.methods.registry import register


class ZeroShotOptions(SamplingOptions):
    """The `zero-shot:` section: zero-shot multi-PLM fusion, no private data (epsilon 0)."""

    n: PositiveInt = Field(600, description="samples in all, split equally among the PLMs, then "
                                    "over the labels by the label shares")


class ZeroShotState(MethodState):
    samples: list[SyntheticSample] = []


@register
class ZeroShot(Method[ZeroShotOptions, ZeroShotState]):
    name = "zero-shot"
    Options = ZeroShotOptions
    State = ZeroShotState
    uses_private_data = False
    summary = "equal-share zero-shot fusion of every PLM (no private data; a reference)"

    def iterations(self) -> int:
        return 1

    def planned_requests(self, labels: int) -> int:
        return self.options.n

    def check_task(self, task) -> None:
        if self.options.n < len(task.labels):
            raise DpsynthError(f"zero-shot.n={self.options.n} is smaller than the number of labels "
                               f"({len(task.labels)}): a label would get no sample; raise zero-shot.n")

    def step(self, ctx: StepContext, state: ZeroShotState, t: int) -> dict:
        f, seed = self.options, self.config.seed
        settings = f.prompt_settings()
        plms = {g.display_name: 1.0 for g in self.config.generators}
        # "fusegen" is the seed tag from before the rename: reruns ask the same questions as earlier runs
        make_requests = zero_shot_requests(ctx.task, settings, seed, "fusegen")

        t0 = time.perf_counter()
        new, stats = generate_samples(t, plans=plan_counts(f.n, plms, ctx.label_shares), generators=ctx.generators,
                                      existing=[], make_requests=make_requests, max_attempts=f.max_attempts,
                                      on_progress=ctx.generation_progress(t))
        ctx.add_time("generation", t0)
        state.samples = new
        return {"iteration": t, "generated": stats, "weights_used": {k: 1 / len(plms) for k in plms}}

    def final_samples(self, state: ZeroShotState) -> list[SyntheticSample]:
        return list(state.samples)
