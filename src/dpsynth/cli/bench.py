"""`dpsynth bench`: run a grid of methods on one dataset and write comparable results."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def bench(
    config: Path = typer.Argument(..., help="Bench configuration (YAML): base run config, variants, epsilons, seeds."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (default: bench/<name>)."),
) -> None:
    """Resumable grid; writes results.csv, results.md (Table-1 shape) and report.html."""
    from dpsynth.bench.grid import load_bench, run_grid
    from dpsynth.bench.report import html_report, markdown_table

    spec = load_bench(config)
    out = out or Path("bench") / spec.name
    rows = run_grid(spec, out, log=typer.echo)
    table = markdown_table(rows)
    (out / "results.md").write_text(table + "\n")
    (out / "report.html").write_text(html_report(rows, out, spec.name))
    typer.echo(table)
    typer.echo(f"written: {out}/results.csv, results.md, report.html")
