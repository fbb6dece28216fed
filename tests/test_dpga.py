"""DPGA-TextSyn: the PRIVACY.md vector, sensitivities against brute force, sparse vector, similarity
suppression, keyword parsing, and a run on the fake backend with canaries and a crash-resume."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeGenerator

from dpsynth.methods.dpga import (
    length_edges,
    parse_keywords,
    select_distinct,
    self_similarity,
)
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.private.holder import length_histogram, svt_length_bound, svt_query
from dpsynth.runs.config import parse_config
from dpsynth.runs.engine import Run
from dpsynth.runs.planning import plan_for_method
from dpsynth.voting.spec import VoteSpec, compute_votes

DELTA = 1 / (2000 * np.log(2000))  # PRIVACY.md: N=2000, delta = 1/(N ln N) = 6.578e-5


@pytest.mark.parametrize("eps,sigma", [(1, 11.38), (4, 3.75)])
def test_privacy_md_vector(eps: float, sigma: float) -> None:
    """25/25/50 split, T=10, q=0.8: three Laplace histograms + two SVT runs + ten subsampled votes."""
    plan = plan_for_method("dpga", epsilon=eps, delta=DELTA, label_proportions="dp",
                           options={"generations": 10, "sampling_rate": 0.8, "budget_svt": 0.25,
                                    "budget_attributes": 0.25})
    knobs = plan.calibrate()
    assert knobs["vote_sigma"] == pytest.approx(sigma, rel=5e-3)
    for what in ("labels", "lengths", "keywords"):  # each histogram (eps_attr/3)-DP
        assert knobs[f"{what}_scale"] == pytest.approx(3 / (0.25 * eps))
    assert knobs["svt_scale"] == pytest.approx(2 / (0.125 * eps))  # each SVT run (eps_svt/2)-DP
    kinds = [r.kind for r in plan.schedule.releases]
    assert kinds.count("dpga.votes") == 10 and len(kinds) == 15
    assert plan.epsilon_of(knobs) <= eps * (1 + 1e-6)


def _neighbours(rng: np.random.Generator, n: int = 12):
    lengths = rng.integers(1, 40, size=n)
    for i in range(n):
        yield lengths, np.delete(lengths, i)


def test_length_histogram_and_svt_queries_have_sensitivity_one() -> None:
    rng = np.random.default_rng(0)
    edges = length_edges(5, 30, 8)
    worst_hist, worst_query = 0.0, 0.0
    for _ in range(50):
        for full, less in _neighbours(rng):
            worst_hist = max(worst_hist, np.abs(length_histogram(full, edges) - length_histogram(less, edges)).sum())
            for i, which in itertools.product(range(45), ("max", "min")):  # the SVT query streams
                worst_query = max(worst_query, abs(svt_query(full, which, i) - svt_query(less, which, i)))
    assert worst_hist == 1.0 and worst_query == 1.0  # attained, never exceeded


def test_keyword_and_subsampled_votes_have_sensitivity_one() -> None:
    """Per-label Top-1 votes: one record moves at most one vote, within its own label."""
    rng = np.random.default_rng(1)
    spec = VoteSpec(kind="rank", weights=(1.0,))
    worst = 0.0
    for _ in range(30):
        private, labels = rng.normal(size=(10, 6)).astype(np.float32), rng.integers(0, 2, size=10)
        cand, cand_labels = rng.normal(size=(7, 6)).astype(np.float32), rng.integers(0, 2, size=7)
        full = compute_votes(spec, private, labels, cand, cand_labels)
        for i in range(10):
            less = compute_votes(spec, np.delete(private, i, 0), np.delete(labels, i), cand, cand_labels)
            diff = full - less
            worst = max(worst, np.abs(diff).sum())
            moved = np.flatnonzero(diff)
            assert all(cand_labels[j] == labels[i] for j in moved), "a record votes only within its label"
    assert worst == 1.0


def test_sparse_vector_finds_the_range_and_is_exact_without_noise() -> None:
    rng = np.random.default_rng(2)
    lengths = rng.integers(8, 40, size=100)
    assert svt_length_bound(lengths, "max", 128, None, rng) == lengths.max()
    assert svt_length_bound(lengths, "min", 128, None, rng) == lengths.min()
    highs = [svt_length_bound(lengths, "max", 128, 4.0, rng) for _ in range(40)]
    lows = [svt_length_bound(lengths, "min", 39, 4.0, rng) for _ in range(40)]
    assert abs(np.median(highs) - lengths.max()) <= 8 and abs(np.median(lows) - lengths.min()) <= 12
    # secure mode: the threshold and query noise come from OpenDP's exact Laplace sampler
    exact = NoiseSource().laplace_sampler("dpga.length_max")
    secure = [svt_length_bound(lengths, "max", 128, 4.0, exact) for _ in range(40)]
    assert abs(np.median(secure) - lengths.max()) <= 8


def test_similarity_suppression_skips_near_duplicates_and_raises_tau() -> None:
    base = np.eye(4, dtype=np.float32)
    emb = np.vstack([base[0], base[0] * 0.99 + base[1] * 0.01, base[1], base[2], base[3]])
    votes = np.array([10.0, 9.0, 5.0, 4.0, 1.0])
    chosen, tau = select_distinct(votes, emb, 3, tau=0.5, step=0.01)
    assert chosen == [0, 2, 3] and tau == 0.5  # the near-copy of the top candidate is skipped
    chosen, tau = select_distinct(votes[:2], emb[:2], 2, tau=0.5, step=0.1)
    assert chosen == [0, 1] and tau == pytest.approx(1.0)  # tau rose until both could be chosen
    assert self_similarity(emb[:2]) > 0.99 and abs(self_similarity(base)) < 1e-6
    rng = np.random.default_rng(5)
    cloud = rng.normal(size=(300, 8)) + 0.5
    unit = cloud / np.linalg.norm(cloud, axis=1, keepdims=True)
    pairs = unit @ unit.T
    assert self_similarity(cloud) == pytest.approx((pairs.sum() - np.trace(pairs)) / (300 * 299), abs=1e-12)
    assert select_distinct(votes, emb, 0, tau=0.5, step=0.01)[0] == []  # a label with no elite keeps none


def test_adjacency_user_level_and_ablations_in_the_schedule() -> None:
    from dpsynth.errors import DpsynthError

    replace = plan_for_method("dpga", epsilon=4, adjacency="replace", options={"generations": 2})
    votes = [r for r in replace.schedule.releases if r.kind == "dpga.votes"]
    # the subsampled Gaussian's PLD applies the replace relation itself: it gets one record's own norm
    assert votes[0].sensitivity == 1.0 and votes[0].event(2.0).noise_multiplier == 2.0
    assert replace.schedule.by_name("dpga.lengths").sensitivity == 2.0  # an L1 count histogram under replace
    # so the report says which figure is which: the votes' is a per-unit bound, the histograms' a sensitivity
    labels = {k["name"]: k["sensitivity_label"] for k in replace.describe(replace.calibrate())["knobs"]}
    assert labels["vote_sigma"].startswith("per-unit bound (add/remove") and labels["lengths_scale"] == "sensitivity"
    with pytest.raises(DpsynthError, match="record-level privacy"):
        plan_for_method("dpga", epsilon=4, max_records_per_user=2, options={"generations": 2})
    user = plan_for_method("dpga", epsilon=4, max_records_per_user=2, options={"generations": 2, "sampling_rate": 1})
    assert user.schedule.by_name("dpga.keywords").sensitivity == 2.0
    full = plan_for_method("dpga", epsilon=4, options={"generations": 2}).calibrate()
    ablated = plan_for_method("dpga", epsilon=4, options={"generations": 2, "use_keywords": False}).calibrate()
    assert "keywords_scale" not in ablated and ablated["lengths_scale"] == pytest.approx(full["lengths_scale"])
    assert ablated["vote_sigma"] < full["vote_sigma"]  # the freed share goes to the votes
    # the report names the votes' Poisson sampler its epsilon relies on (not the default "every record votes")
    sampled = plan_for_method("dpga", epsilon=4, options={"generations": 2}).assumptions().sampler
    assert "Poisson sampling of the records at rate 0.8" in sampled
    assert "every record votes" in user.assumptions().sampler



def test_votes_of_every_record_are_a_plain_gaussian_at_the_adjacencys_sensitivity() -> None:
    """q=1: no subsampling to amplify, so the votes are a Gaussian at the one-hot vote's own sensitivity, which
    under replace is sqrt(2) per record; the subsampled event's shift model charged 2 (about 47% more epsilon for
    ten releases at sigma 10). With q < 1 the subsampled event stays (its PLD applies the adjacency). A person's
    votes (k records) are clipped to one record's norm: the same sensitivity at k = 3."""
    from dpsynth.privacy.events import GaussianEvent, SubsampledGaussianEvent

    for adjacency, per_record in (("add_remove", 1.0), ("replace", math.sqrt(2))):
        for k in (1, 3):
            plan = plan_for_method("dpga", epsilon=4, adjacency=adjacency, max_records_per_user=k,
                                   options={"generations": 2, "sampling_rate": 1})
            votes = [r for r in plan.schedule.releases if r.kind == "dpga.votes"]
            assert len(votes) == 2 and votes[0].sensitivity == pytest.approx(per_record)
            assert isinstance(votes[0].event(10.0), GaussianEvent)
    sampled = plan_for_method("dpga", epsilon=4, adjacency="replace", options={"generations": 2})
    assert all(isinstance(r.event(10.0), SubsampledGaussianEvent)
               for r in sampled.schedule.releases if r.kind == "dpga.votes")


