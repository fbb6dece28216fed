"""DP fine-tuned generator (papers/001, Algorithm 1; Yue et al. 2023): DP-Adam on a LoRA adapter of
a local PLM, then sampling from it, optionally followed by the `resample:` stage (Algorithm 2).

iteration 0: the data holder trains the adapter on (control prompt of the record's label, text)
             with Poisson sampling, per-example clipping and Gaussian noise (Opacus); the whole
             training is one release on the run's ledger: `steps` Poisson-subsampled Gaussian
             steps at rate q, noise multiplier z calibrated for the run's (epsilon, delta)
             jointly with the other releases (e.g. the resampling histogram).
iteration 1: N samples from the fine-tuned model, label mix from the run's label proportions,
             through the request cache (the model id carries the adapter's hash).

The privacy unit is one record, or with `data.person_column` one person: the Poisson draw is then over
persons and a person's gradients are summed before clipping (`finetune/dp_adam.py`), so the accounted
event is the same subsampled Gaussian with the person as the unit.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, PositiveInt

from dpsynth.config import RunConfig
from dpsynth.data.records import TaskSpec
from dpsynth.errors import DpsynthError
from dpsynth.finetune.examples import control_prompt
from dpsynth.finetune.request import AdapterTraining
from dpsynth.llm.base import GenerationRequest
from dpsynth.llm.cache import CachedGenerator
from dpsynth.methods.base import DP_TRAINS_LORA, Method, MethodState, SamplingOptions, StepContext
from dpsynth.methods.generation import (
    GenerationPlan,
    SyntheticSample,
    generate_samples,
    plan_counts,
    request_seed,
)
from dpsynth.methods.registry import register
from dpsynth.privacy.schedule import Knob, Release, Schedule, dp_sgd_events

NOISE_MULTIPLIER = "noise_multiplier"
LOCAL_KINDS = ("llama_cpp", "transformers")


class DpftOptions(SamplingOptions):
    """The `dpft:` section: DP-Adam on a LoRA adapter of the one local PLM, then N samples from it."""

    n: PositiveInt = Field(240, description="samples to generate from the fine-tuned model")
    steps: PositiveInt = Field(60, description="DP-Adam steps (each a Poisson sample of the records)")
    sampling_rate: float = Field(0.25, gt=0, le=1, description="q: each record (each person, with "
                                 "data.person_column) joins each step with this probability (expected batch = q x "
                                 "records)")
    clip_norm: float = Field(1.0, gt=0, description="per-example gradient L2 bound")
    learning_rate: float = Field(3e-3, gt=0, description="DP-Adam learning rate")
    lora_r: PositiveInt = Field(8, description="LoRA rank of the adapter")
    lora_alpha: PositiveInt = Field(16, description="LoRA scaling alpha (the update is scaled by alpha / r)")
    max_length: int = Field(64, ge=8, description="tokens per training sequence (control prompt + text)")
    max_tokens: PositiveInt = 60


class DpftState(MethodState):
    adapter: str | None = None  # the adapter's hash (the adapter itself is the saved release)
    samples: list[SyntheticSample] = []


@register
class Dpft(Method[DpftOptions, DpftState]):
    name = "dpft"
    Options = DpftOptions
    State = DpftState
    one_generator_per_run = True
    needs_packages = DP_TRAINS_LORA
    summary = "DP fine-tuned generator: DP-Adam on a LoRA adapter of a local PLM, then sampling (papers/001)"

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        if config.federated is not None:
            raise ValueError("dpft has no federated mode (DP-FedAvg is the resource-adaptive method's stage 1)")
        if config.generators[0].kind not in LOCAL_KINDS:
            raise ValueError(f"dpft fine-tunes a local GGUF model: generators[0].kind must be one of {LOCAL_KINDS}")

    def iterations(self) -> int:
        return 2

    def planned_requests(self, labels: int) -> int:
        return self.options.n

    def assumptions(self) -> dict[str, str]:
        o = self.options
        if self.config.data.person_column is not None:
            return {"sampler": f"DP-Adam: Poisson sampling of the persons at rate {o.sampling_rate:g}, {o.steps} "
                    "steps; a sampled person's gradients are summed and clipped together"}
        return {"sampler": f"DP-Adam: Poisson sampling of the records at rate {o.sampling_rate:g}, {o.steps} steps"}

    def schedule(self) -> Schedule:
        o = self.options

        release = Release("dpft.training", None, NOISE_MULTIPLIER, dp_sgd_events(o.steps, o.sampling_rate), 1.0)
        return Schedule((release,), (Knob(NOISE_MULTIPLIER, guess=1.0, description=(
            f"DP-Adam noise multiplier (sigma / clip norm) over {o.steps} Poisson-subsampled steps at rate "
            f"{o.sampling_rate:g}")),),
            (f"DP fine-tuning: {o.steps} DP-Adam steps, Poisson sampling at q={o.sampling_rate:g}, "
             f"per-example clipping at {o.clip_norm:g}",))

    def min_private_records(self) -> tuple[int, str]:
        return 2, "2"

    def check_task(self, task: TaskSpec) -> None:
        local_gguf_path(self.config)

    def training_request(self, task: TaskSpec) -> AdapterTraining:
        o = self.options
        return AdapterTraining(
            model=str(local_gguf_path(self.config)), lora_r=o.lora_r, lora_alpha=o.lora_alpha, steps=o.steps,
            sampling_rate=o.sampling_rate, clip_norm=o.clip_norm, learning_rate=o.learning_rate,
            max_length=o.max_length, threads=self.config.generators[0].threads, init_seed=self.config.seed,
            prompts={c: control_prompt(task.text_kind, c, task.labels[c]) for c in task.label_names})

    def step(self, ctx: StepContext, state: DpftState, t: int) -> dict:
        request = self.training_request(ctx.task)
        o = self.options
        if t == 0:
            state.adapter = train_adapter_once(ctx, request, self.release("training"))
            return {"iteration": 0, "training": {"steps": o.steps, "sampling_rate": o.sampling_rate,
                                                 "clip_norm": o.clip_norm, "sampler": "poisson",
                                                 "adapter": state.adapter}}
        adapter = ctx.holder.train_adapter(request, release=self.release("training"))  # the saved release
        state.samples, stats = sample_from_adapter(ctx, request, adapter, o, t, o.n, tag="dpft")
        return {"iteration": t, "generated": stats, "adapter": state.adapter}

    def final_samples(self, state: DpftState) -> list[SyntheticSample]:
        return list(state.samples)


def local_gguf_path(config: RunConfig) -> Path:
    """The GGUF file of the run's one local generator: the base model DP fine-tuning trains an adapter for."""
    from dpsynth.llm.local_models import resolve_local_model

    g = config.generators[0]
    path = resolve_local_model(g.model)[0] if g.kind == "llama_cpp" else Path(g.model).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise DpsynthError(f"{config.method} fine-tunes a local GGUF model file; '{g.model}' is not one")
    return path


