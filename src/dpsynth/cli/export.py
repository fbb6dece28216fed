"""`dpsynth export RUN`: a finished run's synthetic set as a Hugging Face dataset directory, Parquet or CSV."""

from __future__ import annotations

import shutil
from enum import Enum
from pathlib import Path

import typer

from dpsynth.errors import DpsynthError


class ExportFormat(str, Enum):
    hf = "hf"
    parquet = "parquet"
    csv = "csv"


def export(
    run_dir: Path = typer.Argument(..., help="A finished run directory."),
    fmt: ExportFormat = typer.Option(ExportFormat.parquet, "--format", "-f",
                                     help="hf: a datasets directory (save_to_disk) with the card; parquet; csv."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output path (default: beside the run, "
                                    "RUN-synthetic.parquet / .csv / -hf)."),
) -> None:
    """Write a finished run's synthetic set (text, label, plm, iteration; weight in a weighted run) where other
    tools read it."""
    from dpsynth.api import load_run
    from dpsynth.fs import atomic_write_bytes, atomic_write_text
    from dpsynth.runs.outputs import parquet_bytes

    result = load_run(run_dir)
    suffix = {"hf": "-hf", "parquet": "-synthetic.parquet", "csv": "-synthetic.csv"}[fmt.value]
    target = out or run_dir.parent / f"{run_dir.name}{suffix}"
    if target.exists() and fmt is ExportFormat.hf:
        raise DpsynthError(f"{target} exists; give another --out (a datasets directory is written whole)")
    frame = result.to_pandas()
    if fmt is ExportFormat.parquet:
        atomic_write_bytes(target, parquet_bytes(frame.to_dict("records")))
    elif fmt is ExportFormat.csv:
        atomic_write_text(target, frame.to_csv(index=False))
    else:
        try:
            from datasets import Dataset
        except ImportError as err:
            raise DpsynthError("--format hf writes with the `datasets` package: pip install 'dpsynth[hf]'") from err
        Dataset.from_pandas(frame, preserve_index=False).save_to_disk(str(target))
        card = run_dir / "README.md"
        if card.exists():
            shutil.copyfile(card, target / "README.md")
    typer.echo(f"wrote {target} ({len(frame)} samples, {fmt.value})")
