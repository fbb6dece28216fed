"""`dpsynth report RUN_DIR`: a self-contained HTML page for one finished run."""

from __future__ import annotations

from pathlib import Path

import typer

from dpsynth.fs import atomic_write_text


def report(
    run_dir: Path = typer.Argument(..., help="A finished run directory."),
    out: Path | None = typer.Option(None, "--out", "-o", help="HTML file (default: RUN_DIR/report.html)."),
) -> None:
    """Privacy per release, samples and weights per iteration, signal to noise, scores, examples."""
    from dpsynth.bench.run_report import run_report

    page = run_report(run_dir)
    target = out or run_dir / "report.html"
    atomic_write_text(target, page)
    typer.echo(f"written: {target}")
