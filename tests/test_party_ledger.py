"""A party's own ledger: charges derived at the party, refusals past its budget, on a real federation too."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dpsynth.errors import DpsynthError
from dpsynth.federated.flower_secagg import FederationError, FederationSettings, VoteRound, run_federation
from dpsynth.federated.party import PartyShard, noisy_votes
from dpsynth.federated.party_ledger import PartyLedger
from dpsynth.flower_app import party_ledger
from dpsynth.privacy.accountant import Adjacency, epsilon_tight
from dpsynth.privacy.events import GaussianEvent, SubsampledGaussianEvent
from dpsynth.privacy.ledger import BudgetExceededError, PrivacyLedger
from dpsynth.privacy.sensitivity import vote_sensitivity, wasp_topq_sensitivity
from dpsynth.voting.spec import VoteSpec

DELTA = 1e-5


def _eps(*events) -> float:
    return epsilon_tight(list(events), DELTA)


def test_vote_charge_is_the_sum_noise_of_the_fewest_shares_with_the_sensitivity_computed_here(tmp_path: Path) -> None:
    ledger = PartyLedger(tmp_path / "p.json", math.inf, DELTA)
    spec = VoteSpec(kind="wasp", q=8)
    ledger.charge_votes(spec, release="wasp.votes[1]", party_sigma=0.5, min_parties=4)
    expected = GaussianEvent(name="x", sensitivity=wasp_topq_sensitivity(8), sigma=0.5 * 2)
    assert ledger.spent() == pytest.approx(_eps(expected), rel=1e-6)
    # a party votes with every record: a spec claiming subsampling is refused, before anything is charged;
    # label counts have sensitivity 1
    sub = PartyLedger(tmp_path / "s.json", math.inf, DELTA)
    subsampled = VoteSpec(kind="rank", weights=(1.0, 1.0), sampling_rate=0.1)
    with pytest.raises(DpsynthError, match="no federated form"):
        sub.charge_votes(subsampled, release="v", party_sigma=1.0, min_parties=1)
    assert sub.spent() == 0.0
    shard = PartyShard(0, np.zeros((3, 4), np.float32), np.array([0, 1, 0]))
    with pytest.raises(DpsynthError, match="no federated form"):
        noisy_votes(shard, subsampled, np.zeros((2, 4), np.float32), np.array([0, 1]), release="v",
                    party_sigma=1.0, max_records=10, noise_seed=1)
    assert vote_sensitivity(VoteSpec(kind="label_counts"), Adjacency.ADD_REMOVE) == 1.0
    assert vote_sensitivity(VoteSpec(kind="label_counts"), Adjacency.REPLACE) == pytest.approx(math.sqrt(2))


def test_training_charge_is_local_dp_sgd_and_a_repeated_round_is_charged_again(tmp_path: Path) -> None:
    ledger = PartyLedger(tmp_path / "p.json", math.inf, DELTA)
    for _ in range(2):  # a server resuming after a crash asks round 0 again: fresh noise, a second charge
        ledger.charge_training(release="fedgen.training", round_index=0, steps=5, sampling_rate=0.25,
                               noise_multiplier=1.5)
    one = SubsampledGaussianEvent(name="x", count=5, sampling_rate=0.25, noise_multiplier=1.5)
    assert ledger.spent() == pytest.approx(_eps(one, one.model_copy(update={"name": "y"})), rel=1e-6)
    names = [e.name for e in PrivacyLedger.load(tmp_path / "p.json").events]
    assert names == ["fedgen.training/round0/answer1", "fedgen.training/round0/answer2"]


def test_budget_spans_runs_and_refuses_before_recording(tmp_path: Path) -> None:
    path = tmp_path / "party.json"
    spec = VoteSpec(kind="rank")
    one = _eps(GaussianEvent(name="x", sensitivity=1.0, sigma=3.0))
    PartyLedger(path, 1.2 * one, DELTA).charge_votes(spec, release="run1.votes", party_sigma=3.0, min_parties=1)
    # a second run on the same file (a new process, a new ledger object) sees the first run's spend
    again = PartyLedger(path, 1.2 * one, DELTA)
    with pytest.raises(BudgetExceededError, match="nothing was released"):
        again.charge_votes(spec, release="run2.votes", party_sigma=3.0, min_parties=1)
    assert len(PrivacyLedger.load(path).events) == 1 and again.spent() == pytest.approx(one, rel=1e-6)


def test_noiseless_answers_are_refused_even_with_an_infinite_budget(tmp_path: Path) -> None:
    spec = VoteSpec(kind="rank")
    with pytest.raises(DpsynthError, match="without noise"):
        PartyLedger(tmp_path / "a.json", math.inf, DELTA).charge_votes(spec, release="v", party_sigma=0.0,
                                                                        min_parties=3)
    with pytest.raises(DpsynthError, match="without noise"):
        PartyLedger(tmp_path / "a.json", math.inf, DELTA).charge_training(
            release="t", round_index=0, steps=1, sampling_rate=0.5, noise_multiplier=0.0)
    assert not (tmp_path / "a.json").exists()  # nothing recorded for a refused answer
    with pytest.raises(DpsynthError, match="epsilon > 0"):
        PartyLedger(tmp_path / "d.json", 0.0, DELTA)


def test_training_round_is_charged_on_the_party_ledger_before_it_runs(tmp_path: Path, monkeypatch) -> None:
    """A deployed party (its own ledger) refuses a noiseless round before training; a simulated party (no
    ledger of its own: the run's ledger holds the release) trains as asked, as at epsilon = inf."""
    from dpsynth.federated import party_training
    from dpsynth.finetune.request import AdapterTraining

    trained: list[float] = []
    monkeypatch.setattr(party_training, "local_update", lambda shard, adapter, config, noise_seed, device:
                        trained.append(config["noise_multiplier"]) or adapter)
    request = AdapterTraining(model="m.gguf", lora_r=4, lora_alpha=8, steps=3, sampling_rate=0.2, clip_norm=1.0,
                              learning_rate=1e-3, max_length=16, prompts={"a": "A:"})
    shard = PartyShard(party_id=0, embeddings=np.zeros((1, 2), np.float32), label_ids=np.zeros(1, np.int64),
                       texts=("a text",))

    def answer(noise: float, ledger: PartyLedger | None, of: PartyShard = shard) -> np.ndarray:
        config = {"request": request.model_dump_json(), "release": "train", "round_index": 0,
                  "noise_multiplier": noise, "max_records": max_records}
        return party_training.training_answer(of, np.ones(2, np.float32), config, ledger=ledger, noise_seed=None)

    # what can fail without the noise fails before the charge: a refused answer costs nothing
    max_records = 10
    refused = PartyLedger(tmp_path / "refused.json", 4.0, DELTA)
    with pytest.raises(Exception, match="m.gguf"):  # the party cannot load the server's model path
        answer(1.5, refused)
    monkeypatch.setattr(party_training, "_model", lambda request: (None, None))
    with pytest.raises(DpsynthError, match="party 0 has no texts to train on"):
        answer(1.5, refused, PartyShard(party_id=0, embeddings=shard.embeddings, label_ids=shard.label_ids))
    max_records = 0  # the one record is past the bound
    with pytest.raises(DpsynthError, match="party 0 holds more records than federated.max_records_per_party=0"):
        answer(1.5, refused)
    assert trained == [] and refused.spent() == 0.0
    max_records = 10

    deployed = PartyLedger(tmp_path / "p.json", 4.0, DELTA)
    with pytest.raises(DpsynthError, match="without noise"):
        answer(0.0, deployed)
    assert trained == [] and deployed.spent() == 0.0
    answer(1.5, deployed)
    assert trained == [1.5]
    assert deployed.spent() == pytest.approx(_eps(SubsampledGaussianEvent(name="t", count=3, sampling_rate=0.2,
                                                                          noise_multiplier=1.5)))
    answer(0.0, None)
    assert trained == [1.5, 0.0]


def test_a_party_trains_on_its_own_device_choice(monkeypatch) -> None:
    """A deployed party's DP training runs where its node config says (`device`, default auto: its GPU if torch
    sees one), a bad value is one clear error, and the choice reaches the DP-SGD loop (`train_adapter`)."""
    from dpsynth import flower_app
    from dpsynth.device import resolve_device
    from dpsynth.federated import party_training
    from dpsynth.finetune.request import AdapterTraining

    assert flower_app.party_device(SimpleNamespace(node_config={"device": "cpu"})) == "cpu"
    assert flower_app.party_device(SimpleNamespace(node_config={})) == resolve_device("auto")
    with pytest.raises(DpsynthError, match="'tpu' is not one of auto, cpu, cuda"):
        flower_app.party_device(SimpleNamespace(node_config={"device": "tpu"}))

    seen: list[str] = []
    monkeypatch.setattr(party_training, "_model", lambda request: (None, None))
    monkeypatch.setattr("dpsynth.finetune.model.load_adapter_vector", lambda model, vec: None)
    monkeypatch.setattr("dpsynth.finetune.dp_adam.train_adapter",
                        lambda *args, device, **kw: seen.append(device) or np.zeros(2, np.float32))
    request = AdapterTraining(model="m.gguf", lora_r=4, lora_alpha=8, steps=3, sampling_rate=0.2, clip_norm=1.0,
                              learning_rate=1e-3, max_length=16, prompts={"a": "A:"})
    shard = PartyShard(party_id=0, embeddings=np.zeros((1, 2), np.float32), label_ids=np.zeros(1, np.int64),
                       texts=("a text",))
    config = {"request": request.model_dump_json(), "release": "train", "round_index": 0, "noise_multiplier": 1.0,
              "max_records": 10, "labels": '["a"]'}
    party_training.training_answer(shard, np.ones(2, np.float32), config, ledger=None, noise_seed=1, device="cuda")
    assert seen == ["cuda"]  # passed through, not the default (the DP-SGD loop itself is stood in for here)


def test_deployed_party_reads_its_budget_from_node_config(tmp_path: Path) -> None:
    data = tmp_path / "party.csv"
    ledger = party_ledger(SimpleNamespace(node_config={"data-path": str(data), "epsilon": 8, "delta": 1e-6}))
    assert (ledger.path, ledger.epsilon, ledger.delta) == (tmp_path / "party.csv.privacy-ledger.json", 8.0, 1e-6)
    default = party_ledger(SimpleNamespace(node_config={"data-path": str(data),
                                                        "privacy-ledger": str(tmp_path / "l.json")}))
    assert (default.path, default.epsilon, default.delta) == (tmp_path / "l.json", math.inf, 1e-5)


def test_deployed_party_reads_its_adjacency_from_node_config(tmp_path: Path) -> None:
    node = {"data-path": str(tmp_path / "party.csv")}
    assert party_ledger(SimpleNamespace(node_config=node)).adjacency == Adjacency.ADD_REMOVE
    assert party_ledger(SimpleNamespace(node_config={**node, "adjacency": "replace"})).adjacency == Adjacency.REPLACE
    with pytest.raises(DpsynthError, match="give add_remove or replace"):
        party_ledger(SimpleNamespace(node_config={**node, "adjacency": "swap"}))


def test_a_party_that_trusts_fewer_parties_than_the_server_claims_charges_for_those_it_trusts(tmp_path: Path) -> None:
    """A server claiming 9 shares per sum (sigma 0.5 x 3) cannot make a party trusting 4 charge less than
    0.5 x 2 would cost; a claim below the cap is taken as it is; 1 is its own share alone (local DP)."""
    spec = VoteSpec(kind="rank", weights=(1.0,))

    def spent(trusted: int | None, claimed: int, name: str) -> float:
        ledger = PartyLedger(tmp_path / f"{name}.json", math.inf, DELTA, trusted_parties=trusted)
        ledger.charge_votes(spec, release="v", party_sigma=0.5, min_parties=claimed)
        return ledger.spent()

    def gaussian(sigma: float) -> float:
        return _eps(GaussianEvent(name="x", sensitivity=1.0, sigma=sigma))

    assert spent(None, 9, "believer") == pytest.approx(gaussian(1.5), rel=1e-6)
    assert spent(4, 9, "capped") == pytest.approx(gaussian(1.0), rel=1e-6)
    assert spent(4, 2, "below") == pytest.approx(gaussian(0.5 * math.sqrt(2)), rel=1e-6)
    assert spent(1, 9, "alone") == pytest.approx(gaussian(0.5), rel=1e-6)
    from flwr.common.config import parse_config_args

    # the node config as Flower parses `--node-config` (TOML: an int), a quoted number, and bad values
    parsed = parse_config_args([f'data-path="{tmp_path / "party.csv"}" trusted-parties=4'])
    assert party_ledger(SimpleNamespace(node_config=parsed)).trusted_parties == 4
    node = {"data-path": str(tmp_path / "party.csv")}
    assert party_ledger(SimpleNamespace(node_config={**node, "trusted-parties": "4"})).trusted_parties == 4
    assert party_ledger(SimpleNamespace(node_config=node)).trusted_parties is None
    for bad in (0, -2, "many", 2.5, True, "\u00b2"):
        with pytest.raises(DpsynthError, match="trusted-parties"):
            party_ledger(SimpleNamespace(node_config={**node, "trusted-parties": bad}))
    for bad in (0, 2.5, True, float("nan")):
        with pytest.raises(DpsynthError, match="trusted-parties"):
            PartyLedger(tmp_path / "x.json", math.inf, DELTA, trusted_parties=bad)
    # the ledger file states the cap it charges under, and each capped answer what it counted
    stated = {name: PrivacyLedger.load(tmp_path / f"{name}.json").assumptions.trust_model
              for name in ("believer", "capped", "alone")}
    assert [e.name for e in PrivacyLedger.load(tmp_path / "capped.json").events] == [
        "v/answer1 (counted 4 of the 9 shares claimed)"]
    assert [e.name for e in PrivacyLedger.load(tmp_path / "below.json").events] == ["v/answer1"]
    assert "at most" not in stated["believer"] and "at most 4 (node config trusted-parties;" in stated["capped"]
    assert "own noise share alone (local DP" in stated["alone"]


def test_a_party_ledger_must_count_neighbours_at_least_as_strictly_as_the_run(tmp_path: Path) -> None:
    """Replace neighbours have the larger sensitivities: a party counting add/remove under a run planned for
    replace would report less than the run for the same answers (the party's budget then refused too late)."""
    from dpsynth.federated.flower_secagg import check_party_ledger

    add_remove = PartyLedger(tmp_path / "a.json", 8.0, DELTA)
    replace = PartyLedger(tmp_path / "r.json", 8.0, DELTA, Adjacency.REPLACE)
    with pytest.raises(DpsynthError, match='adjacency="replace"'):
        check_party_ledger(add_remove, "replace")
    for ledger, run in ((add_remove, "add_remove"), (replace, "replace"), (replace, "add_remove"), (None, "replace")):
        check_party_ledger(ledger, run)
    # the stricter count is the larger figure for the same answer
    for ledger in (add_remove, replace):
        ledger.charge_votes(VoteSpec(kind="rank"), release="r", party_sigma=2.0, min_parties=2)
    assert replace.spent() > add_remove.spent()


def test_real_federation_preflight_refuses_a_party_ledger_looser_than_the_run(tmp_path: Path) -> None:
    """A run planned for replace neighbours, parties whose ledgers count add/remove: the preflight stops the run
    before any release, with the party's own one-line reason, and nothing is charged."""
    rng = np.random.default_rng(3)
    shards = [PartyShard(i, rng.normal(size=(5, 16)).astype(np.float32), rng.integers(0, 2, 5)) for i in range(3)]
    candidates, cand_labels = rng.normal(size=(12, 16)).astype(np.float32), rng.integers(0, 2, 12)
    settings = FederationSettings(parties=3, min_parties=3, secure=True, max_records=10, timeout=60, noise_seed=5,
                                  adjacency="replace")

    def program(aggregator):
        return aggregator.aggregate(VoteRound("wasp.votes.1", VoteSpec(kind="wasp", q=2), candidates, cand_labels,
                                              0.8, clip=25.0))

    with pytest.raises(FederationError, match='did not pass the preflight.*adjacency="replace"'):
        run_federation(shards, settings, program,
                       ledger_for=lambda party: PartyLedger(tmp_path / f"party{party}.json", 8.0, DELTA))
    assert not list(tmp_path.glob("party*.json"))


def test_real_federation_parties_charge_their_own_ledgers_and_refuse_past_budget(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    shards = [PartyShard(i, rng.normal(size=(5, 16)).astype(np.float32), rng.integers(0, 2, 5)) for i in range(3)]
    candidates, cand_labels = rng.normal(size=(12, 16)).astype(np.float32), rng.integers(0, 2, 12)
    spec = VoteSpec(kind="wasp", q=2)
    settings = FederationSettings(parties=3, min_parties=3, secure=True, max_records=10, timeout=60, noise_seed=5)
    one = _eps(GaussianEvent(name="x", sensitivity=wasp_topq_sensitivity(2), sigma=0.8 * math.sqrt(3)))
    budget = 1.2 * one  # room for one round, not two

    def program(aggregator):
        first = aggregator.aggregate(VoteRound("wasp.votes.1", spec, candidates, cand_labels, 0.8, clip=25.0))
        with pytest.raises(FederationError):
            aggregator.aggregate(VoteRound("wasp.votes.2", spec, candidates, cand_labels, 0.8, clip=25.0))
        return first

    result = run_federation(shards, settings, program,
                            ledger_for=lambda party: PartyLedger(tmp_path / f"party{party}.json", budget, DELTA))
    assert result.contributors == 3
    for party in range(3):
        saved = json.loads((tmp_path / f"party{party}.json").read_text())
        assert [e["name"] for e in saved["events"]] == ["wasp.votes.1/answer1"]  # the refused round left no charge
        assert PartyLedger(tmp_path / f"party{party}.json", budget, DELTA).spent() == pytest.approx(one, rel=1e-6)


def test_cli_prints_a_partys_answers_and_epsilon(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dpsynth.cli import _typer_app

    path = tmp_path / "party.csv.privacy-ledger.json"
    ledger = PartyLedger(path, 8.0, DELTA)
    for _ in range(2):
        ledger.charge_votes(VoteSpec(kind="rank"), release="augpe.votes[1]", party_sigma=2.0, min_parties=2)
    out = CliRunner().invoke(_typer_app, ["party-ledger", str(path)])
    assert out.exit_code == 0, out.output
    assert "augpe.votes[1]: 2 answers" in out.output
    assert f"epsilon: {ledger.spent():.4f} at delta 1e-05" in out.output and "budget: 8" in out.output
    capped = PartyLedger(tmp_path / "capped.json", 8.0, DELTA, trusted_parties=2)
    for claimed in (2, 5):  # the second answer is charged at 2 of the 5 shares the server claims
        capped.charge_votes(VoteSpec(kind="rank"), release="augpe.votes[1]", party_sigma=2.0, min_parties=claimed)
    out = CliRunner().invoke(_typer_app, ["party-ledger", str(tmp_path / "capped.json")])
    assert "augpe.votes[1]: 2 answers (1 charged at fewer shares than the server claimed)" in out.output
    missing = CliRunner().invoke(_typer_app, ["party-ledger", str(tmp_path / "nope.json")])
    assert missing.exit_code != 0 and "no party ledger here" in str(missing.exception)
    bad_delta = CliRunner().invoke(_typer_app, ["party-ledger", str(path), "--delta", "2"])
    assert bad_delta.exit_code != 0 and "--delta must be in (0, 1)" in str(bad_delta.exception)
