"""Person-level DP (issue 36): the data holder bounds each person to k records, a count histogram's sensitivity is
that of k records and a vote release's one record's (each person's votes are clipped to one record's norm), and
settings that cannot keep the promise are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpsynth.data.loaders import LoadedRecords, load_records
from dpsynth.data.public import task_for
from dpsynth.data.records import LabelledTexts
from dpsynth.errors import DpsynthError
from dpsynth.privacy.accountant import Adjacency
from dpsynth.privacy.sensitivity import vote_sensitivity
from dpsynth.private.dataset import bound_per_person, load_private
from dpsynth.runs.config import parse_config
from dpsynth.runs.planning import plan_privacy
from dpsynth.voting.spec import VoteSpec, compute_votes

SALT = b"s" * 32
HISTOGRAM = VoteSpec(kind="rank", weights=(1.0,))  # `resample:`'s cluster histogram: nearest centroid of its label


def _people(rng: np.random.Generator, sizes: list[int], labels: int = 2) -> LoadedRecords:
    """Persons p0, p1, ... with the given numbers of records; record i's text is 'r<i>' (its embedding row)."""
    persons = [f"p{p}" for p, size in enumerate(sizes) for _ in range(size)]
    n = len(persons)
    return LoadedRecords(LabelledTexts([f"r{i}" for i in range(n)], [str(y) for y in rng.integers(0, labels, n)]),
                         persons)


def _without(loaded: LoadedRecords, person: str) -> LoadedRecords:
    keep = [i for i, p in enumerate(loaded.persons or []) if p != person]
    return LoadedRecords(loaded.records.subset(keep), [loaded.persons[i] for i in keep])


def _heavy_person_and_newcomer(rng: np.random.Generator, sizes: list[int], *, extra: int,
                               d: int = 5) -> tuple[LoadedRecords, np.ndarray]:
    """Persons of these sizes whose p0 holds identical records of label 0, and embeddings (rows 'r<i>') with
    `extra` rows after them pointing the other way, for a newcomer replacing a person."""
    loaded = _people(rng, sizes)
    n = len(loaded.records)
    emb = rng.normal(size=(n + extra, d))
    heavy = [i for i, p in enumerate(loaded.persons or []) if p == "p0"]
    emb[heavy] = emb[heavy[0]]
    emb[n:] = -emb[heavy[0]]
    for i in heavy:
        loaded.records.labels[i] = "0"
    return loaded, emb


def _rows(records: LabelledTexts) -> set[tuple[str, str]]:
    return set(zip(records.texts, records.labels))


def test_bound_keeps_at_most_k_of_each_person_whatever_the_others() -> None:
    """A person's selection depends on their own records and the salt only: removing another person changes
    nothing else, which keeps neighbouring data sets at most k records apart after the bound."""
    rng = np.random.default_rng(0)
    loaded = _people(rng, [5, 1, 3, 7, 2])
    bounded = bound_per_person(loaded, 2, SALT)
    assert np.bincount(bounded.person_of).max() == 2 and len(bounded.records) == 2 + 1 + 2 + 2 + 2
    assert bounded.records.texts == sorted(bounded.records.texts, key=lambda t: int(t[1:]))  # the file's order
    for person in sorted(set(loaded.persons or [])):
        smaller = bound_per_person(_without(loaded, person), 2, SALT)
        mine = {t for t, p in zip(loaded.records.texts, loaded.persons or []) if p == person}
        assert _rows(smaller.records) == {r for r in _rows(bounded.records) if r[0] not in mine}
    assert _rows(bound_per_person(loaded, 2, SALT).records) == _rows(bounded.records)  # same salt, same choice
    others = [_rows(bound_per_person(loaded, 2, bytes([b]) * 32).records) for b in range(8)]
    assert len({frozenset(x) for x in others}) > 1  # the salt decides which k


@pytest.mark.parametrize("spec", [VoteSpec(kind="wasp", q=2), VoteSpec(kind="rank", weights=(1.0, 0.5)),
                                  HISTOGRAM, VoteSpec(kind="label_counts"), VoteSpec(kind="popri"),
                                  VoteSpec(kind="embedding_sums")], ids=lambda s: s.kind)
