"""Data holders: charge the ledger, compute on private records, add noise, return only noisy results.

Every request names a release of the run's schedule (e.g. `("wasp.votes", 2)`); the holder
looks up its knob value, records the event on the ledger *before* computing anything
(an over-budget or repeated release is refused before private data is touched), computes,
adds noise and saves the noisy result (`ReleaseStore`) before returning it, as Opacus'
optimizer charges its accountant in a hook no caller can skip.

`CentralHolder` holds the private records in memory; `dpsynth.federated.holder` implements
the same interface by sending each request to the parties and receiving only the noisy sum.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import numpy as np

from dpsynth.data.records import LabelledTexts
from dpsynth.embed.sentence import Embedder
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.privacy.schedule import Release, Schedule
from dpsynth.private.releases import ReleaseStore
from dpsynth.voting.spec import VoteSpec, compute_votes

ReleaseKey = tuple[str, "int | None"]


class DataHolder(Protocol):
    """What a method may ask of the private data."""

    def noisy_votes(self, spec: VoteSpec, candidates: np.ndarray, candidate_labels: np.ndarray, *,
                    release: ReleaseKey) -> np.ndarray:
        """Votes of the private records on the candidates (`spec`), noised for `release`."""
        ...

    def noisy_label_counts(self, labels: list[str], *, release: ReleaseKey) -> np.ndarray:
        """Private record counts per label, noised for `release`."""
        ...


class ReleasingHolder:
    """The release path shared by every holder: schedule lookup, charge, compute+noise, save."""

    def __init__(self, ledger: PrivacyLedger, noise: NoiseSource, schedule: Schedule, knobs: dict[str, float],
                 store: ReleaseStore) -> None:
        self.ledger = ledger
        self.noise = noise
        self.schedule = schedule
        self.knobs = knobs
        self.store = store
        self.timings: dict[str, float] = {}

    def _release(self, key: ReleaseKey, noisy: Callable[[Release, float], np.ndarray]) -> np.ndarray:
        release = self.schedule.get(*key)
        saved = self.store.get(release.name)
        if saved is not None:  # drawn before a crash: reuse, never draw again
            return saved
        value = self.knobs[release.knob]
        event = release.event(value) if value > 0 else None
        if event is None:
            self.ledger.record_non_private(release.name)  # only an epsilon = inf ledger accepts this
        else:
            self.ledger.record(event)  # raises before anything is computed if over budget or repeated
        t0 = time.perf_counter()
        out = noisy(release, value)
        self.timings[release.kind] = self.timings.get(release.kind, 0.0) + time.perf_counter() - t0
        self.store.save(release.name, event, out)
        return out

    def _gaussian(self, release: Release, sigma: float, clean: np.ndarray) -> np.ndarray:
        clean = np.asarray(clean, dtype=np.float64)
        if sigma == 0.0:
            return clean
        return clean + self.noise.stream(release.name).normal(0.0, sigma, size=clean.shape)


class CentralHolder(ReleasingHolder):
    """One trusted data holder with every private record in memory (never written anywhere)."""

    def __init__(self, private: LabelledTexts, label_names: list[str], embedder: Embedder, **kw) -> None:
        super().__init__(**kw)
        self.__private = private
        self.__labels = private.label_ids(label_names)
        self.__embedder = embedder
        self.__embeddings: np.ndarray | None = None

    def _embeddings(self) -> np.ndarray:
        """Computed once per process, held in memory only (never cached: they are private)."""
        if self.__embeddings is None:
            self.__embeddings = self.__embedder.encode(self.__private.texts)
        return self.__embeddings

    def noisy_votes(self, spec: VoteSpec, candidates: np.ndarray, candidate_labels: np.ndarray, *,
                    release: ReleaseKey) -> np.ndarray:
        def draw(r: Release, sigma: float) -> np.ndarray:
            # the clean vector never leaves this function
            votes = compute_votes(spec, self._embeddings(), self.__labels, candidates, candidate_labels)
            return self._gaussian(r, sigma, votes)

        return self._release(release, draw)

    def noisy_label_counts(self, labels: list[str], *, release: ReleaseKey) -> np.ndarray:
        def draw(r: Release, sigma: float) -> np.ndarray:
            return self._gaussian(r, sigma, np.bincount(self.__labels, minlength=len(labels)))

        return self._release(release, draw)
