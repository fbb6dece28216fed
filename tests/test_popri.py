"""POPri (method popri): pairs from scores, the DPO loss against hand-computed values, the privacy plan of
both scorings, settings errors, and a tiny real run (SmolLM2, LoRA, DPO) that trains, samples from the
tuned adapter, resumes after a crash mid-run without drawing a release twice, and writes nothing private."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth.errors import DpsynthError
from dpsynth.finetune.preference import dpo_loss
from dpsynth.methods.generation import SyntheticSample
from dpsynth.methods.popri import SCORE_SIGMA, preference_pairs
from dpsynth.privacy.accountant import gdp_mu_for
from dpsynth.runs.config import parse_config
from dpsynth.runs.planning import plan_for_method
from dpsynth.voting.scores import centroid_scores

CANARY = "Zyxqv canary gamma: the purple hippo reviewed the quantum lasagna"


def _samples(labels: list[str]) -> list[SyntheticSample]:
    return [SyntheticSample(i, f"text {i}", label, "p", 0) for i, label in enumerate(labels)]


def test_pairs_are_ranked_within_groups_of_one_label() -> None:
    samples = _samples(["a"] * 7 + ["b"] * 4)
    scores = np.array([0.1, 0.9, 0.5, 0.3, 0.7, 0.2, 0.8, 1.0, 0.0, 0.5, 0.4])
    # label a: groups [0..3] and [4..6]; label b: [7..10]; j=4, chosen rank 1, rejected rank 3
    pairs = preference_pairs(samples, scores, j=4, chosen_rank=1, rejected_rank=3)
    assert pairs == [(1, 3), (6, 5), (7, 10)]
    # a last group smaller than the rejected rank is dropped
    assert preference_pairs(samples, scores, j=4, chosen_rank=1, rejected_rank=4) == [(1, 0), (7, 8)]


def test_dpo_loss_matches_hand_computation() -> None:
    pc, pr = torch.tensor([-10.0, -12.0]), torch.tensor([-11.0, -9.0])
    rc, rr = torch.tensor([-10.5, -12.0]), torch.tensor([-10.5, -10.0])
    beta = 0.5
    margins = [(-10.0 + 10.5) - (-11.0 + 10.5), (-12.0 + 12.0) - (-9.0 + 10.0)]  # 1.0, -1.0
    expected = np.mean([math.log1p(math.exp(-beta * m)) for m in margins])
    assert float(dpo_loss(pc, pr, rc, rr, beta)) == pytest.approx(expected)


def test_centroid_scores_are_cosines_to_the_label_sum() -> None:
    sums = np.array([[2.0, 0.0], [0.0, -3.0]]).reshape(-1)
    cand = np.array([[1.0, 1.0], [0.0, 2.0], [1.0, 0.0]])
    out = centroid_scores(sums, cand, [0, 1, 1], labels=2)
    assert out == pytest.approx([1 / math.sqrt(2), -1.0, 0.0])


def test_privacy_plans_of_both_scorings() -> None:
    """Per-round scores: R Gaussian releases of sensitivity 1 share epsilon; the one-release variant spends it
    all on one release (sigma = the single Gaussian's), so its sigma is smaller by about sqrt(R)."""
    votes = plan_for_method("popri", epsilon=4.0, delta=1e-5, options={"rounds": 4, "scoring": "votes"})
    once = plan_for_method("popri", epsilon=4.0, delta=1e-5, options={"rounds": 4, "scoring": "centroid"})
    public = plan_for_method("popri", epsilon=4.0, delta=1e-5, options={"rounds": 4, "scoring": "public"})
    s_votes, s_once = votes.calibrate()[SCORE_SIGMA], once.calibrate()[SCORE_SIGMA]
    assert len(votes.schedule.releases) == 4 and len(once.schedule.releases) == 1
    assert votes.epsilon_of(votes.calibrate()) == pytest.approx(4.0, abs=1e-3)
    assert once.epsilon_of(once.calibrate()) == pytest.approx(4.0, abs=1e-3)
    # one Gaussian of sensitivity 1 at (4, 1e-5): sigma = 1/mu of the Gaussian-DP bound, which is exact for Gaussians;
    # four of them compose exactly like one at sigma/2
    assert all(r.sensitivity == 1.0 for r in (*votes.schedule.releases, *once.schedule.releases))
    assert s_once == pytest.approx(1 / gdp_mu_for(4.0, 1e-5), rel=1e-3)
    assert s_votes / s_once == pytest.approx(2.0, rel=1e-3)
    assert public.schedule.is_empty
    # the public control never opens the private records (its card says none were read), the others do
    assert not public.reads_private_records and votes.reads_private_records and once.reads_private_records


def _raw(tmp_path: Path, **popri) -> dict:
    rows = [("An uplifting, warm and funny film with a terrific cast.", "positive"),
            ("A tedious mess that wastes its talented actors.", "negative")] * 6 + [(CANARY, "positive")]
    (tmp_path / "private.csv").write_text("text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows))
    return {
        "method": "popri",
        "data": {"private": str(tmp_path / "private.csv")},
        "task": {"text_kind": "movie review", "labels": {"positive": "a positive review",
                                                         "negative": "a negative review"}},
        "generators": [{"model": "smollm2-135m-instruct", "name": "smol"}],
        "popri": {"n": 6, "rounds": 2, "prompts": 2, "j": 3, "rejected_rank": 3, "max_tokens": 16,
                  "max_length": 96, "learning_rate": 1e-3, **popri},
        "privacy": {"epsilon": 4.0, "delta": 1e-3, "noise_seed": 5},
        "evaluate": False,
        "seed": 2,
    }


@pytest.mark.parametrize("change,message", [
    ({"generators": [{"kind": "openai", "model": "gpt-4o-mini"}]}, "local GGUF"),
    ({"popri": {"chosen_rank": 3, "rejected_rank": 2}}, "chosen_rank < rejected_rank"),
    ({"popri": {"j": 4, "rejected_rank": 5}}, "rejected_rank <= j"),
    ({"popri": {"rounds": 0, "scoring": "votes"}}, "use scoring: public"),
    ({"generators": [{"model": "smollm2-135m-instruct", "name": "a"}, {"model": "gemma3-270m", "name": "b"}]},
     "exactly one PLM"),
])
def test_settings_popri_cannot_run_are_one_line_errors(change: dict, message: str, tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    for key, value in change.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
    with pytest.raises(DpsynthError, match=message):
        parse_config(raw)


@pytest.mark.slow
@pytest.mark.parametrize("scoring", ["votes", "centroid"])
def test_a_tiny_real_run_trains_samples_and_resumes(scoring: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth.methods.popri import Popri
    from dpsynth.runs.engine import Run
    from dpsynth.runs.planning import plan_privacy

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    cfg = parse_config(_raw(tmp_path, scoring=scoring))
    original = Popri._train

    def crash_in_round_1_after_its_release(self, ctx, generator, pairs, t):
        out = original(self, ctx, generator, pairs, t)
        if t == 1:
            raise KeyboardInterrupt  # round 1's release is drawn and its training done, nothing checkpointed
        return out

    monkeypatch.setattr(Popri, "_train", crash_in_round_1_after_its_release)
    with pytest.raises(KeyboardInterrupt):
        Run.create(cfg, tmp_path / "run").execute()
    run = tmp_path / "run"
    state = json.loads((run / "checkpoints" / "state.json").read_text())["state"]
    after_round_0 = (run / "checkpoints" / "method" / f"popri_adapter_{state['adapter']}.npy").read_bytes()
    drawn_before_crash = len(list((run / "checkpoints" / "releases").glob("*.json")))
    monkeypatch.setattr(Popri, "_train", original)
    result = Run.resume(run).execute()
    final = json.loads((run / "checkpoints" / "state.json").read_text())["state"]["adapter"]
    assert final != state["adapter"], "round 1 trained the adapter further"
    assert (run / "checkpoints" / "method" / f"popri_adapter_{state['adapter']}.npy").read_bytes() == after_round_0
    privacy = json.loads((run / "privacy.json").read_text())
    names = [e["name"] for e in privacy["events"]]
    assert len(names) == len(set(names)) == (2 if scoring == "votes" else 1), "no release drawn twice"
    assert drawn_before_crash == len(names) == len(list((run / "checkpoints" / "releases").glob("*.json")))
    planned = plan_privacy(cfg)
    assert privacy["epsilon"] == pytest.approx(planned.epsilon_of(planned.calibrate()), abs=1e-4), \
        "the run pays what `dpsynth budget` plans"
    rounds = result["metrics"]["iterations"]
    assert [r["pairs"] for r in rounds[:2]] == [2, 2]  # 2 prompts per round: one group of 3 per label
    assert all(r["training"]["loss"] is not None for r in rounds[:2])
    samples = [json.loads(line) for line in (run / "synthetic.jsonl").read_text().splitlines()]
    assert len(samples) >= 4 and all(s["text"].strip() for s in samples)
    for path in run.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".log", ".yaml"):
            assert "Zyxqv" not in path.read_text(errors="ignore"), f"a private text reached {path}"


def test_missing_adapter_on_resume_is_a_one_line_error(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from dpsynth.methods.popri import Popri, PopriState

    method = Popri(parse_config(_raw(tmp_path)))
    ctx = SimpleNamespace(files=tmp_path / "method")
    with pytest.raises(DpsynthError, match="cannot resume"):
        method._adapter(ctx, PopriState(adapter="0123456789abcdef", next_iteration=1))


def test_score_signal_to_noise_from_noisy_values() -> None:
    from dpsynth.methods.popri import score_signal_to_noise

    rng = np.random.default_rng(0)
    signal = rng.normal(0.0, 2.0, 20000)
    assert score_signal_to_noise(signal + rng.normal(0.0, 1.0, 20000), 1.0) == pytest.approx(2.0, rel=0.03)
    assert score_signal_to_noise(rng.normal(0.0, 1.0, 20000), 1.0) < 0.1  # pure noise


def test_zero_rounds_is_the_sampling_route_control_at_no_privacy_cost() -> None:
    plan = plan_for_method("popri", epsilon=4.0, delta=1e-5, options={"rounds": 0, "scoring": "public"})
    assert plan.schedule.is_empty