@pytest.mark.parametrize("k", [1, 3])
def test_brute_force_over_neighbours_that_differ_in_one_person(spec: VoteSpec, k: int) -> None:
    """For every person: ||votes(bound(D)) - votes(bound(D without that person))|| <= the k-record sensitivity,
    with persons holding more than k records (one of them k+2 identical ones, the worst case). Without the
    bound that person alone would move the votes by more."""
    rng = np.random.default_rng(k)
    loaded = _people(rng, [k + 2, 1, 2, k + 3, 1, 4])
    n, d = len(loaded.records), 5
    emb = rng.normal(size=(n, d))
    heavy = [i for i, p in enumerate(loaded.persons or []) if p == "p0"]
    emb[heavy] = emb[heavy[0]]  # one person, k + 2 identical records: all of their votes agree
    labels = loaded.records.labels
    for i in heavy:
        labels[i] = labels[heavy[0]]
    labels_n = 2
    if spec.kind in ("label_counts", "embedding_sums"):
        cand, cand_labels = np.zeros((labels_n, d if spec.kind == "embedding_sums" else 1)), np.arange(labels_n)
    else:
        cand, cand_labels = rng.normal(size=(12, d)), rng.integers(0, labels_n, 12)

    def votes(data: LoadedRecords, bound: bool) -> np.ndarray:
        records = bound_per_person(data, k, SALT).records if bound else data.records
        rows = [int(t[1:]) for t in records.texts]
        return compute_votes(spec, emb[rows], np.array([int(y) for y in records.labels]), cand, cand_labels)

    bound = vote_sensitivity(spec, max_records_per_user=k)
    worst = max(float(np.linalg.norm(votes(loaded, True) - votes(_without(loaded, p), True)))
                for p in sorted(set(loaded.persons or [])))
    assert worst <= bound + 1e-9
    unbounded = float(np.linalg.norm(votes(loaded, False) - votes(_without(loaded, "p0"), False)))
    if spec.kind in ("label_counts", "popri", "embedding_sums") or spec == HISTOGRAM:
        assert worst == pytest.approx(bound)  # attained by the person with identical records
        assert unbounded > bound + 0.5  # the bound is what keeps the promise


@pytest.mark.parametrize("spec", [VoteSpec(kind="wasp", q=2), VoteSpec(kind="rank", weights=(1.0, 0.5)),
                                  HISTOGRAM, VoteSpec(kind="label_counts"), VoteSpec(kind="popri"),
                                  VoteSpec(kind="embedding_sums")], ids=lambda s: s.kind)
@pytest.mark.parametrize("k", [1, 3])
def test_brute_force_over_neighbours_that_replace_one_person(spec: VoteSpec, k: int) -> None:
    """Replace adjacency with a person as the unit: any one person's records swapped for a newcomer's (more than k
    identical records pointing the other way, with the other label; bounded to k like everyone's) move the votes
    by at most the k-record replace sensitivity. For label counts the bound is attained (k records of one label
    swapped for k of the other)."""
    rng = np.random.default_rng(10 + k)
    loaded, emb = _heavy_person_and_newcomer(rng, [k + 2, 1, 2, k + 3, 1, 4], extra=k + 2)
    n, d, extra = len(loaded.records), 5, k + 2
    if spec.kind in ("label_counts", "embedding_sums"):
        cand, cand_labels = np.zeros((2, d if spec.kind == "embedding_sums" else 1)), np.arange(2)
    else:
        cand, cand_labels = rng.normal(size=(12, d)), rng.integers(0, 2, 12)

    def replaced(person: str) -> LoadedRecords:
        rest = _without(loaded, person)
        return LoadedRecords(LabelledTexts(rest.records.texts + [f"r{n + j}" for j in range(extra)],
                                           rest.records.labels + ["1"] * extra), (rest.persons or []) + ["new"] * extra)

    def votes(data: LoadedRecords) -> np.ndarray:
        records = bound_per_person(data, k, SALT).records
        rows = [int(t[1:]) for t in records.texts]
        return compute_votes(spec, emb[rows], np.array([int(y) for y in records.labels]), cand, cand_labels)

    bound = vote_sensitivity(spec, Adjacency.REPLACE, max_records_per_user=k)
    worst = max(float(np.linalg.norm(votes(loaded) - votes(replaced(p)))) for p in sorted(set(loaded.persons or [])))
    assert worst <= bound + 1e-9
    if spec.kind == "label_counts" or spec == HISTOGRAM:  # k votes leave one label's bin for the other's
        assert worst == pytest.approx(bound)


CLIPPED = {"popri": VoteSpec(kind="popri", clip_per_unit=True),
           "embedding_sums": VoteSpec(kind="embedding_sums", clip_per_unit=True),
           "wasp": VoteSpec(kind="wasp", q=3, clip_per_unit=True),
           "rank": VoteSpec(kind="rank", weights=(1.0,), clip_per_unit=True),
           "rank_weighted": VoteSpec(kind="rank", weights=(1.0, 0.5, 0.25), clip_per_unit=True)}


