"""Read a user's labelled texts from CSV, JSONL or Parquet, with one-line errors.

Every value the user wrote is kept: pandas' default NA strings (`NA`, `None`, `null`, `nan`, ...) are
texts and labels like any other, and only a cell that is really empty (or a JSON null / Parquet null)
is missing. Rows without a text or a label are dropped, and the user is told on the terminal how many
and why; the count never goes into a run's files (it is a count of private records).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dpsynth.data.records import LabelledTexts
from dpsynth.errors import DpsynthError

SUPPORTED = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def load_labelled(path: str | Path, text_column: str = "text", label_column: str = "label") -> LabelledTexts:
    """Load and validate a labelled file; every problem names the file and the fix."""
    return load_records(path, text_column, label_column).records


@dataclass(frozen=True)
class LoadedRecords:
    """The labelled texts of a file and, when a person column is read, each record's person id."""

    records: LabelledTexts
    persons: list[str] | None = None


def load_records(path: str | Path, text_column: str = "text", label_column: str = "label",
                 person_column: str | None = None, *, quiet: bool = False) -> LoadedRecords:
    """Load and validate a labelled file (and its person column); every problem names the file and the fix."""
    path = Path(path)
    return records_from_frame(read_table(path), str(path), text_column, label_column, person_column, quiet=quiet)


def read_table(path: Path) -> pd.DataFrame:
    """A CSV/TSV/JSONL/Parquet file as a frame of strings, or a one-line error naming the file."""
    if not path.exists():
        where = "" if path.is_absolute() else f" (a relative path is read from the current folder, {Path.cwd()})"
        raise DpsynthError(f"{path}: file not found{where}; check the path in your config")
    kind = SUPPORTED.get(path.suffix.lower())
    if kind is None:
        raise DpsynthError(f"{path}: unsupported format '{path.suffix}'; use one of {', '.join(SUPPORTED)}")
    if path.stat().st_size == 0:
        raise DpsynthError(f"{path}: file is empty; it needs a header and at least one labelled row")
    try:
        return _read(path, kind)
    except UnicodeDecodeError as err:
        raise DpsynthError(f"{path}: not valid UTF-8 ({err.reason} at byte {_first_bad_byte(path, err)}); "
                           "re-save it as UTF-8") from err
    except (ValueError, pd.errors.ParserError, OSError) as err:
        raise DpsynthError(f"{path}: cannot be parsed as {kind} ({str(err).splitlines()[0]})") from err


def records_from_frame(frame: pd.DataFrame, where: str, text_column: str = "text", label_column: str = "label",
                       person_column: str | None = None, *, quiet: bool = False) -> LoadedRecords:
    """The rows of `frame` that have every needed value; the others are dropped and counted on the terminal
    only (unless `quiet`). `where` names the source in messages (a path, or 'the DataFrame')."""
    roles = [("text", text_column), ("label", label_column)] + ([("person", person_column)] if person_column else [])
    for role, column in roles:
        if column not in frame.columns:
            raise DpsynthError(
                f"{where}: {role} column '{column}' not found; columns are: {', '.join(map(str, frame.columns))} "
                f"(set data.{role}_column in the config"
                + (f", or --{role}-column with `dpsynth eval --test`)" if role != "person" else ")")
            )
    cells = {role: [_cell(v) for v in frame[column]] for role, column in roles}
    keep = [i for i in range(len(frame)) if all(cells[role][i] for role, _ in roles)]
    if not keep:
        needed = " and ".join(f"'{column}'" for _, column in roles)
        raise DpsynthError(f"{where}: no rows with a value in each of {needed}")
    if len(keep) < len(frame) and not quiet:
        first_missing = [next((c for r, c in roles if not cells[r][i]), None) for i in range(len(frame))]
        counts = " and ".join(f"{first_missing.count(c)} with an empty '{c}'" for _, c in roles
                              if c in first_missing)
        print(f"dpsynth: {where}: kept {len(keep)} of {len(frame)} rows; dropped {counts} (this count is shown "
              "here only)", file=sys.stderr)
    records = LabelledTexts([cells["text"][i] for i in keep], [cells["label"][i] for i in keep])
    persons = [cells["person"][i] for i in keep] if person_column else None
    return LoadedRecords(records, persons)


def _cell(value: object) -> str:
    """A cell as text; a missing value (JSON/Parquet null, float NaN) is the empty string."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value).strip()


def _read(path: Path, kind: str) -> pd.DataFrame:
    if kind == "csv":
        return pd.read_csv(path, encoding="utf-8", dtype=str, keep_default_na=False)
    if kind == "tsv":
        return pd.read_csv(path, sep="\t", encoding="utf-8", dtype=str, keep_default_na=False)
    if kind == "jsonl":
        return pd.read_json(path, lines=True, encoding="utf-8", dtype=False)
    return pd.read_parquet(path)



def _first_bad_byte(path: Path, err: UnicodeDecodeError) -> int:
    """The offset of the first invalid byte in the whole file (the parser reports one within its chunk)."""
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as whole:
        return whole.start
    return err.start
