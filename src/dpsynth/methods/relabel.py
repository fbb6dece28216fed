"""DP label correction (`relabel:`): a final stage any method can end with, that spends the private signal
without discarding a single generator call.

Why: the small PLMs write a third or more of their samples off-label (docs/results.md: on-label rate 0.58-0.75
for zero-shot), and every selection method so far kept a third of what it paid for. This stage keeps every
sample and fixes its label instead. The data holder releases once, with Gaussian noise, the per-label sums of
the private records' unit embeddings (`VoteSpec(kind="embedding_sums")`: L2 sensitivity 1 per record under
add/remove, 2 under replacement, brute-force tested; with a person unit each person's sum is clipped to norm 1, so
1 per person, not k); everything after that release is post-processing:

1. The noisy sums are denoised by projecting them onto the span of the synthetic set's mean and its top
   `subspace` principal directions (public: synthetic text only). Noise spreads over all 384 dimensions, the
   class directions the samples can show live in few of them, so the projection keeps the signal and drops
   most of the noise (`subspace: 0` keeps all dimensions).
2. Every sample's cosine to each label's denoised centroid is computed; a sample moves to another label when
   that label's centroid is nearer than its own by more than `margin` (a sample the centroids cannot tell
   apart keeps the label its generator was asked for).
3. Do no harm where the noise wins: a sample moves only when its gap also exceeds `min_z` times the gap's
   noise std (`gap_noise`, from the noisy sums and the public sigma only: noise of std sigma per dimension
   turns a centroid of norm |c| so that a sample's cosine to it moves by about sigma |P x| / |c|). With few
   records per label the centroids are mostly noise and moving samples by them costs more than it gains
   (TREC at M=100 lost 16 points of macro-F1 without this test: docs/results.md); the test then leaves the
   labels alone, while a label with many records still corrects its clear cases.

`scoring: public` runs the same rule against the embeddings of the public label descriptions: a control with
no private data (epsilon 0), so that a gain cannot come from the rule alone. `scoring: blend` uses the same one
release and mixes, per label, the private cosine with the public description's by how much of the noisy
centroid is signal (`private_reliability`, from noisy values): few records per label lean on the public prior,
many on the private data; the noise test scales with the private share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from dpsynth.config import RelabelConfig, RunConfig, records_per_unit
from dpsynth.errors import DpsynthError
from dpsynth.methods.generation import SyntheticSample
from dpsynth.privacy.schedule import Schedule, final_stage_knob, gaussian_releases
from dpsynth.privacy.sensitivity import vote_sensitivity
from dpsynth.voting.scores import unit_rows
from dpsynth.voting.spec import EMBEDDING_SUMS

RELABEL = "relabel.centroids"
RELABEL_SIGMA = "relabel_sigma"


def relabel_schedule(config: RunConfig, before: Schedule) -> Schedule:
    """The stage's one release: fixed sigma, a share of epsilon, or (when nothing else has a free knob) the
    whole budget. `before`: the rest of the run's schedule. The public control releases nothing."""
    r = config.relabel
    if r is None or not r.reads_private_records:
        return Schedule((), ())
    sens = vote_sensitivity(EMBEDDING_SUMS, config.privacy.adjacency, max_records_per_user=records_per_unit(config))
    knob = final_stage_knob(RELABEL_SIGMA, r, before, "relabel",
                            "Gaussian noise on the per-label sums of the private records' unit embeddings")
    return Schedule(gaussian_releases(RELABEL, [None], RELABEL_SIGMA, sens), (knob,),
                    ("DP label correction: one release of per-label embedding sums; a sample moves to a label whose "
                     "denoised centroid is nearer than its own by more than the margin and min_z noise std",))


def synthetic_basis(synthetic: np.ndarray, subspace: int) -> np.ndarray | None:
    """Orthonormal columns spanning {synthetic mean, top-`subspace` principal directions of the synthetic
    embeddings}; None for `subspace` 0 (no projection). Synthetic text only: post-processing."""
    if subspace <= 0:
        return None
    x = unit_rows(synthetic)
    mean = x.mean(axis=0)
    _, _, vt = np.linalg.svd(x - mean, full_matrices=False)
    basis, _ = np.linalg.qr(np.vstack([mean, vt[:subspace]]).T)  # (dim, subspace + 1)
    return basis


def denoise_in_synthetic_span(centroids: np.ndarray, basis: np.ndarray | None) -> np.ndarray:
    """Project the (noisy) centroid rows onto the span of `basis` (unchanged for None)."""
    c = np.asarray(centroids, dtype=np.float64)
    return c if basis is None else c @ basis @ basis.T


def gap_noise(synthetic: np.ndarray, own: Sequence[int] | np.ndarray, centroids: np.ndarray, sigma: float,
              basis: np.ndarray | None, weights: np.ndarray | None = None) -> np.ndarray:
    """(samples x labels): the noise std of each sample's cosine gap from its own label to every label, from the
    noisy centroids and the public sigma only (post-processing). Noise of std sigma per dimension turns a centroid
    of norm |c| so that a unit sample x's cosine to it moves by about sigma |P x| / |c| (P: the denoising
    projection, or the identity), independently for two labels: the gap's std is
    sigma |P x| sqrt(w_own^2/|c_own|^2 + w_c^2/|c_c|^2), where w_c (default 1) is the weight label c's private
    cosine has in the score (`blended_scores`). Linear in the samples, whatever the number of labels."""
    x = unit_rows(synthetic)
    reach = np.linalg.norm(x @ basis, axis=1) if basis is not None else np.ones(len(x))
    norms = np.linalg.norm(np.asarray(centroids, dtype=np.float64), axis=1)
    w = np.ones(len(norms)) if weights is None else np.asarray(weights, dtype=np.float64)
    inv2 = (w / np.where(norms > 0, norms, 1e-12)) ** 2
    return sigma * reach[:, None] * np.sqrt(inv2[np.asarray(own, dtype=np.int64)][:, None] + inv2[None, :])


