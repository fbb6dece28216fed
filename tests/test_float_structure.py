"""The released noise carries no float structure that depends on the clean value (issue 34; Mironov, CCS 2012).

The grid check of the attack papers: a textbook sampler returns fl(c + fl(noise)), and with c = 1 every output
is a multiple of 2^-53 (the sum is rounded on 1's grid), while with c = 0 the outputs near 0 are finer floats.
Seeing an output off that grid then proves c = 0: an event of probability 0 under c = 1, which no epsilon allows.
An exact mechanism (the continuous noise added to c exactly, then rounded once, as OpenDP's samplers do) gives
each clean value the share of off-grid outputs that its own continuous distribution predicts, which differs
between neighbours only as the densities do. The test compares the observed share with that prediction, for
the secure `NoiseSource` (what the data holder releases with), and shows that the textbook sampler fails it.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpsynth.privacy.mechanisms import NoiseSource

DRAWS, SCALE = 20_000, 4.0


def off_grid_share(values: np.ndarray) -> float:
    """The share of outputs that are not multiples of 2^-53."""
    scaled = np.ldexp(values, 53)
    return float(np.mean(scaled != np.round(scaled)))


def predicted_off_grid_share(dist: stats.rv_continuous) -> float:
    """Exact-then-rounded outputs in the binade [2^e, 2^(e+1)) lie on a grid of 2^(e-52); for e <= -2 a share
    1 - 2^(e+1) of those floats is off the 2^-53 grid (outputs with |y| >= 0.5 are always on it)."""
    total = 0.0
    for e in range(-2, -80, -1):
        lo, hi = 2.0**e, 2.0 ** (e + 1)
        mass = (dist.cdf(hi) - dist.cdf(lo)) + (dist.cdf(-lo) - dist.cdf(-hi))
        total += mass * (1.0 - 2.0 ** (e + 1))
    return total


def _distribution(kind: str, clean: float) -> stats.rv_continuous:
    return stats.norm(clean, SCALE) if kind == "gaussian" else stats.laplace(clean, SCALE)


def _close_to_prediction(observed: float, predicted: float) -> bool:
    sd = np.sqrt(predicted * (1 - predicted) / DRAWS)
    return abs(observed - predicted) <= 5 * sd


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_secure_releases_have_the_exact_mechanisms_grid_structure_for_every_clean_value(kind: str) -> None:
    for clean in (0.0, 1.0):
        released = NoiseSource().add("release", kind, np.full(DRAWS, clean), SCALE)  # secure mode: OpenDP
        predicted = predicted_off_grid_share(_distribution(kind, clean))
        assert 0.03 < predicted < 0.15
        assert _close_to_prediction(off_grid_share(released), predicted), (kind, clean)


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_the_check_catches_a_textbook_floating_point_sampler(kind: str) -> None:
    rng = np.random.default_rng(0)
    noise = rng.normal(0.0, SCALE, DRAWS) if kind == "gaussian" else rng.laplace(0.0, SCALE, DRAWS)
    assert _close_to_prediction(off_grid_share(0.0 + noise), predicted_off_grid_share(_distribution(kind, 0.0)))
    # c = 1: not one output off the grid, where the exact mechanism puts about 6%: the clean value shows
    assert off_grid_share(1.0 + noise) == 0.0
    assert not _close_to_prediction(off_grid_share(1.0 + noise), predicted_off_grid_share(_distribution(kind, 1.0)))
