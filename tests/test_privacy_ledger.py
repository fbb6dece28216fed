"""Ledger: record before release, budget guard, persistence and resume, noise modes, report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import plan as make_plan
from helpers import sensitivity

from dpsynth.errors import DpsynthError
from dpsynth.privacy.events import GaussianEvent, PureDpEvent
from dpsynth.privacy.ledger import BudgetExceededError, DoubleSpendError, PrivacyLedger
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.privacy.report import privacy_report, summary_lines
from tests.helpers import gaussian_release, laplace_release


def _planned_ledger() -> tuple[PrivacyLedger, float]:
    sigma = make_plan("wasp", 5, 8, epsilon=4.0).calibrate()["vote_sigma"]
    return PrivacyLedger(4.0, 1e-5), sigma


class _Plan:
    """Names and sensitivity of WASP's planned vote releases (T=5, Q=8)."""

    def __init__(self) -> None:
        self.schedule = make_plan("wasp", 5, 8).schedule
        self.sensitivity = sensitivity(make_plan("wasp", 5, 8))

    def release_name(self, t: int) -> str:
        return f"wasp.votes[iteration={t}]"


def test_planned_schedule_fits_and_one_more_release_is_refused_before_noise() -> None:
    ledger, sigma = _planned_ledger()
    plan = _Plan()

    class CountingNoise(NoiseSource):
        draws = 0

        def stream(self, name: str) -> np.random.Generator:
            CountingNoise.draws += 1
            return super().stream(name)

    noise = CountingNoise(seed=1)
    for t in range(1, 5):
        gaussian_release(ledger, noise, np.zeros(3), name=plan.release_name(t), sensitivity=plan.sensitivity,
                         sigma=sigma)
    assert ledger.spent().epsilon == pytest.approx(4.0, rel=1e-3)
    assert CountingNoise.draws == 4
    with pytest.raises(BudgetExceededError, match="nothing was released"):
        gaussian_release(ledger, noise, np.zeros(3), name=plan.release_name(5), sensitivity=plan.sensitivity,
                         sigma=sigma)
    assert CountingNoise.draws == 4, "no noise may be drawn for a refused release"
    assert len(ledger.events) == 4


def test_double_spend_refused() -> None:
    ledger = PrivacyLedger(10.0, 1e-5)
    ledger.record(GaussianEvent(name="votes[1]", sensitivity=1, sigma=5))
    with pytest.raises(DoubleSpendError):
        ledger.record(GaussianEvent(name="votes[1]", sensitivity=1, sigma=5))


def test_save_load_resume_does_not_double_count(tmp_path) -> None:
    ledger, sigma = _planned_ledger()
    plan = _Plan()
    for t in (1, 2):
        ledger.record(GaussianEvent(name=plan.release_name(t), sensitivity=plan.sensitivity, sigma=sigma))
    path = tmp_path / "ledger.json"
    ledger.save(path)
    resumed = PrivacyLedger.load(path)
    assert resumed.spent().epsilon == pytest.approx(ledger.spent().epsilon)
    with pytest.raises(DoubleSpendError):
        resumed.record(GaussianEvent(name=plan.release_name(2), sensitivity=plan.sensitivity, sigma=sigma))
    for t in (3, 4):
        resumed.record(GaussianEvent(name=plan.release_name(t), sensitivity=plan.sensitivity, sigma=sigma))
    assert resumed.spent().epsilon == pytest.approx(4.0, rel=1e-3)
    assert not list(tmp_path.glob(".*.tmp")), "atomic write leaves no temporary file"


def test_bad_budget_is_a_user_error() -> None:
    with pytest.raises(DpsynthError, match="epsilon must be > 0"):
        PrivacyLedger(0.0, 1e-5)
    with pytest.raises(DpsynthError, match="delta"):
        PrivacyLedger(1.0, 0.0)


def test_seeded_noise_is_reproducible_per_stream_and_secure_is_not() -> None:
    a, b = NoiseSource(seed=3), NoiseSource(seed=3)
    assert np.array_equal(a.stream("x").normal(size=4), b.stream("x").normal(size=4))
    assert not np.array_equal(a.stream("x").normal(size=4), a.stream("y").normal(size=4))
    s = NoiseSource()
    assert not np.array_equal(s.stream("x").normal(size=4), s.stream("x").normal(size=4))
    assert "NOT FOR RELEASE" in a.mode and "secure" in s.mode


def test_noise_has_the_calibrated_scale() -> None:
    ledger = PrivacyLedger(1e6, 1e-5)
    out = gaussian_release(ledger, NoiseSource(seed=0), np.zeros(200_000), name="g", sensitivity=1.0, sigma=3.0)
    assert np.std(out) == pytest.approx(3.0, rel=0.01)
    out = laplace_release(ledger, NoiseSource(seed=0), np.zeros(200_000), name="l", sensitivity=1.0, scale=2.0)
    assert np.mean(np.abs(out)) == pytest.approx(2.0, rel=0.01)


