"""FuseGen's rules against hand-computed cases and brute force: the self-boosting update (CDI), the exact
influence of the logistic-regression STM, and the cross-model selection of in-context examples (CDG)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from dpsynth.evaluate.downstream import PROBE_C
from dpsynth.evaluate.influence import (
    ce_logit_gradients,
    hessian_vector_product,
    influence_on_validation,
    parameter_gradients,
    rce_logit_gradients,
)
from dpsynth.evaluate.self_boosting import boost, boosting_beta, self_boosting_weights
from dpsynth.evaluate.stm import Stm, fit_stm


def _data(classes: int, n: int = 60, d: int = 5, seed: int = 0, spread: float = 1.2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    centres = rng.normal(size=(classes, d))
    return centres[y] + rng.normal(scale=spread, size=(n, d)), y


def _tight_stm(x: np.ndarray, y: np.ndarray, classes: int, w: np.ndarray) -> Stm:
    model = LogisticRegression(C=PROBE_C, tol=1e-12, max_iter=20000).fit(x, y, sample_weight=w)
    return Stm(model, classes)


def _params(stm: Stm) -> np.ndarray:
    return np.hstack([stm.model.coef_, stm.model.intercept_[:, None]]).ravel()


# --- self-boosting weights (CDI) ---------------------------------------------------------------------------

def test_the_beta_of_the_authors_code() -> None:
    assert boosting_beta(1000, 30) == pytest.approx(1 + math.sqrt(2 * math.log(1000 / 30)))  # 3.648, as printed
    assert boosting_beta(20, 30) == 2.0  # the max(1, .) guard


def test_a_wrong_sample_decays_and_each_labels_total_is_kept() -> None:
    w = np.array([1.0, 1.0, 2.0, 1.0, 1.0])
    p_true = np.array([0.9, 0.2, 0.6, 0.4, 0.3])
    correct = np.array([True, False, True, False, False])
    labels = np.array([0, 0, 0, 1, 1])
    new = boost(w, p_true, correct, beta=3.0, labels=labels)
    # by hand: wrong ones times 3^-(1-p): 3^-0.8 = 0.41524, 3^-0.6 = 0.51728, 3^-0.7 = 0.46372; then label 0
    # back to its sum 4, label 1 to its sum 2
    raw0 = np.array([1.0, 3 ** -0.8, 2.0])
    raw1 = np.array([3 ** -0.6, 3 ** -0.7])
    assert new == pytest.approx(np.concatenate([raw0 * 4 / raw0.sum(), raw1 * 2 / raw1.sum()]))
    assert new[:3].sum() == pytest.approx(4.0) and new[3:].sum() == pytest.approx(2.0)
    assert new[0] / new[2] == pytest.approx(0.5), "right samples keep their ratio"


def test_a_label_the_stm_always_gets_wrong_keeps_its_share() -> None:
    """The authors' global restoration let a whole label fade out at small scale; per label it cannot."""
    x, y = _data(2, n=24, spread=3.0)
    out = self_boosting_weights(x, y, 2, iterations=30)
    for c in (0, 1):
        assert out.weights[y == c].sum() == pytest.approx((y == c).sum())


def test_self_boosting_fades_the_samples_the_stm_keeps_getting_wrong() -> None:
    x, y = _data(2, n=80, spread=0.4)
    y_noisy = y.copy()
    flipped = np.arange(0, 80, 10)
    y_noisy[flipped] = 1 - y_noisy[flipped]  # mislabelled (off-label) samples
    out = self_boosting_weights(x, y_noisy, 2, iterations=10)
    assert out.weights.mean() == pytest.approx(1.0)
    assert (out.weights[flipped] < 0.1).sum() >= 7 and np.median(np.delete(out.weights, flipped)) > 1.0
    # the final STM is the fit on the returned weights
    again = fit_stm(x, y_noisy, 2, out.weights)
    assert np.allclose(again.proba(x), out.stm.proba(x))


