"""Accounting against the test vectors of ../shared/PRIVACY.md (to 0.5%) and internal consistency."""

from __future__ import annotations

import math
import random

import pytest
from helpers import epsilon_at, plan, sensitivity, sigma_for, vote_events

from dpsynth.privacy.accountant import (
    account,
    epsilon_rdp,
    epsilon_tight,
    gdp_delta,
    gdp_epsilon,
    gdp_mu_for,
    primary_accountant,
)
from dpsynth.privacy.calibrate import calibrate_noise, gaussian_sigma_closed_form
from dpsynth.privacy.events import (
    GaussianEvent,
    LaplaceEvent,
    PureDpEvent,
    SubsampledGaussianEvent,
)
from dpsynth.privacy.sensitivity import wasp_topq_sensitivity

REL = 0.005


def close(actual: float, expected: float, rel: float = REL) -> bool:
    return abs(actual - expected) <= rel * abs(expected)


# target eps -> (paper sigma, actual eps of paper sigma, tight sigma), T-1 = 4, delta = 1e-5
WASP_TABLE = {
    1: (38.758, 0.283, 12.184),
    2: (19.379, 0.602, 6.512),
    4: (9.690, 1.287, 3.531),
    8: (4.845, 2.788, 1.960),
}


def test_wasp_sensitivity_values() -> None:
    assert close(sensitivity(plan("wasp", 5, 8)), 1.63298, 1e-5)
    assert close(sensitivity(plan("wasp", 5, 1)), 1.41421, 1e-5)
    assert close(sensitivity(plan("wasp", 5, 8, adjacency="replace")), 2.30938, 1e-5)
    # PRIVACY.md's user-level vector (m records moving together, a federated party's bound) is 8 x 1.63298; a
    # central person-level run clips each person's votes to one record's norm, so its plan charges 1.63298
    assert close(wasp_topq_sensitivity(8, max_records_per_user=8), 13.06, 1e-3)
    assert close(sensitivity(plan("wasp", 5, 8, max_records_per_user=8)), 1.63298, 1e-5)


@pytest.mark.parametrize("target", sorted(WASP_TABLE))
def test_wasp_table(target: int) -> None:
    paper_sigma, paper_eps, tight_sigma = WASP_TABLE[target]
    p = plan("wasp", 5, 8, epsilon=target)
    assert close(p.paper().value, paper_sigma)
    assert close(epsilon_at(p, paper_sigma), paper_eps)
    sigma = p.calibrate()["vote_sigma"]
    assert close(sigma, tight_sigma)
    # Private side: the calibrated sigma never spends more than the target.
    assert epsilon_at(p, sigma) <= target * (1 + 1e-9)
    assert close(gaussian_sigma_closed_form(target, 1e-5, [sensitivity(p)] * 4), sigma, 1e-3)


def test_wasp_rdp_is_looser_at_paper_sigma() -> None:
    events = vote_events(plan("wasp", 5, 8), 9.690)
    assert close(epsilon_rdp(events, 1e-5), 1.403)
    assert epsilon_rdp(events, 1e-5) > epsilon_tight(events, 1e-5)


def test_federated_without_secure_aggregation() -> None:
    paper_sigma = 9.690
    for parties, expected in ((5, 3.16), (10, 4.71)):
        p = plan("wasp", 5, 8, parties=parties)
        assert close(epsilon_at(p, p.party_sigma(paper_sigma)), expected, 0.01)


def test_party_share_sized_for_min_parties() -> None:
    p = plan("wasp", 5, 8, parties=10, min_parties=7)
    assert math.isclose(p.party_sigma(7.0), 7.0 / math.sqrt(7))
    # Any 7 survivors carry sigma^2 of noise in total.
    assert math.isclose(7 * p.party_sigma(7.0) ** 2, 49.0)


# eps -> (mu, sigma T=4, sigma T=10), delta = 1e-5
AUGPE_TABLE = {
    1: (0.2681, 7.461, 11.797),
    2: (0.5016, 3.988, 6.305),
    4: (0.9249, 2.162, 3.419),
    8: (1.6660, 1.200, 1.898),
}


