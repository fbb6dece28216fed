"""Find the noise for a target (epsilon, delta): calibrate, don't hand-pick.

`calibrate_noise` bisects on the ledger's own accountant, so whatever the
schedule (Gaussian, subsampled, Laplace, pure DP mixed), the answer is exactly
what the ledger will later charge. The bracket starts at a sensible guess and
expands geometrically; it never goes below `min_noise`, because a PLD at a
noise/sensitivity ratio near 0.006 needs tens of GB.

`gaussian_sigma_closed_form` is the analytic answer for Gaussian-only schedules
(Gaussian DP); tests require the two to agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from dpsynth.privacy.accountant import Adjacency, epsilon_tight, gdp_mu_for
from dpsynth.privacy.events import PrivacyEvent

MIN_NOISE = 0.05
MAX_NOISE = 1e6


class CalibrationError(ValueError):
    """The target cannot be met by any noise in the searched range."""


def calibrate_noise(
    make_events: Callable[[float], Sequence[PrivacyEvent]],
    target_epsilon: float,
    delta: float,
    *,
    adjacency: Adjacency = Adjacency.ADD_REMOVE,
    fixed_events: Sequence[PrivacyEvent] = (),
    guess: float = 1.0,
    rtol: float = 1e-4,
    min_noise: float = MIN_NOISE,
) -> float:
    """Smallest noise parameter x with epsilon(fixed_events + make_events(x)) <= target_epsilon.

    The returned value is always on the private side: its epsilon never exceeds
    the target (bisection keeps that end of the bracket).
    """
    if target_epsilon <= 0:
        raise CalibrationError(f"target epsilon must be > 0, got {target_epsilon}")

    def eps(x: float) -> float:
        return epsilon_tight([*fixed_events, *make_events(x)], delta, adjacency)

    if epsilon_tight(list(fixed_events), delta, adjacency) >= target_epsilon:
        raise CalibrationError(
            f"the fixed part of the schedule already spends epsilon >= {target_epsilon}; no noise can fit"
        )
    lo, hi = _bracket(eps, target_epsilon, max(guess, min_noise), min_noise)
    # Invariant: eps(lo) > target >= eps(hi).
    while lo < hi and (hi - lo) > rtol * hi:
        mid = math.sqrt(lo * hi) if hi / lo > 4 else (lo + hi) / 2
        if eps(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


def _bracket(eps: Callable[[float], float], target: float, guess: float, min_noise: float) -> tuple[float, float]:
    """(lo, hi) with eps(lo) > target >= eps(hi), grown geometrically from a tight window around `guess`.

    A good guess (the closed form) brackets the root within +-0.1%, so a
    calibration costs a handful of evaluations (PLD ones where the schedule is not Gaussian-only).
    """
    step = 1e-3
    if eps(guess) <= target:
        hi = guess
        while True:
            lo = max(guess * (1 - step), min_noise)
            if eps(lo) > target:
                return lo, hi
            if lo <= min_noise:
                return min_noise, min_noise
            hi, step = lo, min(step * 4, 0.5)
            guess = hi
    lo = guess
    while True:
        hi = guess * (1 + step)
        if hi > MAX_NOISE:
            raise CalibrationError(f"no noise up to {MAX_NOISE:g} reaches epsilon {target}")
        if eps(hi) <= target:
            return lo, hi
        lo, guess, step = hi, hi, step * 4


def gaussian_sigma_closed_form(
    target_epsilon: float, delta: float, sensitivities: Sequence[float]
) -> float:
    """sigma shared by releases with these L2 sensitivities so that they are exactly (eps, delta)-DP.

    Gaussian DP: the releases compose to mu = sqrt(sum Delta_i^2) / sigma.
    """
    mu = gdp_mu_for(target_epsilon, delta)
    return math.sqrt(sum(s * s for s in sensitivities)) / mu