def test_one_iteration_is_the_unweighted_probe() -> None:
    x, y = _data(3)
    out = self_boosting_weights(x, y, 3, iterations=1)
    assert np.all(out.weights == 1.0)


# --- exact influence ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("classes", [2, 3])
def test_the_stm_objective_is_the_one_the_hessian_assumes(classes: int) -> None:
    """At sklearn's optimum the gradient of sum_i w_i CE_i + ||coef||^2 / (2C) vanishes."""
    x, y = _data(classes)
    w = np.linspace(0.5, 1.5, len(y))
    stm = _tight_stm(x, y, classes, w)
    grad = (w[:, None] * parameter_gradients(ce_logit_gradients(stm, x, y), x)).sum(0)
    theta = np.hstack([stm.model.coef_, np.zeros((stm.model.coef_.shape[0], 1))]).ravel()  # intercepts unpenalised
    assert np.abs(grad + theta / PROBE_C).max() < 1e-5


@pytest.mark.parametrize("classes", [2, 3])
def test_gradients_and_hessian_match_finite_differences(classes: int) -> None:
    x, y = _data(classes, n=20)
    w = np.linspace(0.5, 1.5, len(y))
    stm = _tight_stm(x, y, classes, w)
    base = _params(stm)
    rows = stm.model.coef_.shape[0]

    def at(theta: np.ndarray) -> Stm:
        model = LogisticRegression()
        model.classes_ = stm.model.classes_
        m = theta.reshape(rows, -1)
        model.coef_, model.intercept_ = m[:, :-1].copy(), m[:, -1].copy()
        return Stm(model, classes)

    def ce(theta: np.ndarray) -> float:
        p = at(theta).label_probability(x, y)
        return float((w * -np.log(p)).sum() + (theta.reshape(rows, -1)[:, :-1] ** 2).sum() / (2 * PROBE_C))

    def rce(theta: np.ndarray) -> float:  # a constant minus p(y|x), summed
        return float(-at(theta).label_probability(x[:3], y[:3]).sum())

    h = 1e-5
    eye = np.eye(len(base))
    numeric_rce = np.array([(rce(base + h * e) - rce(base - h * e)) / (2 * h) for e in eye])
    exact_rce = parameter_gradients(rce_logit_gradients(stm, x[:3], y[:3]), x[:3]).sum(0)
    assert np.allclose(numeric_rce, exact_rce, atol=1e-6)
    hvp = hessian_vector_product(stm, x, w)
    v = np.random.default_rng(1).normal(size=len(base))
    numeric_hv = (_grad_of(ce, base + h * v) - _grad_of(ce, base - h * v)) / (2 * h)
    from dpsynth.evaluate.influence import DAMPING
    assert np.allclose(hvp.matvec(v) - DAMPING * v, numeric_hv, rtol=1e-3, atol=1e-4)


def _grad_of(f, theta: np.ndarray, h: float = 1e-5) -> np.ndarray:
    return np.array([(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in np.eye(len(theta))])


@pytest.mark.parametrize("classes", [2, 3])
def test_influence_predicts_the_validation_loss_change_of_upweighting_a_sample(classes: int) -> None:
    """Brute force: refit with one sample's weight raised by eps; d(mean validation RCE)/d eps = I(z)."""
    x, y = _data(classes, n=40)
    xv, yv = _data(classes, n=12, seed=5)
    w = np.ones(len(y))
    stm = _tight_stm(x, y, classes, w)
    candidates = np.array([0, 7, 13, 22])
    scores = influence_on_validation(stm, x, w, x[candidates], y[candidates], xv, yv)
    eps = 1e-3
    for z, score in zip(candidates, scores):
        up, down = w.copy(), w.copy()
        up[z] += eps
        down[z] -= eps
        loss = [-_tight_stm(x, y, classes, ww).label_probability(xv, yv).mean() for ww in (up, down)]
        assert (loss[0] - loss[1]) / (2 * eps) == pytest.approx(score, rel=0.05, abs=1e-6)
