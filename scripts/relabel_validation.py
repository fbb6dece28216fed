"""Validation of `relabel:` rules on the train split only (never the test split the bench scores).

For each dataset: 1,000 train records are the validation set, the private sets (M=100 and M=1,000, seeds 10-14)
are drawn from the rest, the noise of the one release is seeded 100-104, and the synthetic sets are the five
zero-shot sets of the relabel bench (`bench/relabel-<ds>/cells/zero-shot-all-epsNone-seed<0-4>`). Each rule
relabels them; a logistic-regression probe (the bench's) trained on each set is scored on the validation set.
Prints the mean macro-F1 change against the asked-for labels, per dataset and M.

    .venv/bin/python scripts/relabel_validation.py [--bench bench] [--cells PATTERN] [--rules ambient projected]
        [--rule-encoder gemma3-270m]

`--rule-encoder` puts the rules (centroids, descriptions, samples) in another space than the probe's MiniLM: a local
causal LM's mean-pooled last hidden states (llama.cpp's embedding mode), to ask whether the encoder limits a rule.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dpsynth.data.corpora import get_corpus, sample_private, split
from dpsynth.embed.sentence import CachedEmbedder, SentenceTransformerEmbedder
from dpsynth.evaluate.downstream import probe_scores
from dpsynth.methods.relabel import (
    blended_scores,
    corrected_labels,
    denoise_in_synthetic_span,
    gap_noise,
    labels_by_scores,
    private_reliability,
    synthetic_basis,
)
from dpsynth.voting.scores import embedding_sums, unit_rows


class LlamaMeanEmbedder:
    """A local GGUF model's mean-pooled last hidden states (llama.cpp embedding mode), one text at a time."""

    def __init__(self, model: str) -> None:
        import llama_cpp

        from dpsynth.llm.local_models import resolve_local_model

        self.name = f"llama-mean:{model}"
        self._llm = llama_cpp.Llama(model_path=str(resolve_local_model(model)[0]), embedding=True, n_threads=1,
                                    pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=512, verbose=False)

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.array(self._llm.embed(list(texts)), dtype=np.float32).reshape(len(texts), -1)


SIGMA = 1.081  # eps=4, delta 1e-5, one release of sensitivity 1 (the bench's)
DATASETS = {"rt": "rotten_tomatoes", "trec": "trec", "sms": "sms_spam"}
Rule = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, np.random.Generator], np.ndarray]


def projected_centroids(private: np.ndarray, private_labels: np.ndarray, labels: int, synthetic: np.ndarray,
                        subspace: int) -> tuple[np.ndarray, np.ndarray]:
    """A candidate release (not in the stage: see docs/relabel.md): each record's unit embedding centred on the
    synthetic mean, projected onto the synthetic set's top-`subspace` principal directions (public) and
    renormalised, summed per label (still sensitivity 1); returns those clean sums and the synthetic samples in
    the same frame."""
    x = unit_rows(synthetic)
    centre = x.mean(axis=0)
    directions = np.linalg.svd(x - centre, full_matrices=False)[2][:subspace]

    def frame(e: np.ndarray) -> np.ndarray:
        return unit_rows((unit_rows(e) - centre) @ directions.T)

    return embedding_sums(frame(private), private_labels, labels).reshape(labels, -1), frame(synthetic)


def ambient(synth: np.ndarray, own: np.ndarray, private: np.ndarray, p_labels: np.ndarray, n_labels: int,
            rng: np.random.Generator, *, subspace: int = 16, margin: float = 0.05, min_z: float = 2.0) -> np.ndarray:
    """The stage's default: noisy sums of the unit embeddings in 384 dimensions, denoised in the synthetic span."""
    sums = embedding_sums(private, p_labels, n_labels).reshape(n_labels, -1)
    noisy = sums + rng.normal(0.0, SIGMA, sums.shape)
    basis = synthetic_basis(synth, subspace)
    centroids = denoise_in_synthetic_span(noisy, basis)
    return corrected_labels(synth, own, centroids, margin, gap_noise(synth, own, centroids, SIGMA, basis), min_z)


