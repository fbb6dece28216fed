"""Canaries: records built to be recognisable if leaked, each included in the private set by a fair coin.

Two kinds, the ones the literature finds most exposed: strings of random pseudo-words (nothing in
any corpus looks like them) and in-distribution texts carrying a rare phrase (they read like a record
of the task, so a method that favours typical records still meets them). Independent fair coins,
not an exact half, are what the one-run bound (`dpsynth.audit.bound`) assumes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpsynth.data.records import TaskSpec

KINDS = ("random_words", "rare_phrase")
_CONSONANTS = "bcdfghjklmnprstvwxz"
_VOWELS = "aeiouy"


@dataclass(frozen=True)
class Canary:
    text: str
    label: str
    kind: str
    included: bool


def _pseudo_word(rng: np.random.Generator) -> str:
    syllables = int(rng.integers(2, 4))
    return "".join(str(rng.choice(list(_CONSONANTS))) + str(rng.choice(list(_VOWELS))) for _ in range(syllables)) \
        + str(rng.choice(list(_CONSONANTS)))


def plant_canaries(task: TaskSpec, count: int, seed: int) -> list[Canary]:
    """`count` canaries, kinds and labels taking turns, inclusion by independent fair coins (seeded)."""
    if count < 2:
        raise ValueError("an audit needs at least 2 canaries")
    rng = np.random.default_rng([seed, 0xA0D17])
    labels = task.label_names
    canaries = []
    for i in range(count):
        label, kind = labels[i % len(labels)], KINDS[(i // len(labels)) % len(KINDS)]
        words = [_pseudo_word(rng) for _ in range(6)]
        if kind == "random_words":
            text = " ".join(words + [_pseudo_word(rng) for _ in range(4)])
        else:
            meaning = task.labels[label].rstrip(".")
            text = (f"{meaning[:1].upper()}{meaning[1:]}: the {words[0]} {words[1]} of {words[2]} and the "
                    f"{words[3]} {words[4]} {words[5]} stay with me.")
        canaries.append(Canary(text, label, kind, bool(rng.random() < 0.5)))
    return canaries
