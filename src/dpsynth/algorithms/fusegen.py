"""FuseGen-style zero-shot fusion: every PLM writes an equal share of N zero-shot samples.

No private data is touched (epsilon 0); this is the WASP paper's fusion baseline
without its private feedback, and the reference that shows what the votes add.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from dpsynth.algorithms.common import SyntheticSample, generate_samples, plan_counts, zero_shot_requests
from dpsynth.prompts.builder import PromptSettings
from dpsynth.runs.config import RunConfig

if TYPE_CHECKING:
    from dpsynth.runs.run import RunContext


@dataclass
class FuseGenState:
    next_iteration: int = 0
    samples: list[SyntheticSample] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "FuseGenState":
        return cls(**{**data, "samples": [SyntheticSample(**s) for s in data["samples"]]})


class FuseGenMethod:
    name = "fusegen"

    def iterations(self, config: RunConfig) -> int:
        return 1

    def release_plan(self, config: RunConfig) -> None:
        return None

    def new_state(self, config: RunConfig) -> FuseGenState:
        return FuseGenState()

    def load_state(self, data: dict) -> FuseGenState:
        return FuseGenState.from_dict(data)

    def step(self, ctx: "RunContext", state: FuseGenState, t: int) -> dict:
        f, seed, task = ctx.config.fusegen, ctx.config.seed, ctx.data.task
        settings = PromptSettings(max_tokens=f.max_tokens, temperature=f.temperature, top_p=f.top_p)
        plms = {g.display_name: 1.0 for g in ctx.config.generators}
        make_requests = zero_shot_requests(task, settings, seed, "fusegen")

        t0 = time.perf_counter()
        new, stats = generate_samples(t, plans=plan_counts(f.n, plms, ctx.label_shares), generators=ctx.generators,
                                      existing=[], make_requests=make_requests, max_attempts=f.max_attempts,
                                      on_progress=ctx.generation_progress(t))
        ctx.add_time("generation", t0)
        state.samples = new
        return {"iteration": t, "generated": stats, "weights_used": {k: 1 / len(plms) for k in plms}}

    def final_samples(self, state: FuseGenState) -> list[SyntheticSample]:
        return list(state.samples)

    def reference_sets(self, state: FuseGenState) -> dict[str, list[SyntheticSample]]:
        return {}
