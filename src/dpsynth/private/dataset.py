"""Load the private records of a run and check them against the task, before any budget is spent.

The checks that depend on private data (unknown labels, a label with no records, too few
records, delta not below 1/M) run here, inside the data holder, and their messages never
state an exact record count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpsynth.config import RunConfig
from dpsynth.data.corpora import get_corpus, sample_private, split
from dpsynth.data.loaders import load_labelled
from dpsynth.data.records import LabelledTexts, TaskSpec
from dpsynth.embed.sentence import Embedder
from dpsynth.errors import DpsynthError
from dpsynth.private.holder import CentralHolder


@dataclass(frozen=True)
class PrivateData:
    """The private records (in memory only) and, for per-party files, each record's party."""

    records: LabelledTexts
    party_of: np.ndarray | None = None


def load_private(config: RunConfig) -> PrivateData:
    """The private set: the user's file, per-party files, or M records drawn from a public corpus."""
    d, fed = config.data, config.federated
    if fed is not None and fed.partition == "nodes":
        # Deployment server: the private data stays at the SuperNodes; they check it themselves.
        return PrivateData(LabelledTexts([], []))
    if d.corpus is not None:
        return PrivateData(sample_private(split(get_corpus(d.corpus).load(), seed=0).train, d.m or 0,
                                          seed=config.seed))
    if fed is not None and fed.partition == "files":
        parts = [load_labelled(Path(f), d.text_column, d.label_column) for f in fed.party_files or []]
        records = LabelledTexts([t for p in parts for t in p.texts], [y for p in parts for y in p.labels])
        return PrivateData(records, np.concatenate([np.full(len(p), i) for i, p in enumerate(parts)]))
    assert d.private is not None
    return PrivateData(load_labelled(d.private, d.text_column, d.label_column))


def check_private(config: RunConfig, data: PrivateData, task: TaskSpec, *, min_records: tuple[int, str]) -> None:
    """`min_records`: the method's (fewest records, what to change), e.g. (8, "Q=8; lower wasp.q")."""
    fed = config.federated
    if fed is not None and fed.partition == "nodes":
        return
    where = config.data.private or f"corpus {config.data.corpus}"
    private = data.records
    unknown = sorted(set(private.labels) - set(task.labels))
    if unknown:
        raise DpsynthError(
            f"{where}: labels {unknown} are not described in task.labels ({', '.join(task.labels)}); add them")
    missing = [c for c in task.labels if c not in set(private.labels)]
    if missing:
        raise DpsynthError(
            f"{where}: label(s) {missing} have no private samples; remove them from task.labels or add data")
    if len(set(zip(private.texts, private.labels))) < len(private):
        # the exact number stays unsaid: it is a count of private records
        logging.getLogger("dpsynth").warning(
            "%s holds duplicate rows: the guarantee is per record, so a person with several identical rows is "
            "protected only as well as that many records; remove duplicates or set privacy.max_records_per_user",
            where)
    m = len(private)
    if m < min_records[0]:
        raise DpsynthError(f"{where}: the number of private samples is smaller than {min_records[1]}")
    if config.privacy.delta >= 1.0 / m:
        raise DpsynthError(
            f"privacy.delta={config.privacy.delta:g} is not < 1/M for this private set (M records); such a delta "
            "allows leaking a whole record. Use e.g. 1e-5")


def open_central_holder(config: RunConfig, task: TaskSpec, *, min_records: tuple[int, str], load: bool,
                        embedder: Embedder, **kw) -> CentralHolder:
    """Load and check the private records (before any budget is spent) and hold them; `load=False`
    for runs that never touch private data (no record is read)."""
    records = LabelledTexts([], [])
    if load:
        data = load_private(config)
        check_private(config, data, task, min_records=min_records)
        records = data.records
    return CentralHolder(records, task.label_names, embedder, **kw)
