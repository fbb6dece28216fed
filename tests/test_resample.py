"""DP histogram resampling (papers/001, Algorithm 2) as a final stage: clustering, the histogram's
sensitivity against brute force, the schedule it adds to any method, and runs end to end on the fake
backend (budget = what the run pays, the final set follows the noisy histogram, the stage resumes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from fakes import FakeGenerator
from test_engine import _budget_epsilon, _config
from typer.testing import CliRunner

from dpsynth.bench.grid import BenchConfig, cells
from dpsynth.cli import _typer_app
from dpsynth.errors import DpsynthError
from dpsynth.methods.generation import SyntheticSample
from dpsynth.methods.resample import (
    RESAMPLE,
    RESAMPLE_SIGMA,
    cluster_within_labels,
    resample_to_histogram,
    suggested_clusters,
    votes_per_bin_over_noise,
    weights_from_histogram,
)
from dpsynth.runs.config import parse_config
from dpsynth.runs.planning import plan_for_method
from dpsynth.voting.spec import VoteSpec, compute_votes


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls = []
    FakeGenerator.fail_after = None


def _samples(n: int, label: str = "pos") -> list[SyntheticSample]:
    return [SyntheticSample(id=i, text=f"text {i}", label=label, plm="a", iteration=0) for i in range(n)]


def test_clusters_stay_within_their_label() -> None:
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(40, 8))
    labels = np.array([0] * 25 + [1] * 15)
    centroids, centroid_labels, assignment = cluster_within_labels(emb, labels, clusters=4, seed=0)
    assert centroids.shape == (8, 8) and list(centroid_labels) == [0] * 4 + [1] * 4
    assert np.all(centroid_labels[assignment] == labels), "every sample sits in a bin of its own label"
    small = cluster_within_labels(emb[:3], np.array([0, 0, 1]), clusters=4, seed=0)
    assert list(small[1]) == [0, 0, 1], "a label with fewer samples than clusters gets one bin per sample"


def test_resampling_follows_the_noisy_histogram() -> None:
    samples = _samples(100)
    assignment = np.repeat(np.arange(4), 25)
    rng = np.random.default_rng(0)
    chosen, stats = resample_to_histogram(samples, assignment, np.array([20.0, 10.0, -5.0, 0.0]), 30, rng)
    bins = np.array([int(s.text.split()[1]) // 25 for s in chosen])
    assert list(np.bincount(bins, minlength=4)) == [20, 10, 0, 0], "negative noisy counts clip to zero"
    assert len({s.text for s in chosen}) == 30 and stats["duplicated"] == 0, "drawn without replacement"
    short, stats = resample_to_histogram(samples, assignment, np.array([1.0, 0, 0, 0]), 40, rng)
    assert len(short) == 40 and stats["duplicated"] == 15, "a short bin gives all it has, then repeats"
    noise, stats = resample_to_histogram(samples, assignment, np.array([-1.0, -2, -3, -4]), 20, rng)
    assert stats["all_noise_fallback"] and len(noise) == 20


def test_weights_give_each_labels_bins_the_noisy_shares_and_keep_the_label_mix() -> None:
    """Label 0's bins of 50, 30 and 20 samples with clipped noisy counts 10, 30, 0 (from -4) weigh 0.25, 0.75 and
    0 of label 0's weight, which stays 100/140 of the total as label 1's stays 40/140 (its bins 30 and 10 samples,
    counts 5 and 15); the mean weight is 1; a weight a sample already had (FuseGen's) multiplies in; a label whose
    counts are all noise keeps its weights."""
    samples = _samples(140)
    assignment = np.repeat([0, 1, 2, 3, 4], [50, 30, 20, 30, 10])
    bin_labels = np.array([0, 0, 0, 1, 1])
    noisy = np.array([10.0, 30.0, -4.0, 5.0, 15.0])
    out, stats = weights_from_histogram(samples, assignment, noisy, bin_labels)
    w = np.array([x.weight for x in out])
    assert [x.text for x in out] == [x.text for x in samples] and stats["kept"] == 140
    assert np.mean(w) == pytest.approx(1.0)
    per_bin = np.bincount(assignment, weights=w)
    assert per_bin[:3] / per_bin[:3].sum() == pytest.approx([0.25, 0.75, 0.0])
    assert per_bin[3:] / per_bin[3:].sum() == pytest.approx([0.25, 0.75])
    assert per_bin[:3].sum() == pytest.approx(100.0) and per_bin[3:].sum() == pytest.approx(40.0), "label mix kept"
    assert stats["zero_weight"] == 20 and stats["max_weight"] == pytest.approx(0.75 / 0.25)
    boosted = [SyntheticSample(id=x.id, text=x.text, label=x.label, plm="a", iteration=0,
                               weight=2.0 if x.id == 0 else 1.0) for x in samples]
    again = np.array([x.weight for x in weights_from_histogram(boosted, assignment, noisy, bin_labels)[0]])
    assert again[0] / again[1] == pytest.approx(2.0) and again[:100].sum() == pytest.approx(101 / 141 * 140)
    per_bin = np.bincount(assignment, weights=again)
    assert per_bin[:3] / per_bin[:3].sum() == pytest.approx([0.25, 0.75, 0.0]), "the histogram's shares, weighted"
    unweighted = [SyntheticSample(id=x.id, text=x.text, label=x.label, plm="a", iteration=0,
                                  weight=0.0 if 130 <= x.id else 1.0) for x in samples]  # bin 4 weighs nothing
    kept, stats = weights_from_histogram(unweighted, assignment, np.array([10.0, 30.0, -4.0, -1.0, 15.0]), bin_labels)
    assert stats["labels_all_noise"] == 1 and np.isfinite([x.weight for x in kept]).all()
    partly, stats = weights_from_histogram(samples, assignment, np.array([10.0, 30.0, -4.0, -1.0, -2.0]), bin_labels)
    assert stats["labels_all_noise"] == 1 and not stats["all_noise_fallback"]
    assert all(x.weight == pytest.approx(1.0) for x in partly[100:])
    flat, stats = weights_from_histogram(samples, assignment, -np.ones(5), bin_labels)
    assert stats["all_noise_fallback"] and all(x.weight == pytest.approx(1.0) for x in flat)


def test_weights_and_a_target_are_refused_together(tmp_path: Path) -> None:
    raw = _config(tmp_path, "zero-shot")
    with pytest.raises(DpsynthError, match="resample.weights keeps every sample"):
        parse_config({**raw, "resample": {"weights": True, "target": 10}})


def test_weighted_resampling_writes_every_sample_once_with_its_weight(tmp_path: Path) -> None:
    """`resample: {weights: true}`: every sample written once with its weight, the same one release."""
    raw = _config(tmp_path, "zero-shot")
    raw["privacy"]["label_proportions"] = None
    raw["resample"] = {"clusters": 2, "weights": True}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(_typer_app, ["run", str(tmp_path / "run.yaml"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "run" / "synthetic.jsonl").read_text().splitlines()]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    stage = metrics["iterations"][-1]["resample"]
    assert stage["weighted"] and stage["kept"] == len(rows) == sum(metrics["samples_per_plm"].values())
    assert len({r["text"] for r in rows}) == len(rows) and np.mean([r["weight"] for r in rows]) == pytest.approx(1.0)
    assert [e["name"] for e in json.loads((tmp_path / "run" / "privacy.json").read_text())["events"]] == [RESAMPLE]


def _histogram_case(seed: int, records: int):
    """Random private records, centroids of random synthetic samples, and the histogram the holder computes."""
    rng = np.random.default_rng(seed)
    private, private_labels = rng.normal(size=(records, 6)), rng.integers(0, 2, records)
    centroids, centroid_labels, _ = cluster_within_labels(rng.normal(size=(2 * records, 6)),
                                                          rng.integers(0, 2, 2 * records), 3, 0)

    def histogram(texts: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return compute_votes(VoteSpec(kind="rank", weights=(1.0,)), texts, labels, centroids, centroid_labels)

    return rng, private, private_labels, histogram


def test_the_cluster_histogram_has_sensitivity_one_by_brute_force() -> None:
    """Adding or removing any one record moves the released histogram by at most 1 in L2 (the event's)."""
    _, private, private_labels, histogram = _histogram_case(1, 30)
    full = histogram(private, private_labels)
    assert full.sum() == 30
    plan = plan_for_method("zero-shot", epsilon=1.0, resample={"clusters": 3})
    bound = plan.schedule.get(RESAMPLE).sensitivity
    worst = max(np.linalg.norm(full - histogram(np.delete(private, i, 0), np.delete(private_labels, i)))
                for i in range(30))
    assert worst == pytest.approx(bound) == 1.0


def test_the_stage_adds_one_release_to_any_method_and_calibrates_with_it() -> None:
    alone = plan_for_method("zero-shot", epsilon=1.0, delta=1e-5, resample={"clusters": 4})
    knobs = alone.calibrate()
    assert [r.name for r in alone.schedule.releases] == [RESAMPLE]
    assert alone.epsilon_of(knobs) == pytest.approx(1.0, rel=1e-3), "alone, the histogram takes the whole budget"
    wasp = plan_for_method("wasp", epsilon=4.0, delta=1e-5, options={"iterations": 3}, resample={"clusters": 4})
    knobs = wasp.calibrate()
    assert wasp.epsilon_of(knobs) == pytest.approx(4.0, rel=1e-3)
    assert wasp.schedule.knob(RESAMPLE_SIGMA).share == 0.2, "next to a method's own noise: a default share"
    fixed = plan_for_method("wasp", epsilon=4.0, options={"iterations": 3}, resample={"sigma": 10.0})
    assert fixed.calibrate()[RESAMPLE_SIGMA] == 10.0
    with pytest.raises(DpsynthError, match="not both"):
        plan_for_method("wasp", epsilon=4.0, resample={"sigma": 10.0, "share": 0.1})


def test_votes_per_bin_rule_reads_noisy_values_only() -> None:
    noisy = np.array([12.0, 8.0, -3.0, 20.0])
    assert votes_per_bin_over_noise(noisy, 2.0) == pytest.approx(40 / 4 / 2)
    assert suggested_clusters(noisy, 2.0, labels=2) == math.floor(40 / (2 * 3 * 2.0))
    assert votes_per_bin_over_noise(noisy, 0.0) is None


def _resample_config(tmp_path: Path, method: str = "zero-shot") -> dict:
    raw = _config(tmp_path, method)
    raw["privacy"]["label_proportions"] = None
    raw["resample"] = {"clusters": 2, "target": 10}
    return raw


def test_zero_shot_plus_resampling_runs_and_pays_what_budget_plans(tmp_path: Path) -> None:
    raw = _resample_config(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(_typer_app, ["run", str(tmp_path / "run.yaml"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert [e["name"] for e in privacy["events"]] == [RESAMPLE]
    assert privacy["epsilon"] == pytest.approx(_budget_epsilon(tmp_path / "run.yaml"), abs=1e-4)
    assert privacy["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert (tmp_path / "run" / "synthetic.jsonl").read_text().count("\n") == 10
    assert "API retries so far {'a': 0, 'b': 0}" in (tmp_path / "run" / "run.log").read_text()
    stage = json.loads((tmp_path / "run" / "metrics.json").read_text())["iterations"][-1]
    assert stage["resample"]["bins"] == 4 and stage["resample"]["kept"] == 10
    released = json.loads(next((tmp_path / "run" / "checkpoints" / "releases").glob("resample*")).read_text())
    assert len(released["values"]) == 4 and not all(float(v).is_integer() for v in released["values"]), \
        "only the noisy histogram is saved"


def test_a_crash_in_the_stage_resumes_without_paying_twice(tmp_path: Path) -> None:
    from dpsynth.runs.engine import Run

    cfg = parse_config(_resample_config(tmp_path, "augpe"))
    run = Run.create(cfg, tmp_path / "run")
    original = run._resample

    def crash(live, t):
        original(live, t)
        raise KeyboardInterrupt  # after the histogram's release, before the checkpoint

    run._resample = crash
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    saved = json.loads(next((tmp_path / "run" / "checkpoints" / "releases").glob("resample*")).read_text())
    Run.resume(tmp_path / "run").execute()
    again = json.loads(next((tmp_path / "run" / "checkpoints" / "releases").glob("resample*")).read_text())
    assert again["values"] == saved["values"]
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert [e["name"] for e in privacy["events"]].count(RESAMPLE) == 1
    assert privacy["epsilon"] == pytest.approx(2.0, rel=1e-3)


def test_bench_treats_a_resampled_zero_shot_variant_as_private() -> None:
    bench = BenchConfig(base={"data": {"corpus": "rotten_tomatoes", "m": 100}, "generators": [{"model": "a"}]},
                        variants=[{"name": "zero-shot", "method": "zero-shot"},
                                  {"name": "zero-shot-resampled", "method": "zero-shot",
                                   "overrides": {"resample": {"clusters": 2}}}],
                        epsilons=[1.0, 4.0], seeds=[0])
    by_variant = {}
    for cell in cells(bench):
        by_variant.setdefault(cell["variant"], []).append(cell["epsilon"])
    assert by_variant == {"zero-shot": [None], "zero-shot-resampled": [1.0, 4.0]}


def test_empty_kmeans_centroids_get_no_bin_and_the_target_is_met() -> None:
    """Repeated texts can leave k-means centroids empty: they get no bin, and nothing is lost."""
    emb = np.repeat(np.eye(8)[:2], 4, axis=0)  # 8 samples, 2 distinct points
    centroids, _, assignment = cluster_within_labels(emb, np.zeros(8, dtype=np.int64), clusters=4, seed=0)
    assert len(centroids) == 2 and set(assignment) == {0, 1}
    chosen, stats = resample_to_histogram(_samples(8), assignment, np.array([4.0, 4.0]), 8,
                                          np.random.default_rng(0))
    assert len(chosen) == 8 and stats["duplicated"] == 0


def test_the_cluster_histogram_under_replace_adjacency_by_brute_force() -> None:
    rng, private, private_labels, histogram = _histogram_case(2, 20)
    full = histogram(private, private_labels)
    worst = 0.0
    for i in range(20):
        for _ in range(5):
            other, other_labels = private.copy(), private_labels.copy()
            other[i], other_labels[i] = rng.normal(size=6), rng.integers(0, 2)
            worst = max(worst, np.linalg.norm(full - histogram(other, other_labels)))
    bound = plan_for_method("zero-shot", epsilon=1.0, adjacency="replace",
                            resample={"clusters": 3}).schedule.get(RESAMPLE).sensitivity
    assert worst <= bound + 1e-12 and bound == pytest.approx(math.sqrt(2))
