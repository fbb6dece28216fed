"""POPri on the engine (Hou et al., ICML 2025, "Private Federated Learning using Preference-Optimized
Synthetic Data", arXiv 2504.16438; code meiyuw/POPri): the generator learns from DP scores.

for round t in 0..R-1:
    the PLM with the current LoRA adapter writes `prompts` x J candidates (zero-shot prompts of each
        label, label mix from the run's label proportions); per label they are cut into groups of J
    every candidate gets a score:
        scoring=votes     the data holder's POPri score release for this round (each record: cosine
                          similarities to its label's candidates, centred, scaled to unit norm; summed;
                          Gaussian noise; L2 sensitivity 1), one release per round
        scoring=centroid  cosine to the noisy sum of its label's unit embeddings, released once in
                          round 0 (sensitivity 1) and reused at no further cost
        scoring=public    cosine to the embedding of the public label description: no private data
                          (the control that a gain does not come from the DPO procedure alone)
    per group: chosen = rank `chosen_rank`, rejected = rank `rejected_rank` by score (POPri: 1 and 5 of 10)
    one epoch of DPO on the pairs (reference: the adapter switched off), or SFT on the chosen (control)
final: N samples from the tuned adapter, zero-shot prompts.

Everything after the holder's release is post-processing: the adapter is saved in the run's method
files after every round (with its hash in the state), so a resumed run continues from the last finished
round, and a round's score release, saved when drawn, is never drawn twice. Deviations from the paper
are listed in docs/popri.md (per-label scoring, LoRA with a small model on CPU, zero-shot instead of
few-shot prompts, one PLM per run).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, NonNegativeInt, PositiveInt

from dpsynth.config import RunConfig, records_per_unit
from dpsynth.errors import DpsynthError
from dpsynth.fs import atomic_write_bytes
from dpsynth.llm.cache import CachedGenerator
from dpsynth.methods.base import TRAINS_LORA, Method, MethodState, SamplingOptions, StepContext
from dpsynth.methods.dpft import LOCAL_KINDS, adapter_generator, local_gguf_path
from dpsynth.methods.generation import SyntheticSample, generate_samples, plan_counts, zero_shot_requests
from dpsynth.methods.registry import register
from dpsynth.privacy.schedule import Knob, Schedule, gaussian_releases
from dpsynth.privacy.sensitivity import vote_sensitivity
from dpsynth.voting.scores import centroid_scores
from dpsynth.voting.spec import EMBEDDING_SUMS, VoteSpec

SCORE_SIGMA = "score_sigma"
# clipped per person when the unit of privacy is a person: sensitivity 1 per person, not k (voting/scores.py);
# the one-release alternative is voting.spec.EMBEDDING_SUMS
SCORES = VoteSpec(kind="popri", clip_per_unit=True)


class PopriOptions(SamplingOptions):
    """The `popri:` section: R rounds of DP-scored preference training of a LoRA adapter, then N samples."""

    n: PositiveInt = Field(240, description="final samples from the tuned adapter")
    rounds: NonNegativeInt = Field(3, description="R: sample, score, train (0 with scoring public: the untuned "
                                   "model through the adapter's sampling route, a control)")
    prompts: PositiveInt = Field(32, description="preference pairs per round (groups of J candidates)")
    j: int = Field(8, ge=2, description="candidates per group (POPri: 10)")
    chosen_rank: PositiveInt = Field(1, description="rank of the chosen text in its group (1 = best score)")
    rejected_rank: PositiveInt = Field(5, description="rank of the rejected text (POPri: 5 of 10)")
    scoring: Literal["votes", "centroid", "public"] = Field(
        "votes", description="votes: POPri's DP score release each round; centroid: one release of the per-label "
        "embedding sums, reused by every round; public: the label descriptions (no private data, a control)")
    objective: Literal["dpo", "sft"] = Field("dpo", description="dpo: train on (chosen, rejected) pairs; sft: "
                                             "supervised fine-tuning on the chosen texts only (a control)")
    beta: float = Field(0.1, gt=0, description="DPO's beta")
    learning_rate: float = Field(5e-5, gt=0, description="adapter learning rate")
    batch_size: PositiveInt = Field(8, description="training examples per optimiser step (pairs for "
                                         "dpo, texts for sft)")
    epochs: PositiveInt = Field(1, description="epochs over each round's pairs (POPri: 1)")
    lora_r: PositiveInt = Field(8, description="LoRA rank of the adapter")
    lora_alpha: PositiveInt = Field(16, description="LoRA scaling alpha (the update is scaled by alpha / r)")
    max_length: int = Field(128, ge=16, description="tokens per training sequence (prompt + text)")


class PopriState(MethodState):
    adapter: str | None = None  # hash of the adapter after the last finished round (the file is in method files)
    samples: list[SyntheticSample] = []


@register
class Popri(Method[PopriOptions, PopriState]):
    name = "popri"
    Options = PopriOptions
    State = PopriState
    one_generator_per_run = True
    needs_packages = TRAINS_LORA
    summary = "POPri: DPO on a LoRA adapter from DP similarity scores of its samples, then sampling (ICML 2025)"

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self._policy: tuple[Any, Any] | None = None  # (peft model, tokenizer), loaded at the first round

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        o = config.options(cls.name)
        if config.federated is not None:
            raise ValueError("popri has no federated mode in dpsynth yet (the paper's setting; see docs/popri.md)")
        if config.generators[0].kind not in LOCAL_KINDS:
            raise ValueError(f"popri trains a LoRA adapter of a local GGUF model: generators[0].kind must be one "
                             f"of {LOCAL_KINDS}")
        if o.rounds == 0 and o.scoring != "public":
            raise ValueError("popri with rounds: 0 trains nothing and reads no private data: use scoring: public "
                             "(the sampling-route control) or rounds >= 1")
        if not o.chosen_rank < o.rejected_rank <= o.j:
            raise ValueError(f"popri needs chosen_rank < rejected_rank <= j (got {o.chosen_rank}, "
                             f"{o.rejected_rank}, {o.j})")

    @classmethod
    def reads_private_data(cls, options: Any) -> bool:
        return options.scoring != "public"  # the control scores by the public label descriptions only

    def check_task(self, task) -> None:
        local_gguf_path(self.config)

    def iterations(self) -> int:
        return self.options.rounds + 1

    def planned_requests(self, labels: int) -> int:
        o = self.options
        return o.rounds * o.prompts * o.j + o.n

    def schedule(self) -> Schedule:
        o = self.options
        if o.scoring == "public":
            return Schedule((), ())
        spec = SCORES if o.scoring == "votes" else EMBEDDING_SUMS
        sens = vote_sensitivity(spec, self.config.privacy.adjacency, max_records_per_user=records_per_unit(self.config))
        if o.scoring == "votes":
            releases = gaussian_releases("popri.scores", list(range(o.rounds)), SCORE_SIGMA, sens)
            note = f"POPri scores: {o.rounds} Gaussian releases of {o.prompts} x {o.j} candidate scores"
        else:
            releases = gaussian_releases("popri.centroids", [None], SCORE_SIGMA, sens)
            note = "one Gaussian release of the per-label sums of unit embeddings; every round scores from it"
        return Schedule(releases, (Knob(SCORE_SIGMA, guess=1.0, description="Gaussian noise on the scores"),),
                        (note,))

    def step(self, ctx: StepContext, state: PopriState, t: int) -> dict:
        o = self.options
        adapter = self._adapter(ctx, state)
        generator, inner = self._generator(ctx, adapter)
        if t == o.rounds:
            state.samples, stats = self._sample(ctx, generator, t, o.n, "popri-final")
            return {"iteration": t, "generated": stats, "adapter": state.adapter}
        candidates, stats = self._sample(ctx, generator, t, o.prompts * o.j, "popri-candidates")
        scores, score_info = self._scores(ctx, candidates, t)
        pairs = preference_pairs(candidates, scores, o.j, o.chosen_rank, o.rejected_rank)
        trained = self._train(ctx, inner, [(candidates[c], candidates[r]) for c, r in pairs], t)
        state.adapter = self._save_adapter(ctx)
        return {"iteration": t, "generated": stats, "pairs": len(pairs), "training": trained,
                "scores": score_info, "adapter": state.adapter}

    def final_samples(self, state: PopriState) -> list[SyntheticSample]:
        return list(state.samples)

    # -- the parts of a round ------------------------------------------------------------------------------

    def _sample(self, ctx: StepContext, generator: CachedGenerator, t: int, n: int,
                tag: str) -> tuple[list[SyntheticSample], dict]:
        settings = self.options.prompt_settings()
        make = zero_shot_requests(ctx.task, settings, self.config.seed, tag, t)
        t0 = time.perf_counter()
        samples, stats = generate_samples(t, plans=plan_counts(n, {generator.name: 1.0}, ctx.label_shares),
                                          generators={generator.name: generator}, existing=[], make_requests=make,
                                          max_attempts=self.options.max_attempts,
                                          on_progress=ctx.generation_progress(t))
        ctx.add_time("generation", t0)
        return samples, stats

    def _scores(self, ctx: StepContext, candidates: list[SyntheticSample], t: int) -> tuple[np.ndarray, dict]:
        """Scores of the candidates (noisy for votes and centroid), and what may be reported of them: the
        spread of the scores within labels and its signal-to-noise ratio (post-processing of the noisy values
        and the public sigma: `score_signal_to_noise`)."""
        o = self.options
        emb = ctx.embed_synthetic(candidates)
        labels = ctx.label_ids(candidates)
        n_labels = len(ctx.task.label_names)
        info: dict = {}
        sigma = ctx.knobs.get(SCORE_SIGMA, 0.0)
        noise = np.zeros(n_labels)  # the noise scale of one candidate's score, per label
        if o.scoring == "votes":
            scores = ctx.holder.noisy_votes(SCORES, emb, labels, release=self.release("scores", t))
            noise[:] = sigma
        elif o.scoring == "centroid":
            placeholder = np.zeros((n_labels, emb.shape[1]))
            sums = ctx.holder.noisy_votes(EMBEDDING_SUMS, placeholder, np.arange(n_labels),
                                          release=self.release("centroids"))
            scores = centroid_scores(sums, emb, labels, n_labels)
            norms = np.linalg.norm(sums.reshape(n_labels, -1), axis=1)
            noise[:] = sigma / np.maximum(norms, 1e-12)  # a unit candidate's cosine moves by sigma / |noisy sum|
            info["sum_norms"] = [float(x) for x in norms]
        else:
            names = ctx.task.label_names
            public = ctx.embed([f"{ctx.task.text_kind} ({c}: {ctx.task.labels[c]})" for c in names])
            scores = centroid_scores(public, emb, labels, n_labels)
        present = np.unique(labels)
        info["std_within_label"] = float(np.mean([scores[labels == c].std() for c in present]))
        if sigma > 0:
            info["signal_to_noise"] = float(np.mean([score_signal_to_noise(scores[labels == c], noise[c])
                                                     for c in present]))
        return scores, info

    def _train(self, ctx: StepContext, generator: Any, pairs: list[tuple[SyntheticSample, SyntheticSample]],
               t: int) -> dict:
        from dpsynth.finetune.preference import PreferencePair, PreferenceSettings, train_on_preferences
        from dpsynth.llm.base import GenerationRequest
        from dpsynth.methods.generation import request_seed
        from dpsynth.prompts.builder import build_request

        o = self.options
        model, tokenizer = self._policy_model()
        prompt_of: dict[str, str] = {}
        for label in ctx.task.label_names:
            request: GenerationRequest = build_request(ctx.task, label, chat=generator.chat,
                                                       settings=o.prompt_settings())
            prompt_of[label] = generator.prompt_text(request)
        data = [PreferencePair(prompt_of[c.label], c.text, r.text) for c, r in pairs]
        settings = PreferenceSettings(objective=o.objective, beta=o.beta, learning_rate=o.learning_rate,
                                      batch_size=o.batch_size, epochs=o.epochs, max_length=o.max_length,
                                      seed=request_seed(self.config.seed, "popri-train", t))
        report = None
        if ctx.progress is not None:
            progress = ctx.progress

            def report(batch: int, batches: int, loss: float) -> None:
                progress(f"round {t}: {o.objective.upper()} loss {loss:.3f}", batch, batches)

        t0 = time.perf_counter()
        out = train_on_preferences(model, tokenizer, data, settings, on_batch=report)
        # not "training": that key is the data holder's DP training, whose time is private and not reported
        ctx.add_time("preference_training", t0)
        return out

    # -- the adapter: one in memory for training, one merged for sampling, the file for resuming -----------

    def _policy_model(self, start: np.ndarray | None = None) -> tuple[Any, Any]:
        """The trainable model (base + LoRA), built once per process; `start`: the adapter it resumes from."""
        if self._policy is None:
            import torch

            from dpsynth.device import resolve_device
            from dpsynth.finetune.model import add_lora, load_adapter_vector, load_base

            o = self.options
            model, tokenizer = load_base(local_gguf_path(self.config))
            with torch.random.fork_rng(devices=[]):  # the LoRA start from the run's public seed
                torch.manual_seed(self.config.seed)
                model = add_lora(model, o.lora_r, o.lora_alpha)
            if start is not None:
                load_adapter_vector(model, start)
            model.to(resolve_device(self.config.device))  # DPO trains where the run's `device:` says
            self._policy = (model, tokenizer)
        return self._policy

    def _adapter(self, ctx: StepContext, state: PopriState) -> np.ndarray:
        """The adapter the round starts from: the LoRA start, or the one saved after the last finished round
        (read back by its hash, so a round interrupted after training, even after saving, is redone from it)."""
        from dpsynth.finetune.model import adapter_hash, adapter_vector

        if state.adapter is None:
            self._policy = None
            return adapter_vector(self._policy_model()[0])
        path = _adapter_file(ctx, state.adapter)
        vec = np.load(path) if path.exists() else None
        if vec is None or adapter_hash(vec) != state.adapter:
            raise DpsynthError(f"{path}: the adapter of the last finished round is missing or changed; the run "
                               "cannot resume")
        if self._policy is None or adapter_hash(adapter_vector(self._policy[0])) != state.adapter:
            self._policy = None  # a new process, or trained past the checkpoint: start from the saved adapter
            self._policy_model(start=vec)
        return vec

    def _save_adapter(self, ctx: StepContext) -> str:
        """Write the trained adapter under its content hash (files are never overwritten with other content)."""
        import io

        from dpsynth.finetune.model import adapter_hash, adapter_vector

        vec = adapter_vector(self._policy_model()[0])
        digest = adapter_hash(vec)
        buf = io.BytesIO()
        np.save(buf, vec)
        atomic_write_bytes(_adapter_file(ctx, digest), buf.getvalue())
        return digest

    def _generator(self, ctx: StepContext, adapter: np.ndarray) -> tuple[CachedGenerator, Any]:
        o = self.options
        return adapter_generator(ctx, local_gguf_path(self.config), adapter, r=o.lora_r, alpha=o.lora_alpha,
                                 threads=self.config.generators[0].threads, chat=True)

def _adapter_file(ctx: StepContext, digest: str) -> Path:
    return _method_files(ctx) / f"popri_adapter_{digest}.npy"


def _method_files(ctx: StepContext) -> Path:
    if ctx.files is None:
        raise DpsynthError("popri needs the run's method-files directory (checkpoints/method) to resume from")
    return ctx.files


def score_signal_to_noise(noisy: np.ndarray, noise: float) -> float:
    """How far the candidates' scores differ beyond their noise, from noisy values only: the standard deviation
    of the signal, sqrt(max(var(noisy) - noise^2, 0)), over the noise's. 0 means the ranking is noise; POPri's
    pairs need it well above 1."""
    if noise <= 0 or len(noisy) < 2:
        return float("inf") if noise <= 0 else 0.0
    return float(np.sqrt(max(float(np.var(noisy)) - noise ** 2, 0.0)) / noise)


def preference_pairs(samples: list[SyntheticSample], scores: np.ndarray, j: int, chosen_rank: int,
                     rejected_rank: int) -> list[tuple[int, int]]:
    """(chosen, rejected) indices: per label, the samples in order are cut into groups of j (a last group
    smaller than `rejected_rank` is dropped); in each group the ranks by score (1 = highest) name the pair.
    All of a label's candidates answer the same prompt, so any group of them shares its prompt."""
    pairs: list[tuple[int, int]] = []
    labels = sorted({x.label for x in samples})
    for label in labels:
        idx = [i for i, x in enumerate(samples) if x.label == label]
        for start in range(0, len(idx), j):
            group = idx[start:start + j]
            if len(group) < rejected_rank:
                continue
            ranked = sorted(group, key=lambda i: (-scores[i], i))
            pairs.append((ranked[chosen_rank - 1], ranked[rejected_rank - 1]))
    return pairs
