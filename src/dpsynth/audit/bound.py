"""One-run lower bound on epsilon from guesses about canaries (Steinke, Nasr and Jagielski, NeurIPS 2023).

Each of m canaries is included by an independent fair coin. The auditor guesses "in" for the r/2
highest-scoring canaries and "out" for the r/2 lowest, abstaining on the rest; v guesses are right.
For an (eps, delta)-DP run, P[v or more right] <= P[Binomial(r, e^eps / (1 + e^eps)) >= v] + 2 m delta
alpha, where alpha = max_i P[v > Binomial(r, q) >= v - i] / i (their Theorem 3 and its delta term):
so every eps whose p-value is below beta is refuted, with confidence 1 - beta. Several signals and
guess counts are tried, so beta is split among them (Bonferroni) and the largest refuted eps is the
audit's lower bound. The bound holds whatever the attack; a weak attack only makes it low.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats
from sklearn.metrics import roc_auc_score

GUESS_SHARES = (0.25, 0.5, 1.0)  # of the canaries guessed on; fixed in advance, so Bonferroni covers the choice


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Probability of v or more right guesses out of r when the run is (epsilon, delta)-DP."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, q))
    if v == 0 or delta == 0:
        return min(1.0, tail)
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))  # P[v > B >= v - i], i = 1..v
    alpha = float(np.max(below / np.arange(1, v + 1)))
    return min(1.0, tail + 2 * m * delta * alpha)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, beta: float) -> float:
    """The largest epsilon refuted at level beta (0 if none is), by bisection on the monotone p-value."""
    if p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(m, r, v, high, delta) < beta:
        low, high = high, 2 * high
        if high > 100:
            return low
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if p_value(m, r, v, mid, delta) < beta else (low, mid)
    return low


@dataclass(frozen=True)
class Guesses:
    signal: str
    guessed: int  # r
    right: int  # v
    epsilon_lower_bound: float


def audit_scores(scores: dict[str, np.ndarray], included: np.ndarray, *, delta: float, beta: float,
                 seed: int) -> dict:
    """Per signal: AUC and the bound at each guess share; overall: the largest bound (Bonferroni over all)."""
    included = np.asarray(included, dtype=bool)
    m = len(included)
    tests = len(scores) * len(GUESS_SHARES)
    tie_break = np.random.default_rng([seed, 0xB0D]).random(m)  # independent of inclusion
    per_signal, best = {}, None
    for name, values in scores.items():
        order = np.lexsort((tie_break, -np.asarray(values, dtype=float)))  # highest score first
        both = included.any() and (~included).any()
        rows = []
        for share in GUESS_SHARES:
            r = max(2, 2 * int(round(share * m / 2)))
            r = min(r, m - m % 2)
            k = r // 2
            right = int(included[order[:k]].sum() + (~included[order[m - k:]]).sum())
            found = Guesses(name, r, right, epsilon_lower_bound(m, r, right, delta, beta / tests))
            rows.append(asdict(found))
            if best is None or found.epsilon_lower_bound > best.epsilon_lower_bound:
                best = found
        per_signal[name] = {"auc": float(roc_auc_score(included, values)) if both else None, "guesses": rows}
    assert best is not None
    everything = m - m % 2
    return {"canaries": m, "included": int(included.sum()), "confidence": 1 - beta, "delta": delta,
            "epsilon_lower_bound": best.epsilon_lower_bound, "best": asdict(best), "signals": per_signal,
            # what perfect guesses on every canary would refute: the reach of this many canaries
            "largest_possible_bound": epsilon_lower_bound(m, everything, everything, delta, beta / tests)}
