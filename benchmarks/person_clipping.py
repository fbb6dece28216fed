"""Person-level votes clipped per person against the k-fold noise they replaced, at equal epsilon, on real data.

    .venv/bin/python benchmarks/person_clipping.py [--corpus sms_spam] [--records 300] [--persons 80] [--k 3]
                                                   [--candidates 200] [--epsilon 4] [--draws 200]

What a person-level WASP run releases: M records of the corpus' train split given to P persons of skewed sizes
(a geometric count, as customers or patients with few or many rows; the person column of a real file),
bounded to k records a person as the data holder does (`bound_per_person`), vote with WASP's Top-Q near and far
votes (Q=8) on C other train texts standing in for a population of candidates (C/2 per label), embedded with the
default encoder. Each variant's noise is the sigma a WASP run of T=5 calibrates at epsilon (four releases):
- unclipped: every record's votes summed, sensitivity k x 1.63298 (the bound before 2026-12-02);
- clipped: each person's summed votes scaled to one record's largest norm (`VoteSpec.clip_per_unit`),
  sensitivity 1.63298: k times less noise, and a person whose records disagree weighs less.
Both are scored against the same reference, the clean unclipped votes of the bounded records (every record's
votes counted in full, the record-level signal), so the clipped variant's own bias is in its figures. The measure
that matters is the share of WASP's choices (the top-S per label by near votes, its in-context examples, and by
far votes, its contrastive ones; S=4) that the noisy votes get right, over `draws` noise draws, with a 95%
interval over the draws. The relative error ||noisy - clean|| / ||clean|| is shown too; it counts clipping's
shrinking of heavy persons' votes as error although a shrunk vote can rank the same. A noiseless row (clipping
alone) separates the bias from the noise.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from dpsynth.data.corpora import get_corpus, split
from dpsynth.data.loaders import LoadedRecords
from dpsynth.embed.sentence import SentenceTransformerEmbedder
from dpsynth.private.dataset import bound_per_person
from dpsynth.runs.planning import plan_for_method
from dpsynth.voting.spec import VoteSpec, compute_votes


def persons_of(m: int, persons: int, rng: np.random.Generator) -> list[str]:
    """Skewed person sizes summing to m (geometric counts of mean m / persons, rescaled), in a shuffled order."""
    if not 1 <= persons <= m:
        raise SystemExit(f"--persons must be between 1 and --records ({m})")
    sizes = rng.geometric(persons / m, persons)
    sizes = np.maximum(1, np.round(sizes * m / sizes.sum())).astype(int)
    while sizes.sum() != m:  # rounding: take from (or give to) the largest until the sizes add up
        sizes[np.argmax(sizes)] += 1 if sizes.sum() < m else -1
    names = [f"person{p}" for p, size in enumerate(sizes) for _ in range(size)]
    return [names[i] for i in rng.permutation(m)]


def top_overlap(noisy: np.ndarray, clean: np.ndarray, labels: np.ndarray, s: int) -> float:
    """Share of the clean top-s of each label that the noisy votes put in their own top-s."""
    hits = []
    for label in np.unique(labels):
        idx = np.flatnonzero(labels == label)
        mine = set(idx[np.argsort(-noisy[idx], kind="stable")[:s]])
        true = set(idx[np.argsort(-clean[idx], kind="stable")[:s]])
        hits.append(len(mine & true) / s)
    return float(np.mean(hits))


def shown(x: list[float]) -> str:
    """Mean with the half-width of its 95% interval over the draws."""
    half = 1.96 * np.std(x, ddof=1) / math.sqrt(len(x)) if len(x) > 1 else 0.0
    return f"{np.mean(x):.3f} +-{half:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="sms_spam")
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--persons", type=int, default=80)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)

    train = split(get_corpus(args.corpus).load(), seed=0).train
    order = rng.permutation(len(train))
    private = train.subset(order[: args.records])
    names = sorted(set(train.labels))
    per_label = args.candidates // len(names)
    rest = order[args.records:]
    cand_rows = np.array([i for y in names for i in [j for j in rest if train.labels[j] == y][:per_label]], dtype=int)
    loaded = LoadedRecords(private, persons_of(args.records, args.persons, rng))
    bounded = bound_per_person(loaded, args.k, bytes(32))
    largest = max(loaded.persons.count(p) for p in set(loaded.persons))
    at_k = int((np.bincount(bounded.person_of) == args.k).sum())
    print(f"{args.corpus}: {args.records} records of {args.persons} persons (1 to {largest} each), bounded to "
          f"k={args.k}: {len(bounded.records)} records, {at_k} persons at k; {len(cand_rows)} candidates "
          f"({per_label} per label)")

    embedder = SentenceTransformerEmbedder()
    emb = embedder.encode(bounded.records.texts)
    cand = embedder.encode([train.texts[i] for i in cand_rows])
    p_labels = np.array([names.index(y) for y in bounded.records.labels])
    c_labels = np.array([names.index(train.labels[i]) for i in cand_rows])

    plan = plan_for_method("wasp", epsilon=args.epsilon, max_records_per_user=args.k, options={"iterations": 5})
    sigma = plan.calibrate()["vote_sigma"]  # clipped per person: one record's sensitivity
    unclipped_spec, clipped_spec = VoteSpec(kind="wasp", q=8), VoteSpec(kind="wasp", q=8, clip_per_unit=True)
    clean = compute_votes(unclipped_spec, emb, p_labels, cand, c_labels)
    clipped = compute_votes(clipped_spec, emb, p_labels, cand, c_labels, units=bounded.person_of)
    n, s = len(cand_rows), 4
    variants = {"unclipped": (clean, args.k * sigma), "clipped per person": (clipped, sigma),
                "clipped, no noise": (clipped, 0.0)}
    print(f"WASP Q=8, T=5, epsilon {args.epsilon:g}: sigma {sigma:.3f} clipped, {args.k * sigma:.3f} unclipped "
          f"(x{args.k}); clean votes' norm {np.linalg.norm(clean):.1f}, clipped {np.linalg.norm(clipped):.1f}")
    print(f"{'variant':<20} {'sigma':>7} {'rel. error':>11} {'near top-4 right':>18} {'far top-4 right':>18}")
    results = {}
    for name, (votes, noise) in variants.items():
        draws = args.draws if noise > 0 else 1
        errors, near, far = [], [], []
        for _ in range(draws):
            noisy = votes + rng.normal(0.0, noise, votes.shape) if noise > 0 else votes
            errors.append(np.linalg.norm(noisy - clean) / np.linalg.norm(clean))
            near.append(top_overlap(noisy[:n], clean[:n], c_labels, s))
            far.append(top_overlap(noisy[n:], clean[n:], c_labels, s))
        results[name] = (np.mean(errors), np.mean(near), np.mean(far))
        print(f"{name:<20} {noise:>7.3f} {np.mean(errors):>11.3f} {shown(near):>18} {shown(far):>18}")
    base, ours = results["unclipped"], results["clipped per person"]
    print(f"ratio clipped/unclipped: relative error {ours[0] / base[0]:.2f}x, near choices right "
          f"{ours[1] / base[1]:.2f}x, far {ours[2] / base[2]:.2f}x")


if __name__ == "__main__":
    main()
