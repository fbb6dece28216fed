"""The fine-tuned classifier of evaluation: a small BERT-style encoder fine-tuned on synthetic data only (the
papers' downstream model; FuseGen's in-loop STM is the probe, `evaluate/stm.py`).

The backbone is the MiniLM encoder of the default embedder (offline from PyPI),
with a fresh classification head. Settings are fixed so that runs are comparable,
and sized for the few dozen to few hundred samples a small run writes: measured on
120 zero-shot Rotten Tomatoes reviews, 3 epochs at batch 32 (a handful of steps for a
fresh head) reached 58.9% where the probe reached 68.5%; 10 epochs at batch 16 and
learning rate 1e-4 reached 67.5%. Small sets get at least `min_steps` optimiser steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import accuracy_score, f1_score

from dpsynth.embed.sentence import DEFAULT_EMBEDDER, resolve_model_path


@dataclass(frozen=True)
class FinetuneSettings:
    epochs: int = 10
    min_steps: int = 80
    learning_rate: float = 1e-4
    batch_size: int = 16
    max_length: int = 64
    seed: int = 0

    def epochs_for(self, train_size: int) -> int:
        """Epochs to train: `epochs`, or more when that would give fewer than `min_steps` steps."""
        batches = max(1, train_size // self.batch_size)
        return max(self.epochs, math.ceil(self.min_steps / batches))


def finetune_scores(
    train_texts: Sequence[str],
    train_labels: Sequence[str],
    test_texts: Sequence[str],
    test_labels: Sequence[str],
    settings: FinetuneSettings = FinetuneSettings(),
    backbone: str = DEFAULT_EMBEDDER,
    sample_weight: np.ndarray | None = None,
) -> dict:
    """Accuracy and macro-F1 on the test set, and per test example which answers were right and what was
    predicted (so that bench can pair methods by test example, as for the probe). `sample_weight` weights
    each sample's loss (FuseGen's mean of w_i CE_i)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "newly initialized classifier weights" is the point here, not a warning
    torch.manual_seed(settings.seed)
    classes = sorted(set(train_labels) | set(test_labels))
    index = {c: i for i, c in enumerate(classes)}
    path = resolve_model_path(backbone)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=len(classes))
    optim = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    y = torch.tensor([index[c] for c in train_labels])
    w = torch.ones(len(train_labels)) if sample_weight is None else torch.as_tensor(sample_weight, dtype=torch.float32)
    rng = np.random.default_rng(settings.seed)
    model.train()
    for _ in range(settings.epochs_for(len(train_texts))):
        for batch in np.array_split(rng.permutation(len(train_texts)), max(1, len(train_texts) // settings.batch_size)):
            enc = tok([train_texts[i] for i in batch], truncation=True, max_length=settings.max_length,
                      padding=True, return_tensors="pt")
            logits = model(**enc).logits
            loss = (w[batch] * torch.nn.functional.cross_entropy(logits, y[batch], reduction="none")).mean()
            loss.backward()
            optim.step()
            optim.zero_grad()
    model.eval()
    preds: list[str] = []
    with torch.no_grad():
        for start in range(0, len(test_texts), 128):
            enc = tok(list(test_texts[start : start + 128]), truncation=True, max_length=settings.max_length,
                      padding=True, return_tensors="pt")
            preds += [classes[i] for i in model(**enc).logits.argmax(-1).tolist()]
    return {
        "correct": [int(p == t) for p, t in zip(preds, test_labels)],  # per test example, for paired intervals
        "predicted": preds,  # per test example, for paired macro-F1 intervals
        "accuracy": float(accuracy_score(test_labels, preds)),
        "macro_f1": float(f1_score(test_labels, preds, labels=sorted(set(test_labels)), average="macro",
                                   zero_division=0)),
        "train_size": len(train_texts),
        "weighted": sample_weight is not None,
        "test_size": len(test_texts),
    }