def test_keywords_are_parsed_from_plm_lists() -> None:
    text = "1. Acting performances\n- plot twists\n* Soundtrack and score\nA very long line that is not a sub-topic at all really"
    assert parse_keywords(text) == ["Acting performances", "plot twists", "Soundtrack and score"]
    assert length_edges(10, 12, 100) == [10, 11, 12, 13]


CANARY = "Zyxqv canary: the purple hippo reviewed the quantum lasagna"


def _config(tmp_path: Path) -> dict:
    rows = [(f"review number {i} of a {'great' if i % 2 else 'poor'} film with {i % 7 + 3} words", "pos" if i % 2
             else "neg") for i in range(40)] + [(CANARY, "pos")]
    (tmp_path / "private.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return {"method": "dpga", "data": {"private": str(tmp_path / "private.csv")},
            "task": {"text_kind": "review", "labels": {"pos": "a positive review", "neg": "a negative review"}},
            "generators": [{"kind": "fake", "model": "a"}, {"kind": "fake", "model": "b"}],
            "dpga": {"n": 12, "generations": 2, "length_cap": 64, "keywords_asked": 5, "keywords_kept": 3},
            "privacy": {"epsilon": 4.0, "delta": 1e-3}, "evaluate": False, "seed": 2}


def test_dpga_run_keeps_private_text_out_and_resumes_without_drawing_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls, FakeGenerator.fail_after = [], 6  # crash after the metadata, mid initial generation
    cfg = parse_config(_config(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        Run.create(cfg, tmp_path / "run").execute()
    releases = tmp_path / "run" / "checkpoints" / "releases"
    before = {p.name: json.loads(p.read_text())["values"] for p in releases.glob("*.json")}
    assert len(before) == 5  # labels, length max and min, lengths, keywords: saved when drawn
    FakeGenerator.fail_after = None
    Run.resume(tmp_path / "run").execute()
    after = {p.name: json.loads(p.read_text())["values"] for p in releases.glob("*.json")}
    assert all(after[k] == v for k, v in before.items())
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert [e["name"] for e in privacy["events"]] == [
        "dpga.labels", "dpga.length_max", "dpga.length_min", "dpga.lengths", "dpga.keywords",
        "dpga.votes[iteration=1]", "dpga.votes[iteration=2]"]
    assert privacy["epsilon"] == pytest.approx(4.0, rel=1e-3)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert all(it["self_similarity"] is not None for it in metrics["iterations"])
    needles = {CANARY[i:i + 20] for i in range(len(CANARY) - 19)}
    for request in FakeGenerator.calls:
        assert not any(n in request.prompt_text() for n in needles), "private text reached a prompt"
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            text = path.read_bytes().decode("utf-8", errors="ignore")
            assert not any(n in text for n in needles), f"private text in {path.name}"
    asked = [(r.seed, r.prompt_text()) for r in FakeGenerator.calls]
    assert len(asked) == len(set(asked)), "no generation was paid twice"
