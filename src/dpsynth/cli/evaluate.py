"""`dpsynth eval`: score a run's synthetic data on a real test set."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from dpsynth.data.records import LabelledTexts


class Classifier(str, Enum):
    probe = "probe"
    finetune = "finetune"


def evaluate(
    run_dir: Path = typer.Argument(..., help="A finished run directory."),
    test: str = typer.Option(..., "--test", help="Real labelled test file, or corpus:NAME for a corpus' test split."),
    text_column: str = typer.Option("text", "--text-column"),
    label_column: str = typer.Option("label", "--label-column"),
    classifier: Classifier = typer.Option(Classifier.probe, "--classifier",
                                          help="probe (fast) or finetune (MiniLM encoder, slower)."),
    mauve: bool = typer.Option(True, "--mauve/--no-mauve"),
) -> None:
    """Downstream accuracy, FID, MAUVE, precision/recall and diversity; writes RUN_DIR/eval.json."""
    from dpsynth.evaluate.run_eval import evaluate_run, load_run, summary_rows

    load_run(run_dir)  # check the run (config.yaml, synthetic.jsonl) before loading the test set or any model
    result = evaluate_run(run_dir, _load_test(test, text_column, label_column), classifier=classifier.value,
                          with_mauve=mauve)
    for line in summary_rows(result):
        typer.echo(line)
    typer.echo(f"written: {run_dir}/eval.json")


def _load_test(test: str, text_column: str, label_column: str) -> LabelledTexts:
    if test.startswith("corpus:"):
        from dpsynth.data.corpora import get_corpus, split

        return split(get_corpus(test.removeprefix("corpus:")).load(), seed=0).test
    from dpsynth.data.loaders import load_labelled

    return load_labelled(test, text_column, label_column)
