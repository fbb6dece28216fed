"""Every sensitivity function against brute force on random and adversarial vote vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsynth.privacy.accountant import Adjacency
from dpsynth.privacy.sensitivity import (
    histogram_sensitivity,
    knn_votes_sensitivity,
    pe_top1_sensitivity,
    rank_votes_sensitivity,
    vote_l1_sensitivity,
    vote_sensitivity,
    wasp_topq_sensitivity,
)
from dpsynth.voting.rank_votes import decaying_weights, rank_votes, wasp_votes
from dpsynth.voting.scores import embedding_sums, popri_scores
from dpsynth.voting.spec import VoteSpec, compute_votes


def _add_remove_max(vote_fn, private: np.ndarray, labels: np.ndarray, group: int = 1) -> float:
    """max over groups of `group` consecutive records of ||f(D) - f(D minus group)||_2."""
    full = vote_fn(private, labels)
    worst = 0.0
    for start in range(0, len(private) - group + 1):
        keep = np.ones(len(private), dtype=bool)
        keep[start : start + group] = False
        worst = max(worst, float(np.linalg.norm(full - vote_fn(private[keep], labels[keep]))))
    return worst


def _replace_max(vote_fn, private: np.ndarray, labels: np.ndarray, pool: np.ndarray, pool_labels: np.ndarray) -> float:
    full = vote_fn(private, labels)
    worst = 0.0
    for i in range(len(private)):
        for x, y in zip(pool, pool_labels):
            p2, l2 = private.copy(), labels.copy()
            p2[i], l2[i] = x, y
            worst = max(worst, float(np.linalg.norm(full - vote_fn(p2, l2))))
    return worst


def _data(rng: np.random.Generator, m: int, n: int, d: int = 6, labels: int = 2):
    return (
        rng.normal(size=(m, d)),
        rng.integers(0, labels, m),
        rng.normal(size=(n, d)),
        rng.integers(0, labels, n),
    )


@pytest.mark.parametrize("q", [1, 2, 4, 8])
def test_wasp_add_remove_random(q: int) -> None:
    rng = np.random.default_rng(q)
    for _ in range(5):
        priv, pl, syn, sl = _data(rng, 12, 40)
        fn = lambda p, l: wasp_votes(p, l, syn, sl, q)  # noqa: E731
        measured = _add_remove_max(fn, priv, pl)
        assert measured <= wasp_topq_sensitivity(q) + 1e-9
        # each record has >= q candidates of its label here, so the bound is attained
        assert measured == pytest.approx(wasp_topq_sensitivity(q))


def test_wasp_fewer_candidates_than_q() -> None:
    rng = np.random.default_rng(0)
    priv, pl, syn, _ = _data(rng, 6, 3, labels=1)
    sl = np.zeros(3, dtype=int)
    pl = np.zeros(6, dtype=int)
    measured = _add_remove_max(lambda p, l: wasp_votes(p, l, syn, sl, 8), priv, pl)
    assert measured == pytest.approx(wasp_topq_sensitivity(8, candidates_per_label=3))
    assert measured < wasp_topq_sensitivity(8)


def test_wasp_user_level_adversarial_identical_records() -> None:
    """m identical records of one user all vote for the same bins: the m x bound is attained."""
    rng = np.random.default_rng(1)
    _, _, syn, sl = _data(rng, 1, 30, labels=1)
    sl = np.zeros(30, dtype=int)
    user = np.repeat(rng.normal(size=(1, 6)), 4, axis=0)
    others = rng.normal(size=(5, 6))
    priv = np.vstack([user, others])
    pl = np.zeros(len(priv), dtype=int)
    measured = _add_remove_max(lambda p, l: wasp_votes(p, l, syn, sl, 8), priv, pl, group=4)
    assert measured == pytest.approx(wasp_topq_sensitivity(8, max_records_per_user=4))
    # the WASP reference code's user-level bug: sample-level sensitivity would under-noise by 4x
    assert measured > 3.9 * wasp_topq_sensitivity(8)


def test_wasp_replace_one() -> None:
    rng = np.random.default_rng(2)
    priv, pl, syn, sl = _data(rng, 6, 30)
    # pool: points far away in opposite directions, of both labels (votes land on disjoint bins)
    pool = np.vstack([priv[:2] * -50, priv[:2] * 50])
    pool_labels = np.array([0, 1, 0, 1])
    measured = _replace_max(lambda p, l: wasp_votes(p, l, syn, sl, 4), priv, pl, pool, pool_labels)
    bound = wasp_topq_sensitivity(4, Adjacency.REPLACE)
    assert measured <= bound + 1e-9
    assert measured == pytest.approx(bound)


def test_pe_top1_and_knn() -> None:
    rng = np.random.default_rng(3)
    priv, pl, syn, sl = _data(rng, 10, 40)
    top1 = lambda p, l: rank_votes(p, l, syn, sl, [1.0])[0]  # noqa: E731
    assert _add_remove_max(top1, priv, pl) == pytest.approx(pe_top1_sensitivity())
    k = 5
    raw = lambda p, l: rank_votes(p, l, syn, sl, [1.0] * k)[0]  # noqa: E731
    normed = lambda p, l: rank_votes(p, l, syn, sl, [1 / math.sqrt(k)] * k)[0]  # noqa: E731
    assert _add_remove_max(raw, priv, pl) == pytest.approx(knn_votes_sensitivity(k, normalized=False))
    assert _add_remove_max(normed, priv, pl) == pytest.approx(knn_votes_sensitivity(k, normalized=True))
    pool = np.vstack([priv[:1] * -50, priv[:1] * 50])
    measured = _replace_max(top1, priv, pl, pool, np.array([0, 1]))
    assert measured == pytest.approx(pe_top1_sensitivity(Adjacency.REPLACE))


def test_rank_votes_any_weights() -> None:
    rng = np.random.default_rng(5)
    priv, pl, syn, sl = _data(rng, 12, 40)
    weights = [1.0, 0.7, 0.2, 0.05]
    votes = lambda p, l: rank_votes(p, l, syn, sl, weights)[0]  # noqa: E731
    assert _add_remove_max(votes, priv, pl) == pytest.approx(rank_votes_sensitivity(weights))
    # two records of one user voting for the same candidates: the bound doubles and is attained
    twice, twice_labels = np.repeat(priv, 2, axis=0), np.repeat(pl, 2)
    assert _add_remove_max(votes, twice, twice_labels, group=2) == pytest.approx(
        rank_votes_sensitivity(weights, max_records_per_user=2))
    assert rank_votes_sensitivity([1.0] * 5) == pytest.approx(knn_votes_sensitivity(5, normalized=False))
    with pytest.raises(ValueError):
        rank_votes_sensitivity([])


def test_histograms() -> None:
    rng = np.random.default_rng(4)
    assign = rng.integers(0, 7, 20)

    def hist(a: np.ndarray) -> np.ndarray:
        return np.bincount(a, minlength=7).astype(float)

    full = hist(assign)
    l2 = max(np.linalg.norm(full - hist(np.delete(assign, i))) for i in range(len(assign)))
    l1 = max(np.abs(full - hist(np.delete(assign, i))).sum() for i in range(len(assign)))
    assert l2 == histogram_sensitivity(norm=2) and l1 == histogram_sensitivity(norm=1)
    rep_l2 = max(
        np.linalg.norm(full - hist(np.where(np.arange(20) == i, c, assign))) for i in range(20) for c in range(7)
    )
    rep_l1 = max(
        np.abs(full - hist(np.where(np.arange(20) == i, c, assign))).sum() for i in range(20) for c in range(7)
    )
    assert rep_l2 == pytest.approx(histogram_sensitivity(Adjacency.REPLACE, norm=2))
    assert rep_l1 == histogram_sensitivity(Adjacency.REPLACE, norm=1)


def test_decaying_weights_are_powers_not_xor() -> None:
    assert decaying_weights(4) == [1.0, 0.5, 0.25, 0.125]
    assert sum(decaying_weights(8)) == pytest.approx(2 - 2**-7)


def test_popri_scores_add_remove_and_replace() -> None:
    """POPri's standardised, unit-norm score vectors: 1 under add/remove (attained), 2 under replacement (a
    record replaced by its mirror image flips its vector), k with k records of one person."""
    rng = np.random.default_rng(6)
    priv, pl, syn, sl = _data(rng, 10, 24)
    scores = lambda p, l: popri_scores(p, l, syn, sl)  # noqa: E731
    spec = VoteSpec(kind="popri")
    assert _add_remove_max(scores, priv, pl) == pytest.approx(vote_sensitivity(spec))
    pool = np.vstack([-priv, priv * 3])
    measured = _replace_max(scores, priv, pl, pool, np.concatenate([pl, 1 - pl]))
    assert measured <= vote_sensitivity(spec, Adjacency.REPLACE) + 1e-9
    assert measured > 1.9  # near the bound of 2: the mirrored record's vector is the negation
    twice, twice_labels = np.repeat(priv, 3, axis=0), np.repeat(pl, 3)
    assert _add_remove_max(scores, twice, twice_labels, group=3) == pytest.approx(
        vote_sensitivity(spec, max_records_per_user=3))
    # every record's vector sums to zero within its label (it is centred)
    assert scores(priv[:1], pl[:1])[sl == pl[0]].sum() == pytest.approx(0.0, abs=1e-9)


def test_embedding_sums_add_remove_and_replace() -> None:
    rng = np.random.default_rng(7)
    priv, pl, _, _ = _data(rng, 10, 1, labels=3)
    sums = lambda p, l: embedding_sums(p, l, 3)  # noqa: E731
    spec = VoteSpec(kind="embedding_sums")
    assert _add_remove_max(sums, priv, pl) == pytest.approx(vote_sensitivity(spec))
    measured = _replace_max(sums, priv, pl, -priv, pl)
    assert measured == pytest.approx(vote_sensitivity(spec, Adjacency.REPLACE))
    assert len(sums(priv, pl)) == spec.length(3, priv.shape[1])


@pytest.mark.parametrize("spec", [VoteSpec(kind="rank", weights=(1.0,)), VoteSpec(kind="rank", weights=(1.0, 0.5)),
                                  VoteSpec(kind="wasp", q=3), VoteSpec(kind="label_counts")], ids=str)
def test_l1_vote_sensitivity_add_remove_and_replace(spec: VoteSpec) -> None:
    """The L1 bound of a Laplace vote release, against brute force: attained when a record is removed, and when
    it is replaced by one far away with the other label (its mass moves to disjoint bins)."""
    rng = np.random.default_rng(7)
    priv, pl, syn, sl = _data(rng, 8, 30)
    if spec.kind == "label_counts":
        syn, sl = np.zeros((2, 1)), np.arange(2)
    votes = lambda p, l: compute_votes(spec, p, l, syn, sl)  # noqa: E731
    full = votes(priv, pl)
    removed = max(float(np.abs(full - votes(np.delete(priv, i, 0), np.delete(pl, i))).sum()) for i in range(8))
    assert removed == pytest.approx(vote_l1_sensitivity(spec))
    replaced = 0.0
    for i in range(8):
        for sign in (-50.0, 50.0):
            p2, l2 = priv.copy(), pl.copy()
            p2[i], l2[i] = sign * priv[i], 1 - pl[i]
            replaced = max(replaced, float(np.abs(full - votes(p2, l2)).sum()))
    assert replaced <= vote_l1_sensitivity(spec, Adjacency.REPLACE) + 1e-9
    assert replaced == pytest.approx(vote_l1_sensitivity(spec, Adjacency.REPLACE))
    assert vote_l1_sensitivity(spec, max_records_per_user=3) == pytest.approx(3 * vote_l1_sensitivity(spec))
    with pytest.raises(ValueError, match="bounded in L2 only"):
        vote_l1_sensitivity(VoteSpec(kind="embedding_sums"))

