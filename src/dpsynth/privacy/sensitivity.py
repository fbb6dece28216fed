"""L2/L1 sensitivities, one function per voting mechanism.

Each function states the worst-case change of the released vector when one
unit of privacy (a record, or a user with up to `max_records_per_user`
records) is added/removed or replaced. Tests check every one against brute
force on random and adversarial vote vectors.

Vote vectors are non-negative, so replacing one contribution v by v' changes
the sum by at most sqrt(|v|^2 + |v'|^2) = sqrt(2)|v| (disjoint supports), not
2|v| as for signed vectors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dpsynth.privacy.accountant import Adjacency
from dpsynth.voting.rank_votes import decaying_weights

if TYPE_CHECKING:
    from dpsynth.voting.spec import VoteSpec


def _scale(per_unit_l2: float, adjacency: Adjacency, max_records_per_user: int) -> float:
    if max_records_per_user < 1:
        raise ValueError("max_records_per_user must be >= 1")
    # A user's records may all vote for the same candidates: the triangle bound is attained.
    per_user = per_unit_l2 * max_records_per_user
    return per_user * (math.sqrt(2) if adjacency is Adjacency.REPLACE else 1.0)


def wasp_topq_sensitivity(
    q: int,
    adjacency: Adjacency = Adjacency.ADD_REMOVE,
    *,
    max_records_per_user: int = 1,
    candidates_per_label: int | None = None,
) -> float:
    """L2 sensitivity of the concatenated (nearest, furthest) Top-Q histograms.

    One record puts weights 1..2^-(Q'-1) on Q' distinct bins of each histogram,
    Q' = min(Q, candidates of its label): |v|^2 = 2 * sum 4^-i.
    Q=8: sqrt((8/3)(1 - 4^-8)) = 1.63298; the paper's bound is 4.
    """
    if q < 1:
        raise ValueError("Q must be >= 1")
    q_eff = q if candidates_per_label is None else min(q, candidates_per_label)
    if q_eff <= 0:
        return 0.0
    per_record = math.sqrt(2 * sum(w * w for w in decaying_weights(q_eff)))
    return _scale(per_record, adjacency, max_records_per_user)


def pe_top1_sensitivity(adjacency: Adjacency = Adjacency.ADD_REMOVE, *, max_records_per_user: int = 1) -> float:
    """Private Evolution's nearest-neighbour histogram: one vote of weight 1 per record."""
    return _scale(1.0, adjacency, max_records_per_user)


def knn_votes_sensitivity(
    k: int,
    adjacency: Adjacency = Adjacency.ADD_REMOVE,
    *,
    normalized: bool,
    max_records_per_user: int = 1,
) -> float:
    """k-NN votes: weight 1 on each of k distinct neighbours (sqrt(k)), or normalised to unit L2 norm (1).

    The normalised form is the PE library's; the unnormalised one is the K-NN
    voting of the resource-adaptive federated paper.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    return _scale(1.0 if normalized else math.sqrt(k), adjacency, max_records_per_user)


def rank_votes_sensitivity(
    weights: Sequence[float], adjacency: Adjacency = Adjacency.ADD_REMOVE, *, max_records_per_user: int = 1
) -> float:
    """Rank-weighted votes with any weights (weight w_r on the r-th nearest of distinct candidates): ||w||_2.

    k-NN votes are the case of k equal weights, Private Evolution's histogram the case (1,).
    """
    if not weights or any(w < 0 for w in weights):
        raise ValueError("rank weights must be a non-empty sequence of non-negative numbers")
    return _scale(math.sqrt(sum(w * w for w in weights)), adjacency, max_records_per_user)


def signed_unit_sensitivity(adjacency: Adjacency = Adjacency.ADD_REMOVE, *, max_records_per_user: int = 1) -> float:
    """Each record adds a signed vector of L2 norm <= 1 (POPri's standardised scores, per-label sums of unit
    embeddings). Add/remove: 1. Replacement: 2, since signed vectors can point in opposite directions (the
    sqrt(2) of non-negative votes does not hold)."""
    if max_records_per_user < 1:
        raise ValueError("max_records_per_user must be >= 1")
    return max_records_per_user * (2.0 if adjacency is Adjacency.REPLACE else 1.0)


def vote_sensitivity(spec: VoteSpec, adjacency: Adjacency = Adjacency.ADD_REMOVE, *,
                     max_records_per_user: int = 1, candidates_per_label: int | None = None) -> float:
    """L2 sensitivity of the vote vector a `VoteSpec` asks for: the one derivation the central methods and the
    federated parties' own ledgers share. A spec clipped per unit moves it by one record's worth whatever the unit
    holds: each unit's summed vector is scaled to the largest norm one record's can have (`voting/`)."""
    if spec.clip_per_unit:
        max_records_per_user = 1
    if spec.kind == "wasp":
        return wasp_topq_sensitivity(spec.q, adjacency, max_records_per_user=max_records_per_user,
                                     candidates_per_label=candidates_per_label)
    if spec.kind == "label_counts":
        return histogram_sensitivity(adjacency, max_records_per_user=max_records_per_user)
    if spec.kind in ("popri", "embedding_sums"):
        return signed_unit_sensitivity(adjacency, max_records_per_user=max_records_per_user)
    return rank_votes_sensitivity(spec.weights, adjacency, max_records_per_user=max_records_per_user)


def vote_l1_sensitivity(spec: VoteSpec, adjacency: Adjacency = Adjacency.ADD_REMOVE, *,
                        max_records_per_user: int = 1) -> float:
    """L1 sensitivity of the vote vector a `VoteSpec` asks for, for a Laplace release (DPGA's keyword votes).

    One record's votes are non-negative with L1 norm the sum of its weights (WASP's: both histograms'); replacing
    it can move all of that mass to other bins, so replacement doubles it. Signed vectors of bounded L2 norm
    (POPri's scores, embedding sums) have no L1 bound independent of their width: refused.
    """
    if spec.kind == "rank":
        per_record = float(sum(spec.weights))
    elif spec.kind == "label_counts":
        per_record = 1.0
    elif spec.kind == "wasp":
        per_record = 2.0 * sum(decaying_weights(spec.q))
    else:
        raise ValueError(f"{spec.kind} votes are signed vectors bounded in L2 only: no Laplace release for them")
    if max_records_per_user < 1:
        raise ValueError("max_records_per_user must be >= 1")
    return per_record * max_records_per_user * (2.0 if adjacency is Adjacency.REPLACE else 1.0)


def histogram_sensitivity(
    adjacency: Adjacency = Adjacency.ADD_REMOVE, *, norm: int = 2, max_records_per_user: int = 1
) -> float:
    """A count histogram (clusters, labels, lengths): each record adds 1 to one bin.

    L2 and L1 agree under add/remove (1); under replacement L2 is sqrt(2) and L1 is 2.
    """
    if norm == 2:
        return _scale(1.0, adjacency, max_records_per_user)
    if norm == 1:
        factor = 2.0 if adjacency is Adjacency.REPLACE else 1.0
        return factor * max_records_per_user
    raise ValueError("norm must be 1 or 2")
