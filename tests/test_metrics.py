"""Each metric against a hand-checkable case."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.evaluate.distribution import (
    distinct_n,
    fid,
    knn_precision_recall,
    knn_squared_radii,
    mauve_score,
    mean_pairwise_cosine,
)
from dpsynth.evaluate.downstream import probe_scores


def _cloud(rng, center, n=300, d=8):
    return rng.normal(size=(n, d)) * 0.3 + center


def test_fid_identical_zero_and_disjoint_large() -> None:
    rng = np.random.default_rng(0)
    a = _cloud(rng, 0.0)
    assert fid(a, a) == pytest.approx(0.0, abs=1e-6)
    b = _cloud(rng, 5.0)
    assert fid(a, b) == pytest.approx(8 * 25, rel=0.05)  # ||mu_a - mu_b||^2 dominates


def test_mauve_identical_near_one_disjoint_near_zero() -> None:
    rng = np.random.default_rng(1)
    a = _cloud(rng, 0.0)
    assert mauve_score(a, a.copy()) > 0.95
    assert mauve_score(a, _cloud(rng, 5.0)) < 0.1


def test_precision_recall() -> None:
    rng = np.random.default_rng(2)
    a = _cloud(rng, 0.0)
    pr = knn_precision_recall(a, a.copy())
    assert pr == {"precision": 1.0, "recall": 1.0}
    far = knn_precision_recall(_cloud(rng, 10.0), a)
    assert far["precision"] == 0.0 and far["recall"] == 0.0


def test_precision_recall_against_sklearn_neighbours() -> None:
    """The blocked matrix-product distances give the k-NN balls and coverage that sklearn's exact neighbours and
    explicit differences give, duplicates (a synthetic copy of a test text, repeated answers) included."""
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(4)
    real = rng.normal(size=(300, 16)).astype(np.float32)
    synthetic = (rng.normal(size=(280, 16)) * 1.3 + 0.4).astype(np.float32)
    synthetic[:10], synthetic[10:15] = real[:10], synthetic[20:25]

    def brute(points: np.ndarray, ref: np.ndarray, k: int = 3) -> float:
        radius = NearestNeighbors(n_neighbors=k + 1).fit(ref).kneighbors(ref)[0][:, -1]
        d = np.linalg.norm(points[:, None, :].astype(np.float64) - ref[None, :, :], axis=2)
        return float((d <= radius[None, :] + 1e-6).any(axis=1).mean())

    got = knn_precision_recall(synthetic, real)
    assert got == {"precision": brute(synthetic, real), "recall": brute(real, synthetic)}
    assert 0.0 < got["precision"] < 1.0 and 0.0 < got["recall"] < 1.0
    assert knn_precision_recall(synthetic, real, real_sq_radii=knn_squared_radii(real)) == got
    np.testing.assert_allclose(np.sqrt(knn_squared_radii(real)),
                               NearestNeighbors(n_neighbors=4).fit(real).kneighbors(real)[0][:, -1], rtol=1e-5)


def test_diversity() -> None:
    same = np.ones((5, 3))
    assert mean_pairwise_cosine(same) == pytest.approx(1.0)
    assert mean_pairwise_cosine(np.eye(3)) == pytest.approx(0.0)
    assert distinct_n(["a b a b"], 1) == pytest.approx(0.5)
    assert distinct_n(["a b c", "a b d"], 2) == pytest.approx(3 / 4)


def test_probe_separable_and_single_class() -> None:
    rng = np.random.default_rng(3)
    x = np.vstack([_cloud(rng, 0.0, 50), _cloud(rng, 3.0, 50)])
    y = ["a"] * 50 + ["b"] * 50
    assert probe_scores(x, y, x, y)["accuracy"] == 1.0
    single = probe_scores(x[:50], y[:50], x, y)
    assert single["accuracy"] == 0.5


def test_fid_of_a_single_sample_is_none_not_a_slow_nan() -> None:
    import numpy as np

    from dpsynth.evaluate.distribution import fid

    assert fid(np.ones((1, 8)), np.random.default_rng(0).random((5, 8))) is None