@pytest.mark.parametrize("kind", list(CLIPPED))
@pytest.mark.parametrize("adjacency", [Adjacency.ADD_REMOVE, Adjacency.REPLACE])
def test_votes_clipped_per_person_move_by_one_records_worth_whatever_k(kind: str, adjacency: Adjacency) -> None:
    """`clip_per_unit`: each person's summed vector is clipped to the largest norm of one record's (1 for the
    signed kinds, ||w|| for rank votes, both sides' for WASP's), so removing (or replacing) any person moves the
    votes by at most one record's sensitivity, at k = 3 and even without the k-bound; the heavy person with
    identical records attains it. Unclipped, the same person moves them by k times that."""
    rng = np.random.default_rng(7)
    loaded, emb = _heavy_person_and_newcomer(rng, [5, 1, 2, 6, 1, 4], extra=5)
    n, d, extra = len(loaded.records), 5, 5
    clipped = CLIPPED[kind]
    if clipped.kind == "embedding_sums":
        cand, cand_labels = np.zeros((2, d)), np.arange(2)
    else:
        cand, cand_labels = rng.normal(size=(12, d)), np.arange(12) % 2

    def neighbour(person: str) -> LoadedRecords:
        rest = _without(loaded, person)
        if adjacency is Adjacency.ADD_REMOVE:
            return rest
        return LoadedRecords(LabelledTexts(rest.records.texts + [f"r{n + j}" for j in range(extra)],
                                           rest.records.labels + ["1"] * extra), (rest.persons or []) + ["new"] * extra)

    def votes(data: LoadedRecords, spec: VoteSpec, k: int | None) -> np.ndarray:
        records, persons = data.records, np.unique(data.persons or [], return_inverse=True)[1]
        if k is not None:
            bounded = bound_per_person(data, k, SALT)
            records, persons = bounded.records, bounded.person_of
        rows = [int(t[1:]) for t in records.texts]
        return compute_votes(spec, emb[rows], np.array([int(y) for y in records.labels]), cand, cand_labels,
                             units=persons)

    one_record = vote_sensitivity(clipped, adjacency, max_records_per_user=1)
    for k in (3, None):  # bounded to 3 records a person, and not bounded at all
        bound = vote_sensitivity(clipped, adjacency, max_records_per_user=3)
        assert bound == one_record
        moves = {p: float(np.linalg.norm(votes(loaded, clipped, k) - votes(neighbour(p), clipped, k)))
                 for p in sorted(set(loaded.persons or []))}
        assert max(moves.values()) <= bound + 1e-9
    unclipped = clipped.model_copy(update={"clip_per_unit": False})
    if adjacency is Adjacency.ADD_REMOVE:
        assert moves["p0"] == pytest.approx(one_record)
        assert float(np.linalg.norm(votes(loaded, unclipped, 3) - votes(neighbour("p0"), unclipped, 3))) == \
            pytest.approx(3 * one_record)
    # records as their own units (record-level runs): the clipped votes are the unclipped ones
    flat = compute_votes(unclipped, emb[:n], np.array([int(y) for y in loaded.records.labels]), cand,
                         cand_labels)
    assert np.allclose(compute_votes(clipped, emb[:n], np.array([int(y) for y in loaded.records.labels]), cand,
                                     cand_labels), flat)


def test_clipped_votes_equal_their_definition_computed_record_by_record() -> None:
    """The per-(person, label) sums give what clipping each person's whole dense vector gives (persons with
    records in several labels included), for the signed kinds (radius 1) and the rank-weighted ones (radius: one
    record's largest norm), on the CPU's numpy path and torch's device path alike."""
    from dpsynth.voting.rank_votes import rank_votes, wasp_votes
    from dpsynth.voting.scores import embedding_sums, popri_scores

    rng = np.random.default_rng(3)
    n, d, labels = 40, 6, 3
    emb, y, persons = rng.normal(size=(n, d)), rng.integers(0, labels, n), rng.integers(0, 9, n)
    cand, cand_labels = rng.normal(size=(15, d)), np.arange(15) % labels

    def by_definition(per_record: list[np.ndarray], radius: float) -> np.ndarray:
        out = 0.0
        for person in np.unique(persons):
            v = sum(per_record[i] for i in np.flatnonzero(persons == person))
            out = out + v * min(1.0, radius / float(np.linalg.norm(v)))
        return out

    weights = (1.0, 0.5, 0.25)
    kinds = [(lambda rows, **kw: embedding_sums(emb[rows], y[rows], labels, **kw), 1.0),
             (lambda rows, **kw: popri_scores(emb[rows], y[rows], cand, cand_labels, **kw), 1.0),
             (lambda rows, **kw: wasp_votes(emb[rows], y[rows], cand, cand_labels, 3, **kw),
              vote_sensitivity(VoteSpec(kind="wasp", q=3))),
             (lambda rows, **kw: rank_votes(emb[rows], y[rows], cand, cand_labels, weights, **kw)[0],
              vote_sensitivity(VoteSpec(kind="rank", weights=weights))),
             (lambda rows, **kw: wasp_votes(emb[rows], y[rows], cand, cand_labels, 3, device="cpu", **kw),
              vote_sensitivity(VoteSpec(kind="wasp", q=3)))]
    for votes, radius in kinds:
        per_record = [votes(np.array([i])) for i in range(n)]
        clipped = votes(np.arange(n), units=persons)
        assert np.allclose(clipped, by_definition(per_record, radius))
        assert not np.allclose(clipped, votes(np.arange(n)))  # some person's votes were clipped


