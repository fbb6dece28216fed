"""Parallel composition over disjoint scopes of records: checked against direct computations."""

from __future__ import annotations

import math

import pytest

from dpsynth.errors import DpsynthError
from dpsynth.privacy.accountant import epsilon_tight, epsilon_rdp, scope_groups
from dpsynth.privacy.events import GaussianEvent, SubsampledGaussianEvent
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.report import privacy_report
from dpsynth.privacy.schedule import Knob, Release, Schedule, gaussian_releases

DELTA = 1e-5


def _train(z: float, name: str = "train") -> SubsampledGaussianEvent:
    return SubsampledGaussianEvent(name=name, count=50, sampling_rate=0.2, noise_multiplier=z,
                                   scope="parties:strong")


def _votes(sigma: float, name: str = "votes") -> GaussianEvent:
    return GaussianEvent(name=name, sensitivity=math.sqrt(3), sigma=sigma, scope="parties:weak")


def _profile(sigma: float = 8.0) -> GaussianEvent:
    return GaussianEvent(name="profile", sensitivity=1.0, sigma=sigma)


def test_epsilon_is_the_largest_group_composition():
    events = [_profile(), _train(1.1), _votes(6.0)]
    strong = epsilon_tight([_profile(), _train(1.1)], DELTA)
    weak = epsilon_tight([_profile(), _votes(6.0)], DELTA)
    # the unscoped (sequential) composition of the same mechanisms: always larger
    sequential = epsilon_tight([e.model_copy(update={"scope": "all"}) for e in events], DELTA)
    assert epsilon_tight(events, DELTA) == pytest.approx(max(strong, weak))
    assert max(strong, weak) < sequential
    assert epsilon_rdp(events, DELTA) == pytest.approx(max(epsilon_rdp([_profile(), _train(1.1)], DELTA),
                                                           epsilon_rdp([_profile(), _votes(6.0)], DELTA)))


def test_groups_without_named_scopes_are_one():
    events = [_profile(), GaussianEvent(name="v", sensitivity=1.0, sigma=3.0)]
    assert list(scope_groups(events)) == ["all"]
    assert scope_groups(events)["all"] == events


def test_ledger_refuses_what_one_group_cannot_afford():
    ledger = PrivacyLedger(4.0, DELTA)
    ledger.record(_profile(20.0))
    ledger.record(_votes(2.5))  # the weak group spends ~2.9
    unscoped = [e.model_copy(update={"scope": "all"}) for e in (_profile(20.0), _votes(2.5), _train(2.0))]
    assert epsilon_tight(unscoped, DELTA) > 4.0  # composed sequentially there would be no room
    ledger.record(_train(2.0))  # the strong group composes separately (~3.5), so this fits
    with pytest.raises(DpsynthError, match="budget"):
        ledger.record(_votes(2.5, name="votes2"))
    report = privacy_report(ledger, noise_mode="secure")
    assert set(report["per_scope_epsilon"]) == {"parties:strong", "parties:weak"}
    assert report["epsilon"] == pytest.approx(max(report["per_scope_epsilon"].values()))


def test_each_scope_gets_its_own_free_knob_and_spends_exactly_epsilon():
    def train(name: str, z: float):
        return _train(z, name)

    def votes(name: str, sigma: float):
        return _votes(sigma, name)

    schedule = Schedule(
        gaussian_releases("profile", [None], "profile_sigma", 1.0)
        + (Release("train", None, "z", train, 1.0), Release("votes", None, "vote_sigma", votes, math.sqrt(3))),
        (Knob("profile_sigma", share=0.25), Knob("z", guess=1.0), Knob("vote_sigma", guess=5.0)))
    knobs = schedule.calibrate(4.0, DELTA)
    profile = GaussianEvent(name="profile", sensitivity=1.0, sigma=knobs["profile_sigma"])
    assert epsilon_tight([profile], DELTA) == pytest.approx(1.0, rel=1e-3)
    assert epsilon_tight([profile, _train(knobs["z"])], DELTA) == pytest.approx(4.0, rel=1e-3)
    assert epsilon_tight([profile, _votes(knobs["vote_sigma"])], DELTA) == pytest.approx(4.0, rel=1e-3)


def test_two_free_knobs_on_the_same_records_are_refused():
    with pytest.raises(DpsynthError, match="free knob"):
        Schedule(gaussian_releases("a", [None], "x", 1.0) + gaussian_releases("b", [None], "y", 1.0),
                 (Knob("x"), Knob("y")))
