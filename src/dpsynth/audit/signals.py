"""Membership signals that need only the synthetic output: a higher score means "this canary was in".

- `nearest`: cosine similarity of the canary to its nearest synthetic text (sentence embeddings);
- `ngrams`: the share of the canary's distinctive word bigrams (in no other canary) that occur anywhere
  in the synthetic set;
- `likelihood`: mean log-probability per character of the canary's distinctive words under a character
  4-gram model fit on the synthetic set (add-one smoothing), the small language model of the issue.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def nearest_similarity(canaries: np.ndarray, synthetic: np.ndarray) -> np.ndarray:
    if len(synthetic) == 0:
        return np.zeros(len(canaries))
    return (_unit(canaries) @ _unit(synthetic).T).max(axis=1)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def bigram_overlap(canaries: Sequence[str], synthetic: Sequence[str]) -> np.ndarray:
    """Share of a canary's distinctive bigrams (in no other canary) found in the synthetic set.

    Bigrams that canaries share come from their template ("the ... of", a label's description) and
    turn up in synthetic text whether or not any canary was in; only the distinctive ones can tell.
    """
    seen = {pair for text in synthetic for pair in zip(_words(text), _words(text)[1:])}
    per_canary = [set(zip(_words(t), _words(t)[1:])) for t in canaries]
    shared = Counter(pair for pairs in per_canary for pair in pairs)
    scores = []
    for pairs in per_canary:
        distinctive = {p for p in pairs if shared[p] == 1} or pairs
        scores.append(sum(p in seen for p in distinctive) / len(distinctive) if distinctive else 0.0)
    return np.array(scores)


def char_ngram_loglik(canaries: Sequence[str], synthetic: Sequence[str], order: int = 4) -> np.ndarray:
    pad = "\x02" * (order - 1)
    grams: Counter[str] = Counter()
    contexts: Counter[str] = Counter()
    alphabet: set[str] = set()
    for text in synthetic:
        s = pad + text.lower() + "\x03"
        alphabet.update(s)
        for i in range(order - 1, len(s)):
            grams[s[i - order + 1 : i + 1]] += 1
            contexts[s[i - order + 1 : i]] += 1
    vocabulary = len(alphabet | {c for text in canaries for c in text.lower()}) + 1
    # scored on each canary's distinctive words (in no other canary): its template's words are likely
    # under any synthetic set, in or out
    counts = Counter(w for text in canaries for w in set(_words(text)))
    scores = []
    for text in canaries:
        distinctive = " ".join(w for w in _words(text) if counts[w] == 1) or text
        s = pad + distinctive.lower() + "\x03"
        logp = [math.log((grams[s[i - order + 1 : i + 1]] + 1) / (contexts[s[i - order + 1 : i]] + vocabulary))
                for i in range(order - 1, len(s))]
        scores.append(sum(logp) / len(logp))
    return np.array(scores)


def membership_scores(canaries: Sequence[str], synthetic: Sequence[str], canary_embeddings: np.ndarray,
                      synthetic_embeddings: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "nearest": nearest_similarity(canary_embeddings, synthetic_embeddings),
        "ngrams": bigram_overlap(canaries, synthetic),
        "likelihood": char_ngram_loglik(canaries, synthetic),
    }
