"""A run's vote releases, answered by a federation of parties instead of one data holder.

Per release the run charges the ledger first (`RunContext.noisy_votes`; the event is the
*sum's* noise, sigma, which the parties' shares add up to whenever at least `min_parties`
contribute), then the round goes to the parties, and only the aggregate comes back. SecAgg+ clips each
party's noisy vector to [-C, C] before masking; C is set so that clipping anywhere in
the run has probability at most `CLIP_DELTA_SHARE * delta`, which the run reserves out
of its delta (the accountant gets the rest). Bytes and seconds per round are kept for
the communication report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.stats import norm

from dpsynth.federated.flower_secagg import FlowerAggregator, VoteRound, quantization_range
from dpsynth.privacy.plans import ReleasePlan
from dpsynth.runs.config import FederatedConfig
from dpsynth.voting.spec import VoteSpec

CLIP_DELTA_SHARE = 1e-3


def clip_delta(config: FederatedConfig, delta: float) -> float:
    """Part of the run's delta reserved for SecAgg+ clipping a noisy vote (0 without SecAgg+)."""
    return delta * CLIP_DELTA_SHARE if config.aggregation == "secagg+" else 0.0


def clip_range(spec: VoteSpec, max_records: int, party_sigma: float, parties: int, length: int,
               failure_probability: float) -> float:
    """C such that P(any party's |vote + noise| > C in this round) <= failure_probability.

    A party's clean bin is at most max_records * (largest vote per record); each of the
    parties * length noise draws exceeds z * party_sigma in absolute value with
    probability 2 * Phi(-z) (union bound).
    """
    bound = max_records * spec.max_bin_vote()
    if party_sigma == 0.0:
        return bound + 1.0
    z = float(norm.isf(failure_probability / (2.0 * parties * length)))
    return bound + z * party_sigma


@dataclass
class FederatedVoting:
    aggregator: FlowerAggregator
    config: FederatedConfig
    plan: ReleasePlan
    sigma: float
    delta: float
    rounds: list[dict] = field(default_factory=list)

    @property
    def party_sigma(self) -> float:
        return self.plan.party_sigma(self.sigma)

    def noisy_sum(self, spec: VoteSpec, candidates: np.ndarray, labels: np.ndarray, release: str) -> np.ndarray:
        """One aggregation round; the caller has already charged `release` to the ledger."""
        n_out = spec.length(len(candidates))
        secure = self.config.aggregation == "secagg+"
        # Without SecAgg+ nothing is clipped, so no clipping range is needed.
        clip = (clip_range(spec, self.config.max_records_per_party, self.party_sigma, self.config.parties, n_out,
                           clip_delta(self.config, self.delta) / self.plan.noisy_releases) if secure else 0.0)
        result = self.aggregator.aggregate(VoteRound(release, spec, candidates, labels, self.party_sigma, clip))
        self.rounds.append({
            "release": release,
            "parties_contributing": result.contributors,
            "vector_length": n_out,
            "download_bytes_per_party": float(np.mean(list(result.bytes_down.values()))),
            "upload_bytes_per_party": float(np.mean(list(result.bytes_up.values()))),
            "seconds": result.seconds,
            "clipping_range": clip if secure else None,
            "quantization_step": 2 * clip / quantization_range(self.config.parties) if secure else None,
        })
        return result.total
