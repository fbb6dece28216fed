"""Labelled texts and the task they belong to."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class LabelledTexts:
    """Parallel lists of texts and string labels."""

    texts: list[str]
    labels: list[str]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise ValueError("texts and labels differ in length")

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, index: np.ndarray | list[int]) -> LabelledTexts:
        return LabelledTexts([self.texts[i] for i in index], [self.labels[i] for i in index])

    def label_ids(self, label_names: list[str]) -> np.ndarray:
        lookup = {name: i for i, name in enumerate(label_names)}
        return np.array([lookup[label] for label in self.labels], dtype=np.int64)


@dataclass(frozen=True)
class TaskSpec:
    """Public description of the task: what the texts are and what each label means.

    This is all a generator ever learns about the private data besides noisy
    votes, so it must not contain private text.
    """

    text_kind: str = field(metadata={"help": "short noun phrase, e.g. 'movie review'"})
    labels: dict[str, str] = field(metadata={"help": "label -> description used in prompts"})
    description: str = field(default="", metadata={"help": "one sentence on what the texts look like"})
    name: str = "task"

    @property
    def label_names(self) -> list[str]:
        return list(self.labels)
