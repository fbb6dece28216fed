"""Federated voting: partitions, noise shares, clipping bounds, and a real Flower SecAgg+ federation."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import epsilon_at, sensitivity
from helpers import plan as make_plan

from dpsynth.errors import DpsynthError
from dpsynth.federated.clipping import clip_range
from dpsynth.federated.flower_secagg import (
    MODULUS_RANGE,
    FederationError,
    FederationSettings,
    VoteRound,
    quantization_range,
    run_federation,
)
from dpsynth.federated.partition import dirichlet_partition, iid_partition
from dpsynth.federated.party import PartyShard, noisy_votes
from dpsynth.runs.config import parse_config
from dpsynth.voting.spec import VoteSpec


def test_partitions_cover_every_record_once_and_dirichlet_is_non_iid() -> None:
    labels = np.repeat([0, 1, 2], 100)
    for parts in (iid_partition(300, 10, seed=0), dirichlet_partition(labels, 10, alpha=1.0, seed=0)):
        assert len(parts) == 10 and all(len(p) > 0 for p in parts)
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(300))
    assert {len(p) for p in iid_partition(300, 10, seed=0)} == {30}
    skewed = dirichlet_partition(labels, 10, alpha=0.1, seed=1)
    # with small alpha most parties are dominated by one label
    majority = [np.bincount(labels[p], minlength=3).max() / len(p) for p in skewed]
    assert np.mean(majority) > 0.8
    assert [p.tolist() for p in dirichlet_partition(labels, 10, 1.0, seed=5)] == \
        [p.tolist() for p in dirichlet_partition(labels, 10, 1.0, seed=5)]
    with pytest.raises(DpsynthError, match="cannot be split"):
        iid_partition(3, 5, seed=0)


def test_noise_shares_add_up_to_sigma_for_the_fewest_allowed_parties() -> None:
    plan = make_plan("wasp", 5, 8, parties=10, min_parties=7)
    sigma = 3.5
    share = plan.party_sigma(sigma)
    assert 7 * share**2 == pytest.approx(sigma**2)  # the fewest survivors still sum to sigma
    assert 10 * share**2 > sigma**2  # more survivors: more noise, never less
    # a server that saw one party's vector would face only share-sized noise
    assert epsilon_at(plan, share) > epsilon_at(plan, sigma)


def test_clip_range_bounds_the_clipping_probability_and_quantization_cannot_overflow() -> None:
    spec = VoteSpec(kind="wasp", q=8)
    c = clip_range(spec, max_records=64, party_sigma=2.0, parties=10, length=1000, failure_probability=1e-8)
    z = (c - 64) / 2.0
    assert 10 * 1000 * math.erfc(z / math.sqrt(2)) <= 1e-8 * (1 + 1e-6)
    for parties in (2, 10, 150, 1000):
        assert parties * quantization_range(parties) <= MODULUS_RANGE // 4


def test_a_run_without_a_clipping_reserve_still_clips_its_fixed_noise_to_a_finite_range() -> None:
    """epsilon = inf reserves no delta for clipping, yet a fixed-sigma release (the DP label histogram's sigma 10)
    is still noised at every party: its range must be finite, or quantising turns every count into -inf."""
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    spec = VoteSpec(kind="rank")
    c = clip_range(spec, max_records=64, party_sigma=10 / math.sqrt(3), parties=3, length=6, failure_probability=0.0)
    assert math.isfinite(c) and c > 64
    counts = np.array([3.0, 5.0])
    back = dequantize(quantize([counts], c, quantization_range(3)), c, quantization_range(3))[0]
    assert np.allclose(back, counts, atol=2 * c / quantization_range(3))


def test_the_roster_asks_the_parties_connected_when_the_timeout_ends_instead_of_waiting_a_day() -> None:
    """Every round goes through the roster (the preflight's party ids). With a party offline, the roster waited
    for it with Flower's default of a day; now it waits `federated.timeout` and asks the parties connected (the
    round's own threshold then decides), and refuses no node or more nodes than parties in one line."""
    from flwr.common import ndarrays_to_parameters
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.client_proxy import ClientProxy

    from dpsynth.federated.flower_secagg import _sum_strategy

    class Node(ClientProxy):
        get_properties = get_parameters = fit = evaluate = reconnect = None  # never called here

    def instructions(connected: int) -> list:
        manager = SimpleClientManager()
        for i in range(connected):
            manager.register(Node(str(i)))
        settings = FederationSettings(parties=3, min_parties=2, secure=True, max_records=10, timeout=0.2)
        strategy = _sum_strategy([np.zeros(1, np.float32)], {"round": "roster"}, settings, None)
        return strategy.configure_fit(1, ndarrays_to_parameters([np.zeros(1, np.float32)]), manager)

    assert sorted(proxy.cid for proxy, _ in instructions(2)) == ["0", "1"]
    assert len(instructions(3)) == 3
    with pytest.raises(FederationError, match="no party connected within federated.timeout=0.2 s"):
        instructions(0)
    with pytest.raises(FederationError, match="4 nodes are connected for a run of 3 parties"):
        instructions(4)


def test_party_refuses_more_records_than_the_public_bound() -> None:
    shard = PartyShard(0, np.zeros((5, 4), np.float32), np.zeros(5, np.int64))
    with pytest.raises(DpsynthError, match="max_records_per_party=4"):
        noisy_votes(shard, VoteSpec(kind="rank"), np.zeros((3, 4), np.float32), np.zeros(3, np.int64),
                    release="r", party_sigma=1.0, max_records=4, noise_seed=0)


def test_party_refuses_candidates_of_another_embedder_before_its_charge() -> None:
    """Candidates of another dimension than the party's embeddings fail in the check a party runs before its
    ledger is charged (`party_client_app`; they failed inside the vote, after the charge); label counts'
    placeholder candidates pass."""
    from dpsynth.federated.party import check_vote_request

    shard = PartyShard(0, np.zeros((5, 4), np.float32), np.zeros(5, np.int64))
    with pytest.raises(DpsynthError, match="the candidates have 3 dimensions, its records' embeddings 4"):
        check_vote_request(shard, VoteSpec(kind="rank"), np.zeros((2, 3), np.float32), np.zeros(2, np.int64))
    with pytest.raises(DpsynthError, match="one label per candidate"):
        noisy_votes(shard, VoteSpec(kind="rank"), np.zeros((3, 4), np.float32), np.zeros(2, np.int64),
                    release="r", party_sigma=1.0, max_records=10, noise_seed=0)
    check_vote_request(shard, VoteSpec(kind="label_counts"), np.zeros((2, 1), np.float32), np.arange(2))


def test_federated_config_errors_are_clear() -> None:
    base = {"data": {"corpus": "trec", "m": 60}, "generators": [{"model": "smollm2-135m-instruct"}]}
    with pytest.raises(DpsynthError, match="no federated mode"):
        parse_config({**base, "method": "zero-shot", "federated": {"parties": 3}})
    # private label proportions are a federated round (every party's counts, summed by SecAgg+)
    parse_config({**base, "privacy": {"label_proportions": "dp"}, "federated": {"parties": 3}})
    with pytest.raises(DpsynthError, match="exceeds parties"):
        parse_config({**base, "federated": {"parties": 3, "min_parties": 4}})
    # deployed parties refuse plain vote rounds: refused before anything is charged, not at the first round
    with pytest.raises(DpsynthError, match="needs aggregation 'secagg\\+'"):
        parse_config({**base, "federated": {"parties": 3, "partition": "nodes", "aggregation": "plain"}})


def _received_arrays(message) -> list[np.ndarray]:
    """Every array in a reply: array records, and ndarray bytes inside config records (SecAgg+ uploads)."""
    from flwr.common import bytes_to_ndarray

    out = [a.numpy() for rec in message.content.array_records.values() for a in rec.values()]
    for rec in message.content.config_records.values():
        for value in rec.values():
            if isinstance(value, list) and value and isinstance(value[0], bytes):
                for blob in value:
                    try:
                        out.append(np.asarray(bytes_to_ndarray(blob), dtype=float).ravel())
                    except Exception:  # key shares and ciphertexts are not arrays
                        pass
    return out


def _capture_replies(aggregator, replies: list[np.ndarray]) -> None:
    inner = aggregator.grid.send_and_receive

    def capture(messages, *args, **kwargs):  # everything the server-side code receives
        out = list(inner(messages, *args, **kwargs))
        for m in out:
            if m.has_content():
                replies.extend(_received_arrays(m))
        return out

    aggregator.grid.send_and_receive = capture


def _reveals(replies: list[np.ndarray], vec: np.ndarray, clip: float, levels: int) -> bool:
    """Does any received array equal the vector, or its SecAgg+ quantisation, up to rounding?"""
    quantized = (np.clip(vec, -clip, clip) + clip) / (2 * clip) * levels
    return any(r.size == vec.size and (np.allclose(r.ravel(), vec, atol=0.1) or
                                       np.allclose(r.ravel(), quantized, atol=2.0)) for r in replies)


def _shards(rng: np.random.Generator, sizes: list[int]) -> list[PartyShard]:
    return [PartyShard(i, rng.normal(size=(n, 16)).astype(np.float32), rng.integers(0, 2, n))
            for i, n in enumerate(sizes)]


def test_real_flower_secagg_federation_sums_noisy_votes_hides_single_parties_and_refuses_dropouts() -> None:
    rng = np.random.default_rng(0)
    # party 3 passes the preflight but fails every vote round (embeddings of the wrong width): a real dropout
    shards = _shards(rng, [6, 9, 4, 5])
    shards[3] = PartyShard(3, shards[3].embeddings[:, :8], shards[3].label_ids)
    candidates, cand_labels = rng.normal(size=(30, 16)).astype(np.float32), rng.integers(0, 2, 30)
    spec = VoteSpec(kind="wasp", q=4)
    settings = FederationSettings(parties=4, min_parties=3, secure=True, max_records=10, timeout=60, noise_seed=11)
    replies: list[np.ndarray] = []

    def program(aggregator):
        _capture_replies(aggregator, replies)
        first = aggregator.aggregate(VoteRound("wasp.votes.1", spec, candidates, cand_labels, 0.7, clip=25.0))
        aggregator.settings = dataclasses.replace(settings, min_parties=4)
        with pytest.raises(FederationError, match="no aggregate"):
            aggregator.aggregate(VoteRound("wasp.votes.2", spec, candidates, cand_labels, 0.7, clip=25.0))
        return first

    result = run_federation(shards, settings, program)
    assert result.contributors == 3
    expected = [noisy_votes(s, spec, candidates, cand_labels, release="wasp.votes.1", party_sigma=0.7,
                            max_records=10, noise_seed=11) for s in shards[:3]]
    step = 2 * 25.0 / quantization_range(4)
    assert np.abs(result.total - np.sum(expected, axis=0)).max() < 3 * 3 * step
    assert set(result.bytes_up) == set(result.bytes_down) and len(result.bytes_down) == 4
    # the masked uploads reached the server, and none is any single party's (quantised) noisy vector
    assert sum(r.size == 60 for r in replies) >= 3
    assert not any(_reveals(replies, vec, 25.0, quantization_range(4)) for vec in expected)


def test_a_party_past_the_public_bound_stops_the_run_before_any_release() -> None:
    """One record past `max_records_per_party` at one party: the preflight (each party's own check, in plain, before
    the first vote round) stops the run. Before it, that party dropped out of the vote round and the other
    parties' sum was released without its votes: one record more removed a whole party's votes."""
    rng = np.random.default_rng(5)
    shards = _shards(rng, [6, 9, 4, 11])
    candidates, cand_labels = rng.normal(size=(30, 16)).astype(np.float32), rng.integers(0, 2, 30)
    settings = FederationSettings(parties=4, min_parties=3, secure=True, max_records=10, timeout=60, noise_seed=11)
    replies: list[np.ndarray] = []

    def program(aggregator):
        _capture_replies(aggregator, replies)
        with pytest.raises(FederationError, match=r"1 party did not pass the preflight before any release.*party 3 "
                                                  r"holds more records than federated.max_records_per_party=10"):
            aggregator.aggregate(VoteRound("wasp.votes.1", VoteSpec(kind="wasp", q=4), candidates, cand_labels, 0.7,
                                           clip=25.0))
        return True

    assert run_federation(shards, settings, program)
    assert not any(r.size == 60 for r in replies), "no party was asked for its votes"


def test_a_partys_failure_reaches_the_server_as_its_dpsynth_message_only() -> None:
    """As a deployed SuperNode sends it (the exception's own text, no chained cause), as the simulation's Ray
    traceback ends, and for another library's error only its kind (its message could quote the party's data), in the
    preflight's error and in a failed round's."""
    from dpsynth.federated.flower_secagg import party_reason

    message = "party 3 holds more records than federated.max_records_per_party=10"
    deployed = f"Error(code=2, reason=\"<class 'dpsynth.errors.DpsynthError'>:<'{message}'>\")"
    simulated = ("Error(code=2, reason='<class \\'ray.exceptions.RayTaskError(ClientAppException)\\'>:<\\'ray::"
                 "ClientAppActor.run() ...\\n    raise DpsynthError(\\ndpsynth.errors.DpsynthError: "
                 f"{message}\\n\\'>')")
    other = "Error(code=2, reason=\"<class 'ValueError'>:<'could not convert string to float: \\'Jane Doe\\''>\")"
    assert party_reason(deployed) == message and party_reason(simulated) == message
    assert party_reason(other) == "ValueError (the party's own log has its message)"
    # a vote or training round that fails reports its parties' errors the same way (it quoted 200 raw characters)
    from dpsynth.federated.flower_secagg import _party_errors

    assert _party_errors([other, deployed]) == f"; party errors: {party_reason(other)}; {message}"
    assert _party_errors([]) == ""


def test_secagg_rounds_of_a_party_group_and_label_counts_hide_single_parties() -> None:
    """fedgen's rounds on a real federation: every party's label counts, then votes of parties 2-4 only
    (found by a roster round); the server receives no single party's (quantised) noisy vector."""
    rng = np.random.default_rng(3)
    shards = _shards(rng, [6, 7, 5, 8, 6])
    candidates, cand_labels = rng.normal(size=(10, 16)).astype(np.float32), rng.integers(0, 2, 10)
    counts, knn = VoteSpec(kind="label_counts"), VoteSpec(kind="rank", weights=(1.0, 1.0))
    slots, slot_labels = np.zeros((2, 1), np.float32), np.arange(2)
    settings = FederationSettings(parties=5, min_parties=5, secure=True, max_records=10, timeout=60, noise_seed=4)
    replies: list[np.ndarray] = []

    def program(aggregator):
        _capture_replies(aggregator, replies)
        profile = aggregator.aggregate(VoteRound("labels.histogram", counts, slots, slot_labels, 0.6, clip=20.0))
        votes = aggregator.aggregate(VoteRound("fedgen.votes", knn, candidates, cand_labels, 0.8, clip=25.0,
                                               parties=(2, 3, 4), min_parties=2))
        return profile, votes

    profile, votes = run_federation(shards, settings, program)
    expected_counts = [noisy_votes(s, counts, slots, slot_labels, release="labels.histogram", party_sigma=0.6,
                                   max_records=10, noise_seed=4) for s in shards]
    expected_votes = [noisy_votes(s, knn, candidates, cand_labels, release="fedgen.votes", party_sigma=0.8,
                                  max_records=10, noise_seed=4) for s in shards[2:]]
    levels = quantization_range(5)
    assert profile.contributors == 5 and votes.contributors == 3
    assert np.abs(profile.total - np.sum(expected_counts, axis=0)).max() < 5 * 2 * 20.0 / levels
    assert np.abs(votes.total - np.sum(expected_votes, axis=0)).max() < 3 * 2 * 25.0 / levels
    # the clean counts are the records per label (each record votes for its own label once)
    clean = sum(np.bincount(s.label_ids, minlength=2) for s in shards)
    assert np.abs(profile.total - clean).max() < 6 * 0.6 * math.sqrt(5)
    assert len(votes.bytes_down) == 3  # only the weak parties were asked
    assert not any(_reveals(replies, v, 20.0, levels) for v in expected_counts)
    assert not any(_reveals(replies, v, 25.0, levels) for v in expected_votes)


def test_plain_aggregation_sums_exactly_and_sees_each_party() -> None:
    rng = np.random.default_rng(1)
    shards = _shards(rng, [5, 5, 5])
    candidates, cand_labels = rng.normal(size=(12, 16)).astype(np.float32), rng.integers(0, 2, 12)
    spec = VoteSpec(kind="rank")
    settings = FederationSettings(parties=3, min_parties=1, secure=False, max_records=10, timeout=60, noise_seed=2)
    replies: list[np.ndarray] = []

    def program(aggregator):
        _capture_replies(aggregator, replies)
        return aggregator.aggregate(VoteRound("augpe.votes.0", spec, candidates, cand_labels, 1.0, clip=0.0))

    pythonpath = os.environ.get("PYTHONPATH")
    result = run_federation(shards, settings, program)
    assert os.environ.get("PYTHONPATH") == pythonpath  # Ray's backend rewrites it; the caller's stays as it was
    expected = sum(noisy_votes(s, spec, candidates, cand_labels, release="augpe.votes.0", party_sigma=1.0,
                               max_records=10, noise_seed=2) for s in shards)
    assert result.contributors == 3 and np.allclose(result.total, expected)
    # the detector used above does see single parties when there is no secure aggregation
    first = noisy_votes(shards[0], spec, candidates, cand_labels, release="augpe.votes.0", party_sigma=1.0,
                        max_records=10, noise_seed=2)
    assert _reveals(replies, first, 25.0, quantization_range(3))


def test_party_level_sensitivity_and_plain_mode_noise_shares() -> None:
    from dpsynth.runs.planning import plan_privacy

    base = {"data": {"corpus": "rotten_tomatoes", "m": 300}, "generators": [{"model": "smollm2-135m-instruct"}],
            "wasp": {"q": 8}}
    party = parse_config({**base, "federated": {"parties": 150, "unit": "party", "max_records_per_party": 8}})
    plan = plan_privacy(party)
    assert sensitivity(plan) == pytest.approx(13.06, abs=0.01)  # PRIVACY.md: m * 1.63298
    paper = plan.paper()
    assert paper is not None and paper.sensitivity == 32.0  # the WASP paper's user-level Delta for m = 8
    assert plan.party_sigma(10.0) == pytest.approx(10.0 / math.sqrt(150))
    plain = parse_config({**base, "federated": {"parties": 10, "aggregation": "plain"}})
    assert plan_privacy(plain).party_sigma(3.0) == 3.0  # each party carries the full sigma


@pytest.mark.parametrize("method", ["wasp", "augpe"])
def test_with_a_party_as_the_unit_every_release_scales_by_its_records(method: str) -> None:
    """`federated.unit: party` protects a party's m records: every release's sensitivity is m times the per-record
    one, the DP label histogram's too (it once kept the per-record 1, so a run at eps 4 spent 5.5)."""
    from dpsynth.runs.planning import plan_privacy

    # "method" was missing, so the augpe case planned wasp (its section was silently ignored; now refused)
    base = {"method": method, "data": {"corpus": "rotten_tomatoes", "m": 300},
            "generators": [{"model": "smollm2-135m-instruct"}],
            "privacy": {"label_proportions": "dp", "label_histogram_sigma": 20.0}, method: {}}
    per_record = plan_privacy(parse_config({**base, "federated": {"parties": 10}}))
    per_party = plan_privacy(parse_config({**base, "federated": {"parties": 10, "unit": "party",
                                                                 "max_records_per_party": 8}}))
    releases = {r.name: r.sensitivity for r in per_record.schedule.releases}
    assert any(name.startswith("labels") for name in releases)
    assert {r.name: r.sensitivity for r in per_party.schedule.releases} == {
        name: pytest.approx(8 * value) for name, value in releases.items()}


def test_run_summary_prints_any_method_and_the_federation(capsys) -> None:
    from dpsynth.cli.runs import _print_summary

    evaluation = {"classifier": "probe", **{k: {"accuracy": 0.6, "macro_f1": 0.5, "train_size": 6, "test_size": 9}
                                            for k in ("augpe", "zero_shot")}}
    fed = {"parties": 3, "aggregation": "secagg+", "partition": "dirichlet", "sigma_per_party": 1.2,
           "download_bytes_per_party": 22000.0, "upload_bytes_per_party": 2700.0, "aggregation_seconds": 1.5,
           "rounds": [{}]}
    metrics = {"method": "augpe", "samples_per_plm": {"smol": 6}, "usage": {},
               "iterations": [{"iteration": 0, "generated": {"smol": {"kept": 6, "dropped": {}}}}],
               "evaluation": evaluation, "federated": fed, "timings": {"wall": 10.0, "generator_calls": 8.0}}
    _print_summary(Path("run"), {"metrics": metrics, "summary": ["epsilon spent: 4"]})
    out = capsys.readouterr().out
    assert "the final set (augpe): accuracy 0.6000" in out and "3 parties (secagg+" in out and "22.0 kB" in out


def test_per_party_files_keep_each_partys_records_together(tmp_path: Path) -> None:
    from dpsynth.data.public import task_for
    from dpsynth.federated.shards import party_indices
    from dpsynth.private.dataset import load_private

    files = []
    for i, n in enumerate([3, 5]):
        path = tmp_path / f"party{i}.csv"
        path.write_text("text,label\n" + "".join(f"party {i} text {j},{'a' if j % 2 else 'b'}\n" for j in range(n)))
        files.append(str(path))
    cfg = parse_config({"task": {"text_kind": "note", "labels": {"a": "A", "b": "B"}},
                        "generators": [{"model": "smollm2-135m-instruct"}], "wasp": {"q": 2},
                        "federated": {"parties": 2, "partition": "files", "party_files": files}})
    data = load_private(cfg)
    parts = party_indices(cfg, np.asarray(data.records.label_ids(task_for(cfg).label_names)), data.party_of)
    assert [len(p) for p in parts] == [3, 5]
    assert all(data.records.texts[j].startswith("party 1") for j in parts[1])
    with pytest.raises(DpsynthError, match="remove data.private"):
        parse_config({**cfg.model_dump(mode="json", exclude_none=True), "data": {"private": files[0]}})


def test_federated_release_is_charged_before_the_parties_are_asked(tmp_path: Path) -> None:
    from dpsynth.federated.holder import FederatedHolder
    from dpsynth.privacy.ledger import BudgetExceededError, PrivacyLedger
    from dpsynth.privacy.mechanisms import NoiseSource
    from dpsynth.privacy.schedule import Schedule
    from dpsynth.private.releases import ReleaseStore
    from dpsynth.runs.planning import plan_privacy

    cfg = parse_config({"data": {"private": str(tmp_path / "p.csv")},
                        "task": {"text_kind": "note", "labels": {"a": "A", "b": "B"}},
                        "generators": [{"model": "smollm2-135m-instruct"}], "wasp": {"q": 2, "iterations": 3},
                        "privacy": {"delta": 1e-3}, "federated": {"parties": 2, "partition": "iid"}})
    plan = plan_privacy(cfg)
    knobs = plan.calibrate()
    asked: list[str] = []

    class Aggregator:  # stands in for the Flower federation; the real one is covered end to end
        def aggregate(self, vote_round, on_exposed=None):
            asked.append(vote_round.release)

            class Result:
                total = np.zeros(vote_round.spec.length(len(vote_round.candidates)))
                contributors, bytes_down, bytes_up, seconds = 2, {0: 1}, {0: 1}, 0.1

            return Result()

    ledger = PrivacyLedger(4.0, plan.accounting_delta)
    # one release more than planned, to see that the ledger refuses it before the parties are asked
    over = make_plan("wasp", 4, 2, parties=2).schedule
    holder = FederatedHolder(cfg.federated, plan.clip_delta, ledger=ledger, noise=NoiseSource(None),
                             schedule=Schedule(over.releases, over.knobs), knobs=knobs, store=ReleaseStore(None))
    holder.connect(Aggregator())
    spec, cand, labels = VoteSpec(kind="wasp", q=2), np.zeros((4, 8), np.float32), np.array([0, 0, 1, 1])
    for t in (0, 1):  # the planned T-1 releases fit
        holder.noisy_votes(spec, cand, labels, release=("wasp.votes", t))
    assert [e.name for e in ledger.events] == asked == ["wasp.votes[iteration=0]", "wasp.votes[iteration=1]"]
    with pytest.raises(BudgetExceededError):  # one more is refused before any party is asked
        holder.noisy_votes(spec, cand, labels, release=("wasp.votes", 2))
    assert len(asked) == 2


def test_parties_get_the_label_order_of_the_task_also_for_a_corpus() -> None:
    """Regression: a corpus run has no task: section, and parties used to get no label names (a training
    party then failed on its first record)."""
    import json as _json

    from dpsynth.data.public import task_for
    from dpsynth.federated.holder import FederatedHolder
    from dpsynth.federated.simulation import settings_for
    from dpsynth.privacy.ledger import PrivacyLedger
    from dpsynth.privacy.mechanisms import NoiseSource
    from dpsynth.private.releases import ReleaseStore
    from dpsynth.runs.planning import plan_privacy

    cfg = parse_config({"data": {"corpus": "trec", "m": 60}, "generators": [{"model": "smollm2-135m-instruct"}],
                        "federated": {"parties": 3, "partition": "iid"}})
    plan = plan_privacy(cfg)
    holder = FederatedHolder(cfg.federated, plan.clip_delta, ledger=PrivacyLedger(4.0, 1e-5), noise=NoiseSource(0),
                             schedule=plan.schedule, knobs={}, store=ReleaseStore(None))
    labels = task_for(cfg).label_names
    settings = settings_for(cfg, holder, labels, deployed=False)
    assert _json.loads(settings.party_data["labels"]) == labels and len(labels) == 6
    assert settings.device == "cpu"  # the run's `device:` (auto: no GPU here); simulated parties train there


def test_a_vote_round_whose_answer_reached_the_server_unsaved_is_not_asked_again(tmp_path: Path) -> None:
    """The server sees a round's sum before the run saves it: a run stopped in between would, on resume, show the
    server a second noisy answer its ledger counts once. Such a resume is refused; a round stopped before any
    answer arrived is asked again; a saved round leaves no mark."""
    from dpsynth.federated.holder import FederatedHolder
    from dpsynth.privacy.ledger import PrivacyLedger
    from dpsynth.privacy.mechanisms import NoiseSource
    from dpsynth.private.releases import ReleaseStore
    from dpsynth.runs.planning import plan_privacy

    cfg = parse_config({"data": {"private": str(tmp_path / "p.csv")},
                        "task": {"text_kind": "note", "labels": {"a": "A", "b": "B"}},
                        "generators": [{"model": "smollm2-135m-instruct"}], "wasp": {"q": 2, "iterations": 2},
                        "privacy": {"delta": 1e-3}, "federated": {"parties": 2, "partition": "iid"}})
    plan = plan_privacy(cfg)
    spec, cand, labels = VoteSpec(kind="wasp", q=2), np.zeros((4, 8), np.float32), np.array([0, 0, 1, 1])

    class Aggregator:
        def __init__(self, stop: str | None) -> None:
            self.stop = stop

        def aggregate(self, vote_round, on_exposed=None):
            if self.stop == "before":
                raise KeyboardInterrupt
            if on_exposed is not None:
                on_exposed()
            if self.stop == "after":
                raise KeyboardInterrupt

            class Result:
                total = np.zeros(vote_round.spec.length(len(vote_round.candidates)))
                contributors, bytes_down, bytes_up, seconds = 2, {0: 1}, {0: 1}, 0.1

            return Result()

    def ask(stop: str | None, epsilon: float = 4.0) -> np.ndarray:
        knobs = plan.calibrate() if epsilon < math.inf else {k: 0.0 for k in plan.calibrate()}
        holder = FederatedHolder(cfg.federated, plan.clip_delta, ledger=PrivacyLedger(epsilon, plan.accounting_delta),
                                 noise=NoiseSource(None), schedule=plan.schedule, knobs=knobs,
                                 store=ReleaseStore(tmp_path / ("releases" if epsilon < math.inf else "no-noise")))
        holder.connect(Aggregator(stop))
        return holder.noisy_votes(spec, cand, labels, release=("wasp.votes", 0))

    with pytest.raises(KeyboardInterrupt):
        ask("before")
    with pytest.raises(KeyboardInterrupt):
        ask("after")  # asked again: nothing had reached the server
    with pytest.raises(DpsynthError, match="may have reached the server before the run stopped"):
        ask(None)
    marks = list((tmp_path / "releases").rglob("exposed-round"))
    assert len(marks) == 1
    marks[0].unlink()
    assert ask(None).shape == (spec.length(len(cand)),)
    assert not list((tmp_path / "releases").rglob("exposed-*"))
    for _ in range(3):  # un-noised (epsilon = inf): no guarantee to keep, so a recomputed release carries no mark
        ask(None, epsilon=math.inf)
    assert not list((tmp_path / "no-noise").rglob("exposed-*"))
