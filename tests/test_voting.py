"""Blocked rank voting equals the naive full-distance-matrix computation."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.voting.rank_votes import decaying_weights, rank_votes, wasp_votes


def naive_votes(private, p_labels, synthetic, s_labels, weights, furthest=False):
    dist = np.linalg.norm(private[:, None, :] - synthetic[None, :, :], axis=2)  # M x N
    hist = np.zeros(len(synthetic))
    for j in range(len(private)):
        cand = np.flatnonzero(s_labels == p_labels[j])
        if len(cand) == 0:
            continue
        order = cand[np.argsort(dist[j, cand] * (-1 if furthest else 1), kind="stable")]
        for r, i in enumerate(order[: len(weights)]):
            hist[i] += weights[r]
    return hist


@pytest.mark.parametrize("block_bytes", [64, 4096, 64 * 2**20])
def test_matches_naive(block_bytes: int) -> None:
    rng = np.random.default_rng(0)
    private, synthetic = rng.normal(size=(37, 8)), rng.normal(size=(150, 8))
    pl, sl = rng.integers(0, 3, 37), rng.integers(0, 3, 150)
    w = decaying_weights(8)
    near, far = rank_votes(private, pl, synthetic, sl, w, nearest=True, furthest=True, block_bytes=block_bytes)
    np.testing.assert_allclose(near, naive_votes(private, pl, synthetic, sl, w), atol=1e-9)
    np.testing.assert_allclose(far, naive_votes(private, pl, synthetic, sl, w, furthest=True), atol=1e-9)


def test_votes_stay_within_own_label_and_sum_correctly() -> None:
    rng = np.random.default_rng(1)
    private, synthetic = rng.normal(size=(10, 4)), rng.normal(size=(30, 4))
    pl = np.array([0] * 7 + [1] * 3)
    sl = np.array([0] * 20 + [1] * 5 + [2] * 5)
    votes = wasp_votes(private, pl, synthetic, sl, q=4)
    near, far = votes[:30], votes[30:]
    assert near[25:].sum() == 0 and far[25:].sum() == 0  # label 2 has no private samples
    per_record = sum(decaying_weights(4))
    assert near.sum() == pytest.approx(10 * per_record)
    assert near[:20].sum() == pytest.approx(7 * per_record)


def test_fewer_candidates_than_q_and_label_without_candidates() -> None:
    rng = np.random.default_rng(2)
    private, synthetic = rng.normal(size=(4, 3)), rng.normal(size=(3, 3))
    pl = np.array([0, 0, 1, 1])
    sl = np.array([0, 0, 0])
    near, far = rank_votes(private, pl, synthetic, sl, decaying_weights(8), nearest=True, furthest=True)
    assert near.sum() == pytest.approx(2 * (1 + 0.5 + 0.25))
    assert far.sum() == pytest.approx(2 * (1 + 0.5 + 0.25))


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="embedding shapes"):
        rank_votes(np.zeros((2, 3)), [0, 0], np.zeros((2, 4)), [0, 0], [1.0])


def test_numpy_and_torch_selection_agree() -> None:
    from dpsynth.voting.rank_votes import _extremes, _extremes_numpy

    score = np.random.default_rng(5).normal(size=(20, 50)).astype(np.float32)
    for k in (1, 8, 30):
        for a, b in zip(_extremes(score, k, True, True), _extremes_numpy(score, k, True, True)):
            np.testing.assert_array_equal(a, b)
