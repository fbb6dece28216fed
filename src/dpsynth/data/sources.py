"""Where a user's labelled records come from: a file, a Hugging Face `datasets` directory or Hub id, or a
pandas DataFrame / `datasets.Dataset` handed over in Python. Each becomes one pandas frame, and
`loaders.records_from_frame` turns every kind into records the same way (same checks, same messages).

`datasets` is optional (the `hf` extra): it is imported only when a `datasets` source is used, and its
absence is a one-line error that names the install command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from dpsynth.data.loaders import LoadedRecords, read_table, records_from_frame
from dpsynth.errors import DpsynthError

GIVEN = "the records given in Python"


def is_dataset_dir(path: Path) -> bool:
    """A directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`."""
    return path.is_dir() and any((path / name).exists() for name in ("dataset_info.json", "dataset_dict.json",
                                                                     "state.json"))


def load_source(*, path: Path | None = None, hub: str | None = None, given: Any = None, split: str = "train",
                text_column: str = "text", label_column: str = "label", person_column: str | None = None,
                quiet: bool = False) -> LoadedRecords:
    """The records of exactly one source; every problem is a one-line `DpsynthError` naming the source."""
    if given is not None:
        frame, where = frame_of(given, split, GIVEN), GIVEN
    elif hub is not None:
        frame, where = _hub_frame(hub, split), f"Hub dataset {hub}"
    elif path is not None:
        where = str(path)
        if path.is_dir():
            if not is_dataset_dir(path):
                raise DpsynthError(f"{path}: a directory, but not one written by datasets' save_to_disk (no "
                                   "dataset_info.json or dataset_dict.json); give a data file or such a directory")
            frame = frame_of(_datasets().load_from_disk(str(path)), split, where)
        else:
            frame = read_table(path)
    else:
        raise ValueError("load_source needs a path, a Hub id or given records")
    return records_from_frame(frame, where, text_column, label_column, person_column, quiet=quiet)


def frame_of(data: Any, split: str, where: str) -> pd.DataFrame:
    """A pandas frame of a DataFrame, a `datasets.Dataset`, or one split of a `datasets.DatasetDict`."""
    if isinstance(data, pd.DataFrame):
        return data
    kind = type(data).__name__
    if kind == "DatasetDict":
        if split not in data:
            raise DpsynthError(f"{where}: no split '{split}'; splits are: {', '.join(data)} (set data.split)")
        data = data[split]
        kind = type(data).__name__
    if kind == "Dataset":
        return data.to_pandas()
    raise DpsynthError(f"{where}: a {kind}; give a pandas DataFrame, a datasets.Dataset or a DatasetDict")


def _hub_frame(hub: str, split: str) -> pd.DataFrame:
    """A Hub dataset's split (the real `datasets.load_dataset` path for online users); offline, one line."""
    datasets = _datasets()
    try:
        data = datasets.load_dataset(hub, split=split)
    except (ConnectionError, OSError, ValueError, FileNotFoundError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DpsynthError(f"Hub dataset {hub} (split {split}) could not be loaded ({first}); check the id and "
                           "the connection, or save it with save_to_disk and give that directory as "
                           "data.private") from err
    return frame_of(data, split, f"Hub dataset {hub}")


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as err:
        raise DpsynthError("Hugging Face datasets are read with the `datasets` package: pip install "
                           "'dpsynth[hf]' (or pip install datasets)") from err
    return datasets
