"""DP histogram resampling (papers/001, Algorithm 2) as a final stage any method can end with.

k-means clusters the synthetic samples' embeddings (post-processing: no privacy cost), within
each label, so every bin is a (label, cluster) pair. Each private record then votes once, for
the nearest centroid of its own label, and the vote histogram is released once with Gaussian
noise on the run's ledger (sensitivity 1 per record: it is a Top-1 vote over the centroids, the
same request Aug-PE makes over samples, so the federated holder answers it too). The synthetic
set is resampled so its bins follow the noisy histogram; the label mix follows it as well.

Why it helps at small M: a per-candidate vote carries at most a handful of votes against the
same noise, while a cluster collects M / bins of them; the paper picks K so that the votes per
cluster stand well above sigma (`votes_per_bin_over_noise` in the stage's record).

`resample.weights` keeps every sample instead and weights it, within its label, by its bin's noisy share over the
bin's share of the label's samples (importance weights towards the private records' density; the label mix stays
the method's): the same release, post-processed without the draw's duplicates and variance (not in the paper).

Differences from the paper, both in the direction of privacy: the paper divides the noisy
histogram by the exact number of private records (an un-noised count); here the densities are
the clipped noisy counts over their own sum. And where a cluster holds fewer samples than its
share asks, the paper stops ("need more initial samples"); here the cluster's samples are all
taken and the rest drawn again with replacement (counted in `duplicated`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from dpsynth.config import ResampleConfig, RunConfig, vote_records_per_unit
from dpsynth.errors import DpsynthError
from dpsynth.methods.generation import SyntheticSample, split_count
from dpsynth.privacy.schedule import Schedule, final_stage_knob, gaussian_releases
from dpsynth.privacy.sensitivity import pe_top1_sensitivity
from dpsynth.voting.spec import VoteSpec

RESAMPLE = "resample.histogram"
RESAMPLE_SIGMA = "resample_sigma"


def resample_schedule(config: RunConfig, method_schedule: Schedule) -> Schedule:
    """The stage's one release: fixed sigma, a share of epsilon, or (alone) the whole budget."""
    r = config.resample
    if r is None:
        return Schedule((), ())
    sens = pe_top1_sensitivity(config.privacy.adjacency, max_records_per_user=vote_records_per_unit(config))
    knob = final_stage_knob(RESAMPLE_SIGMA, r, method_schedule, "resample", "Gaussian noise on the cluster histogram")
    how = "every sample weighted by it (resample.weights)" if r.weights else "papers/001, Algorithm 2"
    return Schedule(gaussian_releases(RESAMPLE, [None], RESAMPLE_SIGMA, sens), (knob,),
                    (f"DP resampling: k-means into {r.clusters} clusters per label, one noisy histogram ({how})",))


