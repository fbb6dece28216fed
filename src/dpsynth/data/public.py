"""Public inputs of a run: the task description and the real test set used only for evaluation (public when it is
a corpus' split; a user's own test file is outside the guarantee, `say_test_scores_are_unnoised`)."""

from __future__ import annotations

import sys

from dpsynth.config import RunConfig
from dpsynth.data.corpora import get_corpus, split
from dpsynth.data.loaders import load_labelled
from dpsynth.data.records import LabelledTexts, TaskSpec


def task_for(config: RunConfig) -> TaskSpec:
    """The config's task, or the corpus' own description when the config gives none."""
    if config.task is not None:
        t = config.task
        return TaskSpec(t.text_kind, t.labels, description=t.description)
    assert config.data.corpus is not None  # the config validator requires one of the two
    return get_corpus(config.data.corpus).task


def load_test(config: RunConfig) -> LabelledTexts | None:
    """The real test split: the corpus' fixed split, or the user's data.test file (never used to generate)."""
    d = config.data
    if d.corpus is not None:
        return split(get_corpus(d.corpus).load(), seed=0).test
    return test_set(str(d.test), d.text_column, d.label_column) if d.test else None


def say_test_scores_are_unnoised(source: str) -> None:
    """One terminal line where a user's own test file is evaluated: its scores are functions of its records, read
    without noise (a corpus' test split is public)."""
    if not source.startswith("corpus:"):
        print(f"dpsynth: {source}: the test set is read without noise, so its scores (metrics.json, eval.json) are "
              "outside the DP guarantee: give public texts, or keep those files with the data holder",
              file=sys.stderr)


def test_set(source: str, text_column: str = "text", label_column: str = "label") -> LabelledTexts:
    """A labelled test file, or `corpus:NAME` for a public corpus' fixed test split."""
    if source.startswith("corpus:"):
        return split(get_corpus(source.removeprefix("corpus:")).load(), seed=0).test
    return load_labelled(source, text_column, label_column)
