"""The data holder refuses votes more sensitive than the release they are drawn for was charged (the release's
sensitivity comes from the method's schedule, the vote definition from its step; nothing else ties them), before
the ledger is charged or a vote computed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dpsynth.data.public import task_for
from dpsynth.federated.holder import FederatedHolder
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.private.dataset import load_private
from dpsynth.private.holder import CentralHolder
from dpsynth.private.releases import ReleaseStore
from dpsynth.runs.build import build_holder
from dpsynth.runs.config import parse_config
from dpsynth.runs.planning import plan_privacy
from dpsynth.voting.spec import VoteSpec


class _Embedder:
    def encode(self, texts):
        return np.random.default_rng(len(texts)).normal(size=(len(texts), 4)).astype(np.float32)


def _config(tmp_path: Path, method: str, **privacy) -> dict:
    rows = "text,label,patient\n" + "".join(f"message {i},{'ab'[i % 2]},p{i % 10}\n" for i in range(40))
    (tmp_path / "p.csv").write_text(rows)
    return {"method": method,
            "data": {"private": str(tmp_path / "p.csv"), **({"person_column": "patient"} if privacy else {})},
            "task": {"text_kind": "note", "labels": {"a": "an a note", "b": "a b note"}},
            "generators": [{"model": "smollm2-135m-instruct"}],
            **({"wasp": {"n": 12, "iterations": 3, "q": 4}} if method == "wasp" else {}),
            "privacy": {"epsilon": 2.0, "delta": 1e-5, "noise_seed": 1, **privacy}}


def _holder(cfg, ledger: PrivacyLedger, *, records_per_unit: int = 1, schedule_of=None,
            persons: np.ndarray | None = None) -> CentralHolder:
    plan = plan_privacy(schedule_of or cfg)
    return CentralHolder(load_private(cfg).records, task_for(cfg).label_names, _Embedder(), ledger=ledger,
                         noise=NoiseSource(1), schedule=plan.schedule, knobs=plan.calibrate(),
                         store=ReleaseStore(None), records_per_unit=records_per_unit, persons=persons)


CANDIDATES, LABELS = np.eye(8, 4, dtype=np.float32), np.array([0, 0, 0, 0, 1, 1, 1, 1])


@pytest.mark.parametrize("method,release,asked", [
    ("wasp", ("wasp.votes", 0), VoteSpec(kind="wasp", q=8)),  # charged at Q=4 (1.6298), asked Q=8 (1.6330)
    ("augpe", ("augpe.votes", 1), VoteSpec(kind="wasp", q=2)),  # charged one vote (1), asked Top-2 near+far (1.58)
    ("augpe", ("augpe.votes", 1), VoteSpec(kind="rank", weights=(1.0, 1.0))),  # two votes per record (1.41)
    ("augpe", ("augpe.votes", 1), VoteSpec(kind="rank", weights=(1.0,), sampling_rate=0.5)),  # charged unsampled
])
def test_votes_more_sensitive_than_their_release_are_refused_before_anything_is_charged(
        tmp_path: Path, method: str, release: tuple[str, int], asked: VoteSpec) -> None:
    cfg = parse_config(_config(tmp_path, method))
    ledger = PrivacyLedger(2.0, 1e-5)
    holder = _holder(cfg, ledger)
    name = f"release {release[0]}[iteration={release[1]}]"
    with pytest.raises(ValueError, match=re.escape(f"{name} is ") + "(charged for sensitivity|accounted at sampling)"):
        holder.noisy_votes(asked, CANDIDATES, LABELS, release=release)
    assert not ledger.events


@pytest.mark.parametrize("method,release,asked", [
    ("wasp", ("wasp.votes", 0), VoteSpec(kind="wasp", q=4)),
    ("wasp", ("wasp.votes", 0), VoteSpec(kind="wasp", q=2)),  # less sensitive than charged: over-noised, allowed
    ("augpe", ("augpe.votes", 1), VoteSpec(kind="rank", weights=(1.0,))),
])
def test_votes_the_release_was_charged_for_are_drawn(tmp_path: Path, method: str, release: tuple[str, int],
                                                      asked: VoteSpec) -> None:
    cfg = parse_config(_config(tmp_path, method))
    ledger = PrivacyLedger(2.0, 1e-5)
    votes = _holder(cfg, ledger).noisy_votes(asked, CANDIDATES, LABELS, release=release)
    assert votes.shape == (asked.length(len(CANDIDATES)),) and len(ledger.events) == 1


def test_votes_of_persons_unclipped_on_a_release_charged_for_one_record_are_refused(tmp_path: Path) -> None:
    """A person-level plan charges its votes one record's sensitivity (each person's votes are clipped to one
    record's norm): votes asked without that clipping (sensitivity 3 for persons of up to 3 records) are refused,
    and clipped votes without each record's person too; the clipped ones are drawn. The run's holder
    (`build_holder`) knows the bound from the config."""
    person = parse_config(_config(tmp_path, "augpe", max_records_per_user=3))
    persons = load_private(person).person_of  # the bounded records' persons (3 of each of 10)
    plain, clipped = VoteSpec(kind="rank", weights=(1.0,)), VoteSpec(kind="rank", weights=(1.0,), clip_per_unit=True)
    with pytest.raises(ValueError, match="charged for sensitivity 1, but the votes asked of it .* sensitivity 3"):
        _holder(person, PrivacyLedger(2.0, 1e-5), records_per_unit=3, persons=persons).noisy_votes(
            plain, CANDIDATES, LABELS, release=("augpe.votes", 1))
    with pytest.raises(ValueError, match="need each record's person"):
        _holder(person, PrivacyLedger(2.0, 1e-5), records_per_unit=3).noisy_votes(
            clipped, CANDIDATES, LABELS, release=("augpe.votes", 1))
    ledger = PrivacyLedger(2.0, 1e-5)
    _holder(person, ledger, records_per_unit=3, persons=persons).noisy_votes(clipped, CANDIDATES, LABELS,
                                                                            release=("augpe.votes", 1))
    assert ledger.events[0].sensitivity == pytest.approx(1.0)
    plan = plan_privacy(person)
    built = build_holder(plan, knobs=plan.calibrate(), ledger=PrivacyLedger(2.0, 1e-5), store=ReleaseStore(None),
                         task=task_for(person), embedder=_Embedder())
    assert built.records_per_unit == 3


def test_subsampled_votes_of_persons_are_refused_by_the_holder_itself(tmp_path: Path) -> None:
    """The holder's Poisson mask samples records: with persons of several records it would not be the per-person
    rate the event states. DPGA's config refuses that pairing; the holder refuses it too, before any charge."""
    record = parse_config(_config(tmp_path, "dpga"))  # q=0.8, record level
    person = parse_config(_config(tmp_path, "augpe", max_records_per_user=3))
    ledger = PrivacyLedger(2.0, 1e-5)
    holder = _holder(person, ledger, records_per_unit=3, schedule_of=record)
    with pytest.raises(ValueError, match="sample records, not persons"):
        holder.noisy_votes(VoteSpec(kind="rank", weights=(1.0,), sampling_rate=0.8), CANDIDATES, LABELS,
                           release=("dpga.votes", 1))
    assert not ledger.events


