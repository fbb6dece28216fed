"""`dpsynth bench`: run a grid of methods on one dataset and write comparable results."""

from __future__ import annotations

from pathlib import Path

import typer

from dpsynth.errors import DpsynthError
from dpsynth.fs import atomic_write_text


def _test_labels(spec) -> list[str] | None:
    from dpsynth.data.public import load_test
    from dpsynth.runs.config import parse_config

    # only the data section matters here; a federated base would not parse as a (non-federated) zero-shot run
    base = {k: v for k, v in spec.base.items() if k != "federated"}
    test = load_test(parse_config({**base, "method": "zero-shot"}, "bench base", other_methods="drop"))
    return None if test is None else list(test.labels)


CLASSIFIER_HEADINGS = {
    "probe": "### Logistic-regression probe on MiniLM sentence embeddings",
    "finetune": "### Fine-tuned MiniLM encoder (the papers' small task model)",
}


def majority_line(labels: list[str] | None) -> str:
    """Always answering the test split's most frequent label: a floor for every row (its macro-F1 too)."""
    from collections import Counter

    if not labels:
        return ""
    label, count = Counter(labels).most_common(1)[0]
    f1 = 2 * count / (count + len(labels)) / len(set(labels))  # F1 of the majority class; 0 for every other
    return (f"Majority-class reference on the test split: accuracy {100 * count / len(labels):.2f}%, macro-F1 "
            f"{100 * f1:.2f}% ('{label}', n={len(labels)}).")


def bench(
    config: Path = typer.Argument(..., help="Bench configuration (YAML): base run config, variants, epsilons, seeds."),
    out: Path | None = typer.Option(None, "--out", "-o",
                                    help="Output directory (default: bench/ and the bench's name)."),
    run: bool = typer.Option(True, "--run/--report-only", help="--report-only: tables of the finished cells only."),
    only: list[str] | None = typer.Option(
        None, "--only", help="Run only this variant (repeatable) and the variants it is compared with; finished "
        "cells of the others are still reported."),
) -> None:
    """Compare methods over a resumable grid: results.csv, results.md (Table-1 shape), report.html.

    Several processes may run one grid into the same directory (one per core; Linux and macOS): each cell is run
    by one of them, and each waits for the cells the others run before it reports."""
    from dpsynth.bench.grid import load_bench, run_grid
    from dpsynth.bench.report import html_report, markdown_table
    from dpsynth.bench.spending import spending_note
    from dpsynth.bench.stats import paired_markdown

    spec = load_bench(config)
    out = out or Path("bench") / spec.name
    spending = spending_note(spec)
    if spending and run:
        typer.echo(f"note: {spending}", err=True)
    rows = run_grid(spec, out, log=typer.echo, run_missing=run, only=only or None)
    if not rows:
        raise DpsynthError(f"{out}: no finished cell to report")
    labels = _test_labels(spec)
    compare_with = {v.name: v.paired_with() for v in spec.variants if v.compare_with}
    paired = spec.baseline and any(
        r["variant"] in (spec.baseline, *(b for bs in compare_with.values() for b in bs)) for r in rows)
    sections = []
    for classifier in spec.classifiers:
        prefix = "ft_" if classifier == "finetune" else ""
        scored = [r for r in rows if r.get(prefix + "accuracy") is not None]
        parts = [CLASSIFIER_HEADINGS[classifier] + (f" ({len(scored)} of {len(rows)} cells scored)"
                                                     if len(scored) < len(rows) else ""),
                 markdown_table(scored, prefix + "accuracy"), markdown_table(scored, prefix + "macro_f1")]
        if paired:
            parts.append(paired_markdown(scored, spec.baseline, compare_with, prefix=prefix))
            if labels and all(r.get(prefix + "predicted") for r in scored):
                parts.append(paired_markdown(scored, spec.baseline, compare_with, truth=labels, prefix=prefix))
        sections.append("\n\n".join(p for p in parts if p))
    table = "\n\n".join(sections) + "\n\n" + majority_line(labels) + (f"\n\n{spending[0].upper()}{spending[1:]}"
                                                                          if spending else "")
    atomic_write_text(out / "results.md", table + "\n")  # bench processes sharing `out` may write at once
    atomic_write_text(out / "report.html", html_report(rows, out, spec.name))
    typer.echo(table)
    typer.echo(f"written: {out}/results.csv, results.md, report.html")
