"""What a method asks the private data to vote on, as data that can travel to a data party.

Centrally the run computes the votes itself; in a federation each party receives the
spec with the candidates' embeddings and computes its own votes. Keeping the vote
definition in one serialisable place makes both paths run the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dpsynth.voting.rank_votes import rank_votes, wasp_votes
from dpsynth.voting.scores import embedding_sums, popri_scores

# the vector kinds, whose per-person sums can be clipped to one record's largest norm (label counts are not clipped)
CLIPPABLE_KINDS = ("wasp", "rank", "popri", "embedding_sums")


class VoteSpec(BaseModel):
    """WASP Top-Q near+far votes (length 2N), rank-weighted nearest votes (length N), label counts
    (each record votes for its own label's entry: the candidates are one placeholder per label),
    POPri scores (length N; `voting.scores.popri_scores`), or per-label sums of the records' unit
    embeddings (the candidates are one placeholder row per label of the embedding's width; length
    labels x width)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["wasp", "rank", "label_counts", "popri", "embedding_sums"]
    q: int = Field(8, ge=1, description="WASP: votes per private sample on each side")
    weights: tuple[float, ...] = Field((1.0,), description="rank: weight of the r-th nearest candidate")
    sampling_rate: float = Field(1.0, gt=0, le=1, description="Poisson subsampling: each record votes with this "
                                 "probability, drawn by the data holder from its secret noise stream")
    clip_per_unit: bool = Field(False, description="wasp, rank, popri, embedding_sums: each unit's (person's) summed "
                                "vector is clipped to the largest norm one record's can have (1 for the signed kinds), "
                                "so the L2 sensitivity is that of one record whatever the unit holds (central data "
                                "holder only: it knows each record's person)")

    @model_validator(mode="after")
    def _clip_vectors_only(self) -> VoteSpec:
        if self.clip_per_unit and self.kind not in CLIPPABLE_KINDS:
            raise ValueError(f"clip_per_unit applies to {', '.join(CLIPPABLE_KINDS)} votes, not {self.kind}")
        return self

    def length(self, candidates: int, width: int = 1) -> int:
        if self.kind == "embedding_sums":
            return candidates * width
        return 2 * candidates if self.kind == "wasp" else candidates

    def max_bin_vote(self) -> float:
        """Largest vote one private record can give one candidate (bounds a party's bin by its records)."""
        return max(self.weights) if self.kind == "rank" else 1.0  # popri, embedding_sums: |entry| <= 1


# the per-label sums of unit embeddings (relabel:, POPri's centroids), each person's clipped to norm 1 when the
# unit of privacy is a person: sensitivity 1 per person, not k (voting/scores.py)
EMBEDDING_SUMS = VoteSpec(kind="embedding_sums", clip_per_unit=True)


def compute_votes(
    spec: VoteSpec,
    private: np.ndarray,
    private_labels: Sequence[int] | np.ndarray,
    synthetic: np.ndarray,
    synthetic_labels: Sequence[int] | np.ndarray,
    device: str | None = None,
    units: np.ndarray | None = None,
) -> np.ndarray:
    """The clean vote vector: it must be noised before it leaves the data holder. `device`: None computes the
    rank votes with numpy/BLAS on the CPU; 'cuda' (or 'cpu') with torch on that device. `units`: each record's
    unit (person) for a `clip_per_unit` spec; None: each record is its own unit."""
    # without units each record is its own unit, and a record's vector (norm <= 1) needs no clipping
    clip_units = np.asarray(units) if spec.clip_per_unit and units is not None else None
    if spec.kind == "wasp":
        return wasp_votes(private, private_labels, synthetic, synthetic_labels, spec.q, device=device,
                          units=clip_units)
    if spec.kind == "label_counts":
        return np.bincount(np.asarray(private_labels, dtype=np.int64), minlength=len(synthetic_labels)).astype(
            np.float64)
    if spec.kind == "popri":
        return popri_scores(private, private_labels, synthetic, synthetic_labels, units=clip_units)
    if spec.kind == "embedding_sums":
        return embedding_sums(private, private_labels, len(synthetic_labels), units=clip_units)
    (votes,) = rank_votes(private, private_labels, synthetic, synthetic_labels, spec.weights, device=device,
                          units=clip_units)
    return votes
