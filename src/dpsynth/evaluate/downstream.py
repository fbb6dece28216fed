"""Downstream usefulness: a classifier trained on synthetic data, scored on real test data.

The fast default is a logistic-regression probe on sentence embeddings (the
same embedder the votes use). The test set is real, public, held out and
never used in generation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score

PROBE_C = 1.0  # inverse L2 strength of the probe (and of FuseGen's STM, which is the same model)


def probe_scores(
    train_emb: np.ndarray,
    train_labels: Sequence[str],
    test_emb: np.ndarray,
    test_labels: Sequence[str],
    seed: int = 0,
    sample_weight: np.ndarray | None = None,
) -> dict:
    """Accuracy and macro-F1 of a logistic-regression probe (and which test examples it got right, so that
    methods can be compared paired by test example); chance-level if training has one class. `sample_weight`
    (e.g. FuseGen's self-boosting weights) weights each training sample's loss."""
    classes = sorted(set(test_labels))
    if len(set(train_labels)) < 2:
        majority = train_labels[0] if len(train_labels) else classes[0]
        pred = [majority] * len(test_labels)
    else:
        clf = LogisticRegression(max_iter=2000, C=PROBE_C, random_state=seed)
        clf.fit(train_emb, list(train_labels), sample_weight=sample_weight)
        pred = clf.predict(test_emb)
    return {
        "correct": [int(p == y) for p, y in zip(pred, test_labels)],  # per test example, for paired intervals
        "predicted": [str(p) for p in pred],  # per test example, for paired macro-F1 intervals
        "accuracy": float(accuracy_score(test_labels, pred)),
        "macro_f1": float(f1_score(test_labels, pred, labels=classes, average="macro", zero_division=0)),
        "train_size": int(len(train_labels)),
        "weighted": sample_weight is not None,
        "test_size": int(len(test_labels)),
    }
