"""Read a user's labelled texts from CSV, JSONL or Parquet, with one-line errors.

Every value the user wrote is kept: pandas' default NA strings (`NA`, `None`, `null`, `nan`, ...) are
texts and labels like any other, and only a cell that is really empty (or a JSON null / Parquet null)
is missing. Rows without a text or a label are dropped, and the user is told on the terminal how many
and why; the count never goes into a run's files (it is a count of private records).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from dpsynth.data.records import LabelledTexts
from dpsynth.errors import DpsynthError

SUPPORTED = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def load_labelled(path: str | Path, text_column: str = "text", label_column: str = "label") -> LabelledTexts:
    """Load and validate a labelled file; every problem names the file and the fix."""
    path = Path(path)
    if not path.exists():
        raise DpsynthError(f"{path}: file not found; check the path in your config")
    kind = SUPPORTED.get(path.suffix.lower())
    if kind is None:
        raise DpsynthError(f"{path}: unsupported format '{path.suffix}'; use one of {', '.join(SUPPORTED)}")
    if path.stat().st_size == 0:
        raise DpsynthError(f"{path}: file is empty; it needs a header and at least one labelled row")
    try:
        frame = _read(path, kind)
    except UnicodeDecodeError as err:
        raise DpsynthError(f"{path}: not valid UTF-8 ({err.reason} at byte {_first_bad_byte(path, err)}); "
                           "re-save it as UTF-8") from err
    except (ValueError, pd.errors.ParserError, OSError) as err:
        raise DpsynthError(f"{path}: cannot be parsed as {kind} ({str(err).splitlines()[0]})") from err
    for role, column in (("text", text_column), ("label", label_column)):
        if column not in frame.columns:
            raise DpsynthError(
                f"{path}: {role} column '{column}' not found; columns are: {', '.join(map(str, frame.columns))} "
                f"(set {role}_column in the config)"
            )
    texts = [_cell(t) for t in frame[text_column]]
    labels = [_cell(y) for y in frame[label_column]]
    keep = [i for i, (t, y) in enumerate(zip(texts, labels)) if t and y]
    if not keep:
        raise DpsynthError(f"{path}: no rows with both a '{text_column}' and a '{label_column}' value")
    if len(keep) < len(texts):
        no_text = sum(1 for t in texts if not t)
        no_label = sum(1 for t, y in zip(texts, labels) if t and not y)
        print(f"dpsynth: {path}: kept {len(keep)} of {len(texts)} rows; dropped {no_text} with an empty "
              f"'{text_column}' and {no_label} with an empty '{label_column}' (this count is shown here only)",
              file=sys.stderr)
    return LabelledTexts([texts[i] for i in keep], [labels[i] for i in keep])


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
