"""POPri's similarity scores and the one-release alternative: signed, per-record unit vectors.

`popri_scores` (Hou et al., ICML 2025, "Private Federated Learning using Preference-Optimized
Synthetic Data"; code meiyuw/POPri, `client_feedback.py`): each private record takes the cosine
similarities to every candidate *of its own label*, subtracts their mean, divides by their
standard deviation and scales the result to unit L2 norm (a standardised vector of n entries has
norm sqrt(n) >= 1, so POPri's "clip to norm 1" always scales); the records' vectors are summed.
A record's vector is signed with norm <= 1, so the L2 sensitivity is 1 under add/remove and 2
under replacement (`privacy.sensitivity.signed_unit_sensitivity`). The per-label restriction
is ours: POPri's data is unlabelled; here a record only judges texts written for its label.

`embedding_sums`: the per-label sums of the records' unit-normalised embeddings, one row per
label (flattened). One record adds a unit vector to one row: the same sensitivity. Released once,
it scores any number of candidates afterwards at no further privacy cost (`centroid_scores`).

`units` (each record's person, when the unit of privacy is a person): each person's records' vectors are summed
and the sum clipped to L2 norm 1, as DP-SGD clips a person's summed gradient, so one person changes the output by
at most 1 (2 under replacement), whatever number of records k it holds; without it a person's k vectors add up to
norm k and the noise must be k times larger. POPri's own code clips a client's vector the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def popri_scores(private: np.ndarray, private_labels: Sequence[int] | np.ndarray, synthetic: np.ndarray,
                 synthetic_labels: Sequence[int] | np.ndarray, units: np.ndarray | None = None) -> np.ndarray:
    """Sum over records of the standardised, unit-norm similarity vector to the candidates of the record's
    label (zeros elsewhere). A label with fewer than two candidates gets no score (its vectors are zero).
    `units`: clip each person's summed vector to norm 1 (module docstring)."""
    p_labels = np.asarray(private_labels, dtype=np.int64)
    s_labels = np.asarray(synthetic_labels, dtype=np.int64)
    p, s = unit_rows(private), unit_rows(synthetic)
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (columns, records, their vectors) per label
    for label in np.unique(p_labels):
        cols = np.flatnonzero(s_labels == label)
        rows = np.flatnonzero(p_labels == label)
        if len(cols) < 2 or len(rows) == 0:
            continue
        sims = p[rows] @ s[cols].T  # (records of the label, its candidates)
        centred = sims - sims.mean(axis=1, keepdims=True)
        norms = np.linalg.norm(centred, axis=1, keepdims=True)
        # (x - mean) / std has norm sqrt(n); scaled to norm 1 it is (x - mean) / ||x - mean||
        blocks.append((cols, rows, np.divide(centred, norms, out=np.zeros_like(centred), where=norms > 1e-12)))
    return _summed(blocks, len(s_labels), units)


def embedding_sums(private: np.ndarray, private_labels: Sequence[int] | np.ndarray, labels: int,
                   units: np.ndarray | None = None) -> np.ndarray:
    """(labels x dim) flattened: row c is the sum of the unit-normalised embeddings of the records of label c.
    `units`: clip each person's summed contribution to norm 1 (module docstring)."""
    p_labels = np.asarray(private_labels, dtype=np.int64)
    p = unit_rows(private)
    dim = p.shape[1]
    blocks = [(np.arange(label * dim, (label + 1) * dim), rows, p[rows])
              for label in np.unique(p_labels) for rows in [np.flatnonzero(p_labels == label)]]
    return _summed(blocks, labels * dim, units)


def _summed(blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]], length: int,
            units: np.ndarray | None) -> np.ndarray:
    """The sum of every record's vector, given per label as (its columns, its records, their vectors); with
    `units`, each unit's vector (its sums in every label's columns: disjoint, so their squared norms add) is
    clipped to norm 1 first. Memory: one sum per (unit, label), never a dense record x length matrix."""
    out = np.zeros(length, dtype=np.float64)
    if units is None:
        for cols, _, vectors in blocks:
            out[cols] += vectors.sum(axis=0)
        return out
    ids, unit_of = np.unique(np.asarray(units), return_inverse=True)
    unit_of = unit_of.ravel()
    per_label = []
    squared = np.zeros(len(ids), dtype=np.float64)
    for cols, rows, vectors in blocks:
        present, index = np.unique(unit_of[rows], return_inverse=True)
        sums = np.zeros((len(present), vectors.shape[1]), dtype=np.float64)
        np.add.at(sums, index.ravel(), vectors)
        np.add.at(squared, present, (sums ** 2).sum(axis=1))
        per_label.append((cols, present, sums))
    scale = 1.0 / np.maximum(np.sqrt(squared), 1.0)
    for cols, present, sums in per_label:
        out[cols] += (sums * scale[present, None]).sum(axis=0)
    return out


def centroid_scores(noisy_sums: np.ndarray, synthetic: np.ndarray, synthetic_labels: Sequence[int] | np.ndarray,
                    labels: int) -> np.ndarray:
    """Post-processing of the released sums: each candidate's cosine to its label's noisy sum."""
    centroids = unit_rows(np.asarray(noisy_sums, dtype=np.float64).reshape(labels, -1))
    s = unit_rows(synthetic)
    idx = np.asarray(synthetic_labels, dtype=np.int64)
    return np.einsum("ij,ij->i", s, centroids[idx])
