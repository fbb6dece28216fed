"""How a labelled example becomes a training sequence, and the loss of one sequence.

A sequence is a public control prompt (text kind, label and its public description) followed by
the private text and an end-of-text token. Only the text and the end-of-text token are learned:
the prompt is the control code that generation will give, and the final eos teaches the model
where a text stops. The prompt is tokenized on its own, exactly as the generator tokenizes it
later, so training and generation see the same prompt tokens.

The tokenizer pads with its end-of-text id, the same id as the learned final token, so padding
is told apart by the attention mask, never by the token id.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def control_prompt(text_kind: str, label: str, label_description: str) -> str:
    """Completion-style prefix with the label as control code, e.g. 'movie review (positive: praises it):\\n'."""
    return f"{text_kind} ({label}: {label_description}):\n"


def encode_examples(
    tokenizer: Any, prompts: list[str], texts: list[str], max_length: int, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, loss_mask) on `device`, right-padded to the longest sequence (at most
    `max_length`).

    `loss_mask[i, t]` is 1 where token t of sequence i is a target: a text token or the final eos
    (truncation may cut both). Empty lists give tensors of shape (0, 0).
    """
    if len(prompts) != len(texts):
        raise ValueError("prompts and texts differ in length")
    rows: list[tuple[list[int], list[int]]] = []
    for prompt, text in zip(prompts, texts):
        prompt_ids = tokenizer(prompt)["input_ids"]  # with special tokens, as at generation time
        text_ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = (prompt_ids + text_ids)[:max_length]
        targets = ([0] * len(prompt_ids) + [1] * len(text_ids))[:max_length]
        rows.append((ids, targets))
    width = max((len(ids) for ids, _ in rows), default=0)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, targets) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
        loss_mask[i, : len(ids)] = torch.tensor(targets, dtype=torch.long)
    return input_ids.to(device), attention_mask.to(device), loss_mask.to(device)


def sequence_losses(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """One loss per sequence: the mean token cross-entropy over its targets (0 if truncation left none).

    Per sequence, not the model's built-in `labels=` loss: that one averages over all tokens of
    the batch, so one example's weight depends on the others' lengths, and per-example clipping
    needs each example's loss to depend on that example alone.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    # The token at t is predicted from position t-1.
    token_losses = F.cross_entropy(
        logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none"
    )
    weights = loss_mask[:, 1:].to(token_losses.dtype)
    return (token_losses * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