def test_the_federated_holder_refuses_them_before_asking_the_parties(tmp_path: Path) -> None:
    raw = _config(tmp_path, "wasp")
    raw["federated"] = {"parties": 2, "partition": "iid"}
    cfg = parse_config(raw)
    plan = plan_privacy(cfg)
    ledger = PrivacyLedger(2.0, plan.accounting_delta)
    holder = FederatedHolder(cfg.federated, plan.clip_delta, ledger=ledger, noise=NoiseSource(1),
                             schedule=plan.schedule, knobs=plan.calibrate(), store=ReleaseStore(None))
    with pytest.raises(ValueError, match="charged for sensitivity"):  # no aggregator connected: never reached
        holder.noisy_votes(VoteSpec(kind="wasp", q=8), CANDIDATES, LABELS, release=("wasp.votes", 0))
    assert not ledger.events


def test_a_training_request_other_than_its_release_is_refused_before_the_charge(tmp_path: Path) -> None:
    """DP-SGD asked for more steps (or another rate) than the release was accounted for: refused before the ledger
    is charged, as votes are (it was refused after the charge, over-charging the run's ledger in memory)."""
    from dpsynth.methods.dpft import NOISE_MULTIPLIER, Dpft

    raw = {**_config(tmp_path, "dpft"), "dpft": {"n": 12, "steps": 5, "sampling_rate": 0.25}}
    cfg = parse_config(raw)
    ledger = PrivacyLedger(20.0, 1e-5)
    holder = CentralHolder(load_private(cfg).records, task_for(cfg).label_names, _Embedder(), ledger=ledger,
                           noise=NoiseSource(1), schedule=plan_privacy(cfg).schedule, knobs={NOISE_MULTIPLIER: 1.0},
                           store=ReleaseStore(None))  # a fixed noise multiplier: calibrating DP-SGD takes 30 s
    request = Dpft(cfg).training_request(task_for(cfg))
    for wrong in (request.model_copy(update={"steps": 6}), request.model_copy(update={"sampling_rate": 0.5})):
        with pytest.raises(ValueError, match="is not accounted as"):
            holder.train_adapter(wrong, release=("dpft.training", None))
    assert not ledger.events


