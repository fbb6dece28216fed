"""The evaluation's k-NN precision/recall: blocked matrix products against the explicit differences it replaced.

    .venv/bin/python benchmarks/eval_distribution.py [--sizes 120 400 2000]

Real embeddings: Rotten Tomatoes' fixed test split (2,550 reviews, the reference set of every bench on it) and
the first N reviews of its train split standing in for a synthetic set at each cut-off size. The baseline is the
code the evaluation used before (sklearn neighbours for the balls, a (256, len(ref), 384) difference array a
block for the coverage), kept here only to measure against; both must give the same precision and recall.
An evaluation of T cut-offs computes the test set's balls once now (it did T times): `per evaluation` adds that.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.neighbors import NearestNeighbors

from dpsynth.data.corpora import get_corpus, split
from dpsynth.embed.sentence import SentenceTransformerEmbedder, embed_test_set
from dpsynth.evaluate.distribution import knn_precision_recall, knn_squared_radii


def broadcast_precision_recall(synthetic: np.ndarray, real: np.ndarray, k: int = 3) -> dict[str, float]:
    """The evaluation's code before the change (the baseline)."""

    def radii(x: np.ndarray) -> np.ndarray:
        return NearestNeighbors(n_neighbors=min(k + 1, len(x))).fit(x).kneighbors(x)[0][:, -1]

    def coverage(points: np.ndarray, ref: np.ndarray, ref_radii: np.ndarray) -> float:
        inside = np.zeros(len(points), dtype=bool)
        for start in range(0, len(points), 256):
            d = np.linalg.norm(points[start : start + 256, None, :] - ref[None, :, :], axis=2)
            inside[start : start + 256] = (d <= ref_radii[None, :]).any(axis=1)
        return float(inside.mean())

    synthetic, real = np.asarray(synthetic, np.float32), np.asarray(real, np.float32)
    return {"precision": coverage(synthetic, real, radii(real)), "recall": coverage(real, synthetic, radii(synthetic))}


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[120, 400, 2000])
    args = parser.parse_args()
    data = split(get_corpus("rotten_tomatoes").load(), seed=0)
    embedder = SentenceTransformerEmbedder()
    real = embed_test_set(embedder, data.test.texts)  # cached across runs, as in an evaluation
    pool = embedder.encode(data.train.texts[: max(args.sizes)])
    print(f"reference: {len(real)} test reviews; synthetic stand-ins: the first N train reviews")
    radii_seconds, sq_radii = timed(knn_squared_radii, real)
    print(f"the test set's k-NN balls, once per evaluation now: {radii_seconds:.3f} s")
    print(f"{'N':>6} {'before s':>9} {'now s':>7} {'now s (balls shared)':>21} {'ratio':>6} {'same':>5}")
    for n in args.sizes:
        before_s, before = timed(broadcast_precision_recall, pool[:n], real)
        now_s, now = timed(knn_precision_recall, pool[:n], real)
        shared_s, shared = timed(knn_precision_recall, pool[:n], real, real_sq_radii=sq_radii)
        same = before == now == shared
        print(f"{n:>6} {before_s:>9.2f} {now_s:>7.2f} {shared_s:>21.2f} {before_s / now_s:>5.1f}x {str(same):>5}")


if __name__ == "__main__":
    main()