def projected(synth: np.ndarray, own: np.ndarray, private: np.ndarray, p_labels: np.ndarray, n_labels: int,
              rng: np.random.Generator, *, subspace: int = 16, margin: float = 0.05, min_z: float = 2.0) -> np.ndarray:
    """Project, centre and normalise each record in the synthetic set's principal subspace before the sums."""
    sums, synth_z = projected_centroids(private, p_labels, n_labels, synth, subspace)
    noisy = sums + rng.normal(0.0, SIGMA, sums.shape)
    noise = gap_noise(synth_z, own, noisy, SIGMA, None)
    return corrected_labels(synth_z, own, noisy, margin, noise, min_z)


def public(synth: np.ndarray, own: np.ndarray, private: np.ndarray, p_labels: np.ndarray, n_labels: int,
           rng: np.random.Generator, *, descriptions: np.ndarray, subspace: int = 16,
           margin: float = 0.05) -> np.ndarray:
    """The no-private-data control: the public label descriptions' embeddings as centroids, no noise test."""
    basis = synthetic_basis(synth, subspace)
    return corrected_labels(synth, own, denoise_in_synthetic_span(descriptions, basis), margin)


def clean(synth: np.ndarray, own: np.ndarray, private: np.ndarray, p_labels: np.ndarray, n_labels: int,
          rng: np.random.Generator, *, subspace: int = 16, margin: float = 0.05) -> np.ndarray:
    """Not private (a ceiling): the stage's rule with the noise-free sums, so no noise test; what the centroids
    could do if the release cost nothing."""
    basis = synthetic_basis(synth, subspace)
    sums = embedding_sums(private, p_labels, n_labels).reshape(n_labels, -1)
    return corrected_labels(synth, own, denoise_in_synthetic_span(sums, basis), margin)