def test_the_holder_clips_each_persons_votes_with_its_own_persons(tmp_path: Path) -> None:
    """The central holder hands each record's person (of the bounded records it holds) to the votes: at zero
    noise its answer is the clipped votes computed from outside, which differ from the unclipped ones."""
    from dpsynth.voting.spec import compute_votes

    person = parse_config(_config(tmp_path, "augpe", max_records_per_user=3))
    private = load_private(person)
    plan = plan_privacy(person)
    holder = CentralHolder(private.records, task_for(person).label_names, _Embedder(),
                           ledger=PrivacyLedger(float("inf"), 1e-5),
                           noise=NoiseSource(1), schedule=plan.schedule, knobs={**plan.calibrate(), "vote_sigma": 0.0},
                           store=ReleaseStore(None), records_per_unit=3, persons=private.person_of)
    clipped = VoteSpec(kind="rank", weights=(1.0,), clip_per_unit=True)
    answer = holder.noisy_votes(clipped, CANDIDATES, LABELS, release=("augpe.votes", 1))
    emb, labels = _Embedder().encode(private.records.texts), private.records.label_ids(["a", "b"])
    assert np.allclose(answer, compute_votes(clipped, emb, labels, CANDIDATES, LABELS, units=private.person_of))
    assert not np.allclose(answer, compute_votes(clipped, emb, labels, CANDIDATES, LABELS))


@pytest.mark.parametrize("method,options", [
    ("wasp", {}), ("augpe", {}), ("augpe", {"votes": "knn", "k": 3}),
    ("dpga", {"sampling_rate": 1.0}), ("dpga", {}),
])
@pytest.mark.parametrize("privacy", [{}, {"adjacency": "replace"}, {"max_records_per_user": 3},
                                     {"max_records_per_user": 3, "adjacency": "replace"}],
                         ids=["record", "replace", "person", "person-replace"])
def test_the_votes_each_method_asks_fit_what_its_plan_charges(tmp_path: Path, method: str, options: dict,
                                                              privacy: dict) -> None:
    """Every vote release of a method's plan accepts the `vote_spec()` its steps send, at record and person
    level and under replacement: a drift between the two would otherwise surface only when a run reaches its
    first vote, after its generation was paid for. (DPGA samples records, so its subsampled votes are refused
    for persons by the config itself.)"""
    from dpsynth.config import records_per_unit

    raw = _config(tmp_path, method, **privacy)
    if method != "wasp":
        raw[method] = {**raw.get(method, {}), **options}
    if method == "dpga" and privacy.get("max_records_per_user", 1) > 1 and options.get("sampling_rate", 0.8) < 1:
        from dpsynth.errors import DpsynthError

        with pytest.raises(DpsynthError, match="record-level privacy"):
            parse_config(raw)
        return
    cfg = parse_config(raw)
    plan = plan_privacy(cfg)
    ledger = PrivacyLedger(2.0, 1e-5)
    holder = _holder(cfg, ledger, records_per_unit=records_per_unit(cfg),
                     persons=load_private(cfg).person_of if privacy.get("max_records_per_user") else None)
    spec = plan.method.vote_spec()
    votes = [r for r in plan.schedule.releases if r.kind == f"{method}.votes"]
    assert votes
    for release in votes:
        holder._check_vote_charge((release.kind, release.index), spec)  # raises on a mismatch
    assert not ledger.events