def cluster_within_labels(embeddings: np.ndarray, label_ids: np.ndarray, clusters: int,
                          seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k-means (faiss, spherical) of each label's samples: (centroids, their labels, each sample's bin)."""
    import faiss

    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    centroids: list[np.ndarray] = []
    centroid_labels: list[int] = []
    assignment = np.empty(len(x), dtype=np.int64)
    for label in np.unique(label_ids):
        rows = np.flatnonzero(label_ids == label)
        k = min(clusters, len(rows))
        if k == 1:
            found = x[rows].mean(axis=0, keepdims=True)
            local = np.zeros(len(rows), dtype=np.int64)
        else:
            km = faiss.Kmeans(x.shape[1], k, niter=25, seed=seed, spherical=True, verbose=False,
                              min_points_per_centroid=1)
            km.train(x[rows])
            found = km.centroids
            local = km.index.search(x[rows], 1)[1].ravel().astype(np.int64)
        used = np.unique(local)  # k-means may leave a centroid empty (e.g. repeated texts): no bin for it
        assignment[rows] = len(centroids) + np.searchsorted(used, local)
        centroids.extend(found[used])
        centroid_labels.extend([label] * len(used))
    return np.asarray(centroids, dtype=np.float32), np.asarray(centroid_labels, dtype=np.int64), assignment


def resample_to_histogram(samples: Sequence[SyntheticSample], assignment: np.ndarray, noisy: np.ndarray,
                          target: int, rng: np.random.Generator) -> tuple[list[SyntheticSample], dict]:
    """Draw `target` samples whose bins follow the clipped noisy histogram (post-processing only)."""
    weights = np.clip(np.asarray(noisy, dtype=np.float64), 0.0, None)
    fallback = weights.sum() <= 0
    if fallback:  # all noise: keep the bins as the samples fill them
        weights = np.bincount(assignment, minlength=len(noisy)).astype(np.float64)
    counts = split_count(target, list(weights / weights.sum()))
    chosen: list[SyntheticSample] = []
    duplicated = 0
    for b, want in enumerate(counts):
        members = np.flatnonzero(assignment == b)
        if want == 0 or len(members) == 0:
            duplicated += want if len(members) == 0 else 0
            continue
        take = rng.permutation(members)[: min(want, len(members))]
        extra = rng.choice(members, size=want - len(take)) if want > len(members) else np.empty(0, dtype=np.int64)
        duplicated += len(extra)
        chosen.extend(samples[i] for i in np.concatenate([take, extra]))
    return chosen, {"bins": len(noisy), "target": target, "kept": len(chosen), "duplicated": duplicated,
                    "all_noise_fallback": bool(fallback)}


def weights_from_histogram(samples: Sequence[SyntheticSample], assignment: np.ndarray, noisy: np.ndarray,
                           bin_labels: np.ndarray) -> tuple[list[SyntheticSample], dict]:
    """Every sample, weighted within its label by (its bin's share of the label's clipped noisy counts) / (the
    bin's share of the label's weight: samples count 1, or the weight they had, e.g. FuseGen's, whose ratios within
    a bin are kept), then scaled so that each label weighs what it weighed before: a weighted classifier sees each
    label's clusters in the noisy histogram's proportions, with no sample repeated or dropped by chance, and the
    label mix stays the method's (moving it to the private records' mix made the probe predict SMS's majority
    label for every message: docs/dpft.md).
    Bins the noise left at 0 weigh 0. Post-processing only: the histogram is noisy, the bins are public."""
    before = np.array([1.0 if x.weight is None else x.weight for x in samples])
    mass = np.bincount(assignment, weights=before, minlength=len(noisy))  # each bin's weight so far
    # clipped noisy counts of the bins that hold weight (a bin of weight 0 can take no share)
    counts = np.where(mass > 0, np.clip(np.asarray(noisy, dtype=np.float64), 0.0, None), 0.0)
    per_bin = np.divide(counts, mass, out=np.zeros(len(counts)), where=mass > 0)  # count per unit of weight
    w = before.copy()
    all_noise = 0
    for label in np.unique(bin_labels):
        bins = np.flatnonzero(bin_labels == label)
        rows = np.isin(assignment, bins)
        if counts[bins].sum() <= 0:  # all noise: this label keeps its weights
            all_noise += 1
            continue
        w[rows] = before[rows] * per_bin[assignment[rows]] * (before[rows].sum() / counts[bins].sum())
    w *= len(w) / w.sum()
    out = [replace(x, weight=float(wi)) for x, wi in zip(samples, w)]
    return out, {"bins": len(counts), "target": len(samples), "kept": len(out), "duplicated": 0,
                 "weighted": True, "zero_weight": int((w == 0).sum()), "max_weight": float(w.max()),
                 "effective_samples": float(w.sum() ** 2 / (w ** 2).sum()), "labels_all_noise": all_noise,
                 "all_noise_fallback": all_noise == len(np.unique(bin_labels))}


def votes_per_bin_over_noise(noisy: np.ndarray, sigma: float) -> float | None:
    """The paper's rule for K, from noisy values only: average (clipped) votes per bin in noise units."""
    if sigma <= 0:
        return None
    return float(np.clip(noisy, 0.0, None).sum() / len(noisy) / sigma)


def suggested_clusters(noisy: np.ndarray, sigma: float, labels: int, ratio: float = 3.0) -> int | None:
    """Largest clusters-per-label whose bins would hold `ratio` noise scales of votes on average."""
    if sigma <= 0:
        return None
    total = float(np.clip(noisy, 0.0, None).sum())
    return max(1, math.floor(total / (labels * ratio * sigma)))


def resample_stage(options: ResampleConfig, *, samples: list[SyntheticSample], embeddings: np.ndarray,
                   label_ids: np.ndarray, labels: int, holder, release: tuple[str, int | None], sigma: float,
                   seed: int, clip_per_person: bool) -> tuple[list[SyntheticSample], dict]:
    """Cluster, ask the holder for the noisy histogram of `release`, resample. Returns (samples, record).
    `clip_per_person`: each person's votes clipped to one record's (`config.votes_clipped_per_person`)."""
    if not samples:
        raise DpsynthError("resample: the method produced no samples to resample")
    centroids, centroid_labels, assignment = cluster_within_labels(embeddings, label_ids, options.clusters, seed)
    noisy = holder.noisy_votes(VoteSpec(kind="rank", weights=(1.0,), clip_per_unit=clip_per_person), centroids,
                               centroid_labels, release=release)
    if len(noisy) != len(centroids):  # a resumed run re-clusters: the saved histogram must fit its bins
        raise DpsynthError(f"resample: the saved histogram has {len(noisy)} bins, the clustering {len(centroids)}; "
                           "the run cannot resume this stage")
    if options.weights:
        chosen, stats = weights_from_histogram(samples, assignment, noisy, centroid_labels)
    else:
        target = options.target or len(samples)
        chosen, stats = resample_to_histogram(samples, assignment, noisy, target, np.random.default_rng([seed, 1]))
    # no timing here: the holder's vote (and its embedding of the private texts) grows with M
    stats.update(before=len(samples), votes_per_bin_over_noise=votes_per_bin_over_noise(noisy, sigma),
                 suggested_clusters=suggested_clusters(noisy, sigma, labels))
    return chosen, stats