def test_secure_noise_is_opendps_exact_sampler_with_the_accounted_map() -> None:
    """Issue 34: in secure mode every additive release is noised by OpenDP's exact samplers (floating-point
    safe), with the calibrated scale; OpenDP's own privacy map of that measurement is the continuous
    Gaussian's zCDP rho = Delta^2 / (2 sigma^2) that the PLD ledger assumes, so the accounting is unchanged."""
    from dpsynth.privacy.mechanisms import _measurement, exact_noise

    secure = NoiseSource()
    clean = np.linspace(-5.0, 5.0, 20_000)
    g = secure.add("g", "gaussian", clean, 3.0) - clean
    assert np.std(g) == pytest.approx(3.0, rel=0.03) and abs(np.mean(g)) < 0.1
    lap = secure.add("l", "laplace", clean, 2.0) - clean
    assert np.mean(np.abs(lap)) == pytest.approx(2.0, rel=0.04)
    assert _measurement("gaussian", 4, 3.0).map(1.0) == pytest.approx(1 / 18)  # rho at Delta=1, sigma=3
    assert _measurement("laplace", 4, 2.0).map(1.0) == pytest.approx(0.5)  # epsilon at Delta=1, b=2
    assert exact_noise(np.zeros((2, 3)), "gaussian", 1.0).shape == (2, 3)
    with pytest.raises(ValueError, match="finite"):
        exact_noise(np.array([np.nan]), "gaussian", 1.0)
    # seeded mode (experiments, NOT FOR RELEASE) stays reproducible
    assert np.array_equal(NoiseSource(7).add("x", "gaussian", clean, 1.0), NoiseSource(7).add("x", "gaussian",
                                                                                                clean, 1.0))
    assert "OpenDP" in secure.mode


def test_report_lists_everything_and_compares_with_paper() -> None:
    plan = make_plan("wasp", 5, 8, epsilon=4.0)
    knobs = plan.calibrate()
    # the votes spend the 4.0 they were calibrated for (exactly, up to the bisection's tolerance); the tiny
    # pure-DP release outside that schedule needs room of its own, more than its epsilon because the PLD that
    # composes it with them is pessimistic by up to a grid step (1e-4)
    ledger = PrivacyLedger(4.0 + 1e-3, 1e-5)
    for event in plan.schedule.events(knobs):
        ledger.record(event)
    ledger.record(PureDpEvent(name="tiny", epsilon=1e-9))
    report = privacy_report(ledger, noise_mode=NoiseSource(seed=1).mode, plan=plan.describe(knobs))
    json.dumps(report)
    assert report["within_budget"]
    assert report["noise"]["for_release"] is False
    assert "dp_sgd" not in report["noise"]  # no DP-SGD release: the exact samplers made every noise
    assert len(report["events"]) == 5
    assert report["paper_formula"]["value"] == pytest.approx(9.690, rel=1e-3)
    assert report["paper_formula"]["epsilon_of_paper_value"] == pytest.approx(1.287, rel=5e-3)
    assert report["accountant"]["epsilon_rdp"] > report["epsilon"]
    assert report["accountant"]["primary"].startswith("PLD")  # not every release is Gaussian
    text = "\n".join(summary_lines(report))
    assert "9.6896" in text and "NOT FOR RELEASE" in text


def test_non_private_release_only_in_an_infinite_budget_run_and_reported_as_not_dp() -> None:
    import math

    from dpsynth.privacy.ledger import BudgetExceededError
    from dpsynth.privacy.report import privacy_report, summary_lines

    finite = PrivacyLedger(4.0, 1e-5)
    with pytest.raises(BudgetExceededError, match="epsilon = inf"):
        finite.record_non_private("wasp.votes.1")
    ledger = PrivacyLedger(math.inf, 1e-5)
    assert ledger.is_private
    ledger.record_non_private("wasp.votes.1")
    with pytest.raises(DoubleSpendError):
        ledger.record_non_private("wasp.votes.1")
    assert ledger.spent().epsilon == math.inf
    restored = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert not restored.is_private and restored.non_private_releases == ("wasp.votes.1",)
    report = privacy_report(restored, noise_mode="secure")
    text = json.dumps(report, allow_nan=False)  # strict JSON: no Infinity
    assert '"differentially_private": false' in text and report["epsilon"] is None
    assert "NOT DP" in summary_lines(report)[0]


def test_the_report_states_what_was_checked_on_the_private_data_without_noise() -> None:
    """A run refuses private data with an empty label, too few records or delta >= 1/M, unnoised: a finished run
    discloses that they hold, so the report says so (and that a simulation's split is not a fixed partition)."""
    from dpsynth.runs.planning import plan_for_method

    central = plan_for_method("wasp", epsilon=4, options={"q": 8}).assumptions().checked_on_private_data
    assert "every task label has a private record" in central and "at least 8 private records" in central
    assert "M < 100000" in central and "both pass them" in central and "simulation" not in central
    assert plan_for_method("zero-shot", epsilon=4).assumptions().checked_on_private_data == "none"
    assert "every private label is one of task.labels" in central
    simulated = plan_for_method("wasp", epsilon=4, parties=3).assumptions().checked_on_private_data
    assert "no party holds more than" in simulated and "move others between parties" in simulated
