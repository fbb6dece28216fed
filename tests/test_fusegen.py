"""FuseGen on the engine: its rounds and prompts, the cross-model selection, the weights in the outputs, and a
tiny end-to-end run with the real local models (no private data, epsilon 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpsynth.data.records import TaskSpec
from dpsynth.errors import DpsynthError
from dpsynth.methods.cross_model_feedback import candidate_pool, cross_model_variability, split_per_plm
from dpsynth.methods.generation import GenerationPlan, shared_example_requests, zero_shot_requests
from dpsynth.methods.registry import method_class
from dpsynth.prompts.builder import PromptSettings
from dpsynth.runs.config import parse_config

TASK = TaskSpec(text_kind="movie review", description="Short movie reviews.",
                labels={"positive": "a positive review", "negative": "a negative review"})


def _base(**fusegen) -> dict:
    return {"method": "fusegen", "data": {"corpus": "rotten_tomatoes", "m": 100},
            "generators": [{"kind": "fake", "model": "a"}, {"kind": "fake", "model": "b"}],
            "fusegen": {"n": 20, "rounds": 4, **fusegen}}


def test_round_zero_asks_the_zero_shot_methods_own_questions() -> None:
    """So round 0 is the zero-shot baseline's first samples (a paired comparison shares them)."""
    settings = PromptSettings(max_tokens=40)
    zero_shot = zero_shot_requests(TASK, settings, 3, "fusegen")  # the zero-shot method's maker, seed 3
    plan = GenerationPlan("smol", {"positive": 2, "negative": 1})
    whole = GenerationPlan("smol", {"positive": 5, "negative": 5})
    first = zero_shot(plan, 0, True)
    assert first == [p for p in zero_shot(whole, 0, True) if p in first] and len(first) == 3


def test_the_feedback_prompt_shows_the_same_unlabelled_examples_for_every_label() -> None:
    examples = ["A dazzling, heartfelt film.", "Two hours I will never get back."]
    make = shared_example_requests(TASK, PromptSettings(), examples, 0, "fusegen-cdg", 1, templates="fusegen")
    for chat in (True, False):
        requests = make(GenerationPlan("smol", {"positive": 1, "negative": 1}), 0, chat)
        bodies = [r.messages[0][1] if chat else r.prompt for _, r in requests]
        for body, label in zip(bodies, ("positive", "negative")):
            assert 'The movie review is: "A dazzling, heartfelt film."' in body
            assert 'The movie review is: "Two hours I will never get back."' in body
            assert "diverse in the expression" in body and f"a {label} review" in body
            assert "(positive)" not in body and "(negative)" not in body, "examples carry no label"
        assert bodies[0].split("\n")[1:3] == bodies[1].split("\n")[1:3]


def test_the_pool_takes_the_least_and_the_most_variable() -> None:
    variability = np.array([0.30, 0.01, 0.20, 0.05, 0.50, 0.02, 0.40, 0.10])
    # size 4, half ambiguous: the two least (0.01 at 1, 0.02 at 5) and the two most (0.40 at 6, 0.50 at 4)
    assert sorted(candidate_pool(variability, 4, 0.5).tolist()) == [1, 4, 5, 6]
    assert sorted(candidate_pool(variability, 4, 0.0).tolist()) == [1, 3, 5, 7]  # no ambiguous: 4 least
    assert sorted(candidate_pool(variability, 4, 1.0).tolist()) == [0, 2, 4, 6]  # all ambiguous: 4 most
    assert sorted(candidate_pool(variability, 10, 0.5).tolist()) == list(range(8))  # fewer than the pool


def test_variability_is_the_spread_of_the_plms_stms_on_a_samples_label() -> None:
    """Two PLMs whose samples disagree about one region of the space: their STMs split on it."""
    rng = np.random.default_rng(0)
    a_pos, a_neg = rng.normal([3, 0], 0.3, (10, 2)), rng.normal([-3, 0], 0.3, (10, 2))
    b_pos, b_neg = rng.normal([0, 3], 0.3, (10, 2)), rng.normal([0, -3], 0.3, (10, 2))
    emb = np.vstack([a_pos, a_neg, b_pos, b_neg])
    y = np.array([0] * 10 + [1] * 10 + [0] * 10 + [1] * 10)
    trains = [np.arange(20), np.arange(20, 40)]
    train, var = cross_model_variability(emb, y, trains, 2)
    assert train.tolist() == list(range(40)) and var.shape == (40,)
    # by hand for one sample: the std (ddof 1) of the two STMs' p(label)
    from dpsynth.evaluate.stm import fit_stm

    p = [fit_stm(emb[t], y[t], 2).label_probability(emb[:1], y[:1])[0] for t in trains]
    assert var[0] == pytest.approx(abs(p[0] - p[1]) / np.sqrt(2))
    # a sample that both models place alike varies less than one they split on
    agreed = np.array([[3.0, 3.0]])
    split = np.array([[3.0, -3.0]])  # A says positive, B says negative
    stms = [fit_stm(emb[t], y[t], 2) for t in trains]
    spread = [np.std([s.label_probability(x, np.array([0]))[0] for s in stms], ddof=1) for x in (agreed, split)]
    assert spread[0] < spread[1]


