"""`dpsynth bench`: run a grid of methods on one dataset and write comparable results."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dpsynth.errors import DpsynthError


def majority_line(spec) -> str:
    """The accuracy of always answering the test split's most frequent label (a floor for every row)."""
    from collections import Counter

    from dpsynth.data.public import load_test
    from dpsynth.runs.config import parse_config

    raw = {**spec.base, "method": "fusegen"}
    test = load_test(parse_config(raw, "bench base"))
    if test is None:
        return ""
    label, count = Counter(test.labels).most_common(1)[0]
    return f"Majority-class reference on the test split: {100 * count / len(test):.2f}% ('{label}', n={len(test)})."


def bench(
    config: Path = typer.Argument(..., help="Bench configuration (YAML): base run config, variants, epsilons, seeds."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (default: bench/<name>)."),
    run: bool = typer.Option(True, "--run/--report-only", help="--report-only: tables of the finished cells only."),
) -> None:
    """Resumable grid; writes results.csv, results.md (Table-1 shape) and report.html."""
    from dpsynth.bench.grid import load_bench, run_grid
    from dpsynth.bench.report import html_report, markdown_table
    from dpsynth.bench.stats import paired_markdown

    spec = load_bench(config)
    out = out or Path("bench") / spec.name
    rows = run_grid(spec, out, log=typer.echo, run_missing=run)
    if not rows:
        raise DpsynthError(f"{out}: no finished cell to report")
    table = markdown_table(rows)
    compare_with = {v.name: v.paired_with() for v in spec.variants if v.compare_with}
    if spec.baseline and any(r["variant"] in (spec.baseline, *(b for bs in compare_with.values() for b in bs))
                             for r in rows):
        table += "\n\n" + paired_markdown(rows, spec.baseline, compare_with)
    table += "\n\n" + majority_line(spec)
    (out / "results.md").write_text(table + "\n")
    (out / "report.html").write_text(html_report(rows, out, spec.name))
    typer.echo(table)
    typer.echo(f"written: {out}/results.csv, results.md, report.html")
