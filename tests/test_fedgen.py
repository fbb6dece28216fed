"""Resource-adaptive federated generation (method fedgen, papers/004): roles, refinement sampling, the
parallel-composition plan against a direct computation, and a real Flower federation (strong parties
DP-fine-tune SmolLM2 by FedAvg, every party profiles, weak parties vote through SecAgg+, one drops out)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpsynth.errors import DpsynthError
from dpsynth.methods.base import LABEL_SIGMA
from dpsynth.methods.fedgen import NOISE_MULTIPLIER, STRONG, VOTE_SIGMA, WEAK, refine
from dpsynth.privacy.accountant import epsilon_tight
from dpsynth.privacy.events import GaussianEvent, SubsampledGaussianEvent
from dpsynth.runs.config import parse_config
from dpsynth.runs.planning import plan_privacy


def _raw(**fedgen) -> dict:
    return {"method": "fedgen", "data": {"corpus": "rotten_tomatoes", "m": 100},
            "generators": [{"model": "smollm2-135m-instruct"}],
            "fedgen": {"rounds": 3, "local_steps": 5, "sampling_rate": 0.2, "k": 3, **fedgen},
            "privacy": {"epsilon": 4.0, "delta": 1e-5},
            "federated": {"parties": 10, "partition": "iid", "max_records_per_party": 40}}


def test_refinement_draws_without_replacement_per_label_in_proportion_to_positive_votes() -> None:
    labels = ["a"] * 6 + ["b"] * 4
    noisy = np.array([5.0, -2.0, 0.0, 3.0, 0.1, -7.0, 1.0, 1.0, -1.0, 0.0])
    rng = np.random.default_rng(0)
    for _ in range(50):
        kept = refine(noisy, labels, 0.5, rng)
        a, b = [i for i in kept if i < 6], [i for i in kept if i >= 6]
        assert len(a) == 3 and len(b) == 2 and len(set(kept)) == 5
        assert set(a) == {0, 3, 4}  # exactly the three positive candidates of 'a'
        assert set(b) == {6, 7}
    # more to keep than positive votes: all positive ones, then uniform among the rest (A.4's W = 0 case)
    kept = refine(noisy, labels, 1.0, rng)
    assert kept == list(range(10))
    counts = np.zeros(6)
    for _ in range(4000):
        for i in refine(np.array([3.0, 1.0, 0, 0, 0, 0]), ["a"] * 6, 1 / 6, rng):
            counts[i] += 1
    assert counts[0] / 4000 == pytest.approx(0.75, abs=0.03) and counts[2:].sum() == 0


@pytest.mark.parametrize("change,message", [
    ({"fedgen": {"strong": [0, 12]}}, "party ids in 0..9"),
    ({"fedgen": {"strong": 0.9}}, "at least 2 weak parties"),
    ({"federated": None}, "fedgen is federated"),
    ({"federated": {"parties": 10, "unit": "party"}}, "federated.unit must be 'record'"),
])
def test_settings_fedgen_cannot_run_are_one_line_errors(change: dict, message: str) -> None:
    raw = _raw()
    for key, value in change.items():
        if value is None:
            raw.pop(key)
        elif key == "fedgen":
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    with pytest.raises(DpsynthError, match=message):
        parse_config(raw)


def test_plan_composes_the_two_groups_in_parallel_and_each_spends_the_budget() -> None:
    """Direct computation: strong records see profile + training, weak ones profile + votes; each group's
    PLD epsilon is the budget, and the paper's sequential alternative (all three on every record) would
    need more noise for the same epsilon."""
    plan = plan_privacy(parse_config(_raw(strong=[0, 1, 2])))
    knobs = plan.calibrate()
    profile = GaussianEvent(name="p", sensitivity=1.0, sigma=knobs[LABEL_SIGMA])
    train = SubsampledGaussianEvent(name="t", count=15, sampling_rate=0.2, noise_multiplier=knobs[NOISE_MULTIPLIER])
    votes = GaussianEvent(name="v", sensitivity=math.sqrt(3), sigma=knobs[VOTE_SIGMA])
    delta = plan.accounting_delta
    assert epsilon_tight([profile], delta) == pytest.approx(1.0, rel=2e-3)  # the paper's eps_prof = eps / 4
    assert epsilon_tight([profile, train], delta) == pytest.approx(4.0, rel=2e-3)
    assert epsilon_tight([profile, votes], delta) == pytest.approx(4.0, rel=2e-3)
    assert epsilon_tight([profile, train, votes], delta) > 4.5  # what sequential composition would charge
    assert plan.epsilon_of(knobs) == pytest.approx(4.0, rel=2e-3)
    assert {r.name: r.scope for r in plan.schedule.releases} == {
        "labels.histogram": "all", "fedgen.training": STRONG, "fedgen.votes": WEAK}
    assert plan.method.party_groups() == {STRONG: (0, 1, 2), WEAK: (3, 4, 5, 6, 7, 8, 9)}
    rows = {k["name"]: k for k in plan.describe(knobs)["knobs"]}
    assert rows[NOISE_MULTIPLIER]["party_value"] == knobs[NOISE_MULTIPLIER]  # local DP-SGD: the full noise
    assert rows[VOTE_SIGMA]["party_value"] == pytest.approx(knobs[VOTE_SIGMA] / math.sqrt(7))


def test_weak_round_threshold_follows_the_runs_dropout_allowance() -> None:
    from dpsynth.config import FederatedConfig, fewest_answering

    fed = FederatedConfig(parties=10, partition="iid", min_parties=8)
    assert fewest_answering(fed) == 8
    assert fewest_answering(fed, 7) == 5  # 2 dropouts allowed in the run, so 2 among the 7 weak
    assert fewest_answering(fed, 3) == 2  # SecAgg+ never sums fewer than 2
    assert fewest_answering(FederatedConfig(parties=10, partition="iid", aggregation="plain"), 7) == 1


ROWS = {"positive": ["An uplifting, warm and funny film with a terrific cast.",
                     "A moving and beautifully acted story.", "Sharp, witty and full of heart."],
        "negative": ["A tedious mess that wastes its talented actors.", "Dull, slow and badly written.",
                     "A lifeless film with nothing to say."]}


def _party_files(tmp_path: Path, sizes: list[int]) -> list[str]:
    files = []
    for i, n in enumerate(sizes):
        rows = [(ROWS[y][j % 3] + f" (party {i}, note {j})", y)
                for j in range(n) for y in (("positive", "negative")[j % 2],)]
        path = tmp_path / f"party{i}.csv"
        path.write_text("text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows))
        files.append(str(path))
    return files


@pytest.mark.slow
def test_real_federation_strong_parties_train_every_party_profiles_weak_parties_vote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from dpsynth.federated import simulation
    from dpsynth.runs.engine import Run

    # 5 parties: 0 and 1 strong; 2, 3, 4 weak. Party 4's shard is damaged once the simulation has checked it
    # (a label id out of range, embeddings of the wrong width): it passes the preflight, which checks its size,
    # and fails every round it is asked (a real dropout); min_parties 4 lets the profile (4 of 5) and the votes
    # (2 of 3) go on. (A party past the public bound stops the run instead: tests/test_federated.py.)
    files = _party_files(tmp_path, [8, 8, 8, 8, 8])
    real_shards = simulation.party_shards

    def one_party_damaged(*args, **kwargs):
        shards = real_shards(*args, **kwargs)
        s = shards[4]
        shards[4] = dataclasses.replace(s, embeddings=s.embeddings[:, :8],
                                        label_ids=np.concatenate([[-1], s.label_ids[1:]]))
        return shards

    monkeypatch.setattr(simulation, "party_shards", one_party_damaged)
    raw = {"method": "fedgen",
           "task": {"text_kind": "movie review", "labels": {"positive": "a positive review",
                                                            "negative": "a negative review"}},
           "generators": [{"model": "smollm2-135m-instruct", "name": "smol"}],
           "fedgen": {"strong": [0, 1], "rounds": 2, "local_steps": 2, "sampling_rate": 0.5, "max_length": 32,
                      "n": 8, "keep": 0.5, "k": 2, "max_tokens": 16},
           "privacy": {"epsilon": 4.0, "delta": 1e-3, "noise_seed": 5},
           "federated": {"parties": 5, "partition": "files", "party_files": files, "min_parties": 4,
                         "max_records_per_party": 10},
           "evaluate": False, "seed": 3}
    config = parse_config(raw)
    Run.create(config, tmp_path / "run").execute()
    run = tmp_path / "run"
    report = json.loads((run / "privacy.json").read_text())
    plan = plan_privacy(config)
    assert report["epsilon"] == pytest.approx(plan.epsilon_of(plan.calibrate()), abs=1e-3)
    assert report["within_budget"] and set(report["per_scope_epsilon"]) == {STRONG, WEAK}
    assert {e["name"]: e["scope"] for e in report["events"]} == {
        "labels.histogram": "all", "fedgen.training": STRONG, "fedgen.votes": WEAK}
    rounds = json.loads((run / "metrics.json").read_text())["federated"]["rounds"]
    by_release: dict[str, list[dict]] = {}
    for r in rounds:
        by_release.setdefault(r["release"], []).append(r)
    assert [r["parties_contributing"] for r in by_release["fedgen.training"]] == [2, 2]  # the strong parties only
    assert by_release["labels.histogram"][0]["parties_contributing"] == 4  # every party, less the dropout
    assert by_release["fedgen.votes"][0]["parties_contributing"] == 2  # the weak parties, less the dropout
    assert by_release["fedgen.votes"][0]["download_bytes_per_party"] < by_release["fedgen.training"][0][
        "download_bytes_per_party"]  # a vote round ships embeddings, a training round the adapter
    samples = [json.loads(line) for line in (run / "synthetic.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and {s["label"] for s in samples} <= {"positive", "negative"}
    private = [line.split('"')[1] for f in files for line in Path(f).read_text().splitlines()[1:]]
    for path in run.rglob("*"):
        if path.is_file() and path.suffix in {".json", ".jsonl", ".log", ".yaml"}:
            text = path.read_text()
            assert not any(p in text for p in private), f"private text in {path}"


def test_fedavg_saves_each_round_and_a_resume_continues_from_the_last(tmp_path: Path, monkeypatch) -> None:
    """A crash in round 3 of 3: the resumed training asks the parties for round 3 only, from the saved
    round-2 adapter. (The Flower federation is a stand-in here; the real one runs in the slow test.)"""
    from dpsynth.federated.flower_secagg import RoundResult
    from dpsynth.federated.holder import FederatedHolder
    from dpsynth.finetune.request import AdapterTraining
    from dpsynth.privacy.ledger import PrivacyLedger
    from dpsynth.privacy.mechanisms import NoiseSource
    from dpsynth.private.releases import ReleaseStore

    monkeypatch.setattr("dpsynth.finetune.model.initial_adapter", lambda *args: np.zeros(4, np.float32))
    config = parse_config(_raw(strong=[0, 1, 2]))
    plan = plan_privacy(config)
    knobs = {LABEL_SIGMA: 5.0, NOISE_MULTIPLIER: 1.5, VOTE_SIGMA: 3.0}
    request = AdapterTraining(model="base.gguf", lora_r=8, lora_alpha=16, steps=5, sampling_rate=0.2, clip_norm=1.0,
                              learning_rate=1e-3, max_length=32, prompts={"a": "a:"}, rounds=3,
                              server_learning_rate=0.5, parties=(0, 1, 2))

    class Federation:
        def __init__(self, crash_in: int | None, after_receipt: bool = False) -> None:
            self.crash_in, self.asked, self.after_receipt = crash_in, [], after_receipt

        def train(self, train_round, on_exposed=None):
            if train_round.round_index == self.crash_in and not self.after_receipt:
                raise KeyboardInterrupt  # before any answer reached the server: the round is asked again
            on_exposed()  # the answers may reach the server from now on
            if train_round.round_index == self.crash_in:
                raise KeyboardInterrupt  # after: the server has seen an answer the run has not saved
            assert set(train_round.parties) == {0, 1, 2} and train_round.noise_multiplier == 1.5
            self.asked.append((train_round.round_index, train_round.adapter.copy()))
            return RoundResult(total=np.full(4, 2.0 * (train_round.round_index + 1)), contributors=3,
                               bytes_down={1: 10}, bytes_up={1: 10}, seconds=0.0)

    def holder(federation) -> FederatedHolder:
        h = FederatedHolder(config.federated, plan.clip_delta, groups=plan.method.party_groups(),
                            ledger=PrivacyLedger(4.0, plan.accounting_delta), noise=NoiseSource(1),
                            schedule=plan.schedule, knobs=knobs, store=ReleaseStore(tmp_path / "releases"))
        h.connect(federation)
        return h

    first = Federation(crash_in=2)
    with pytest.raises(KeyboardInterrupt):
        holder(first).train_adapter(request, release=("fedgen.training", None))
    assert [k for k, _ in first.asked] == [0, 1]
    work = tmp_path / "releases" / "fedgen.training.partial"
    assert not list(work.glob("exposed-*"))  # each saved round took its mark away
    # stopped after round 2's answers reached the server, before they were saved: asking again is refused
    with pytest.raises(KeyboardInterrupt):
        holder(Federation(crash_in=2, after_receipt=True)).train_adapter(request, release=("fedgen.training", None))
    with pytest.raises(DpsynthError, match="may have reached the server before the run stopped"):
        holder(Federation(crash_in=None)).train_adapter(request, release=("fedgen.training", None))
    (work / "exposed-round2").unlink()  # the operator states the server kept nothing
    # the same 15 steps a record (what the ledger books), in other rounds: the saved rounds are not continued
    other = request.model_copy(update={"rounds": 5, "steps": 3})
    with pytest.raises(DpsynthError, match="other training settings"):
        holder(Federation(crash_in=None)).train_adapter(other, release=("fedgen.training", None))
    again = Federation(crash_in=None)
    resumed = holder(again)
    adapter = resumed.train_adapter(request, release=("fedgen.training", None))
    assert [k for k, _ in again.asked] == [2]
    assert np.allclose(again.asked[0][1], 0.5 * (2.0 + 4.0))  # the saved round-2 adapter
    assert np.allclose(adapter, 0.5 * (2.0 + 4.0 + 6.0))
    assert [e.scope for e in resumed.ledger.events] == [STRONG]
    assert [r["parties"] for r in resumed.rounds] == [STRONG]
    assert not work.exists()  # saved: its partial state and marks are gone