def test_each_plm_keeps_a_validation_sample_once_it_has_two() -> None:
    """The authors' split keeps int(0.9 n) for training (main_accumulate_fuse.py): 10 of 12, so 2 validate."""
    plm_of = np.array([0] * 12 + [1] * 2 + [2] + [3] * 10)
    trains, valids = split_per_plm(plm_of, 4, 0.1, np.random.default_rng(0))
    assert [len(v) for v in valids] == [2, 1, 0, 1] and [len(t) for t in trains] == [10, 1, 1, 9]
    assert sorted(np.concatenate(trains + valids).tolist()) == list(range(25))


@pytest.mark.parametrize("change,message", [
    ({"generators": [{"kind": "fake", "model": "a"}]}, "fusegen fuses several PLMs"),
    ({"fusegen": {"n": 6, "rounds": 4}}, "gives a round 1 samples, fewer than the 2 labels"),
])
def test_settings_fusegen_cannot_run_are_one_line_errors(change: dict, message: str) -> None:
    from dpsynth.runs.build import check_before_start
    from dpsynth.runs.planning import plan_privacy

    with pytest.raises(DpsynthError, match=message):
        check_before_start(plan_privacy(parse_config({**_base(), **change})))


def test_fusegen_plans_no_privacy_cost() -> None:
    from dpsynth.runs.planning import plan_privacy

    plan = plan_privacy(parse_config(_base()))
    assert plan.schedule.releases == () and not method_class("fusegen").uses_private_data
    assert plan.method.planned_requests(2) == 20 and plan.method.round_sizes() == [4, 4, 4, 4, 4]


def test_the_card_says_where_the_weight_column_comes_from() -> None:
    """FuseGen's weights were described as the DP cluster histogram's (review helper-57)."""
    from dpsynth.data.public import task_for
    from dpsynth.runs.card import dataset_card

    def contents(raw: dict) -> str:
        cfg = parse_config(raw)
        card = dataset_card(cfg, task_for(cfg), {"events": [], "epsilon": None, "delta": 1e-5}, ["a"], weighted=True)
        return " ".join(card.split("## Contents")[1].split())

    alone = contents(_base())
    assert "FuseGen's self-boosting weights (from the synthetic set alone); train with it" in alone
    assert "histogram" not in alone
    both = contents({**_base(), "data": {"corpus": "sms_spam", "m": 100}, "resample": {"weights": True}})
    assert "FuseGen's self-boosting weights (from the synthetic set alone), then scaled by the DP cluster" in both


@pytest.mark.slow
def test_a_tiny_fusegen_run_with_the_real_local_models(tmp_path: Path) -> None:
    config = {
        "method": "fusegen",
        "data": {"corpus": "rotten_tomatoes", "m": 20},
        "generators": [{"model": "smollm2-135m-instruct", "name": "smol"}, {"model": "gemma3-270m", "name": "gemma"}],
        "fusegen": {"n": 16, "rounds": 1, "examples": 3, "max_tokens": 24},
        "seed": 1,
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "DPSYNTH_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "dpsynth", "run", str(tmp_path / "run.yaml"), "-o",
                           str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["epsilon"] == 0.0 and privacy["events"] == [] and privacy["private_records_read"] is False
    rows = [json.loads(line) for line in (run / "synthetic.jsonl").read_text().splitlines()]
    assert len(rows) >= 12 and {r["plm"] for r in rows} == {"smol", "gemma"}
    assert {r["iteration"] for r in rows} == {0, 1}
    weights = np.array([r["weight"] for r in rows])
    for label in {r["label"] for r in rows}:  # each label's weights keep their total (mean 1)
        mine = weights[[r["label"] == label for r in rows]]
        assert mine.mean() == pytest.approx(1.0, abs=1e-4)
    metrics = json.loads((run / "metrics.json").read_text())
    first, last = metrics["iterations"]
    assert first["feedback"]["pool"] >= 3 and sum(first["feedback"]["examples_per_plm"].values()) == 3
    assert last["examples_shown"] == 3 and "weights" in last
    evaluation = metrics["evaluation"]
    assert evaluation["fusegen"]["weighted"] and not evaluation["unweighted"]["weighted"]
    import pandas as pd

    assert "weight" in pd.read_parquet(run / "synthetic.parquet").columns
