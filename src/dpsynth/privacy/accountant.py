"""Composition of privacy events into epsilon(delta).

Primary (`epsilon_tight`): for a group of records whose releases are all plain Gaussian ones, the
exact closed form of Gaussian DP; otherwise privacy loss distributions (dp-accounting's PLD),
which are tight up to a pessimistic discretisation. Cross-check: Renyi DP (dp-accounting's RDP),
a valid but looser upper bound; the ledger asserts RDP >= the primary on every report.

Scopes (parallel composition): an event's `scope` names the records it touches. "all" touches
every record; any other scope is a group of records disjoint from every other named group
(e.g. the strong and the weak parties of the resource-adaptive federated method). A record in
group s is touched only by the "all" events and the events of s, so the run's epsilon at delta
is the largest over groups of the composition of those events (the guarantee is per record,
and each record is in exactly one group). With only "all" events this is plain composition.

Why Gaussian events are merged first: k Gaussian releases with sensitivity
Delta_i and noise sigma_i compose *exactly* into one Gaussian with
mu = sqrt(sum (Delta_i/sigma_i)^2) (Gaussian DP, Dong, Roth & Su 2019), so the PLD of a
schedule is built with one Gaussian part, not convolved k times; and a schedule of Gaussian
releases only needs no PLD at all: mu-GDP is (epsilon, delta)-DP exactly where
delta = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2), solved for epsilon in
microseconds (it agrees with the PLD to within 1e-6), where a PLD took 0.1-1 s a call: about 2 s
of every WASP run, whose ledger asks before every release.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from dp_accounting import dp_event as dpe
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dpsynth.privacy.events import (
    GaussianEvent,
    LaplaceEvent,
    PrivacyEvent,
    PureDpEvent,
    SubsampledGaussianEvent,
)

PLD_DISCRETIZATION = 1e-4


class Adjacency(str, Enum):
    """Which pairs of datasets count as neighbours."""

    ADD_REMOVE = "add_remove"
    REPLACE = "replace"

    @property
    def dp_accounting_relation(self) -> NeighboringRelation:
        if self is Adjacency.ADD_REMOVE:
            return NeighboringRelation.ADD_OR_REMOVE_ONE
        return NeighboringRelation.REPLACE_ONE


def gaussian_mu(events: Sequence[PrivacyEvent]) -> float:
    """Gaussian-DP parameter of the Gaussian events in `events` (others ignored)."""
    return math.sqrt(
        sum(e.count * (e.sensitivity / e.sigma) ** 2 for e in events if isinstance(e, GaussianEvent))
    )


def _pld(events: Sequence[PrivacyEvent], adjacency: Adjacency) -> pld_lib.PrivacyLossDistribution | None:
    parts: list[pld_lib.PrivacyLossDistribution] = []
    mu = gaussian_mu(events)
    if mu > 0:
        # Sensitivities are already stated under `adjacency`; a Gaussian pair is
        # symmetric, so the add/remove construction with unit sensitivity is exact.
        parts.append(
            pld_lib.from_gaussian_mechanism(
                standard_deviation=1.0 / mu, value_discretization_interval=PLD_DISCRETIZATION
            )
        )
    # Identical events (same mechanism and parameters) are built once and self-composed, which is exact
    # and much faster than composing them one by one (a DPGA run has T identical vote releases).
    groups: dict[tuple, int] = {}
    for e in events:
        if isinstance(e, SubsampledGaussianEvent):
            key: tuple = ("subsampled", e.noise_multiplier, e.sampling_rate)
        elif isinstance(e, LaplaceEvent):
            key = ("laplace", e.scale / e.sensitivity)
        elif isinstance(e, PureDpEvent):
            key = ("pure", e.epsilon)
        elif isinstance(e, GaussianEvent):
            continue  # composed above, in closed form
        else:  # a new kind of event must be taught to the accountant, never counted as free
            raise TypeError(f"the PLD accountant does not know {type(e).__name__} ({e.name})")
        groups[key] = groups.get(key, 0) + e.count
    for key, count in groups.items():
        if key[0] == "subsampled":
            pld = pld_lib.from_gaussian_mechanism(
                standard_deviation=key[1], sampling_prob=key[2],
                neighboring_relation=adjacency.dp_accounting_relation,
                value_discretization_interval=PLD_DISCRETIZATION)
        elif key[0] == "laplace":
            pld = pld_lib.from_laplace_mechanism(parameter=key[1], value_discretization_interval=PLD_DISCRETIZATION)
        else:
            pld = pld_lib.from_privacy_parameters(
                pld_common.DifferentialPrivacyParameters(epsilon=key[1], delta=0.0),
                value_discretization_interval=PLD_DISCRETIZATION)
        parts.append(pld.self_compose(count) if count > 1 else pld)
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total.compose(p)
    return total


ALL_RECORDS = "all"


def scope_groups(events: Sequence[PrivacyEvent]) -> dict[str, list[PrivacyEvent]]:
    """The events each group of records sees: per named scope, the "all" events plus its own.

    With no named scope there is one group, "all", holding every event.
    """
    shared = [e for e in events if e.scope == ALL_RECORDS]
    named = sorted({e.scope for e in events} - {ALL_RECORDS})
    if not named:
        return {ALL_RECORDS: list(events)}
    return {s: [*shared, *(e for e in events if e.scope == s)] for s in named}


def epsilon_tight(events: Sequence[PrivacyEvent], delta: float, adjacency: Adjacency = Adjacency.ADD_REMOVE) -> float:
    """Tight epsilon at `delta` for the composition of `events` (0 for no events), the largest over
    disjoint scopes (see the module docstring)."""
    _check_delta(delta)
    return max(_epsilon_group(group, delta, adjacency) for group in scope_groups(events).values())


def _gaussian_only(events: Sequence[PrivacyEvent]) -> bool:
    return all(isinstance(e, GaussianEvent) for e in events)


def _epsilon_group(events: Sequence[PrivacyEvent], delta: float, adjacency: Adjacency) -> float:
    if _gaussian_only(events):  # their sensitivities are stated under the adjacency already
        return gdp_epsilon(gaussian_mu(events), delta)
    pld = _pld(events, adjacency)
    if pld is None:
        return 0.0
    return float(pld.get_epsilon_for_delta(delta))


def primary_accountant(events: Sequence[PrivacyEvent], *, short: bool = False) -> str:
    """How `epsilon_tight` composes these events: for the privacy report, or (`short`) a terminal line."""
    from importlib.metadata import version

    exact = "Gaussian DP, exact" if short else "Gaussian DP (Dong, Roth & Su 2019), exact closed form"
    pld = "PLD" if short else \
        f"PLD (dp-accounting {version('dp-accounting')}), pessimistic, discretisation {PLD_DISCRETIZATION:g}"
    if not events:
        return "none: no releases"
    kinds = {_gaussian_only(group) for group in scope_groups(events).values()}
    if kinds == {True}:
        return exact if short else f"{exact}: every release is Gaussian"
    if kinds == {False}:
        return pld
    return f"{pld} and {exact}" if short else f"{pld}; {exact} for the groups of records with only Gaussian releases"


def _rdp_event(e: PrivacyEvent) -> dpe.DpEvent:
    if isinstance(e, GaussianEvent):
        inner: dpe.DpEvent = dpe.GaussianDpEvent(e.noise_multiplier)
    elif isinstance(e, SubsampledGaussianEvent):
        inner = dpe.PoissonSampledDpEvent(e.sampling_rate, dpe.GaussianDpEvent(e.noise_multiplier))
    elif isinstance(e, LaplaceEvent):
        inner = dpe.LaplaceDpEvent(e.scale / e.sensitivity)
    elif isinstance(e, PureDpEvent):
        # eps-DP implies (eps^2/2)-zCDP (Bun & Steinke 2016): a valid, looser RDP curve.
        inner = dpe.ZCDpEvent(rho=e.epsilon**2 / 2)
    else:
        raise TypeError(f"the RDP accountant does not know {type(e).__name__} ({e.name})")
    return dpe.SelfComposedDpEvent(inner, e.count) if e.count > 1 else inner


def epsilon_rdp(
    events: Sequence[PrivacyEvent], delta: float, adjacency: Adjacency = Adjacency.ADD_REMOVE
) -> float | None:
    """RDP upper bound on epsilon at `delta`; None where RDP cannot express the schedule.

    Plain Gaussian/Laplace sensitivities already include the adjacency, so only
    subsampled events depend on the relation; dp-accounting's RDP supports
    Poisson subsampling under add/remove only.
    """
    _check_delta(delta)
    if not events:
        return 0.0
    if adjacency is Adjacency.REPLACE and any(isinstance(e, SubsampledGaussianEvent) for e in events):
        return None
    return max(_epsilon_rdp_group(group, delta) for group in scope_groups(events).values())


def _epsilon_rdp_group(events: Sequence[PrivacyEvent], delta: float) -> float:
    if not events:
        return 0.0
    # dp-accounting warns (per order, per call) when a low RDP order of a subsampled Gaussian does not converge
    # and drops that order: the bound stays valid, so the warning is noise on every budget and run.
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        accountant = rdp_lib.RdpAccountant(neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
        accountant.compose(dpe.ComposedDpEvent([_rdp_event(e) for e in events]))
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


def gdp_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of mu-GDP at delta (Dong, Roth & Su), by root finding on log delta(eps), which falls
    strictly as eps grows; the root is then moved up until delta(eps) <= delta holds even with the rounding
    error of its computation added, so that the answer is never on the loose side of the exact one."""
    from scipy import optimize

    _check_delta(delta)
    if mu <= 0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    target = math.log(delta)

    def excess(eps: float) -> float:  # log delta(eps) - log delta
        return _gdp_log_delta(mu, eps)[0] - target

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    eps = float(optimize.brentq(excess, 0.0, hi, xtol=1e-13, rtol=1e-14))
    step = max(eps * 1e-14, 1e-300)
    while True:
        value, error = _gdp_log_delta(mu, eps)
        if value + error <= target:
            return eps
        eps, step = eps + step, step * 2


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) for mu-GDP."""
    return math.exp(_gdp_log_delta(mu, epsilon)[0])


def _gdp_log_delta(mu: float, epsilon: float) -> tuple[float, float]:
    """log delta(eps) of mu-GDP and a bound on its rounding error, computed on logs of the normal tails so that
    neither a large epsilon (e^eps) nor a small delta (a difference of two tiny tails) loses it. The error: each
    log tail is good to a few units in the last place of its size, and the difference of the two is divided by
    1 - e^(second - first) on the way to the log, which is where a small mu cancels."""
    from scipy.special import log_ndtr

    first = float(log_ndtr(-epsilon / mu + mu / 2))
    second = epsilon + float(log_ndtr(-epsilon / mu - mu / 2))
    if second >= first:  # the two tails agree to rounding: delta is below what doubles can tell apart from 0
        return -math.inf, 0.0
    gap = -math.expm1(second - first)
    error = 8 * 2.0**-52 * (abs(first) + abs(second) + 1) / gap
    return first + math.log(gap), error


def membership_test_power(events: Sequence[PrivacyEvent], false_positive_rate: float,
                          adjacency: Adjacency = Adjacency.ADD_REMOVE) -> float:
    """The most a test of "was this record (person) in the private data?" can catch, for a given rate of false
    alarms, from everything the events released: the run's guarantee in plain words (the largest over groups of
    records). A group with only Gaussian releases is mu-GDP, whose trade-off is exact: Phi(Phi^-1(fpr) + mu). Other
    groups use their whole privacy profile: power <= min over epsilon of e^eps fpr + delta(eps) (each (eps, delta)
    pair bounds it; one pair alone is loose: at eps=4 it allows power 1 for any false-alarm rate above 2%)."""
    from scipy.stats import norm

    if not 0 < false_positive_rate < 1:
        raise ValueError(f"false_positive_rate must be in (0, 1), got {false_positive_rate}")
    powers = [false_positive_rate]
    for group in scope_groups(events).values():
        if _gaussian_only(group):
            powers.append(float(norm.cdf(norm.ppf(false_positive_rate) + gaussian_mu(group))))
            continue
        pld = _pld(group, adjacency)
        if pld is None:
            continue
        eps = [i * 0.05 for i in range(601)]  # epsilon 0..30, one vectorised call
        deltas = pld.get_delta_for_epsilon(eps)
        powers.append(min(math.exp(e) * false_positive_rate + float(d) for e, d in zip(eps, deltas)))
    return min(1.0, max(powers))


def gdp_mu_for(epsilon: float, delta: float) -> float:
    """The mu for which mu-GDP is exactly (epsilon, delta)-DP."""
    from scipy import optimize

    _check_delta(delta)
    hi = 1.0
    while gdp_delta(hi, epsilon) < delta:
        hi *= 2
    return float(optimize.brentq(lambda mu: gdp_delta(mu, epsilon) - delta, 1e-9, hi, xtol=1e-12))


@dataclass(frozen=True)
class EpsilonReport:
    """Both accountants' answers for one schedule."""

    epsilon: float
    epsilon_rdp: float | None
    delta: float

    def check(self) -> None:
        """RDP is an upper bound; if it came out tighter the primary computation is wrong."""
        if self.epsilon_rdp is not None and self.epsilon_rdp < self.epsilon * (1 - 1e-3):
            raise AssertionError(
                f"RDP cross-check ({self.epsilon_rdp:.4f}) is tighter than the primary accountant "
                f"({self.epsilon:.4f}): the accounting is inconsistent"
            )


def account(events: Sequence[PrivacyEvent], delta: float, adjacency: Adjacency = Adjacency.ADD_REMOVE) -> EpsilonReport:
    report = EpsilonReport(
        epsilon=epsilon_tight(events, delta, adjacency),
        epsilon_rdp=epsilon_rdp(events, delta, adjacency),
        delta=delta,
    )
    report.check()
    return report


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
