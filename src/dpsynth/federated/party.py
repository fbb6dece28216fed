"""What runs at a data party: votes on its own records, plus its share of the noise.

The clean vote vector exists only inside `noisy_votes`; what leaves is already noised
with the party's share sigma_party, so even a protocol failure that exposed one party's
upload would show a noisy vector (whose privacy the report states separately).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpsynth.errors import DpsynthError
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.voting.spec import VoteSpec, compute_votes


@dataclass(frozen=True)
class PartyShard:
    """One party's private records: embeddings and label ids for votes, texts for local training
    (held in memory only)."""

    party_id: int
    embeddings: np.ndarray
    label_ids: np.ndarray
    texts: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.label_ids)


def check_party_size(shard: PartyShard, max_records: int) -> None:
    """The clipping range (and a party-level unit's sensitivity) assume this public bound on a party's records."""
    if len(shard) > max_records:
        raise DpsynthError(
            f"party {shard.party_id} holds more records than federated.max_records_per_party={max_records}"
        )


def check_vote_request(shard: PartyShard, spec: VoteSpec, candidates: np.ndarray,
                       candidate_labels: np.ndarray) -> None:
    """What the party can check of a vote request before it is charged (a refused answer costs nothing):
    one label per candidate, and candidates in its embeddings' space (label counts' are placeholders)."""
    if spec.clip_per_unit:  # its sensitivity assumes clipping per person, which a party cannot do (central only)
        raise DpsynthError(f"party {shard.party_id}: votes clipped per person have no federated form")
    candidates = np.asarray(candidates)
    if candidates.ndim != 2 or len(candidates) != len(candidate_labels):
        raise DpsynthError(f"party {shard.party_id}: a vote round needs one label per candidate embedding")
    if spec.kind != "label_counts" and len(shard) and candidates.shape[1] != shard.embeddings.shape[1]:
        raise DpsynthError(f"party {shard.party_id}: the candidates have {candidates.shape[1]} dimensions, its "
                           f"records' embeddings {shard.embeddings.shape[1]}: the run and the party must use one "
                           "embedder")


def noisy_votes(
    shard: PartyShard,
    spec: VoteSpec,
    candidates: np.ndarray,
    candidate_labels: np.ndarray,
    *,
    release: str,
    party_sigma: float,
    max_records: int,
    noise_seed: int | None,
) -> np.ndarray:
    """The party's votes + N(0, party_sigma^2 I), one independent stream per (release, party)."""
    check_party_size(shard, max_records)
    check_vote_request(shard, spec, candidates, candidate_labels)
    if spec.sampling_rate < 1:
        # Only the central data holder draws Poisson subsamples; a party votes with every record, so a
        # release accounted as subsampled must never be answered here.
        raise DpsynthError(f"party {shard.party_id}: subsampled votes (sampling_rate {spec.sampling_rate:g}) "
                           "have no federated form")
    votes = compute_votes(spec, shard.embeddings, shard.label_ids, candidates, candidate_labels)
    if party_sigma == 0.0:  # epsilon = inf reference run: the ledger says NOT DP
        return votes
    return NoiseSource(noise_seed).add(f"{release}/party{shard.party_id}", "gaussian", votes, party_sigma)