def probe_clean(synth: np.ndarray, own: np.ndarray, private: np.ndarray, p_labels: np.ndarray, n_labels: int,
                rng: np.random.Generator) -> np.ndarray:
    """Not private (a ceiling): every sample takes the label a logistic-regression probe trained on the private
    records predicts; what a linear classifier (rather than the label centroids) could do without noise."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=2000).fit(private, p_labels).predict(unit_rows(synth)).astype(np.int64)


def _private_centroids(synth, private, p_labels, n_labels, rng, subspace):
    sums = embedding_sums(private, p_labels, n_labels).reshape(n_labels, -1)
    noisy = sums + rng.normal(0.0, SIGMA, sums.shape)
    basis = synthetic_basis(synth, subspace)
    return denoise_in_synthetic_span(noisy, basis), basis


def blend(synth: np.ndarray, own: np.ndarray, private: np.ndarray, p_labels: np.ndarray, n_labels: int,
          rng: np.random.Generator, *, descriptions: np.ndarray, subspace: int = 16, margin: float = 0.05,
          min_z: float = 2.0) -> np.ndarray:
    """`scoring: blend`: each label's cosine mixes the noisy private centroid's and the public description's by
    the share of the noisy centroid that is signal; the noise test scales with that share."""
    centroids, basis = _private_centroids(synth, private, p_labels, n_labels, rng, subspace)
    reliability = private_reliability(centroids, SIGMA, basis.shape[1])
    scores = blended_scores(synth, centroids, denoise_in_synthetic_span(descriptions, basis), reliability)
    noise = gap_noise(synth, own, centroids, SIGMA, basis, reliability)
    return labels_by_scores(scores, own, margin, noise, min_z)


def union(synth: np.ndarray, own: np.ndarray, private: np.ndarray, p_labels: np.ndarray, n_labels: int,
          rng: np.random.Generator, *, descriptions: np.ndarray, subspace: int = 16, margin: float = 0.05,
          min_z: float = 2.0) -> np.ndarray:
    """The stage's moves, plus the public control's moves where the stage did not move the sample and the noisy
    private centroids do not disagree (the target's private cosine at least the own label's)."""
    centroids, basis = _private_centroids(synth, private, p_labels, n_labels, rng, subspace)
    moved = corrected_labels(synth, own, centroids, margin, gap_noise(synth, own, centroids, SIGMA, basis), min_z)
    pub = corrected_labels(synth, own, denoise_in_synthetic_span(descriptions, basis), margin)
    s = unit_rows(synth) @ unit_rows(centroids).T
    rows = np.arange(len(own))
    agree = s[rows, pub] >= s[rows, own]
    return np.where(moved != own, moved, np.where(agree, pub, own))


RULES: dict[str, Rule] = {
    "ambient-k4": lambda *a: ambient(*a, subspace=4),
    "ambient-k8": lambda *a: ambient(*a, subspace=8),
    "ambient-k32": lambda *a: ambient(*a, subspace=32),
    "ambient-z1.5": lambda *a: ambient(*a, min_z=1.5),
    "ambient": ambient,
    "projected": projected,
    "projected-k8": lambda *a: projected(*a, subspace=8),
    "projected-k32": lambda *a: projected(*a, subspace=32),
    "projected-z3": lambda *a: projected(*a, min_z=3.0),
    "clean": clean,
    "clean-m0": lambda *a: clean(*a, margin=0.0),
    "probe-clean": probe_clean,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", type=Path, default=Path("bench"))
    parser.add_argument("--rules", nargs="+", default=["ambient", "projected"],
                        choices=[*RULES, "public", "blend", "blend-z1", "union"])
    parser.add_argument("--repeats", type=int, default=1,
                        help="private draws and noise draws per synthetic set (seeds 10+s+5r and 100+s+5r)")
    parser.add_argument("--cells", default="relabel-{ds}/cells/zero-shot-all-epsNone-seed{seed}",
                        help="the synthetic sets under --bench ({ds}: rt, trec or sms; {seed}: 0-4)")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--rule-encoder", default=None,
                        help="a local model (e.g. gemma3-270m) whose mean-pooled states the rules use; default MiniLM")
    args = parser.parse_args()
    cache = Path(tempfile.gettempdir()) / "relabel-validation.sqlite"
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), cache)
    rule_space = CachedEmbedder(LlamaMeanEmbedder(args.rule_encoder), cache) if args.rule_encoder else embedder
    print("| dataset | M | " + " | ".join(args.rules) + " |  (macro-F1 change of the probe: mean (standard error), "
          "share of samples moved)")
    for short in args.datasets:
        data = get_corpus(DATASETS[short]).load()
        train = split(data).train
        order = np.random.default_rng(7).permutation(len(train))
        val, pool = train.subset(order[:1000]), train.subset(order[1000:])
        names = sorted(set(train.labels))
        task = get_corpus(DATASETS[short]).task
        descriptions = rule_space.encode([f"{task.text_kind} ({c}: {task.labels[c]})" for c in names])
        RULES["public"] = lambda *a, d=descriptions: public(*a, descriptions=d)
        RULES["blend"] = lambda *a, d=descriptions: blend(*a, descriptions=d)
        RULES["blend-z1"] = lambda *a, d=descriptions: blend(*a, descriptions=d, min_z=1.0)
        RULES["union"] = lambda *a, d=descriptions: union(*a, descriptions=d)
        val_emb = embedder.encode(list(val.texts))
        sets = []
        for seed in range(5):
            path = args.bench / args.cells.format(ds=short, seed=seed) / "synthetic.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            texts = [r["text"] for r in rows]
            sets.append((embedder.encode(texts), rule_space.encode(texts),
                         np.array([names.index(r["label"]) for r in rows])))
        for m in (100, 1000):
            gains: dict[str, list[float]] = {r: [] for r in args.rules}
            moved: dict[str, list[float]] = {r: [] for r in args.rules}
            for s, r in ((s, r) for s in range(len(sets)) for r in range(args.repeats)):
                synth, synth_rule, own = sets[s]
                private = sample_private(pool, m, seed=10 + s + 5 * r)
                p_emb = unit_rows(rule_space.encode(list(private.texts)))
                p_labels = np.array([names.index(y) for y in private.labels])
                base = probe_scores(synth, [names[i] for i in own], val_emb, list(val.labels))["macro_f1"]
                for rule in args.rules:
                    noise_rng = np.random.default_rng(100 + s + 5 * r)
                    new = RULES[rule](synth_rule, own, p_emb, p_labels, len(names), noise_rng)
                    score = probe_scores(synth, [names[i] for i in new], val_emb, list(val.labels))["macro_f1"]
                    gains[rule].append(100 * (score - base))
                    moved[rule].append(float(np.mean(new != own)))
            cells = [f"{np.mean(gains[r]):+.1f} ({np.std(gains[r]) / np.sqrt(len(gains[r])):.1f}), moved "
                     f"{np.mean(moved[r]):.2f}" for r in args.rules]
            print(f"| {short} | {m} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
