"""FuseGen-style zero-shot fusion: every PLM writes an equal share of N zero-shot samples.

No private data is touched (epsilon 0); this is the WASP paper's fusion baseline
without its private feedback, and the reference that shows what the votes add.
"""

from __future__ import annotations

import time

from pydantic import PositiveInt

from dpsynth.errors import DpsynthError
from dpsynth.methods.base import Method, MethodState, SamplingOptions, StepContext
from dpsynth.methods.generation import (
    SyntheticSample,
    generate_samples,
    plan_counts,
    zero_shot_requests,
)
from dpsynth.methods.registry import register


class FuseGenOptions(SamplingOptions):
    """The `fusegen:` section: zero-shot multi-PLM fusion, no private data (epsilon 0)."""

    n: PositiveInt = 600


class FuseGenState(MethodState):
    samples: list[SyntheticSample] = []


@register
class FuseGen(Method[FuseGenOptions, FuseGenState]):
    name = "fusegen"
    Options = FuseGenOptions
    State = FuseGenState
    uses_private_data = False
    summary = "equal-share zero-shot fusion of every PLM (no private data; a reference)"

    def iterations(self) -> int:
        return 1

    def planned_requests(self, labels: int) -> int:
        return self.options.n

    def check_task(self, task) -> None:
        if self.options.n < len(task.labels):
            raise DpsynthError(f"fusegen.n={self.options.n} is smaller than the number of labels "
                               f"({len(task.labels)}): a label would get no sample; raise fusegen.n")

    def step(self, ctx: StepContext, state: FuseGenState, t: int) -> dict:
        f, seed = self.options, self.config.seed
        settings = f.prompt_settings()
        plms = {g.display_name: 1.0 for g in self.config.generators}
        make_requests = zero_shot_requests(ctx.task, settings, seed, "fusegen")

        t0 = time.perf_counter()
        new, stats = generate_samples(t, plans=plan_counts(f.n, plms, ctx.label_shares), generators=ctx.generators,
                                      existing=[], make_requests=make_requests, max_attempts=f.max_attempts,
                                      on_progress=ctx.generation_progress(t))
        ctx.add_time("generation", t0)
        state.samples = new
        return {"iteration": t, "generated": stats, "weights_used": {k: 1 / len(plms) for k in plms}}

    def final_samples(self, state: FuseGenState) -> list[SyntheticSample]:
        return list(state.samples)