def cosine_scores(synthetic: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """(samples x labels): each sample's cosine to each label's centroid."""
    return unit_rows(synthetic) @ unit_rows(centroids).T


def private_reliability(centroids: np.ndarray, sigma: float, dims: int) -> np.ndarray:
    """Per label, the share of a noisy centroid's energy that is signal: max(0, 1 - dims sigma^2 / |c|^2), with
    `dims` the dimensions the centroid keeps after denoising (noise of std sigma adds dims sigma^2 to |c|^2 in
    expectation). From the noisy values and the public sigma only: post-processing."""
    norms2 = (np.asarray(centroids, dtype=np.float64) ** 2).sum(axis=1)
    return np.clip(1.0 - dims * sigma ** 2 / np.where(norms2 > 0, norms2, 1e-12), 0.0, 1.0)


def blended_scores(synthetic: np.ndarray, private: np.ndarray, public: np.ndarray,
                   reliability: np.ndarray) -> np.ndarray:
    """(samples x labels): each label's score is a_c cos(x, private_c) + (1 - a_c) cos(x, public_c): the noisy
    private centroid where it is mostly signal, the public label description where it is mostly noise (a_c:
    `private_reliability`). With a_c = 1 it is the private rule, with a_c = 0 the public control's."""
    a = np.asarray(reliability, dtype=np.float64)[None, :]
    return a * cosine_scores(synthetic, private) + (1.0 - a) * cosine_scores(synthetic, public)


def corrected_labels(synthetic: np.ndarray, label_ids: Sequence[int] | np.ndarray, centroids: np.ndarray,
                     margin: float, noise: np.ndarray | None = None, min_z: float = 0.0) -> np.ndarray:
    """Each sample's label after correction by cosine to `centroids` (`labels_by_scores`)."""
    return labels_by_scores(cosine_scores(synthetic, centroids), label_ids, margin, noise, min_z)


def labels_by_scores(scores: np.ndarray, label_ids: Sequence[int] | np.ndarray, margin: float,
                     noise: np.ndarray | None = None, min_z: float = 0.0) -> np.ndarray:
    """Each sample's label after correction: the label of its highest score (samples x labels) among those that
    beat the sample's own label's by more than `margin` and, given `noise` (`gap_noise`: samples x labels), by at
    least `min_z` times the gap's noise std; else its own label."""
    own = np.asarray(label_ids, dtype=np.int64)
    rows = np.arange(len(own))
    gap = scores - scores[rows, own][:, None]
    needed = np.full_like(gap, margin)
    if noise is not None:
        needed = np.maximum(needed, min_z * noise)
    open_ = gap > needed
    open_[rows, own] = False
    candidate = np.where(open_, scores, -np.inf)
    return np.where(open_.any(axis=1), candidate.argmax(axis=1), own)


def relabel_stage(options: RelabelConfig, *, samples: list[SyntheticSample], embeddings: np.ndarray,
                  label_ids: np.ndarray, label_names: Sequence[str], holder,
                  public_centroids: Callable[[], np.ndarray], release: tuple[str, int | None],
                  sigma: float) -> tuple[list[SyntheticSample], dict]:
    """Ask the holder for the noisy per-label sums of `release` (or embed the public label descriptions), denoise
    them in the synthetic span and correct the labels. Returns (samples, record of what moved)."""
    if not samples:
        raise DpsynthError("relabel: the method produced no samples to relabel")
    n_labels = len(label_names)
    basis = synthetic_basis(embeddings, options.subspace)
    reliability = None
    if not options.reads_private_records:  # the public control
        public = denoise_in_synthetic_span(np.asarray(public_centroids(), dtype=np.float64), basis)
        new = corrected_labels(embeddings, label_ids, public, options.margin)
    else:
        placeholder = np.zeros((n_labels, embeddings.shape[1]))
        sums = holder.noisy_votes(EMBEDDING_SUMS, placeholder, np.arange(n_labels),
                                  release=release)
        denoised = denoise_in_synthetic_span(np.asarray(sums, dtype=np.float64).reshape(n_labels, -1), basis)
        if options.scoring == "blend" and sigma > 0:
            dims = basis.shape[1] if basis is not None else embeddings.shape[1]
            reliability = private_reliability(denoised, sigma, dims)
            public = denoise_in_synthetic_span(np.asarray(public_centroids(), dtype=np.float64), basis)
            scores = blended_scores(embeddings, denoised, public, reliability)
        else:  # private, or blend without noise (every centroid all signal: the private rule)
            scores = cosine_scores(embeddings, denoised)
        noise = gap_noise(embeddings, label_ids, denoised, sigma, basis, reliability) if sigma > 0 else None
        new = labels_by_scores(scores, label_ids, options.margin, noise, options.min_z)
    out = [s if new[i] == label_ids[i] else replace(s, label=label_names[int(new[i])])
           for i, s in enumerate(samples)]
    moved = np.bincount(new[new != label_ids], minlength=n_labels)
    stats = {"samples": len(samples), "moved": int((new != label_ids).sum()),
             "moved_to": {label_names[c]: int(moved[c]) for c in range(n_labels)},
             "scoring": options.scoring, "subspace": options.subspace, "margin": options.margin,
             "min_z": options.min_z}
    if reliability is not None:  # from noisy values: safe to report
        stats["private_reliability"] = {label_names[c]: round(float(reliability[c]), 4) for c in range(n_labels)}
    return out, stats

