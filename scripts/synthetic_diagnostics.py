"""Why a bench variant's synthetic set trains a better or worse classifier: per variant (mean over its cells),
diversity (distinct-2, mean pairwise cosine of MiniLM embeddings), length, on-label rate (the share of
samples that a probe trained on the corpus' real train split assigns to their own label) and the real test
set's coverage (k-NN precision / recall against it); then the on-label rate per iteration (and the mean
sample weight, for runs that write weights, e.g. FuseGen's).

Reads only the cells results.csv lists (run `dpsynth bench CONFIG --report-only` first) and the public corpus;
writes nothing.

    .venv/bin/python scripts/synthetic_diagnostics.py bench/popri-rt rotten_tomatoes \\
        zero-shot-120 popri-r0 popri-public popri-centroid popri-votes
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression

from dpsynth.data.corpora import get_corpus, split
from dpsynth.embed.sentence import DEFAULT_EMBEDDER, SentenceTransformerEmbedder
from dpsynth.evaluate.distribution import distinct_n, knn_precision_recall, mean_pairwise_cosine

REFERENCE_SIZE = 2000  # real train records the on-label probe learns from (public corpus)


def cell_dirs(bench: Path, variant: str) -> list[Path]:
    """The finished cells of one variant, as the bench's results.csv lists them."""
    import csv

    with open(bench / "results.csv", newline="") as f:
        return [bench / "cells" / row["name"] for row in csv.DictReader(f) if row["variant"] == variant]


def main(bench: Path, corpus: str, variants: list[str]) -> None:
    embedder = SentenceTransformerEmbedder(DEFAULT_EMBEDDER)
    data = split(get_corpus(corpus).load(), seed=0)
    rng = np.random.default_rng(0)
    pick = rng.choice(len(data.train), min(REFERENCE_SIZE, len(data.train)), replace=False)
    train = data.train.subset(pick)
    probe = LogisticRegression(max_iter=2000).fit(embedder.encode(train.texts), train.labels)
    test_emb = embedder.encode(data.test.texts[:1000])
    print("| variant | cells | distinct-2 | pairwise cosine | words | on-label | precision | recall |")
    print("|---|---|---|---|---|---|---|---|")
    for variant in variants:
        rows = []
        for cell in cell_dirs(bench, variant):
            samples = [json.loads(x) for x in (cell / "synthetic.jsonl").read_text().splitlines() if x.strip()]
            texts, labels = [s["text"] for s in samples], [s["label"] for s in samples]
            emb = embedder.encode(texts)
            pr = knn_precision_recall(emb, test_emb)
            rows.append([distinct_n(texts, 2), mean_pairwise_cosine(emb), np.mean([len(t.split()) for t in texts]),
                         float(np.mean(probe.predict(emb) == np.array(labels))), pr["precision"], pr["recall"]])
        if not rows:
            print(f"| {variant} | 0 | | | | | | |")
            continue
        m = np.mean(rows, axis=0)
        print(f"| {variant} | {len(rows)} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.1f} | {m[3]:.3f} | {m[4]:.3f} | "
              f"{m[5]:.3f} |")
    print("\non-label rate by iteration (mean over cells), and the mean sample weight where the run wrote weights:")
    for variant in variants:
        by_iteration: dict[int, list[float]] = {}
        weights: dict[int, list[float]] = {}
        weight_if: dict[bool, list[float]] = {True: [], False: []}
        for cell in cell_dirs(bench, variant):
            samples = [json.loads(x) for x in (cell / "synthetic.jsonl").read_text().splitlines() if x.strip()]
            on_label = probe.predict(embedder.encode([s["text"] for s in samples])) == np.array(
                [s["label"] for s in samples])
            for s, ok in zip(samples, on_label):
                by_iteration.setdefault(s.get("iteration", 0), []).append(float(ok))
                if s.get("weight") is not None:
                    weights.setdefault(s.get("iteration", 0), []).append(float(s["weight"]))
                    weight_if[bool(ok)].append(float(s["weight"]))
        cells = [f"{t}: {np.mean(v):.3f}" + (f" (w {np.mean(weights[t]):.2f})" if t in weights else "")
                 for t, v in sorted(by_iteration.items())]
        by_label = (f"; mean weight on-label {np.mean(weight_if[True]):.2f}, off-label {np.mean(weight_if[False]):.2f}"
                    if weight_if[True] and weight_if[False] else "")
        print(f"- {variant}: " + ", ".join(cells) + by_label)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
