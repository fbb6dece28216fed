"""DP label correction (`relabel:`) as a final stage: the correction rule and the denoising projection on hand
cases, the release's sensitivity against brute force, the schedule it adds to any method, and runs end to end on
the fake backend (budget = what the run pays, labels move and nothing else, the stage resumes without a second
release, the public control reads no private record)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from fakes import FakeGenerator
from test_engine import PRIVATE, _budget_epsilon, _config
from typer.testing import CliRunner

from dpsynth.bench.grid import BenchConfig, cells
from dpsynth.cli import _typer_app
from dpsynth.config import DEFAULT_EMBEDDER
from dpsynth.embed.sentence import SentenceTransformerEmbedder
from dpsynth.errors import DpsynthError
from dpsynth.methods.relabel import (
    RELABEL,
    RELABEL_SIGMA,
    blended_scores,
    corrected_labels,
    denoise_in_synthetic_span,
    gap_noise,
    labels_by_scores,
    private_reliability,
    synthetic_basis,
)
from dpsynth.runs.config import parse_config
from dpsynth.runs.planning import plan_for_method
from dpsynth.voting.scores import unit_rows
from dpsynth.voting.spec import VoteSpec, compute_votes


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls = []
    FakeGenerator.fail_after = None


def test_a_sample_moves_only_when_another_centroid_is_nearer_by_more_than_the_margin() -> None:
    centroids = np.array([[1.0, 0.0], [0.0, 1.0]])
    # cosines to (label 0, label 1): (0.6, 0.8) gap 0.2; (0.7, 0.714) gap 0.014; (1, 0) own already nearest
    samples = np.array([[0.6, 0.8], [0.7, 0.714], [1.0, 0.0], [0.0, 1.0]])
    own = np.array([0, 0, 0, 1])
    assert list(corrected_labels(samples, own, centroids, margin=0.05)) == [1, 0, 0, 1]
    assert list(corrected_labels(samples, own, centroids, margin=0.0)) == [1, 1, 0, 1]
    assert list(corrected_labels(samples, own, centroids, margin=0.3)) == [0, 0, 0, 1]
    # cosine, not dot product: a centroid's length (its label's record count) does not decide
    assert list(corrected_labels(samples, own, centroids * [[10.0], [1.0]], margin=0.05)) == [1, 0, 0, 1]


def test_a_sample_moves_only_when_its_gap_beats_the_noise() -> None:
    centroids = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    samples = np.array([[0.1, 0.9, 0.5], [0.0, 0.2, 1.0]])
    own = np.array([0, 0])
    noise = np.zeros((2, 3))
    assert list(corrected_labels(samples, own, centroids, 0.05, noise, min_z=2.0)) == [1, 2]
    noise[0, 1] = 0.4  # sample 0's gap to label 1 (about 0.78) is under 2 x 0.4: it takes its next open label
    assert list(corrected_labels(samples, own, centroids, 0.05, noise, min_z=2.0)) == [2, 2]
    noise[:, :] = 1.0
    assert list(corrected_labels(samples, own, centroids, 0.05, noise, min_z=2.0)) == [0, 0], "all noise: stays"
    assert list(corrected_labels(samples, own, centroids, 0.05, noise, min_z=0.0)) == [1, 2], "z 0: no test"


def test_gap_noise_by_hand() -> None:
    # centroids of norm 2 and 4: a unit sample's gap from label 0 to label 1 moves by sigma x sqrt(1/4 + 1/16)
    centroids = np.array([[2.0, 0.0], [0.0, 4.0]])
    noise = gap_noise(np.array([[1.0, 0.0]]), [0], centroids, sigma=0.5, basis=None)
    assert noise.shape == (1, 2) and noise[0, 1] == pytest.approx(0.5 * np.sqrt(1 / 4 + 1 / 16))
    basis = np.array([[0.0], [1.0]])  # a sample outside the kept span is not moved by the kept noise
    assert gap_noise(np.array([[1.0, 0.0]]), [0], centroids, 0.5, basis)[0, 1] == 0.0


def test_private_reliability_by_hand() -> None:
    # |c|^2 = 25, 4 and 1 in 2 kept dimensions with sigma 0.5: 1 - 2 x 0.25 / |c|^2 = 0.98, 0.875 and 0.5
    centroids = np.array([[3.0, 4.0], [0.0, 2.0], [1.0, 0.0], [0.1, 0.0]])
    assert np.allclose(private_reliability(centroids, sigma=0.5, dims=2), [0.98, 0.875, 0.5, 0.0])
    assert np.allclose(private_reliability(centroids, sigma=0.0, dims=2), 1.0), "no noise: all signal"


def test_blend_is_the_private_rule_when_reliable_and_the_public_control_when_not() -> None:
    samples = np.array([[0.6, 0.8], [0.8, 0.6]])
    own = np.array([0, 1])
    private = np.array([[1.0, 0.0], [0.0, 1.0]])  # sample 0 nearer label 1, sample 1 nearer label 0
    public = np.array([[0.0, 1.0], [1.0, 0.0]])  # the public descriptions say the opposite
    by_private = corrected_labels(samples, own, private, 0.05)
    assert list(labels_by_scores(blended_scores(samples, private, public, np.ones(2)), own, 0.05)) == \
        list(by_private) == [1, 0]
    assert list(labels_by_scores(blended_scores(samples, private, public, np.zeros(2)), own, 0.05)) == \
        list(corrected_labels(samples, own, public, 0.05)) == [0, 1]
    half = blended_scores(samples, private, public, np.array([0.5, 0.5]))
    assert np.allclose(half, 0.7), "equal shares of opposite opinions: a tie, nothing moves"
    # the weights are per label: label 1's private centroid trusted, label 0's not
    mixed = blended_scores(samples, private, public, np.array([0.0, 1.0]))
    assert np.allclose(mixed, [[0.8, 0.8], [0.6, 0.6]])


def test_gap_noise_scales_with_the_private_share() -> None:
    centroids = np.array([[2.0, 0.0], [0.0, 4.0]])
    weighted = gap_noise(np.array([[1.0, 0.0]]), [0], centroids, 0.5, None, weights=np.array([0.5, 1.0]))
    assert weighted[0, 1] == pytest.approx(0.5 * np.sqrt(0.25 / 4 + 1 / 16))
    zero = gap_noise(np.array([[1.0, 0.0]]), [0], centroids, 0.5, None, weights=np.zeros(2))
    assert np.all(zero == 0.0), "a score with no private share carries no noise"


def test_denoising_keeps_the_synthetic_span_and_drops_the_rest() -> None:
    rng = np.random.default_rng(0)
    synthetic = np.zeros((50, 6))
    synthetic[:, 0] = 1.0
    synthetic[:, 1] = rng.normal(size=50)  # the samples vary along e1 only: span{mean, top direction} = {e0, e1}
    centroids = np.array([[2.0, 3.0, 5.0, 0.0, -1.0, 0.0]])
    basis = synthetic_basis(synthetic, subspace=1)
    assert np.allclose(denoise_in_synthetic_span(centroids, basis), [[2.0, 3.0, 0, 0, 0, 0]])
    assert synthetic_basis(synthetic, subspace=0) is None
    assert np.array_equal(denoise_in_synthetic_span(centroids, None), centroids)


def test_the_released_sums_have_sensitivity_one_per_record_by_brute_force() -> None:
    rng = np.random.default_rng(3)
    private, labels = rng.normal(size=(9, 5)), rng.integers(0, 3, size=9)
    placeholder, spec = np.zeros((3, 5)), VoteSpec(kind="embedding_sums")
    full = compute_votes(spec, private, labels, placeholder, np.arange(3))
    worst = max(np.linalg.norm(full - compute_votes(spec, np.delete(private, i, 0), np.delete(labels, i),
                                                    placeholder, np.arange(3))) for i in range(9))
    assert worst == pytest.approx(1.0), "removing one record moves the sums by its unit embedding"


def test_the_stage_adds_one_release_to_any_method_and_the_public_control_none() -> None:
    alone = plan_for_method("zero-shot", epsilon=4.0, delta=1e-5, relabel={})
    knobs = alone.calibrate()
    assert [r.name for r in alone.schedule.releases] == [RELABEL]
    assert alone.epsilon_of(knobs) == pytest.approx(4.0, rel=1e-3), "alone, the sums take the whole budget"
    assert knobs[RELABEL_SIGMA] == pytest.approx(1.081, abs=2e-3)
    wasp = plan_for_method("wasp", epsilon=4.0, delta=1e-5, options={"iterations": 3}, relabel={})
    assert wasp.epsilon_of(wasp.calibrate()) == pytest.approx(4.0, rel=1e-3)
    assert wasp.schedule.knob(RELABEL_SIGMA).share == 0.2, "next to a method's own noise: a default share"
    both = plan_for_method("zero-shot", epsilon=4.0, delta=1e-5, relabel={}, resample={"clusters": 2})
    assert both.epsilon_of(both.calibrate()) == pytest.approx(4.0, rel=1e-3), "with resampling: one free knob"
    assert plan_for_method("zero-shot", epsilon=4.0, relabel={"scoring": "public"}).schedule.is_empty
    with pytest.raises(DpsynthError, match="not both"):
        plan_for_method("zero-shot", epsilon=4.0, relabel={"sigma": 1.0, "share": 0.1})


def test_relabel_is_refused_in_a_federated_run(tmp_path: Path) -> None:
    raw = _config(tmp_path, "wasp")
    raw["relabel"] = {}
    raw["federated"] = {"parties": 2}
    with pytest.raises(DpsynthError, match="central stage"):
        parse_config(raw, "run.yaml")


def _relabel_config(tmp_path: Path, **options) -> dict:
    raw = _config(tmp_path, "zero-shot")
    raw["privacy"]["label_proportions"] = None
    raw["relabel"] = {"margin": 0.0, "min_z": 0.0, **options}
    return raw


def _run(tmp_path: Path, raw: dict) -> Path:
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(_typer_app, ["run", str(tmp_path / "run.yaml"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    return tmp_path / "run"


def test_zero_shot_plus_relabelling_pays_what_budget_plans_and_changes_only_labels(tmp_path: Path) -> None:
    run = _run(tmp_path, _relabel_config(tmp_path))
    privacy = json.loads((run / "privacy.json").read_text())
    assert [e["name"] for e in privacy["events"]] == [RELABEL]
    assert privacy["epsilon"] == pytest.approx(_budget_epsilon(tmp_path / "run.yaml"), abs=1e-4)
    assert privacy["private_records_read"] is True
    stage = json.loads((run / "metrics.json").read_text())["iterations"][-1]["relabel"]
    final = [json.loads(x) for x in (run / "synthetic.jsonl").read_text().splitlines()]
    assert stage["samples"] == len(final) == 12
    plain_raw = _relabel_config(tmp_path)
    del plain_raw["relabel"]
    (tmp_path / "plain").mkdir()
    plain = [json.loads(x) for x in (_run(tmp_path / "plain", plain_raw) / "synthetic.jsonl").read_text().splitlines()]
    assert [r["text"] for r in final] == [r["text"] for r in plain], "the texts and their order are unchanged"
    assert stage["moved"] == sum(a["label"] != b["label"] for a, b in zip(final, plain)) > 0
    assert stage["moved"] == sum(stage["moved_to"].values())
    released = json.loads(next((run / "checkpoints" / "releases").glob("relabel*")).read_text())
    values = np.asarray(released["values"], dtype=float).reshape(2, -1)
    # the saved release is the clean per-label sums plus noise of the planned sigma, recomputed here from the
    # private records with the run's own embedder
    emb = unit_rows(SentenceTransformerEmbedder(DEFAULT_EMBEDDER).encode([t for t, _ in PRIVATE]))
    clean = np.stack([emb[[y == c for _, y in PRIVATE]].sum(axis=0) for c in stage["moved_to"]])  # the run's order
    sigma = next(k["value"] for k in privacy["plan"]["knobs"] if k["name"] == RELABEL_SIGMA)
    residual = values - clean
    assert residual.std() == pytest.approx(sigma, rel=0.1) and abs(residual.mean()) < 0.15 * sigma, \
        "one noisy row of sums per label is saved, nothing clean"
    # and the sums are in it, each label's in its row: pure noise gives a slope near 0, swapped rows about 0.7
    # (standard error about 0.07 here)
    assert float((values * clean).sum() / (clean * clean).sum()) == pytest.approx(1.0, abs=0.25)


def test_blend_scoring_pays_the_same_release_and_reports_its_shares(tmp_path: Path) -> None:
    run = _run(tmp_path, _relabel_config(tmp_path, scoring="blend"))
    privacy = json.loads((run / "privacy.json").read_text())
    assert [e["name"] for e in privacy["events"]] == [RELABEL] and privacy["private_records_read"] is True
    assert privacy["epsilon"] == pytest.approx(_budget_epsilon(tmp_path / "run.yaml"), abs=1e-4)
    stage = json.loads((run / "metrics.json").read_text())["iterations"][-1]["relabel"]
    assert stage["scoring"] == "blend"
    assert set(stage["private_reliability"]) == set(stage["moved_to"])
    assert all(0.0 <= a <= 1.0 for a in stage["private_reliability"].values())


def test_the_public_control_reads_no_private_record_and_spends_nothing(tmp_path: Path) -> None:
    run = _run(tmp_path, _relabel_config(tmp_path, scoring="public"))
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["events"] == [] and privacy["private_records_read"] is False
    assert json.loads((run / "metrics.json").read_text())["iterations"][-1]["relabel"]["scoring"] == "public"


@pytest.mark.parametrize("scoring", ["private", "blend"])
def test_a_crash_in_the_stage_resumes_without_a_second_release(tmp_path: Path, scoring: str) -> None:
    from dpsynth.runs.engine import Run

    cfg = parse_config(_relabel_config(tmp_path, scoring=scoring))
    run = Run.create(cfg, tmp_path / "run")
    original = run._relabel

    def crash(live, t):
        original(live, t)
        raise KeyboardInterrupt  # after the sums' release, before the checkpoint

    run._relabel = crash  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    saved = json.loads(next((tmp_path / "run" / "checkpoints" / "releases").glob("relabel*")).read_text())
    Run.resume(tmp_path / "run").execute()
    again = json.loads(next((tmp_path / "run" / "checkpoints" / "releases").glob("relabel*")).read_text())
    assert again["values"] == saved["values"]
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert [e["name"] for e in privacy["events"]].count(RELABEL) == 1


def test_relabelling_then_weights_pay_both_releases_once_and_resume_between_the_stages(tmp_path: Path) -> None:
    """The two final stages stacked (`relabel:` then `resample: {weights: true}`): one ledger with both releases,
    the run's epsilon what `dpsynth budget` plans, the weights on the corrected labels, and a crash after the
    label correction resumes without a second release of the sums."""
    from dpsynth.methods.resample import RESAMPLE
    from dpsynth.runs.engine import Run

    raw = _relabel_config(tmp_path)
    raw["privacy"]["noise_seed"] = 3  # the same sums' noise as the run without the weights below
    raw["resample"] = {"clusters": 2, "weights": True}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    run = Run.create(parse_config(raw), tmp_path / "run")

    def crash(live, t):
        raise KeyboardInterrupt  # the label correction has run and been checkpointed; the histogram not yet

    run._resample = crash  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    releases = tmp_path / "run" / "checkpoints" / "releases"
    saved = json.loads(next(releases.glob("relabel*")).read_text())
    assert not list(releases.glob("resample*"))
    Run.resume(tmp_path / "run").execute()
    assert json.loads(next(releases.glob("relabel*")).read_text())["values"] == saved["values"]
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert [e["name"] for e in privacy["events"]] == [RELABEL, RESAMPLE]
    assert privacy["epsilon"] == pytest.approx(_budget_epsilon(tmp_path / "run.yaml"), abs=1e-4)
    assert privacy["epsilon"] == pytest.approx(2.0, rel=1e-3)
    rows = [json.loads(x) for x in (tmp_path / "run" / "synthetic.jsonl").read_text().splitlines()]
    stages = json.loads((tmp_path / "run" / "metrics.json").read_text())["iterations"][-2:]
    assert stages[0]["relabel"]["samples"] == stages[1]["resample"]["kept"] == len(rows)
    sigma = next(k["value"] for k in privacy["plan"]["knobs"] if k["name"] == RELABEL_SIGMA)
    alone = _relabel_config(tmp_path, sigma=sigma)  # the sums' release of the stacked run, drawn again alone
    alone["privacy"]["noise_seed"] = 3
    Run.create(parse_config(alone), tmp_path / "alone").execute()  # created alike: the same label order
    relabelled = [json.loads(x) for x in (tmp_path / "alone" / "synthetic.jsonl").read_text().splitlines()]
    assert [(r["text"], r["label"]) for r in rows] == [(r["text"], r["label"]) for r in relabelled], \
        "every sample kept, in its order, with its corrected label"
    assert stages[0]["relabel"]["moved"] > 0 and all(r["weight"] >= 0 for r in rows)
    for label in {r["label"] for r in rows}:  # each label keeps its share of the set: weights sum to its count
        mine = [r["weight"] for r in rows if r["label"] == label]
        assert sum(mine) == pytest.approx(len(mine)), "the weights follow the corrected labels"
    assert "`weight`" in (tmp_path / "run" / "README.md").read_text(), "the card names the weight column"
    assert "`weight`" not in (tmp_path / "alone" / "README.md").read_text()


def test_bench_treats_private_relabelling_as_private_and_the_public_control_as_not() -> None:
    bench = BenchConfig(base={"data": {"corpus": "rotten_tomatoes", "m": 100}, "generators": [{"model": "a"}]},
                        variants=[{"name": "zero-shot", "method": "zero-shot"},
                                  {"name": "public", "method": "zero-shot",
                                   "overrides": {"relabel": {"scoring": "public"}}},
                                  {"name": "private", "method": "zero-shot", "overrides": {"relabel": {}}},
                                  {"name": "blend", "method": "zero-shot",
                                   "overrides": {"relabel": {"scoring": "blend"}}}],
                        epsilons=[4.0], seeds=[0])
    assert {c["variant"]: c["epsilon"] for c in cells(bench)} == \
        {"zero-shot": None, "public": None, "private": 4.0, "blend": 4.0}


def test_a_resume_that_adds_or_drops_a_final_stage_is_refused(tmp_path: Path) -> None:
    """Final stages are numbered after the method's iterations: a resume must find the same list, even when the
    added stage (the public control) releases nothing."""
    from dpsynth.runs.engine import Run

    raw = _config(tmp_path, "zero-shot")
    raw["privacy"]["label_proportions"] = None
    (tmp_path / "run").mkdir()
    run = Run.create(parse_config(raw), tmp_path / "run" / "a")
    original = run.method.step

    def crash(ctx, state, t):
        original(ctx, state, t)
        raise KeyboardInterrupt

    run.method.step = crash  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    saved = yaml.safe_load((tmp_path / "run" / "a" / "config.yaml").read_text())
    saved["relabel"] = {"scoring": "public"}
    (tmp_path / "run" / "a" / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(DpsynthError, match="final stages"):
        Run.resume(tmp_path / "run" / "a").execute()


def test_the_run_summary_names_the_moves_and_the_gain_with_a_test_example_interval(tmp_path: Path) -> None:
    """`dpsynth run`/`demo` print what the stage moved (and blend's shares) and the final set's macro-F1 gain over
    the same texts before relabelling, paired by test example; no line without a reference set."""
    from dpsynth.cli.runs import gain_lines, relabel_lines
    from dpsynth.data.public import load_test
    from dpsynth.runs.config import dump_config

    stage = {"relabel": {"samples": 120, "moved": 9, "moved_to": {"ham": 9, "spam": 0}, "scoring": "blend",
                         "private_reliability": {"ham": 0.97, "spam": 0.68}}}
    (line,) = relabel_lines([{"iteration": 0}, stage])
    assert "(blend): 9 of 120 samples moved (9 to ham, 0 to spam)" in line and "ham 0.97, spam 0.68" in line
    assert relabel_lines([{"iteration": 0}]) == []

    raw = _config(tmp_path, "zero-shot")
    raw["data"] = {"corpus": "trec", "m": 20}
    config = parse_config(raw)
    (tmp_path / "config.yaml").write_text(dump_config(config))
    truth = list(load_test(config).labels)
    wrong = [truth[(i + 1) % len(truth)] if i % 2 else t for i, t in enumerate(truth)]  # every other one off
    evaluation = {"zero-shot": {"predicted": truth}, "before_relabelling": {"predicted": wrong}}
    lines = gain_lines(tmp_path, "zero-shot", evaluation)
    assert "gain from the private data" in lines[0] and "over the same texts with the labels" in lines[0]
    gain, low, high = (float(x) for x in re.findall(r"[+-]\d+\.\d+", lines[0])[:3])
    assert 0 < low < gain < high, "a real gain, with an interval around it"
    assert gain_lines(tmp_path, "zero-shot", {"zero-shot": {"predicted": truth}}) == []