@pytest.mark.parametrize("target", sorted(AUGPE_TABLE))
def test_augpe_gaussian_dp_table(target: int) -> None:
    mu, sigma4, sigma10 = AUGPE_TABLE[target]
    assert close(gdp_mu_for(target, 1e-5), mu)
    assert close(sigma_for("augpe", 5, target), sigma4)
    assert close(sigma_for("augpe", 11, target), sigma10)
    # a Gaussian-only schedule is accounted by the exact closed form; dp-accounting's PLD agrees with it
    events = vote_events(plan("augpe", 11), sigma10)
    assert epsilon_tight(events, 1e-5) == pytest.approx(gdp_epsilon(math.sqrt(10) / sigma10, 1e-5), rel=1e-12)
    assert abs(epsilon_tight(events, 1e-5) - _dp_accounting_pld(math.sqrt(10) / sigma10, 1e-5)) < 1e-6


def _dp_accounting_pld(mu: float, delta: float) -> float:
    """dp-accounting's own PLD epsilon of one Gaussian with sensitivity 1 and noise 1/mu (mu-GDP)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pld = pld_lib.from_gaussian_mechanism(standard_deviation=1 / mu, value_discretization_interval=1e-4)
    return float(pld.get_epsilon_for_delta(delta))


@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8, 1e-12])
def test_exact_gaussian_dp_epsilon_is_tight_and_agrees_with_dp_accounting(delta: float) -> None:
    """The closed form is the exact epsilon: delta(eps) is at most the target there and above it a hair below,
    and dp-accounting's PLD (an independent computation, pessimistic up to its discretisation) agrees."""
    for mu in (0.01, 0.05, 0.2681, 0.9249, 1.666, 3.0, 6.0):
        eps = gdp_epsilon(mu, delta)
        assert gdp_delta(mu, eps) <= delta * (1 + 1e-12)
        assert gdp_delta(mu, eps - 1e-6 * max(eps, 1)) > delta
        pld = _dp_accounting_pld(mu, delta)
        assert eps == pytest.approx(pld, rel=1e-5, abs=1e-6)
        assert eps <= pld * (1 + 1e-8) + 1e-9  # the PLD is pessimistic: the exact value is not above it


# (mu, delta) -> epsilon, solved with mpmath at 80 digits (bisection on the same delta(eps)), to 20 digits
GDP_REFERENCE = {
    (1e-6, 1e-12): 4.4248927590894820484e-6,  # a tiny mu: the two normal tails nearly cancel
    (1e-4, 1e-15): 0.00064222886744660913701,
    (0.9249, 1e-5): 3.9998461044926409107,
    (100.0, 1e-15): 5793.1722821645734217,  # e^eps far beyond a double
}


@pytest.mark.parametrize("mu,delta", sorted(GDP_REFERENCE))
def test_exact_gaussian_dp_epsilon_against_high_precision(mu: float, delta: float) -> None:
    """Never below the exact epsilon (the private side), and above it by rounding only."""
    exact = GDP_REFERENCE[(mu, delta)]
    assert exact <= gdp_epsilon(mu, delta) <= exact * (1 + 1e-7)


def test_exact_gaussian_dp_epsilon_at_the_extremes() -> None:
    """No overflow where e^eps is beyond a double (mu = 50: eps about 1,300), nothing spent for no noise budget
    used, and epsilon grows with mu."""
    big = gdp_epsilon(50.0, 1e-5)
    assert math.isfinite(big) and 1200 < big < 1500
    assert gdp_epsilon(0.0, 1e-5) == 0.0
    assert gdp_epsilon(math.inf, 1e-5) == math.inf
    values = [gdp_epsilon(mu, 1e-6) for mu in (1e-4, 1e-3, 0.1, 1.0, 10.0)]
    assert values == sorted(values) and values[0] > 0


