"""Rank-weighted nearest/furthest votes of private embeddings on synthetic ones.

One function covers the voting of every method: each private sample gives
`weights[r]` to its r-th nearest (or furthest) synthetic sample *of its own
label*. WASP uses weights 1, 1/2, ..., 2^-(Q-1) for both nearest and furthest;
Private Evolution uses [1] (Top-1) or k equal weights normalised to unit norm.

Why blocked: the naive way builds the M x N distance matrix (10,000 x 100,000
floats is 4 GB). Here private rows are processed in blocks sized to a memory
budget, distances come from one BLAS matrix product per block, and only the
Q best indices per row are kept (argpartition, then a sort of those Q).
The squared norm of the private row is constant along the row, so ranking
uses ||s||^2 - 2 p.s and never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_BLOCK_BYTES = 64 * 2**20

try:  # optional accelerator for top-k selection
    import torch as _torch
except ImportError:  # pragma: no cover - numpy path is tested directly
    _torch = None  # type: ignore[assignment]


def decaying_weights(q: int) -> list[float]:
    """WASP's vote weights 1, 1/2, ..., 2^-(q-1). (The reference code's `2^(Q-1)` is XOR in Python.)"""
    if q < 1:
        raise ValueError("Q must be >= 1")
    return [2.0 ** (-i) for i in range(q)]


def rank_votes(
    private: np.ndarray,
    private_labels: Sequence[int] | np.ndarray,
    synthetic: np.ndarray,
    synthetic_labels: Sequence[int] | np.ndarray,
    weights: Sequence[float],
    *,
    nearest: bool = True,
    furthest: bool = False,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    device: str | None = None,
    units: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Histograms over synthetic samples (length N each) of rank-weighted votes.

    Returns [nearest histogram] and/or [furthest histogram], in that order;
    both come from the same distance block, computed once. A label with fewer
    synthetic candidates than len(weights) receives only the first
    `n_candidates` weights from each of its private samples. `device` ('cuda' or
    'cpu'): the distance blocks and their top-k in torch on that device (None:
    numpy/BLAS); the histograms are the same up to float ties. `units`: each
    private row's unit (person); each unit's summed votes (both histograms
    together) are scaled down to the largest norm one record's votes can have
    (`_clipped_per_unit`), so a person moves the histograms as one record can.
    """
    private = np.asarray(private, dtype=np.float32)
    synthetic = np.asarray(synthetic, dtype=np.float32)
    p_labels = np.asarray(private_labels)
    s_labels = np.asarray(synthetic_labels)
    w = np.asarray(weights, dtype=np.float64)
    if private.ndim != 2 or synthetic.ndim != 2 or private.shape[1] != synthetic.shape[1]:
        raise ValueError(f"embedding shapes differ: private {private.shape}, synthetic {synthetic.shape}")
    sides = [side for side, wanted in (("near", nearest), ("far", furthest)) if wanted]
    n = len(synthetic)
    hists = np.zeros(len(sides) * n, dtype=np.float64)  # the sides' histograms, concatenated
    votes: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # with units: (rows, columns, weights) kept

    def cast(rows: np.ndarray, side: int, top: np.ndarray, cand: np.ndarray, k: int) -> None:
        columns, weights = side * n + cand[top].ravel(), np.tile(w[:k], len(top))
        if units is None:
            hists[:] += np.bincount(columns, weights=weights, minlength=len(hists))
        else:
            votes.append((np.repeat(rows, k), columns, weights))

    for label in np.unique(p_labels):
        cand = np.flatnonzero(s_labels == label)
        if len(cand) == 0:
            continue
        rows = np.flatnonzero(p_labels == label)
        voters = private[rows]
        k = min(len(w), len(cand))
        if device is not None:
            for side, top in enumerate(_extremes_on(device, voters, synthetic[cand], k, "near" in sides,
                                                    "far" in sides, block_bytes)):
                cast(rows, side, top, cand, k)
            continue
        s = synthetic[cand]
        s_sq = np.einsum("ij,ij->i", s, s)
        rows_per_block = max(1, block_bytes // (4 * len(cand)))
        for start in range(0, len(voters), rows_per_block):
            block = voters[start : start + rows_per_block]
            score = block @ s.T  # squared distance minus the row constant, built in place
            score *= -2.0
            score += s_sq[None, :]
            for side, top in enumerate(_extremes(score, k, "near" in sides, "far" in sides)):
                cast(rows[start : start + rows_per_block], side, top, cand, k)
    if units is not None:
        # the largest norm of one record's votes: its label's first min(len(w), candidates) weights on each side
        most = min(len(w), int(np.unique(s_labels, return_counts=True)[1].max(initial=0)))
        radius = float(np.sqrt(len(sides) * np.sum(w[:most] ** 2)))
        hists = _clipped_per_unit(votes, np.asarray(units), radius, len(hists))
    return [hists[i * n : (i + 1) * n] for i in range(len(sides))]


def _clipped_per_unit(votes: list[tuple[np.ndarray, np.ndarray, np.ndarray]], units: np.ndarray, radius: float,
                      length: int) -> np.ndarray:
    """The sum over units of each unit's summed vote vector, scaled to L2 norm at most `radius`.

    `votes`: (private rows, columns, weights) of every vote cast. Sparse throughout: one entry per (unit,
    column) voted for, never a dense units x length matrix. The vectors are non-negative, so a clipped unit
    still changes the sum by at most `radius` when removed (sqrt(2) radius when replaced)."""
    if not votes:
        return np.zeros(length, dtype=np.float64)
    rows, columns, weights = (np.concatenate(part) for part in zip(*votes))
    unit_of = np.unique(units, return_inverse=True)[1].ravel()[rows].astype(np.int64)
    cells, index = np.unique(unit_of * length + columns, return_inverse=True)
    sums = np.bincount(index.ravel(), weights=weights)  # each (unit, column)'s summed votes
    unit, column = cells // length, cells % length
    norms = np.sqrt(np.bincount(unit, weights=sums ** 2))
    scale = radius / np.maximum(norms, radius)  # 1 for a unit within the radius
    return np.bincount(column, weights=sums * scale[unit], minlength=length)


def _extremes_on(device: str, voters: np.ndarray, s: np.ndarray, k: int, nearest: bool, furthest: bool,
                 block_bytes: int) -> list[np.ndarray]:
    """`_extremes` of every voter's distance row, computed in torch on `device` block by block (the same
    ||s||^2 - 2 p.s ranking); only the (voters, k) indices come back to the host."""
    import torch

    s_t = torch.from_numpy(np.ascontiguousarray(s)).to(device)
    s_sq = (s_t * s_t).sum(1)
    rows_per_block = max(1, block_bytes // (4 * len(s)))
    parts: list[list[np.ndarray]] = [[] for _ in range(nearest + furthest)]
    for start in range(0, len(voters), rows_per_block):
        block = torch.from_numpy(np.ascontiguousarray(voters[start : start + rows_per_block])).to(device)
        score = s_sq[None, :] - 2.0 * (block @ s_t.T)
        ends = [largest for largest, wanted in ((False, nearest), (True, furthest)) if wanted]
        for part, largest in zip(parts, ends):
            part.append(torch.topk(score, k, dim=1, largest=largest, sorted=True).indices.cpu().numpy())
    return [np.concatenate(p) for p in parts]


def _extremes(score: np.ndarray, k: int, nearest: bool, furthest: bool) -> list[np.ndarray]:
    """Column indices of the k smallest (increasing) and/or k largest (decreasing) entries per row.

    torch.topk (multi-threaded, installed with the local extra) is 4-8x faster than
    numpy's argpartition here; without torch, one argpartition serves both ends.
    """
    if _torch is not None:
        t = _torch.from_numpy(score)
        return [
            _torch.topk(t, k, dim=1, largest=largest, sorted=True).indices.numpy()
            for largest, wanted in ((False, nearest), (True, furthest))
            if wanted
        ]
    return _extremes_numpy(score, k, nearest, furthest)


def _extremes_numpy(score: np.ndarray, k: int, nearest: bool, furthest: bool) -> list[np.ndarray]:
    n = score.shape[1]
    if 2 * k < n:
        kth = [k - 1] * nearest + [n - k] * furthest
        part = np.argpartition(score, kth, axis=1)
        candidates = [(part[:, :k], 1.0)] * nearest + [(part[:, n - k :], -1.0)] * furthest
    else:
        everything = np.broadcast_to(np.arange(n), score.shape)
        candidates = [(everything, 1.0)] * nearest + [(everything, -1.0)] * furthest
    out = []
    for idx, sign in candidates:
        order = np.argsort(sign * np.take_along_axis(score, idx, axis=1), axis=1, kind="stable")[:, :k]
        out.append(np.take_along_axis(idx, order, axis=1))
    return out


def wasp_votes(
    private: np.ndarray,
    private_labels: Sequence[int] | np.ndarray,
    synthetic: np.ndarray,
    synthetic_labels: Sequence[int] | np.ndarray,
    q: int,
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    device: str | None = None,
    units: np.ndarray | None = None,
) -> np.ndarray:
    """WASP's Top-Q nearest and furthest histograms, concatenated: shape (2N,).

    Released together as one vector, which is what the L2 sensitivity
    `wasp_topq_sensitivity` is about (and what `units` clips per unit).
    """
    near, far = rank_votes(
        private,
        private_labels,
        synthetic,
        synthetic_labels,
        decaying_weights(q),
        nearest=True,
        furthest=True,
        block_bytes=block_bytes,
        device=device,
        units=units,
    )
    return np.concatenate([near, far])
