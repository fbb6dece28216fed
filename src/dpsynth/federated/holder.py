"""The federated data holder: the same interface as the central one, answered by the parties.

Per release the holder charges the ledger first (the event is the *sum's* noise, sigma,
which the parties' shares add up to whenever at least `min_parties` contribute), then the
round goes to the parties, and only the aggregate comes back. The clipping range of each
round spends an equal part of the run's clipping reserve (`clipping.clip_delta`). Bytes and
seconds per round are kept for the communication report.
"""

from __future__ import annotations

import math

import numpy as np

from dpsynth.config import FederatedConfig
from dpsynth.errors import DpsynthError
from dpsynth.finetune.request import AdapterTraining
from dpsynth.federated.clipping import clip_range
from dpsynth.federated.flower_secagg import (
    FlowerAggregator,
    VoteRound,
    quantization_range,
)
from dpsynth.privacy.schedule import Release
from dpsynth.private.holder import ReleaseKey, ReleasingHolder
from dpsynth.voting.spec import VoteSpec


class FederatedHolder(ReleasingHolder):
    """Releases computed by L parties on their own records, summed by (secure) aggregation."""

    def __init__(self, config: FederatedConfig, clip_delta: float, **kw) -> None:
        super().__init__(**kw)
        self.config = config
        self.clip_delta = clip_delta
        self.aggregator: FlowerAggregator | None = None
        self.rounds: list[dict] = []

    def connect(self, aggregator: FlowerAggregator) -> None:
        """Attach the running federation (its server side exists only inside Flower's ServerApp)."""
        self.aggregator = aggregator

    @property
    def min_parties(self) -> int:
        # Without secure aggregation every party carries the full sigma, so any number of answers is safe.
        return self.config.threshold if self.config.aggregation == "secagg+" else 1

    def party_sigma(self, sigma: float) -> float:
        return sigma / math.sqrt(self.min_parties)

    def noisy_votes(self, spec: VoteSpec, candidates: np.ndarray, candidate_labels: np.ndarray, *,
                    release: ReleaseKey) -> np.ndarray:
        def draw(r: Release, sigma: float) -> np.ndarray:
            return self._round(r, sigma, spec, candidates, candidate_labels)

        return self._release(release, draw)

    def noisy_label_counts(self, labels: list[str], *, release: ReleaseKey) -> np.ndarray:
        raise DpsynthError("federated runs take public label proportions (uniform or {label: share})")

    def noisy_length_histogram(self, edges: list[int], *, release: ReleaseKey) -> np.ndarray:
        raise DpsynthError("length metadata has no federated form yet (the parties would need a histogram round)")

    def length_bound(self, which: str, cap: int, *, release: ReleaseKey) -> int:
        raise DpsynthError("sparse-vector length bounds have no federated form yet")

    def train_adapter(self, request: AdapterTraining, *, release: ReleaseKey, on_step=None) -> np.ndarray:
        raise DpsynthError("DP fine-tuning has no federated form yet (federated DP-FedAvg is the resource-adaptive "
                           "method's first stage)")

    def _round(self, release: Release, sigma: float, spec: VoteSpec, candidates: np.ndarray,
               labels: np.ndarray) -> np.ndarray:
        if self.aggregator is None:
            raise AssertionError("federated holder used outside a running federation")
        n_out = spec.length(len(candidates))
        secure = self.config.aggregation == "secagg+"
        party_sigma = self.party_sigma(sigma)
        rounds_in_run = len(self.schedule.releases)  # the run's clipping reserve, split over every release
        # Without SecAgg+ nothing is clipped, so no clipping range is needed.
        clip = (clip_range(spec, self.config.max_records_per_party, party_sigma, self.config.parties, n_out,
                           self.clip_delta / rounds_in_run) if secure else 0.0)
        result = self.aggregator.aggregate(VoteRound(release.name, spec, candidates, labels, party_sigma, clip))
        self.rounds.append({
            "release": release.name,
            "parties_contributing": result.contributors,
            "vector_length": n_out,
            "download_bytes_per_party": float(np.mean(list(result.bytes_down.values()))),
            "upload_bytes_per_party": float(np.mean(list(result.bytes_up.values()))),
            "seconds": result.seconds,
            "clipping_range": clip if secure else None,
            "quantization_step": 2 * clip / quantization_range(self.config.parties) if secure else None,
        })
        return result.total
