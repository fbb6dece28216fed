"""Shared test helpers: privacy plans of a method built exactly as `dpsynth budget` and a run build them, and
stand-alone releases on a ledger (what a data holder does, without a method around it)."""

from __future__ import annotations

import math

import numpy as np

from dpsynth.privacy.events import GaussianEvent, LaplaceEvent
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.runs.planning import PrivacyPlan, plan_for_method

VOTES = "vote_sigma"


def plan(method: str, iterations: int, q: int | None = None, *, epsilon: float = math.inf, delta: float = 1e-5,
         **kw) -> PrivacyPlan:
    options = {"iterations": iterations, **({"q": q} if q is not None else {})}
    return plan_for_method(method, epsilon=epsilon, delta=delta, options=options, **kw)


def sigma_for(method: str, iterations: int, epsilon: float, q: int | None = None, **kw) -> float:
    return plan(method, iterations, q, epsilon=epsilon, **kw).calibrate()[VOTES]


def epsilon_at(p: PrivacyPlan, sigma: float) -> float:
    return p.epsilon_of({VOTES: sigma})


def vote_events(p: PrivacyPlan, sigma: float) -> list:
    return p.schedule.events({VOTES: sigma})


def sensitivity(p: PrivacyPlan) -> float:
    return p.schedule.uses(VOTES)[0].sensitivity


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
    return noise.add(name, "gaussian", values, sigma)


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
    return noise.add(name, "laplace", values, scale)
