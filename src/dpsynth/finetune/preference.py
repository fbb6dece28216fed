"""Preference training of a LoRA adapter on synthetic pairs: DPO (POPri's step) or SFT on the chosen texts.

Everything trained here is public: the prompts are built from the task description, the texts are
synthetic and the pairs come from DP-released scores, so this is post-processing and needs no noise
and no secret seed (the seed is the run's public one; two runs with the same seed write the same
adapter).

DPO (Rafailov et al. 2023): loss = -log sigmoid(beta * [(log pi(c) - log ref(c)) - (log pi(r) - log
ref(r))]) with log-probabilities summed over the response tokens (and the final end-of-text token).
The reference is the base model with the adapter switched off (`peft`'s `disable_adapter`), as in
TRL's DPOTrainer for a PEFT model; its log-probabilities are computed once per call, before
training, since the reference does not change. Our own loop, not TRL's trainer: it is 40 lines
on the same model, tokenisation and seeds as dpsynth's DP fine-tuning, and needs no extra
dependency; the loss is TRL's sigmoid loss.

SFT (`objective="sft"`): the mean token cross-entropy of the chosen texts (the control the POPri
paper shows failing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from dpsynth.finetune.examples import encode_examples, sequence_losses


@dataclass(frozen=True)
class PreferencePair:
    prompt: str  # exactly the text the generator is given (chat template applied)
    chosen: str
    rejected: str


@dataclass(frozen=True)
class PreferenceSettings:
    objective: Literal["dpo", "sft"] = "dpo"
    beta: float = 0.1
    learning_rate: float = 5e-5
    batch_size: int = 8
    epochs: int = 1
    max_length: int = 128
    seed: int = 0


def response_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      loss_mask: torch.Tensor) -> torch.Tensor:
    """Per sequence, the summed log-probability of its target tokens (the response and its final eos)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    token_logp = -F.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
    return (token_logp * loss_mask[:, 1:].to(token_logp.dtype)).sum(dim=1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """Mean DPO sigmoid loss over pairs."""
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


def train_on_preferences(model: Any, tokenizer: Any, pairs: Sequence[PreferencePair], settings: PreferenceSettings,
                         *, on_batch: Callable[[int, int, float], None] | None = None) -> dict:
    """Train `model`'s adapter (a `peft` model) in place for `settings.epochs` epochs over `pairs`; returns
    the mean loss of the last epoch and (DPO) the share of the last epoch's pairs whose implicit reward
    margin was positive when their batch was met (before its update: no extra forward pass is paid)."""
    if not pairs:
        return {"pairs": 0, "loss": None}
    generator = torch.Generator().manual_seed(settings.seed)  # the pair order: on the CPU on every device
    device = next(model.parameters()).device  # train where the model is (the run's `device:`)
    prompts = [p.prompt for p in pairs]
    chosen = encode_examples(tokenizer, prompts, [p.chosen for p in pairs], settings.max_length, device)
    rejected = encode_examples(tokenizer, prompts, [p.rejected for p in pairs], settings.max_length, device)
    ref_c = ref_r = None
    if settings.objective == "dpo":
        with torch.no_grad(), model.disable_adapter():
            model.eval()
            ref_c = _batched_logprobs(model, chosen, settings.batch_size)
            ref_r = _batched_logprobs(model, rejected, settings.batch_size)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=settings.learning_rate)
    # The policy stays in eval mode (no dropout), as the reference was computed: a dropout difference would
    # make policy and reference differ at the start (TRL turns dropout off for DPO by default too).
    model.eval()
    batches = -(-len(pairs) // settings.batch_size)
    losses: list[float] = []
    ahead = 0
    for _ in range(settings.epochs):
        losses, ahead = [], 0
        order = torch.randperm(len(pairs), generator=generator)
        for b in range(batches):
            idx = order[b * settings.batch_size:(b + 1) * settings.batch_size].to(device)
            if settings.objective == "dpo":
                assert ref_c is not None and ref_r is not None  # computed above for DPO
                pc = response_logprobs(model, *(x[idx] for x in chosen))
                pr = response_logprobs(model, *(x[idx] for x in rejected))
                loss = dpo_loss(pc, pr, ref_c[idx], ref_r[idx], settings.beta)
                ahead += int(((pc - ref_c[idx]) - (pr - ref_r[idx]) > 0).sum())
            else:
                loss = sequence_losses(model, *(x[idx] for x in chosen)).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            if on_batch is not None:
                on_batch(b + 1, batches, losses[-1])
    out: dict = {"pairs": len(pairs), "loss": float(np.mean(losses)),
                 # sequences cut at max_length lose their end (and its eos): say how many
                 "truncated": int(((chosen[1].sum(dim=1) >= settings.max_length)
                                   | (rejected[1].sum(dim=1) >= settings.max_length)).sum())}
    if settings.objective == "dpo":
        out["reward_accuracy"] = ahead / len(pairs)
    return out


def _batched_logprobs(model: Any, encoded: tuple[torch.Tensor, ...], batch_size: int) -> torch.Tensor:
    return torch.cat([response_logprobs(model, *(x[i:i + batch_size] for x in encoded))
                      for i in range(0, len(encoded[0]), batch_size)])

