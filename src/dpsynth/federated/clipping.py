"""SecAgg+ clipping: the range C that makes clipping a noisy vote a delta-accounted rare event.

SecAgg+ clips each party's noisy vector to [-C, C] before masking. Clipping happens per
party before the sum, so it is not post-processing of the released sum: if clipping has
probability at most delta_clip on every input, the run is
(eps, delta_acc + (1 + e^eps) * delta_clip)-DP (the clipped mechanism is within total
variation delta_clip of the unclipped one on both neighbours). The run therefore reserves
`CLIP_DELTA_SHARE` of its delta for it: delta_clip = share * delta / (1 + e^eps), and the
accountant gets delta_acc = (1 - share) * delta, so the two add up to exactly delta.
"""

from __future__ import annotations

import math

from scipy.stats import norm

from dpsynth.config import FederatedConfig
from dpsynth.voting.spec import VoteSpec

CLIP_DELTA_SHARE = 1e-3
# A run with no delta to reserve (epsilon = inf) still adds fixed-sigma noise where a knob is fixed (e.g. the DP
# label histogram's): its clipping need only be rare, and its range finite (quantising to an infinite range
# turns every value into -inf).
UNRESERVED_CLIP_PROBABILITY = 1e-9


def clip_delta(config: FederatedConfig | None, delta: float, epsilon: float) -> float:
    """Probability budget for any clipping in the run (0 without SecAgg+ or at epsilon = inf)."""
    if config is None or config.aggregation != "secagg+" or math.isinf(epsilon):
        return 0.0
    return CLIP_DELTA_SHARE * delta / (1.0 + math.exp(epsilon))


def accounting_delta(config: FederatedConfig | None, delta: float) -> float:
    """The part of the run's delta the accountant may spend."""
    if config is None or config.aggregation != "secagg+":
        return delta
    return delta * (1.0 - CLIP_DELTA_SHARE)


def clip_range(spec: VoteSpec, max_records: int, party_sigma: float, parties: int, length: int,
               failure_probability: float) -> float:
    """C such that P(any party's |vote + noise| > C in this round) <= failure_probability.

    A party's clean bin is at most max_records * (largest vote per record); each of the
    parties * length noise draws exceeds z * party_sigma in absolute value with
    probability 2 * Phi(-z) (union bound). No reserve (failure_probability 0, an epsilon = inf run) takes
    UNRESERVED_CLIP_PROBABILITY.
    """
    bound = max_records * spec.max_bin_vote()
    if party_sigma == 0.0:
        return bound + 1.0
    probability = failure_probability if failure_probability > 0 else UNRESERVED_CLIP_PROBABILITY
    z = float(norm.isf(probability / (2.0 * parties * length)))
    return bound + z * party_sigma
