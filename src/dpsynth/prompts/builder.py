"""Build generation requests from the public task description and synthetic examples only.

This module is the privacy boundary on the generation side: its inputs are a
`TaskSpec` and synthetic texts, nothing else, so no code path can put a
private text into a prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib.resources import files
from typing import Any

import yaml

from dpsynth.data.records import TaskSpec
from dpsynth.llm.base import GenerationRequest


@cache
def load_templates(name: str = "wasp") -> dict:
    return yaml.safe_load(files("dpsynth.prompts").joinpath("templates", f"{name}.yaml").read_text())


@dataclass(frozen=True)
class PromptSettings:
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 0.95


def build_request(
    task: TaskSpec,
    label: str,
    *,
    chat: bool,
    good: Sequence[str] = (),
    bad: Sequence[str] = (),
    settings: PromptSettings = PromptSettings(),
    seed: int = 0,
    templates: str = "wasp",
) -> GenerationRequest:
    """Zero-shot without examples, contrastive with bad+good, plain few-shot with good only."""
    t = load_templates(templates)
    style = t["chat" if chat else "completion"]
    fields = {
        "description": task.description or f"Examples of {task.text_kind}s.",
        "text_kind": task.text_kind,
        "label": label,
        "label_description": task.labels[label],
    }
    if not good and not bad:
        body = style["zero_shot"].format(**fields)
    else:
        lines = [t["example_bad"].format(text=_one_line(x), **fields) for x in bad]
        example = t["example_good"] if bad else t["example_plain"]
        lines += [example.format(text=_one_line(x), **fields) for x in good]
        body = style["contrastive" if bad else "few_shot"].format(examples="\n".join(lines), **fields)
    common: dict[str, Any] = dict(max_tokens=settings.max_tokens, temperature=settings.temperature,
                                 top_p=settings.top_p, seed=seed)
    if chat:
        return GenerationRequest(messages=(("user", body),), **common)
    return GenerationRequest(prompt=body, stop=('"', "\n"), **common)


def build_variation_request(
    task: TaskSpec,
    label: str,
    parent: str,
    *,
    chat: bool,
    kind: str,
    rng_seed: int,
    fill_ratio: float = 0.3,
    settings: PromptSettings = PromptSettings(),
) -> GenerationRequest:
    """Aug-PE's variation API: paraphrase `parent`, or fill in a copy with ~fill_ratio of its words blanked."""
    import numpy as np

    style = load_templates("augpe")["chat" if chat else "completion"]
    words = _one_line(parent).split()
    rng = np.random.default_rng(rng_seed)
    masked = " ".join("_" if rng.random() < fill_ratio else w for w in words)
    body = style[kind].format(
        description=task.description or f"Examples of {task.text_kind}s.",
        text_kind=task.text_kind,
        label=label,
        label_description=task.labels[label],
        text=" ".join(words),
        masked=masked,
        words=max(3, len(words)),
    )
    common: dict[str, Any] = dict(max_tokens=settings.max_tokens, temperature=settings.temperature,
                                 top_p=settings.top_p, seed=rng_seed)
    if chat:
        return GenerationRequest(messages=(("user", body),), **common)
    return GenerationRequest(prompt=body, stop=('"', "\n"), **common)


@lru_cache(maxsize=4096)
def _one_line(text: str) -> str:
    """`text` on one line, its double quotes made single (a prompt quotes its examples). Cached: WASP shows the
    same few selected examples in thousands of prompts an iteration."""
    return " ".join(text.replace('"', "'").split())


def build_dpga_request(
    task: TaskSpec,
    label: str,
    kind: str,
    *,
    chat: bool,
    seed: int,
    settings: PromptSettings = PromptSettings(),
    keyword: str = "",
    words: int = 0,
    first: str = "",
    second: str = "",
    count: int = 0,
) -> GenerationRequest:
    """DPGA-TextSyn's requests: `keywords` (sub-topics from the public label description), `generate`
    (from DP metadata: a keyword and a target length) and `crossover` (two elite synthetic samples)."""
    style = load_templates("dpga")["chat" if chat else "completion"]
    body = style[kind].format(
        description=task.description or f"Examples of {task.text_kind}s.",
        text_kind=task.text_kind,
        label=label,
        label_description=task.labels[label],
        keyword=keyword,
        words=max(3, words),
        first=_one_line(first),
        second=_one_line(second),
        count=count,
    )
    common: dict[str, Any] = dict(max_tokens=settings.max_tokens, temperature=settings.temperature,
                                 top_p=settings.top_p, seed=seed)
    if chat:
        return GenerationRequest(messages=(("user", body),), **common)
    stop = ("\n\n",) if kind == "keywords" else ('"', "\n")
    return GenerationRequest(prompt=body, stop=stop, **common)
