"""FuseGen's small task model (STM), on the probe's features.

FuseGen judges synthetic samples with small classifiers trained on the synthetic data itself
(BERT-base in its code). dpsynth's STM is the downstream probe: a logistic regression on the
sentence embeddings every run already computes, so that judging a round costs milliseconds
instead of a fine-tuning. It is fitted with per-sample weights (FuseGen's weighted loss) and
gives a probability for every class of the task, also for classes it never saw (0 then).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import LogisticRegression

from dpsynth.evaluate.downstream import PROBE_C


@dataclass(frozen=True)
class Stm:
    """A fitted STM. `model` is None when it saw one class only: it then predicts that class for sure."""

    model: LogisticRegression | None
    classes: int
    only_class: int | None = None

    def proba(self, emb: np.ndarray) -> np.ndarray:
        """(n, classes) probabilities; columns of classes absent from training are 0."""
        out = np.zeros((len(emb), self.classes))
        if self.model is None:
            out[:, self.only_class] = 1.0
            return out
        out[:, self.model.classes_] = self.model.predict_proba(emb)
        return out

    def label_probability(self, emb: np.ndarray, y: np.ndarray) -> np.ndarray:
        """p(y_i | x_i) for each sample's own label."""
        return self.proba(emb)[np.arange(len(y)), y]


def fit_stm(emb: np.ndarray, y: np.ndarray, classes: int, weights: np.ndarray | None = None,
            seed: int = 0) -> Stm:
    """Fit the STM on embeddings `emb` with integer labels `y` in [0, classes), weighting each sample's loss."""
    present = np.unique(y)
    if len(present) == 1:
        return Stm(None, classes, int(present[0]))
    model = LogisticRegression(max_iter=2000, C=PROBE_C, random_state=seed)
    model.fit(emb, y, sample_weight=weights)
    return Stm(model, classes)
