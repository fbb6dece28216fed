"""FuseGen's Cross-model Dataset Generation: which synthetic samples go back to the PLMs as examples.

As in the authors' code (LindaLydia/FuseGen, `run_divergence_calculation`, `sample_dynamic_selection`,
`importance_selection_among_good_dynamic_samples`), each round:
1. each PLM's samples are split at random into train (90%) and validation (10%);
2. one STM per PLM is trained on that PLM's train split;
3. every train sample is judged by all K STMs: its *variability* is the standard deviation over the
   STMs of p(its label | text) (cross-model, not FuseGen's name's dataset-cartography epochs);
4. a pool of S * pool_factor candidates: the least variable (all STMs agree) and, `ambiguous_share`
   of it, the most variable, over all PLMs and labels together;
5. the fused STM (trained on every sample with self-boosting weights, `evaluate/self_boosting.py`)
   ranks the pool by influence on a synthetic validation set (`validation_size // K` per PLM) and the
   top S, shuffled, are the examples every PLM sees next round (without their labels).
Only synthetic samples are involved: no private data, no privacy cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpsynth.evaluate.influence import influence_on_validation
from dpsynth.evaluate.self_boosting import self_boosting_weights
from dpsynth.evaluate.stm import fit_stm

InfluenceOrder = Literal["largest", "most_helpful"]


@dataclass(frozen=True)
class FeedbackSettings:
    examples: int = 8  # S, --gen_few_shot_k
    pool_factor: int = 5  # the pool is S * pool_factor candidates, --gen_few_shot_pool_size
    ambiguous_share: float = 0.5  # --gen_few_shot_ambiguous_ratio
    validation_share: float = 0.1  # each PLM's validation split
    validation_size: int = 100  # validation samples over all PLMs (100 // K from each)
    swa_iterations: int = 30  # E of the fused STM
    influence: InfluenceOrder = "largest"  # the code's order; "most_helpful" = most negative I_up,loss


@dataclass(frozen=True)
class Feedback:
    chosen: list[int]  # indices of the examples, in prompt order
    pool: list[int]
    variability: np.ndarray  # of the train samples, in `train` order
    train: list[int]
    validation: list[int]
    influence: np.ndarray  # of the pool, in `pool` order


def split_per_plm(plm_of: np.ndarray, plms: int, share: float,
                  rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each PLM's sample indices split at random into train and validation: the authors' code keeps int((1 -
    share) n) for training and the rest for validation (2 of 12, where int(share n) would keep 1); at least one
    validation sample once a PLM has two."""
    trains, valids = [], []
    for k in range(plms):
        idx = rng.permutation(np.flatnonzero(plm_of == k))
        n_valid = max(1, len(idx) - int(len(idx) * (1 - share))) if len(idx) >= 2 else 0
        valids.append(idx[:n_valid])
        trains.append(idx[n_valid:])
    return trains, valids


def cross_model_variability(emb: np.ndarray, y: np.ndarray, trains: list[np.ndarray], classes: int,
                            seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, std over the per-PLM STMs of p(y|x)) for every train sample; 0 with fewer than 2 STMs."""
    train = np.concatenate(trains)
    stms = [fit_stm(emb[idx], y[idx], classes, seed=seed) for idx in trains if len(idx)]
    if len(stms) < 2:
        return train, np.zeros(len(train))
    p = np.stack([stm.label_probability(emb[train], y[train]) for stm in stms])
    return train, p.std(axis=0, ddof=1)


def candidate_pool(variability: np.ndarray, size: int, ambiguous_share: float) -> np.ndarray:
    """Positions of the `size - a` least and the `a` most variable samples, a = round(size * share)."""
    if len(variability) <= size:
        return np.arange(len(variability))
    order = np.argsort(variability, kind="stable")
    ambiguous = int(round(size * ambiguous_share))
    easy = size - ambiguous
    return np.concatenate([order[:easy], order[len(order) - ambiguous:]])


def cross_model_feedback(emb: np.ndarray, y: np.ndarray, plm_of: np.ndarray, plms: int, classes: int,
                         settings: FeedbackSettings, rng: np.random.Generator, seed: int = 0) -> Feedback:
    """The round's in-context examples from all PLMs' samples so far (indices into them)."""
    trains, valids = split_per_plm(plm_of, plms, settings.validation_share, rng)
    train, variability = cross_model_variability(emb, y, trains, classes, seed=seed)
    pool = train[candidate_pool(variability, settings.examples * settings.pool_factor, settings.ambiguous_share)]
    per_plm = settings.validation_size // plms
    validation = np.concatenate([rng.permutation(v)[:per_plm] for v in valids]).astype(np.int64)
    fused = self_boosting_weights(emb, y, classes, settings.swa_iterations, seed=seed)
    influence = influence_on_validation(fused.stm, emb, fused.weights, emb[pool], y[pool], emb[validation],
                                        y[validation])
    ranked = np.argsort(-influence if settings.influence == "largest" else influence, kind="stable")
    chosen = rng.permutation(pool[ranked[: settings.examples]])
    return Feedback([int(i) for i in chosen], pool.tolist(), variability, train.tolist(), validation.tolist(),
                    influence)