def test_only_gaussian_schedules_skip_the_pld(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gaussian releases alone (in every group of records) need no PLD; any other kind of release does."""
    import dpsynth.privacy.accountant as accountant

    built: list[int] = []
    real = accountant._pld
    monkeypatch.setattr(accountant, "_pld", lambda events, adjacency: built.append(1) or real(events, adjacency))
    gaussian = [GaussianEvent(name="v", sensitivity=1.63, sigma=3.5, count=4),
                GaussianEvent(name="h", sensitivity=1.0, sigma=10.0)]
    mu = math.sqrt(4 * (1.63 / 3.5) ** 2 + (1.0 / 10.0) ** 2)
    assert epsilon_tight(gaussian, 1e-5) == pytest.approx(gdp_epsilon(mu, 1e-5), rel=1e-12)
    assert not built
    assert primary_accountant(gaussian).startswith("Gaussian DP")
    mixed = [*gaussian, LaplaceEvent(name="l", sensitivity=1, scale=5.0)]
    assert epsilon_tight(mixed, 1e-5) > epsilon_tight(gaussian, 1e-5)
    assert built
    assert primary_accountant(mixed).startswith("PLD")
    scoped = [GaussianEvent(name="v", sensitivity=1.0, sigma=3.0),  # every record
              GaussianEvent(name="w", sensitivity=1.0, sigma=3.0, scope="weak"),
              SubsampledGaussianEvent(name="s", sampling_rate=0.1, noise_multiplier=1.0, count=10, scope="strong")]
    assert "Gaussian DP" in primary_accountant(scoped) and primary_accountant(scoped).startswith("PLD")
    weak = [e for e in scoped if e.scope != "strong"]
    assert epsilon_tight(scoped, 1e-5) == max(epsilon_tight(weak, 1e-5), epsilon_tight(scoped[:1] + scoped[2:], 1e-5))
    assert primary_accountant([]).startswith("none")


def test_augpe_rdp_overstates() -> None:
    events = vote_events(plan("augpe", 11), 11.797)
    ratio = epsilon_rdp(events, 1e-5) / epsilon_tight(events, 1e-5)
    assert 1.05 < ratio < 1.12


def _dpga_fixed(eps: float) -> list:
    attr = [LaplaceEvent(name=f"dpga.hist.{h}", sensitivity=1, scale=3 / (0.25 * eps)) for h in ("label", "len", "kw")]
    svt = [PureDpEvent(name=f"dpga.svt.{i}", epsilon=0.125 * eps, mechanism="svt") for i in range(2)]
    return attr + svt


@pytest.mark.parametrize("eps,expected", [(1, 11.38), (2, 6.46), (4, 3.75)])
def test_dpga_composition(eps: float, expected: float) -> None:
    delta = 1 / (2000 * math.log(2000))
    assert close(delta, 6.578e-5, 1e-3)
    sigma = calibrate_noise(
        lambda z: [SubsampledGaussianEvent(name="dpga.votes", sampling_rate=0.8, noise_multiplier=z, count=10)],
        eps,
        delta,
        fixed_events=_dpga_fixed(eps),
        guess=5.0,
    )
    assert close(sigma, expected)


def test_dp_finetuning_with_histogram() -> None:
    histogram = GaussianEvent(name="yu.histogram", sensitivity=1, sigma=10)

    def sgd(z: float) -> list:
        return [SubsampledGaussianEvent(name="yu.dpadam", sampling_rate=4096 / 180000, noise_multiplier=z, count=440)]

    z = calibrate_noise(sgd, 6.0, 5e-7, fixed_events=[histogram], guess=0.8)
    assert close(z, 0.8054)
    # the histogram alone adds only about 0.02 to the total (PRIVACY.md)
    assert 0.01 < 6.0 - epsilon_tight(sgd(z), 5e-7) < 0.03
    # RDP would need more noise (0.8445) for the same target: at z it reports more than 6.
    assert epsilon_rdp([histogram, *sgd(z)], 5e-7) > 6.0
    assert epsilon_rdp([histogram, *sgd(0.8445)], 5e-7) == pytest.approx(6.0, rel=0.01)


def test_rdp_never_tighter_than_pld_on_random_schedules() -> None:
    rng = random.Random(7)
    for _ in range(6):
        events = []
        for i in range(rng.randint(1, 4)):
            kind = rng.choice(["g", "s", "l", "p"])
            if kind == "g":
                events.append(GaussianEvent(name=f"g{i}", sensitivity=rng.uniform(0.5, 2), sigma=rng.uniform(2, 20),
                                            count=rng.randint(1, 5)))
            elif kind == "s":
                events.append(SubsampledGaussianEvent(name=f"s{i}", sampling_rate=rng.uniform(0.01, 0.5),
                                                      noise_multiplier=rng.uniform(0.8, 3), count=rng.randint(1, 50)))
            elif kind == "l":
                events.append(LaplaceEvent(name=f"l{i}", sensitivity=1, scale=rng.uniform(2, 20)))
            else:
                events.append(PureDpEvent(name=f"p{i}", epsilon=rng.uniform(0.05, 0.5)))
        delta = 10 ** rng.uniform(-7, -4)
        report = account(events, delta)  # .check() raises if RDP < PLD
        assert report.epsilon_rdp >= report.epsilon * (1 - 1e-3)


def test_closed_form_agrees_with_bisection_for_mixed_sensitivities() -> None:
    sens = [1.0, 1.63, 0.5]
    sigma = gaussian_sigma_closed_form(2.0, 1e-6, sens)
    bisected = calibrate_noise(
        lambda s: [GaussianEvent(name=f"r{i}", sensitivity=d, sigma=s) for i, d in enumerate(sens)], 2.0, 1e-6,
        guess=1.0,
    )
    assert close(bisected, sigma, 1e-3)


def test_calibration_from_a_bad_guess_still_brackets() -> None:
    p = plan("wasp", 5, 8)

    def make(s: float) -> list:
        return vote_events(p, s)
    for guess in (1.0, 30.0):
        assert close(calibrate_noise(make, 4.0, 1e-5, guess=guess), 3.531)


def test_no_events_spend_nothing() -> None:
    assert epsilon_tight([], 1e-5) == 0.0
    assert epsilon_rdp([], 1e-5) == 0.0


def test_every_event_kind_follows_its_stated_sensitivity_convention() -> None:
    """privacy/events.py's convention, enforced over every kind of the PrivacyEvent union (issue 34): events that
    carry a sensitivity (Gaussian, Laplace) or an epsilon (pure DP) already include the adjacency, so the
    accountant gives them the same epsilon under both relations; a subsampled Gaussian carries the per-unit
    bound and the accountant applies the relation itself, so replacement costs more. A new kind must be added
    here with its convention, or this test fails."""
    import typing

    from dpsynth.privacy.accountant import Adjacency, epsilon_tight
    from dpsynth.privacy.events import (
        GaussianEvent,
        LaplaceEvent,
        PrivacyEvent,
        PureDpEvent,
        SubsampledGaussianEvent,
    )

    kinds = set(typing.get_args(typing.get_args(PrivacyEvent)[0]))
    carries_adjacency = {GaussianEvent(name="g", sensitivity=1.4, sigma=3.0),
                         LaplaceEvent(name="l", sensitivity=2.0, scale=4.0),
                         PureDpEvent(name="p", epsilon=0.5, mechanism="svt")}
    relation_applied = {SubsampledGaussianEvent(name="s", sampling_rate=0.05, noise_multiplier=1.1, count=20)}
    assert {type(e) for e in carries_adjacency | relation_applied} == kinds, "every event kind has a stated convention"
    for event in carries_adjacency:
        add_remove = epsilon_tight([event], 1e-5, Adjacency.ADD_REMOVE)
        assert epsilon_tight([event], 1e-5, Adjacency.REPLACE) == pytest.approx(add_remove, rel=1e-6), event.kind
    for event in relation_applied:
        assert epsilon_tight([event], 1e-5, Adjacency.REPLACE) > 1.2 * epsilon_tight([event], 1e-5, Adjacency.ADD_REMOVE)


def test_an_event_the_accountants_do_not_know_is_an_error_not_a_free_release() -> None:
    """A new kind of release added without teaching the accountants must fail loudly: counted as nothing (the
    PLD's old `continue`) or as pure DP (the RDP fallback), the report's epsilon would be too small."""
    from dpsynth.privacy.events import _Event

    class NewMechanism(_Event):
        pass

    events = [GaussianEvent(name="votes", sigma=5.0, sensitivity=1.0), NewMechanism(name="new")]
    with pytest.raises(TypeError, match="does not know NewMechanism"):
        epsilon_tight(events, 1e-5)
    with pytest.raises(TypeError, match="does not know NewMechanism"):
        epsilon_rdp(events, 1e-5)


def test_a_nan_budget_is_refused() -> None:
    from dpsynth.errors import DpsynthError
    from dpsynth.privacy.ledger import PrivacyLedger

    with pytest.raises(DpsynthError, match="epsilon must be > 0"):
        PrivacyLedger(float("nan"), 1e-5)


def test_the_membership_test_bound_is_gdps_tradeoff_and_the_privacy_profile_agrees() -> None:
    """The plain-words guarantee: at eps=4, delta=1e-5 (mu 0.925) a membership test with 5% false alarms catches at
    most 23.6% (Phi(Phi^-1(0.05) + mu)); the privacy-profile bound used for non-Gaussian runs gives the same on the
    same Gaussian (to the PLD's discretisation), and one (eps, delta) pair alone would allow e^4 x 5% > 100%."""
    from scipy.stats import norm

    from dpsynth.privacy.accountant import membership_test_power

    mu = gdp_mu_for(4.0, 1e-5)
    gaussian = [GaussianEvent(name="v", sensitivity=1.0, sigma=1 / mu)]
    exact = membership_test_power(gaussian, 0.05)
    assert exact == pytest.approx(norm.cdf(norm.ppf(0.05) + mu)) and exact == pytest.approx(0.2358, abs=1e-4)
    profile = membership_test_power([*gaussian, PureDpEvent(name="p", epsilon=1e-9)], 0.05)
    assert exact <= profile <= exact + 1e-3
    assert membership_test_power([], 0.05) == 0.05
    assert membership_test_power(gaussian, 0.01) < exact < membership_test_power(gaussian, 0.2)
    sgd = [SubsampledGaussianEvent(name="t", count=300, sampling_rate=0.05, noise_multiplier=1.0)]
    assert 0.05 < membership_test_power(sgd, 0.05) < 1.0


@pytest.mark.parametrize("method,iterations,q,epsilon,sensitivity", [("wasp", 5, 8, 4.0, wasp_topq_sensitivity(8)),
                                                                     ("augpe", 11, None, 1.0, 1.0)])
def test_calibration_agrees_with_dp_accountings_own_calibration(method: str, iterations: int, q: int | None,
                                                                epsilon: float, sensitivity: float) -> None:
    """dpsynth bisects on its ledger's own accountant (so the sigma is exactly what the ledger charges, across
    several knobs and scopes); on a plain schedule it must give what dp_accounting's calibrate_dp_mechanism gives
    with its PLD accountant (PRIVACY.md: WASP T=5, eps 4: 3.531)."""
    import dp_accounting
    from dp_accounting import mechanism_calibration
    from dp_accounting.pld import pld_privacy_accountant

    ours = plan(method, iterations, q, epsilon=epsilon).calibrate()["vote_sigma"]

    def event(noise_multiplier: float):
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), iterations - 1)

    theirs = sensitivity * mechanism_calibration.calibrate_dp_mechanism(
        pld_privacy_accountant.PLDAccountant, event, epsilon, 1e-5,
        bracket_interval=mechanism_calibration.ExplicitBracketInterval(0.5, 50.0), tol=1e-4)
    assert ours == pytest.approx(theirs, rel=2e-3)
