"""Clean generated text; drop (and count) what is not a usable sample.

Small models echo the prompt, answer with a preamble ("Here is a review:"),
loop on a phrase or stop at once. Each such output is either repaired (strip a
preamble or quotes, keep the first paragraph) or dropped with a reason, and
the reasons are counted in the run's metrics: nothing is silently kept.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

_PREAMBLE = re.compile(
    r"^(sure[,!.]?\s*)?"
    r"(here('s| is)\s+(a|an|one|the)?\s*[^:\n]{0,60}:\s*|(new\s+)?(review|question|text|answer|message)\s*:\s*)",
    re.IGNORECASE,
)
_EXAMPLE_FORMAT = re.compile(r'^[^"\n]{0,200}?\bis:\s*"(?P<text>[^"]+)"?', re.IGNORECASE)
_ECHO_MARKERS = (
    "based on the above",
    "the above",
    "reply with",
    "good examples",
    "bad examples",
    "analyze the differences",
    " is: \"",
)
# a blank left as it was ("The _ notes on the _ joints"): Aug-PE's fill-in-the-blank prompt shows blanks as "_"
_UNFILLED_BLANK = re.compile(r"""(?:^|[\s(\['"])_+(?=[\s.,;:!?)\]'"]|$)""")
MIN_WORDS = 3


@dataclass
class CleaningStats:
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"kept": self.kept, "dropped": dict(self.dropped)}


def clean_generation(raw: str) -> tuple[str | None, str]:
    """(clean text, 'ok') or (None, reason): empty, preamble_only, prompt_echo, unfilled_blank, too_short,
    degenerate."""
    text = raw.strip()
    text = text.split("\n\n")[0].strip()
    example = _EXAMPLE_FORMAT.match(text) if ":" in text else None  # the format has a colon; most texts do not
    if example:  # the model wrote a new example in the prompt's own 'A ... is: "..."' format
        text = example.group("text")
    if text.endswith(":"):
        return None, "preamble_only"
    text = _PREAMBLE.sub("", text).strip()
    text = text.strip('"“”\'` ').strip()
    text = " ".join(text.split())
    if not text:
        return None, "empty"
    lowered = text.lower()
    if any(marker in lowered for marker in _ECHO_MARKERS):
        return None, "prompt_echo"
    if "_" in text and _UNFILLED_BLANK.search(text):
        return None, "unfilled_blank"
    words = lowered.split()
    if len(words) < MIN_WORDS:
        return None, "too_short"
    if _degenerate(words):
        return None, "degenerate"
    return text, "ok"


def _degenerate(words: list[str]) -> bool:
    if len(words) >= 12 and len(set(words)) / len(words) < 0.4:
        return True
    trigrams = list(zip(words, words[1:], words[2:]))
    if len(set(trigrams)) > len(trigrams) - 3:  # fewer than 3 repeats: no trigram can occur 4 times (most texts)
        return False
    return max(Counter(trigrams).values()) >= 4
