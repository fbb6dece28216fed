"""Cleaning's shortcuts give the answers of its definitions (they exist for speed: every answer is cleaned)."""

from __future__ import annotations

import random
from collections import Counter

from dpsynth.prompts.cleaning import _degenerate, clean_generation


def _degenerate_by_definition(words: list[str]) -> bool:
    if len(words) >= 12 and len(set(words)) / len(words) < 0.4:
        return True
    trigrams = Counter(zip(words, words[1:], words[2:]))
    return bool(trigrams) and max(trigrams.values()) >= 4


def test_degenerate_agrees_with_counting_every_trigram() -> None:
    rng = random.Random(0)
    for _ in range(20_000):
        words = [str(rng.randrange(rng.randint(1, 6))) for _ in range(rng.randint(0, 30))]
        assert _degenerate(words) == _degenerate_by_definition(words), words
    assert _degenerate("a b c a b c a b c a b c x y z w v u t s".split())  # one trigram 4 times, varied words
    assert not _degenerate("a b c a b c a b c x y z w v u t s".split())  # 3 times


def test_the_example_format_is_still_recognised_with_its_colon() -> None:
    assert clean_generation('A positive review is: "A warm, funny and moving film."') == (
        "A warm, funny and moving film.", "ok")
    assert clean_generation("A warm, funny and moving film about friends.") == (
        "A warm, funny and moving film about friends.", "ok")


def test_a_blank_left_unfilled_is_dropped_and_an_underscore_in_a_word_is_not() -> None:
    """Aug-PE's fill-in-the-blank answers sometimes keep the prompt's blanks ("The _ notes on the _ joints")."""
    for text in ("The _ notes on the _ joints of the knee", "_ patient reports mild pain today",
                 "Pain in the left knee, worse at __.", "Pain in the left knee (_) since Monday"):
        assert clean_generation(text) == (None, "unfilled_blank"), text
    for text in ("Write to john_doe@example.com about the refund", "The snake_case name is fine here"):
        assert clean_generation(text)[1] == "ok", text