def train_adapter_once(ctx: StepContext, request: AdapterTraining, release: tuple[str, int | None]) -> str:
    """Ask the data holder for the DP-trained adapter (the release is charged and trained once; later asks
    get the saved adapter); returns the adapter's hash, which names it in the state and the cache."""
    adapter = ctx.holder.train_adapter(request, release=release,  # timed as training by the holder's door
                                       on_step=training_progress(ctx, request.total_steps))
    return _hash(adapter)


def training_progress(ctx: StepContext, steps: int):
    """Progress line of a DP training release: noisy gradient norm and epsilon so far (both public)."""
    if ctx.progress is None:
        return None
    report = ctx.progress

    def on_step(step: int, grad_norm: float, epsilon: float) -> None:
        report(f"DP fine-tuning: noisy gradient norm {grad_norm:.2f}, epsilon so far {epsilon:.2f}", step, steps)

    return on_step


def sample_from_adapter(ctx: StepContext, request: AdapterTraining, adapter: np.ndarray, options: SamplingOptions,
                        t: int, n: int, *, tag: str) -> tuple[list[SyntheticSample], dict]:
    """n samples (label mix from the run's label proportions) from the base PLM with this DP-trained adapter,
    prompted by each label's control code, through the request cache (the model id carries the adapter's hash)."""
    generator, _ = adapter_generator(ctx, Path(request.model), adapter, r=request.lora_r, alpha=request.lora_alpha,
                                     threads=request.threads)
    settings = options.prompt_settings()
    seed = ctx.config.seed

    def make(plan: GenerationPlan, attempt: int, chat: bool) -> list[tuple[str, GenerationRequest]]:
        return [(label, GenerationRequest(prompt=request.prompts[label], max_tokens=settings.max_tokens,
                                          temperature=settings.temperature, top_p=settings.top_p, stop=("\n",),
                                          seed=request_seed(seed, tag, label, attempt, j)))
                for label, j in plan.indices()]

    t0 = time.perf_counter()
    samples, stats = generate_samples(t, plans=plan_counts(n, {generator.name: 1.0}, ctx.label_shares),
                                      generators={generator.name: generator}, existing=[], make_requests=make,
                                      max_attempts=options.max_attempts, on_progress=ctx.generation_progress(t))
    ctx.add_time("generation", t0)
    return samples, stats


def adapter_generator(ctx: StepContext, model: Path, adapter: np.ndarray, *, r: int, alpha: int,
                      threads: int | None, chat: bool = False) -> tuple[CachedGenerator, Any]:
    """The run's one local PLM with a LoRA adapter merged in, behind the run's request cache (and the inner
    generator, whose `prompt_text` preference training needs). `chat=False`: completion prompts (dpft's
    control codes); popri trains on the chat prompts, so it samples with them."""
    from dpsynth.device import resolve_device
    from dpsynth.finetune.generator import AdapterGenerator

    (name, base), = ctx.generators.items()
    if threads is not None:  # the generator's `threads:` shares the cores as for llama.cpp
        import torch

        torch.set_num_threads(threads)
    inner = AdapterGenerator(model, adapter.astype("float32"), r=r, alpha=alpha, name=name, chat=chat,
                             batch_size=32 if chat else 8)
    inner.to_device(resolve_device(ctx.config.device))  # the run's `device:`, as for the base generators
    return CachedGenerator(inner, base.cache, base.usage, payer=base.payer), inner


def _hash(adapter) -> str:
    from dpsynth.finetune.model import adapter_hash

    return adapter_hash(adapter.astype("float32"))