def _file(tmp_path: Path, rows: list[tuple[str, str, str]]) -> Path:
    import pandas as pd

    path = tmp_path / "private.csv"
    pd.DataFrame(rows, columns=["text", "label", "patient"]).to_csv(path, index=False)
    return path


def _config(tmp_path: Path, path: Path, **privacy) -> dict:
    return {"method": "augpe", "data": {"private": str(path), "person_column": "patient"},
            "task": {"text_kind": "note", "labels": {"a": "an a note", "b": "a b note"}},
            "generators": [{"model": "smollm2-135m-instruct"}],
            "privacy": {"delta": 1e-3, "noise_seed": 1, **privacy}}


def test_the_holder_bounds_at_load_and_the_plan_states_the_person(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    rows = [(f"note {i}", "ab"[i % 2], f"patient{i % 4}") for i in range(20)] + [("lonely", "a", "")]
    config = parse_config(_config(tmp_path, _file(tmp_path, rows), max_records_per_user=3))
    data = load_private(config)
    assert len(data.records) == 12 and np.bincount(data.person_of).tolist() == [3, 3, 3, 3]
    err = capsys.readouterr().err
    assert "dropped 1 with an empty 'patient'" in err
    assert "kept at most 3 records per person ('patient'): dropped 8 records of 4 persons" in err
    plan = plan_privacy(config)
    assert plan.assumptions().unit == "person (<= 3 records)"


def test_every_load_of_a_run_keeps_the_same_records_without_a_noise_seed(tmp_path: Path) -> None:
    """The check before a run, the run and its resume each load the records: a salt drawn at each load made the
    check pass and the run keep other records (a label left without any, or two selections in one run)."""
    from dpsynth.private.dataset import check_private

    rows = [(f"note {i}", "ab"[i % 2], f"patient{i % 5}") for i in range(40)]
    raw = _config(tmp_path, _file(tmp_path, rows), max_records_per_user=1)
    raw["privacy"].pop("noise_seed")
    config = parse_config(raw)
    loads = [_rows(load_private(config, quiet=True).records) for _ in range(6)]
    assert all(load == loads[0] for load in loads) and len(loads[0]) == 5
    # one person holds the only 'b' record among ten 'a' ones; under the fixed salt an 'a' one is kept, and the
    # message says that the per-person cut emptied the label (the file has a 'b' record)
    config = parse_config({**raw, "data": {**raw["data"], "private": str(_file(
        tmp_path, [(f"note {i}", "a", "p0") for i in range(10)] + [("b note", "b", "p0")]))}})
    data = load_private(config, quiet=True)
    with pytest.raises(DpsynthError, match=r"label\(s\) \['b'\] have no private samples after keeping at "
                                           r"most 1 record\(s\) per person \('patient'\)"):
        check_private(config, data, task_for(config), min_records=(1, "one"))
    # a label the file never held is not blamed on the cut
    config = parse_config({**raw, "data": {**raw["data"], "private": str(_file(
        tmp_path, [(f"note {i}", "a", f"p{i}") for i in range(10)]))}})
    with pytest.raises(DpsynthError, match=r"label\(s\) \['b'\] have no private samples; remove"):
        check_private(config, load_private(config, quiet=True), task_for(config), min_records=(1, "one"))


@pytest.mark.parametrize("change,message", [
    ({"data": {"person_column": None}, "privacy": {"max_records_per_user": 2}}, "needs data.person_column"),
    ({"data": {"private": None, "corpus": "trec", "m": 50}, "privacy": {}},
     "a public corpus has none"),
    ({"federated": {"parties": 2, "partition": "iid"}, "privacy": {}}, "federated runs"),
    ({"data": {"person_column": ""}, "privacy": {}}, "person_column"),
])
def test_settings_that_cannot_keep_the_person_promise_are_refused(change: dict, message: str,
                                                                  tmp_path: Path) -> None:
    raw = _config(tmp_path, tmp_path / "x.csv")
    for key, value in change.items():
        raw[key] = {k: v for k, v in {**raw.get(key, {}), **value}.items() if v is not None}
    with pytest.raises(DpsynthError, match=message):
        parse_config(raw)


def test_a_missing_person_column_names_the_columns(tmp_path: Path) -> None:
    path = _file(tmp_path, [("x", "a", "p")])
    with pytest.raises(DpsynthError, match=r"person column 'person' not found; columns are: text, label, patient"):
        load_records(path, person_column="person")


@pytest.mark.parametrize("method,extra,vote_kind,one_record", [
    ("wasp", {}, "wasp.votes", 1.632981),
    ("augpe", {"resample": {"clusters": 2}}, "augpe.votes", 1.0),
    ("dpga", {"dpga": {"n": 12, "generations": 2, "length_cap": 64, "sampling_rate": 1.0}}, "dpga.votes", 1.0),
])
def test_person_level_runs_charge_each_vote_release_one_records_worth(method: str, extra: dict, vote_kind: str,
                                                                      one_record: float, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on the fake backend, persons of up to 5 records bounded to k=3: every vote release (WASP's,
    Aug-PE's with `resample:`'s histogram, DPGA's of every record) is charged one record's sensitivity, the
    votes each method's steps ask are clipped per person (the holder refuses unclipped votes on such a release),
    and the label histogram stays k-fold (3)."""
    import json

    import yaml
    from fakes import FakeGenerator
    from test_engine import _config as engine_config
    from typer.testing import CliRunner

    from dpsynth.cli import _typer_app

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls, FakeGenerator.fail_after = [], None
    raw = engine_config(tmp_path, method)
    rows = (tmp_path / "private.csv").read_text().splitlines()
    (tmp_path / "private.csv").write_text("\n".join([rows[0] + ",who"] + [f"{r},p{i // 5}"
                                                                          for i, r in enumerate(rows[1:])]))
    raw["data"]["person_column"] = "who"
    raw["privacy"].update(max_records_per_user=3, noise_seed=1)
    raw.update(extra)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(_typer_app, ["run", str(tmp_path / "run.yaml"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    events = json.loads((tmp_path / "run" / "privacy.json").read_text())["events"]
    votes = [e for e in events if e["name"].startswith(vote_kind)]
    assert votes and [e["sensitivity"] for e in votes] == [pytest.approx(one_record, abs=1e-6)] * len(votes)
    if method == "augpe":
        assert [e["sensitivity"] for e in events if e["name"].startswith("resample")] == [pytest.approx(1.0)]
    labels = [e for e in events if e["name"] in ("labels.histogram", "dpga.labels")]
    assert labels and labels[0]["sensitivity"] == pytest.approx(3.0)


def test_the_clip_radius_is_one_records_largest_norm_over_the_candidates_labels() -> None:
    """WASP at Q=8 with 6 candidates in label 0 and 3 in label 1: one record votes on at most 6 per side, so each
    person is clipped to sqrt(2 (1 + 1/4 + ... + 4^-5)), below the Q=8 sensitivity the plan charges. A person of
    three identical records in label 1 (one record's norm there: Q'=3) is clipped to that radius, not to its own
    label's single-record norm: it moves the votes by the radius, still within the charge."""
    from dpsynth.privacy.sensitivity import wasp_topq_sensitivity

    rng = np.random.default_rng(5)
    cand, cand_labels = rng.normal(size=(9, 4)), np.array([0] * 6 + [1] * 3)
    emb, labels = rng.normal(size=(10, 4)), np.array([0] * 5 + [1] * 5)
    emb[7:] = emb[7]  # person 9: three identical records of label 1
    persons = np.array([0, 1, 2, 3, 4, 5, 6, 9, 9, 9])
    spec = VoteSpec(kind="wasp", q=8, clip_per_unit=True)
    full = compute_votes(spec, emb, labels, cand, cand_labels, units=persons)
    moves = {p: float(np.linalg.norm(full - compute_votes(spec, emb[persons != p], labels[persons != p], cand,
                                                            cand_labels, units=persons[persons != p])))
             for p in np.unique(persons)}
    radius = wasp_topq_sensitivity(8, candidates_per_label=6)
    assert moves[9] == pytest.approx(radius) and moves[9] > wasp_topq_sensitivity(8, candidates_per_label=3)
    assert max(moves.values()) <= radius + 1e-9 < vote_sensitivity(spec, max_records_per_user=3)
