"""`dpsynth eval`: score a run's synthetic data on a real test set."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer


class Classifier(str, Enum):
    probe = "probe"
    finetune = "finetune"


class Weights(str, Enum):
    auto = "auto"
    none = "none"
    swa = "swa"


def evaluate(
    run_dir: Path = typer.Argument(..., help="A finished run directory."),
    test: str | None = typer.Option(None, "--test", help="Real labelled test file, or corpus:NAME for a corpus' test "
                                    "split; default: the run's own (data.test, or its corpus' test split)."),
    text_column: str | None = typer.Option(None, "--text-column",
                                           help="default: the run's data.text_column"),
    label_column: str | None = typer.Option(None, "--label-column",
                                            help="default: the run's data.label_column"),
    classifier: Classifier = typer.Option(Classifier.probe, "--classifier",
                                          help="probe (fast) or finetune (MiniLM encoder, slower)."),
    mauve: bool = typer.Option(True, "--mauve/--no-mauve"),
    weights: Weights = typer.Option(Weights.auto, "--weights",
                                    help="classifier sample weights: auto (the run's own, e.g. FuseGen's), none, "
                                         "or swa (FuseGen's self-boosting weights for any run's set)."),
) -> None:
    """Downstream accuracy, FID, MAUVE, precision/recall and diversity; writes RUN_DIR/eval.json."""
    from dpsynth.data.public import say_test_scores_are_unnoised
    from dpsynth.data.public import test_set as load_test_set
    from dpsynth.errors import require
    from dpsynth.evaluate.run_eval import evaluate_run, load_run, summary_rows

    config, rows = load_run(run_dir)  # check the run (config.yaml, synthetic.jsonl) before loading any model
    if mauve:
        require("mauve", "eval", "MAUVE (--no-mauve leaves it out)")
    data = config.get("data") or {}
    test = test or _runs_own_test(data, run_dir)
    test_set = load_test_set(test, text_column or data.get("text_column") or "text",
                             label_column or data.get("label_column") or "label")
    check_labels_match({str(r["label"]) for r in rows}, set(test_set.labels), test)
    say_test_scores_are_unnoised(test)
    result = evaluate_run(run_dir, test_set, classifier=classifier.value, with_mauve=mauve, weights=weights.value)
    for line in summary_rows(result):
        typer.echo(line)
    typer.echo(f"written: {run_dir}/eval.json")


def _runs_own_test(data: dict, run_dir: Path) -> str:
    """The test set the run itself was configured with: its corpus' test split or its data.test file."""
    from dpsynth.errors import DpsynthError

    if data.get("corpus"):
        return f"corpus:{data['corpus']}"
    if data.get("test"):
        return str(data["test"])
    raise DpsynthError(f"{run_dir}: the run has no test set (data.test); give one with --test FILE")


def check_labels_match(synthetic: set[str], test: set[str], where: str) -> None:
    """A test set that shares no label with the run scores 0 whatever the data: refuse it; one that shares
    only some scores the rest as errors: say so."""
    from dpsynth.errors import DpsynthError, warn_user

    if not synthetic & test:
        raise DpsynthError(f"{where}: its labels ({', '.join(sorted(test))}) share none with the run's "
                           f"({', '.join(sorted(synthetic))}); give the test set of this task (or --label-column)")
    if test - synthetic:
        warn_user(f"{where}: labels {sorted(test - synthetic)} have no synthetic sample, so every test example of "
                  "them counts as an error")
