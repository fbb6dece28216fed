"""Load the private records of a run and check them against the task, before any budget is spent.

The checks that depend on private data (unknown labels, a label with no records, too few
records, delta not below 1/M) run here, inside the data holder, and their messages never
state an exact record count.

With `data.person_column` the unit of privacy is a person: before anything else sees the records,
each person keeps at most k = `privacy.max_records_per_user` of them, so that every release's
sensitivity (that of k records for the count histograms, one record's where a person's votes or gradients are
clipped as a whole) holds for a whole person. Which k are kept is decided per person
by a keyed hash of that person's own records under a fixed salt (or one drawn from `noise_seed`), so
adding or removing one person changes no other person's selection: neighbouring data sets stay at
most k records apart after the bound, which is what the accounting assumes. The salt need not be secret
(the bound holds for any choice that depends on the person's own records only) but must be the same at
every load of a run: the check before it starts, the run and its resumes keep the same records.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.config import RunConfig
from dpsynth.data.corpora import get_corpus, sample_private, split
from dpsynth.data.loaders import LoadedRecords, load_labelled
from dpsynth.data.records import LabelledTexts, TaskSpec
from dpsynth.data.sources import GIVEN, load_source
from dpsynth.embed.sentence import Embedder
from dpsynth.errors import DpsynthError
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.private.holder import CentralHolder


@dataclass(frozen=True)
class PrivateData:
    """The private records (in memory only) and, for per-party files, each record's party; with a person
    column, each record's person (an index; the ids themselves are not kept)."""

    records: LabelledTexts
    party_of: np.ndarray | None = None
    person_of: np.ndarray | None = None
    labels_before_cut: frozenset[str] | None = None  # with a person column: the labels the file holds


def load_private(config: RunConfig, *, quiet: bool = False, given: Any = None) -> PrivateData:
    """The private set: the user's file or datasets directory, a Hub dataset, the records `given` in Python
    (DataFrame or Dataset, with data.in_memory), per-party files, or M records drawn from a public corpus.
    `quiet`: say nothing about dropped rows (a check ahead of the load that will say it)."""
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
    loaded = read_private_file(config, quiet=quiet, given=given)
    if loaded.persons is None:
        return PrivateData(loaded.records)
    k = config.privacy.max_records_per_user
    bounded = bound_per_person(loaded, k, person_bound_salt(config.privacy.noise_seed))
    bounded = replace(bounded, labels_before_cut=frozenset(loaded.records.labels))
    dropped = len(loaded.records) - len(bounded.records)
    if dropped and not quiet:
        cut = int(np.sum(np.bincount(_person_index(loaded.persons)) > k))
        print(f"dpsynth: {source_name(config)}: kept at most {k} records per person ('{d.person_column}'): "
              f"dropped {dropped} records of {cut} persons (this count is shown here only)", file=sys.stderr)
    return bounded


def read_private_file(config: RunConfig, *, quiet: bool = False, given: Any = None) -> LoadedRecords:
    """The user's private records as written (with the person ids when data.person_column is set), unbounded:
    for the holder's own use (the bound is applied by `load_private`)."""
    d = config.data
    if given is not None and not d.in_memory:
        raise DpsynthError("records were given in Python, but this run reads its data from its config "
                           f"({source_name(config)}); give private= only for a run made with records in memory")
    if d.in_memory and given is None:
        raise DpsynthError("data.in_memory: this run's private records were given in Python; give them again "
                           "(dpsynth.synthesize(config, private=..., resume=True))")
    return load_source(path=d.private, hub=d.hub, given=given if d.in_memory else None, split=d.split,
                       text_column=d.text_column, label_column=d.label_column, person_column=d.person_column,
                       quiet=quiet)


def source_name(config: RunConfig) -> str:
    """How messages name the private data (never a count or a record)."""
    d = config.data
    if d.corpus is not None:
        return f"corpus {d.corpus}"
    if d.hub is not None:
        return f"Hub dataset {d.hub}"
    return GIVEN if d.in_memory else str(d.private)


PERSON_BOUND_SALT = hashlib.blake2b(b"dpsynth person bound v1", digest_size=32).digest()


