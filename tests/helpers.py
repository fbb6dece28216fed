"""Shared test helpers: privacy plans of a method built exactly as `dpsynth budget` and a run build them."""

from __future__ import annotations

import math

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
