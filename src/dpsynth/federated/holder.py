"""The federated data holder: the same interface as the central one, answered by the parties.

Per release the holder charges the ledger first (the event is the *sum's* noise, sigma,
which the parties' shares add up to whenever at least `min_parties` contribute), then the
round goes to the parties, and only the aggregate comes back. The clipping range of each
round spends an equal part of the run's clipping reserve (`clipping.clip_delta`). Bytes and
seconds per round are kept for the communication report.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dpsynth.config import FederatedConfig, fewest_answering
from dpsynth.errors import DpsynthError
from dpsynth.federated.clipping import clip_range
from dpsynth.federated.flower_secagg import (
    FlowerAggregator,
    RoundResult,
    TrainRound,
    VoteRound,
    quantization_range,
)
from dpsynth.finetune.request import AdapterTraining
from dpsynth.fs import atomic_write_bytes, atomic_write_text, sync_directory
from dpsynth.privacy.schedule import Release
from dpsynth.private.holder import ReleaseKey, ReleasingHolder, asked_about, check_training_release
from dpsynth.voting.spec import VoteSpec


class FederatedHolder(ReleasingHolder):
    """Releases computed by L parties on their own records, summed by (secure) aggregation."""

    def __init__(self, config: FederatedConfig, clip_delta: float, groups: dict[str, tuple[int, ...]] | None = None,
                 **kw) -> None:
        super().__init__(**kw)
        self.config = config
        self.clip_delta = clip_delta
        self.groups = dict(groups or {})  # event scope -> the parties whose records it touches
        members = [p for g in self.groups.values() for p in g]
        if len(set(members)) != len(members) or any(not 0 <= p < config.parties for p in members):
            raise AssertionError(f"party groups must be disjoint party ids in 0..{config.parties - 1}: {self.groups}")
        self.aggregator: FlowerAggregator | None = None
        self.rounds: list[dict] = []

    def _parties(self, release: Release) -> tuple[int, ...] | None:
        """Who answers a release: the group its event is scoped to (its accounting assumes exactly them)."""
        scope = release.scope
        if scope == "all":
            return None
        if scope not in self.groups:
            raise AssertionError(f"release {release.name} is scoped to '{scope}', which names no party group")
        return self.groups[scope]

    def connect(self, aggregator: FlowerAggregator) -> None:
        """Attach the running federation (its server side exists only inside Flower's ServerApp)."""
        self.aggregator = aggregator

    def _fewest(self, parties: tuple[int, ...] | None) -> int:
        return fewest_answering(self.config, None if parties is None else len(parties))

    @property
    def min_parties(self) -> int:
        return fewest_answering(self.config)

    def party_sigma(self, sigma: float, parties: tuple[int, ...] | None = None) -> float:
        return sigma / math.sqrt(self._fewest(parties))

    def noisy_votes(self, spec: VoteSpec, candidates: np.ndarray, candidate_labels: np.ndarray, *,
                    release: ReleaseKey) -> np.ndarray:
        self._check_vote_charge(release, spec)

        def draw(r: Release, sigma: float) -> np.ndarray:
            return self._round(r, sigma, spec, candidates, candidate_labels)

        return self._release(release, draw, asked_about(spec, candidates, candidate_labels))

    def noisy_label_counts(self, labels: list[str], *, release: ReleaseKey) -> np.ndarray:
        """Every party's label counts plus its noise share, summed (papers/004's profile round)."""
        spec = VoteSpec(kind="label_counts")
        placeholders = np.zeros((len(labels), 1), dtype=np.float32)  # one "candidate" per label, no content
        self._check_vote_charge(release, spec)

        def draw(r: Release, sigma: float) -> np.ndarray:
            return self._round(r, sigma, spec, placeholders, np.arange(len(labels)))

        return self._release(release, draw)

    def noisy_length_histogram(self, edges: list[int], *, release: ReleaseKey) -> np.ndarray:
        raise DpsynthError("length metadata has no federated form yet (the parties would need a histogram round)")

    def length_bound(self, which: str, cap: int, *, release: ReleaseKey) -> int:
        raise DpsynthError("sparse-vector length bounds have no federated form yet")

    def train_adapter(self, request: AdapterTraining, *, release: ReleaseKey, on_step=None) -> np.ndarray:
        """FedAvg of local DP-SGD (papers/004, A.3): `request.rounds` rounds; in each, every training party
        takes `request.steps` DP-Adam steps from the current adapter and the server adds the mean update
        (times `request.server_learning_rate`). The whole training is one release charged before round 1;
        each round's adapter (DP: post-processing of DP updates) is saved, so a resume continues from it."""

        booked = self.schedule.get(*release)  # checked before the release is charged
        check_training_release(booked, self.knobs[booked.knob], request)
        parties = self._parties(booked)
        if parties is None or request.parties is None or set(parties) != set(request.parties):
            raise AssertionError(f"release {booked.name}: the training parties differ from its accounted group")

        def draw(r: Release, value: float) -> np.ndarray:
            report = None if on_step is None else self._step_report(r, value, on_step)
            return self._fedavg(r, value, request, report)

        adapter = self._release(release, draw)
        self.diagnostics.pop(self.schedule.get(*release).name, None)  # weights are not counts
        return adapter

    def _fedavg(self, r: Release, noise_multiplier: float, request: AdapterTraining, report) -> np.ndarray:
        from dpsynth.finetune.model import initial_adapter

        if self.aggregator is None:
            raise AssertionError("federated holder used outside a running federation")
        work = self.store.work_dir(r.name, noised=noise_multiplier > 0)  # un-noised rounds are never written
        saved = work / "adapter.npz" if work is not None else None
        settings = training_settings(request, noise_multiplier)
        if saved is not None and saved.exists():
            with np.load(saved) as z:
                done, adapter = int(z["round"]), z["adapter"].astype(np.float32)
                before = str(z["settings"]) if "settings" in z.files else None
            if before is not None and before != settings:
                raise DpsynthError(f"{r.name}: the saved rounds of federated training were taken with other "
                                   "training settings (rounds, local_steps, learning rates, parties, model, noise); "
                                   "resume with the settings the run started with")
        else:
            done = 0
            adapter = initial_adapter(Path(request.model), request.lora_r, request.lora_alpha, request.init_seed)
        payload = request.model_dump_json()
        for k in range(done, request.rounds):
            exposed = self._exposure_mark(r.name, f"round{k}", noise_multiplier)
            result = self.aggregator.train(TrainRound(r.name, k, adapter, payload, noise_multiplier,
                                                      tuple(request.parties or ())), on_exposed=exposed)
            adapter = (adapter + request.server_learning_rate * result.total).astype(np.float32)
            self._log_round(r.name, result, group=r.scope, length=adapter.size, round_index=k)
            if saved is not None:
                buffer = io.BytesIO()
                np.savez(buffer, round=k + 1, adapter=adapter, settings=np.array(settings))
                atomic_write_bytes(saved, buffer.getvalue())
                (saved.parent / f"exposed-round{k}").unlink(missing_ok=True)  # saved: a resume starts after it
            if report is not None:
                report((k + 1) * request.steps, float(np.linalg.norm(result.total)))
        return adapter.astype(np.float64)

    def _exposure_mark(self, release: str, what: str, noise: float) -> Callable[[], None] | None:
        """The callback the aggregator calls once the round's answers (or their sum) may reach the server: before
        a plain round is sent (answers arrive one by one), when SecAgg+ starts unmasking. It marks the round
        exposed, durably; the mark goes with the round's saved result. Why: the server may hold the answer before
        the run saves it; had the run stopped in between (a crash, a kill, Ctrl-C), a resume would ask again with
        fresh noise and show the server a second answer that the run's ledger counts once. Such a resume is
        refused here; a round stopped before its answers could reach the server is asked again. The mark is
        prepared before anything is sent, so a full disk stops the round before it is asked, and exposing it is
        one rename. Un-noised releases (epsilon = inf: no guarantee to keep) and those already saved carry none."""
        work = self.store.work_dir(release, noised=noise > 0)
        if work is None or noise <= 0 or release in self.store:
            return None
        marker, pending = work / f"exposed-{what}", work / f"pending-{what}"
        if marker.exists():
            raise DpsynthError(
                f"{release} ({what}): the parties' answers may have reached the server before the run stopped, and "
                "were not saved; asking again would show the server a second noisy answer that the run's ledger "
                "does not count (each party's own ledger counts both). Start a new run; or, if no answer can have "
                f"reached the server, delete {marker} and resume")
        atomic_write_text(pending, "asked; exposed once renamed\n")

        def expose() -> None:
            os.replace(pending, marker)
            sync_directory(work)

        return expose

    def _round(self, release: Release, sigma: float, spec: VoteSpec, candidates: np.ndarray,
               labels: np.ndarray) -> np.ndarray:
        if self.aggregator is None:
            raise AssertionError("federated holder used outside a running federation")
        n_out = spec.length(len(candidates), candidates.shape[1] if candidates.ndim == 2 else 1)
        secure = self.config.aggregation == "secagg+"
        parties = self._parties(release)
        party_sigma = self.party_sigma(sigma, parties)
        asked = self.config.parties if parties is None else len(parties)
        rounds_in_run = len(self.schedule.releases)  # the run's clipping reserve, split over every release
        # Without SecAgg+ nothing is clipped, so no clipping range is needed.
        clip = (clip_range(spec, self.config.max_records_per_party, party_sigma, asked, n_out,
                           self.clip_delta / rounds_in_run) if secure else 0.0)
        exposed = self._exposure_mark(release.name, "round", sigma)  # it goes with the saved release (ReleaseStore)
        result = self.aggregator.aggregate(VoteRound(release.name, spec, candidates, labels, party_sigma, clip,
                                                     parties=parties, min_parties=self._fewest(parties)),
                                           on_exposed=exposed)
        self._log_round(release.name, result, group=release.scope, length=n_out,
                        clipping_range=clip if secure else None,
                        quantization_step=2 * clip / quantization_range(self.config.parties) if secure else None)
        return result.total

    def _log_round(self, release: str, result: RoundResult, *, group: str, length: int, **extra) -> None:
        self.rounds.append({
            "release": release,
            "parties": group,
            "parties_contributing": result.contributors,
            "vector_length": length,
            "download_bytes_per_party": float(np.mean(list(result.bytes_down.values()))),
            "upload_bytes_per_party": float(np.mean(list(result.bytes_up.values()))),
            "seconds": result.seconds,
            **extra,
        })


def training_settings(request: AdapterTraining, noise_multiplier: float) -> str:
    """What a federated training's saved rounds belong to: a resume that changed rounds x local_steps (or the
    parties, the model, the rates or the noise) would continue a trajectory whose steps the ledger books under
    the new settings. Threads are left out (they change speed only), and the model by its file name (the cache
    folder it sits in may move between machines)."""
    payload = request.model_copy(update={"model": Path(request.model).name}).model_dump_json(exclude={"threads"})
    return hashlib.sha256(f"{payload}\0{noise_multiplier!r}".encode()).hexdigest()
