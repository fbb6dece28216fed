"""Noise sources and mechanisms that record in the ledger before they release.

A `NoiseSource` in secure mode seeds its generator from the operating system's
entropy (`secrets`), and never stores the seed: anyone holding the seed and a
noisy release could subtract the noise. The seeded mode exists for tests and
experiments; the privacy report marks it as not for release.

Noise for a release is drawn from a stream named after the event, so a seeded
run that resumes draws exactly the noise the uninterrupted run would have.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable

import numpy as np

from dpsynth.privacy.events import GaussianEvent, LaplaceEvent
from dpsynth.privacy.ledger import PrivacyLedger


class NoiseSource:
    """Per-release random streams: secure (OS entropy) or seeded (reproducible, not for release)."""

    def __init__(self, seed: int | None = None) -> None:
        self.reproducible = seed is not None
        self._seed = seed

    @property
    def mode(self) -> str:
        return "seeded (reproducible; NOT FOR RELEASE)" if self.reproducible else "secure (OS entropy)"

    def stream(self, name: str) -> np.random.Generator:
        if self._seed is None:
            return np.random.Generator(np.random.PCG64DXSM(secrets.randbits(256)))
        digest = hashlib.sha256(f"{self._seed}:{name}".encode()).digest()
        return np.random.Generator(np.random.PCG64DXSM(int.from_bytes(digest, "big")))


def gaussian_release(
    ledger: PrivacyLedger,
    noise: NoiseSource,
    values: np.ndarray,
    *,
    name: str,
    sensitivity: float,
    sigma: float,
) -> np.ndarray:
    """values + N(0, sigma^2 I), charged to the ledger first (raises before drawing if over budget)."""
    ledger.record(GaussianEvent(name=name, sensitivity=sensitivity, sigma=sigma))
    rng = noise.stream(name)
    return np.asarray(values, dtype=np.float64) + rng.normal(0.0, sigma, size=np.shape(values))


def laplace_release(
    ledger: PrivacyLedger,
    noise: NoiseSource,
    values: np.ndarray,
    *,
    name: str,
    sensitivity: float,
    scale: float,
) -> np.ndarray:
    """values + Laplace(0, scale) per coordinate, charged to the ledger first."""
    ledger.record(LaplaceEvent(name=name, sensitivity=sensitivity, scale=scale))
    rng = noise.stream(name)
    return np.asarray(values, dtype=np.float64) + rng.laplace(0.0, scale, size=np.shape(values))


def above_threshold(queries: Iterable[float], *, threshold: float, scale: float | None,
                    rng: np.random.Generator) -> int | None:
    """Sparse vector's AboveThreshold (Dwork & Roth, Alg. 1; papers/003 App. B.2): index of the first query
    whose noisy value reaches the noisy threshold, or None.

    Threshold noise Lap(b), query noise Lap(2b): (2 Delta / b)-DP for any number of queries of
    sensitivity Delta (b = 2 Delta / eps gives the textbook Lap(2 Delta/eps), Lap(4 Delta/eps)).
    scale=None: no noise (NOT DP). The caller records the event before calling.
    """
    noisy_threshold = threshold + (rng.laplace(0.0, scale) if scale else 0.0)
    for i, value in enumerate(queries):
        noise = rng.laplace(0.0, 2 * scale) if scale else 0.0
        if value + noise >= noisy_threshold:
            return i
    return None