def person_bound_salt(noise_seed: int | None) -> bytes:
    """The same at every load of a run. A salt drawn at each load (as before) let the check before a run pass
    and the run itself, or its resume, keep other records and fail (a label left without records), and mixed
    two selections in one run's releases."""
    if noise_seed is None:
        return PERSON_BOUND_SALT
    return NoiseSource(noise_seed).stream("person-bound").bytes(32)


def bound_per_person(loaded: LoadedRecords, k: int, salt: bytes) -> PrivateData:
    """At most k records of each person: the k whose keyed hash (salt, person, label, text) is smallest, the
    file's order breaking ties between identical records. A person's selection depends on their own records
    and the salt only."""
    if loaded.persons is None:
        raise ValueError("bound_per_person needs the records' persons")
    records, persons = loaded.records, loaded.persons

    def key(i: int) -> bytes:
        row = "\x00".join((persons[i], records.labels[i], records.texts[i])).encode()
        return hashlib.blake2b(row, key=salt, digest_size=16).digest()

    keys = [key(i) for i in range(len(records))]
    taken: Counter[str] = Counter()
    kept: list[int] = []
    for i in sorted(range(len(records)), key=lambda i: (keys[i], i)):
        if taken[persons[i]] < k:
            taken[persons[i]] += 1
            kept.append(i)
    kept.sort()  # the file's order, so that nothing downstream sees the hash order
    index = _person_index(persons)
    return PrivateData(records.subset(kept), person_of=index[kept])


def _person_index(persons: list[str]) -> np.ndarray:
    """Each record's person as 0..P-1 (first appearance order)."""
    ids: dict[str, int] = {}
    return np.array([ids.setdefault(p, len(ids)) for p in persons], dtype=np.int64)


def check_private(config: RunConfig, data: PrivateData, task: TaskSpec, *, min_records: tuple[int, str]) -> None:
    """`min_records`: the method's (fewest records, what to change), e.g. (8, "Q=8; lower wasp.q")."""
    fed = config.federated
    if fed is not None and fed.partition == "nodes":
        return
    where = source_name(config)
    private = data.records
    unknown = sorted(set(private.labels) - set(task.labels))
    if unknown:  # a few, shortened: a wrong label column would otherwise print private texts or ids in full
        shown = ", ".join(repr(v if len(v) <= 30 else v[:27] + "...") for v in unknown[:3])
        more = ", and more" if len(unknown) > 3 else ""
        raise DpsynthError(f"{where}: labels {shown}{more} are not described in task.labels "
                           f"({', '.join(task.labels)}); add them, or check data.label_column")
    missing = [c for c in task.labels if c not in set(private.labels)]
    if missing:
        cut = data.labels_before_cut is not None and all(c in data.labels_before_cut for c in missing)
        after = (f" after keeping at most {config.privacy.max_records_per_user} record(s) per person "
                 f"('{config.data.person_column}')" if cut else "")
        raise DpsynthError(f"{where}: label(s) {missing} have no private samples{after}; remove them from "
                           "task.labels or add data" + (" (or raise privacy.max_records_per_user)" if after else ""))
    if config.data.person_column is None and len(set(zip(private.texts, private.labels))) < len(private):
        # the exact number stays unsaid: it is a count of private records
        logging.getLogger("dpsynth").warning(
            "%s holds duplicate rows: the guarantee is per record, so a person with several identical rows is "
            "protected only as well as that many records; remove duplicates, or give data.person_column and "
            "privacy.max_records_per_user",
            where)
    m = len(private)
    if m < min_records[0]:
        raise DpsynthError(f"{where}: the number of private samples is smaller than {min_records[1]}")
    if config.privacy.delta >= 1.0 / m:
        raise DpsynthError(
            f"{where}: privacy.delta={config.privacy.delta:g} is not < 1/M, M being the number of private records "
            "(not shown: it is private); such a delta allows leaking a whole record. Use e.g. 1e-5")


def open_central_holder(config: RunConfig, task: TaskSpec, *, min_records: tuple[int, str], load: bool,
                        embedder: Embedder, given: Any = None, **kw) -> CentralHolder:
    """Load and check the private records (before any budget is spent) and hold them; `load=False`
    for runs that never touch private data (no record is read)."""
    data = PrivateData(LabelledTexts([], []))
    if load:
        data = load_private(config, given=given)
        check_private(config, data, task, min_records=min_records)
    return CentralHolder(data.records, task.label_names, embedder, persons=data.person_of, **kw)
