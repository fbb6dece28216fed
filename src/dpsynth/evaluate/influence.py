"""Influence of training samples on a validation loss, exact for the logistic-regression STM.

FuseGen ranks its in-context candidates by the influence function of Koh and Liang (2017),
I(z, v) = -grad L(z)^T H^-1 grad L_rce(v), averaged over a synthetic validation set, with H the
Hessian of the STM's training objective. Its code approximates H^-1 by LiSSA on a BERT; for a
logistic regression the gradients and the Hessian have closed forms, so dpsynth solves
H s = mean_v grad L_rce(v) once by conjugate gradients on exact Hessian-vector products.

Sign: I(z) > 0 means that up-weighting z raises the validation loss (Koh and Liang's I_up,loss).
`L_rce` is the reverse cross-entropy FuseGen uses for the validation set, CE(p_model, softmax(onehot)),
which is a constant minus p(y|x): its gradient in the logits is -p_y (e_y - p).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse.linalg import LinearOperator, cg

from dpsynth.evaluate.downstream import PROBE_C
from dpsynth.evaluate.stm import Stm

DAMPING = 1e-3  # added to the Hessian's diagonal (the unpenalised intercepts make it singular otherwise)


def _features(emb: np.ndarray) -> np.ndarray:
    return np.hstack([emb, np.ones((len(emb), 1))])  # the intercept is a weight on a constant feature


def _model_proba(stm: Stm, emb: np.ndarray) -> np.ndarray:
    """Probabilities over the classes the model knows (its own parameterisation)."""
    assert stm.model is not None
    return stm.model.predict_proba(emb)


def _onehot(stm: Stm, y: np.ndarray) -> np.ndarray:
    assert stm.model is not None
    return (y[:, None] == stm.model.classes_[None, :]).astype(np.float64)


def _to_logits(stm: Stm, grad: np.ndarray) -> np.ndarray:
    """A gradient in the class probabilities' softmax logits -> in the model's logits: a binary model
    has one logit (class 1 against class 0, whose logit is fixed at 0)."""
    return grad[:, 1:] if len(stm.model.classes_) == 2 else grad  # type: ignore[union-attr]


def ce_logit_gradients(stm: Stm, emb: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d CE / d logits, (n, L)."""
    return _to_logits(stm, _model_proba(stm, emb) - _onehot(stm, y))


def rce_logit_gradients(stm: Stm, emb: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d RCE / d logits = -p_y (e_y - p), (n, L)."""
    p, e = _model_proba(stm, emb), _onehot(stm, y)
    p_y = (p * e).sum(1, keepdims=True)
    return _to_logits(stm, -p_y * (e - p))


def parameter_gradients(logit_grads: np.ndarray, emb: np.ndarray) -> np.ndarray:
    """Per-sample gradients in the (logit, feature) parameters, flattened: (n, L * (d + 1))."""
    x = _features(emb)
    return (logit_grads[:, :, None] * x[:, None, :]).reshape(len(emb), -1)


def hessian_vector_product(stm: Stm, emb: np.ndarray, weights: np.ndarray) -> LinearOperator:
    """H v for sklearn's objective sum_i w_i CE_i + ||coef||^2 / (2C), plus DAMPING on every parameter."""
    x = _features(emb)
    p = _model_proba(stm, emb)
    binary = p.shape[1] == 2
    logits = 1 if binary else p.shape[1]
    d1 = x.shape[1]
    penalised = np.ones((logits, d1))
    penalised[:, -1] = 0.0  # the intercepts carry no L2 penalty

    def matvec(v: np.ndarray) -> np.ndarray:
        vm = v.reshape(logits, d1)
        u = x @ vm.T  # (n, L): each sample's logit change
        if binary:
            au = (p[:, 1] * p[:, 0])[:, None] * u
        else:  # (diag p - p p^T) u
            au = p * u - p * (p * u).sum(1, keepdims=True)
        out = (weights[:, None] * au).T @ x + penalised * vm / PROBE_C + DAMPING * vm
        return out.ravel()

    size = logits * d1
    return LinearOperator((size, size), matvec=matvec, dtype=np.float64)


def influence_on_validation(stm: Stm, train_emb: np.ndarray, train_weights: np.ndarray,
                            candidates_emb: np.ndarray, candidates_y: np.ndarray,
                            validation_emb: np.ndarray, validation_y: np.ndarray) -> np.ndarray:
    """Mean over the validation set of I(z, v) for each candidate z (0 for an STM that saw one class only:
    it has no parameters to move)."""
    if stm.model is None or len(validation_y) == 0:
        return np.zeros(len(candidates_y))
    g_val = parameter_gradients(rce_logit_gradients(stm, validation_emb, validation_y), validation_emb).mean(0)
    s_test, info = cg(hessian_vector_product(stm, train_emb, train_weights), g_val, rtol=1e-10, maxiter=2000)
    if info < 0:
        raise ValueError("conjugate gradients broke down on the STM's Hessian")
    g_cand = parameter_gradients(ce_logit_gradients(stm, candidates_emb, candidates_y), candidates_emb)
    return -(g_cand @ s_test)
