"""Noise sources and the sparse vector: the randomness of every release (the data holder records the event
in the ledger before it calls them).

A `NoiseSource` in secure mode adds the noise of every additive release (`add`) with OpenDP's exact
samplers: the Gaussian and Laplace noise is drawn from their discrete counterparts on the finest 2^k
grid of a float64 (k = -1074) from OpenDP's cryptographic random source, and added with exact rounding.
A textbook floating-point sampler (numpy's `normal`, `laplace`) leaks through the low bits of its outputs:
not every float is a possible output, and which ones are depends on the clean value, so a saved noisy
release can betray it (Mironov, CCS 2012; Jin et al., S&P 2022). OpenDP's privacy map of the same
measurement is the continuous mechanism's (rho = Delta^2 / (2 sigma^2) for the Gaussian), so the ledger's
accounting stands unchanged (`tests/test_privacy_ledger.py` checks the map). Its other secret randomness
(Poisson subsampling masks, DP-SGD seeds) comes from numpy PCG64DXSM streams seeded with 256 bits of OS entropy
(`secrets`, through a 256-bit SeedSequence pool), whose seeds are never stored. PCG64DXSM is a statistical
generator, not a cryptographic one: an attacker who saw enough of a stream's raw output could in principle
recover its state, but what leaves the holder is noisy releases and models trained with the masks, never the raw
draws. The sparse vector's threshold and query noise uses the exact Laplace sampler too.

DP-SGD's noise is the one exception to the exact samplers: a LoRA adapter has 10^5-10^6 coordinates a step, and
OpenDP's exact Gaussian draws about 20,000 a second on one core (measured: 100,000 in 4.8 s), so a step's
noise would outlast its training. It is drawn in float64, each coordinate the sum of 4 standard normal draws
scaled by sigma / 2 (the same distribution; Holohan and Braghin 2021, sec. 5.1, Opacus's `secure_mode`), from a
PCG64DXSM stream (256-bit SeedSequence pool) under the training's 256-bit secret seed, added to the float64
clipped sum, and only then
rounded to the parameters' float32 (finetune/dp_adam.py). That raises the cost of a floating-point attack
without removing it; `DPSGD_NOISE` says so in every privacy report of a run that trains.

The seeded mode exists for tests and experiments: numpy streams named after each event, so a seeded run
that resumes draws exactly the noise the uninterrupted run would have; the privacy report marks it as not
for release.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np

DPSGD_NOISE = ("float64 Gaussian, each coordinate the sum of 4 draws (Holohan and Braghin 2021) from a stream under "
               "a 256-bit secret seed; a floating-point attack is made harder, not ruled out as with the exact "
               "samplers")


class NoiseSource:
    """Per-release random streams: secure (OS entropy) or seeded (reproducible, not for release)."""

    def __init__(self, seed: int | None = None) -> None:
        self.reproducible = seed is not None
        self._seed = seed

    @property
    def mode(self) -> str:
        return ("seeded (reproducible; NOT FOR RELEASE)" if self.reproducible
                else "secure (OpenDP exact samplers; OS entropy)")

    def add(self, name: str, kind: Literal["gaussian", "laplace"], clean: np.ndarray, scale: float) -> np.ndarray:
        """clean + Gaussian (scale = sigma) or Laplace (scale = b) noise per coordinate, for release `name`."""
        clean = np.asarray(clean, dtype=np.float64)
        if self._seed is not None:
            rng = self.stream(name)
            noise = rng.normal(0.0, scale, clean.shape) if kind == "gaussian" else rng.laplace(0.0, scale, clean.shape)
            return clean + noise
        return exact_noise(clean, kind, scale)

    def laplace_sampler(self, name: str) -> Callable[[float], float]:
        """Draws of Laplace noise of a given scale for release `name` (the sparse vector's threshold and
        queries): OpenDP's exact sampler in secure mode, the seeded stream otherwise."""
        if self._seed is not None:
            rng = self.stream(name)
            return lambda scale: float(rng.laplace(0.0, scale))
        return lambda scale: float(exact_noise(np.zeros(1), "laplace", scale)[0])

    def secret_seed(self, name: str) -> int:
        """A 256-bit seed for the randomness a release derives itself (DP-SGD's batches and noise): from OS entropy,
        or from the seeded stream; never stored."""
        if self._seed is None:
            return secrets.randbits(256)
        return int.from_bytes(self.stream(name).bytes(32), "big")

    def stream(self, name: str) -> np.random.Generator:
        if self._seed is None:  # pool_size 8: all 256 bits reach the state (numpy's default pool keeps 128)
            return np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(secrets.randbits(256), pool_size=8)))
        digest = hashlib.sha256(f"{self._seed}:{name}".encode()).digest()
        return np.random.Generator(np.random.PCG64DXSM(int.from_bytes(digest, "big")))


def exact_noise(clean: np.ndarray, kind: Literal["gaussian", "laplace"], scale: float) -> np.ndarray:
    """clean + noise from OpenDP's exact Gaussian / Laplace measurement (see the module docstring)."""
    flat = np.asarray(clean, dtype=np.float64).ravel()
    if flat.size == 0:
        return np.asarray(clean, dtype=np.float64).copy()
    if not np.all(np.isfinite(flat)):
        raise ValueError("a release's clean values must be finite")
    noisy = np.asarray(_measurement(kind, flat.size, float(scale))(flat.tolist()), dtype=np.float64)
    return noisy.reshape(np.shape(clean))


@functools.lru_cache(maxsize=32)
def _measurement(kind: str, size: int, scale: float):  # noqa: ANN202 - an OpenDP Measurement
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    if kind == "gaussian":
        return dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)
    return dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=scale)


def above_threshold(queries: Iterable[float], *, threshold: float, scale: float | None,
                    rng: np.random.Generator | Callable[[float], float]) -> int | None:
    """Sparse vector's AboveThreshold (Dwork & Roth, Alg. 1; papers/003 App. B.2): index of the first query
    whose noisy value reaches the noisy threshold, or None.

    Threshold noise Lap(b), query noise Lap(2b): (2 Delta / b)-DP for any number of queries of
    sensitivity Delta (b = 2 Delta / eps gives the textbook Lap(2 Delta/eps), Lap(4 Delta/eps)).
    scale=None: no noise (NOT DP). The caller records the event before calling. `rng`: a numpy generator, or
    a sampler of Laplace noise by scale (`NoiseSource.laplace_sampler`: OpenDP's exact one for releases).
    """
    laplace = (lambda b: float(rng.laplace(0.0, b))) if isinstance(rng, np.random.Generator) else rng
    noisy_threshold = threshold + (laplace(scale) if scale else 0.0)
    for i, value in enumerate(queries):
        noise = laplace(2 * scale) if scale else 0.0
        if value + noise >= noisy_threshold:
            return i
    return None
