"""Federated WASP and Pre-Text end to end: real local models, a real Flower federation with SecAgg+."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dpsynth.runs.config import parse_config
from dpsynth.runs.engine import Run
from dpsynth.runs.planning import plan_privacy

pytestmark = pytest.mark.slow


def _private_texts() -> list[str]:
    return [f"{'A warm, funny and moving film' if i % 2 else 'A dull, lifeless and boring film'} number {i}."
            for i in range(24)]


def _config(method: str, tmp_path: Path) -> dict:
    frame = pd.DataFrame({"text": _private_texts(), "label": ["negative", "positive"] * 12})
    frame.to_csv(tmp_path / "private.csv", index=False)  # the texts hold commas: quoted
    return {
        "method": method,
        "data": {"private": str(tmp_path / "private.csv")},
        "task": {"text_kind": "movie review", "labels": {"positive": "a positive review", "negative": "a negative review"}},
        "generators": [{"model": "smollm2-135m-instruct", "name": "smol"}, {"model": "gemma3-270m", "name": "gemma"}]
        if method == "wasp" else [{"model": "smollm2-135m-instruct", "name": "smol"}],
        method: {"wasp": {"n": 12, "iterations": 2, "q": 2, "s": 1, "max_tokens": 24},
                 "augpe": {"n": 6, "iterations": 2, "max_tokens": 24}}[method],  # another method's is refused
        "privacy": {"epsilon": 4.0, "delta": 1e-3, "noise_seed": 5},
        "federated": {"parties": 3, "partition": "dirichlet", "alpha": 1.0, "max_records_per_party": 24},
        "evaluate": False,
    }


@pytest.mark.parametrize("method", ["wasp", "augpe"])
def test_federated_run_with_secagg(method: str, tmp_path: Path) -> None:
    config = parse_config(_config(method, tmp_path))
    out = Run.create(config, tmp_path / "run").execute()
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    plan = plan_privacy(config)  # what `dpsynth budget --config` prints, with the SecAgg+ clipping reserve
    assert report["epsilon"] == pytest.approx(plan.epsilon_of(plan.calibrate()), abs=1e-4)
    assert report["within_budget"] and report["epsilon"] <= 4.0 * (1 + 1e-6)
    assert "SecAgg+" in report["assumptions"]["trust_model"]
    assert "clips" in report["assumptions"]["delta_convention"]
    # the guarantee's delta is reported; the accountant's, smaller by the clipping reserve, beside it
    assert report["delta"] == config.privacy.delta and report["accounting_delta"] == pytest.approx(plan.accounting_delta)
    assert report["accounting_delta"] < report["delta"]
    votes = report["plan"]["knobs"][0]
    assert votes["name"] == "vote_sigma" and votes["party_value"] == pytest.approx(votes["value"] / 3**0.5)
    fed = json.loads((tmp_path / "run" / "metrics.json").read_text())["federated"]
    assert [r["parties_contributing"] for r in fed["rounds"]] == [3]
    assert fed["download_bytes_per_party"] > fed["upload_bytes_per_party"] > 0
    # the rounds' time holds the parties' work on their records: only the caller's copy has it
    assert "aggregation_seconds" not in fed and all("seconds" not in r for r in fed["rounds"])
    assert out["metrics"]["federated"]["aggregation_seconds"] > 0
    lines = (tmp_path / "run" / "synthetic.jsonl").read_text().splitlines()
    assert len(lines) >= 6 and out["metrics"]["method"] == method
    assert list(pd.read_csv(tmp_path / "private.csv")["text"]) == _private_texts()  # what the run loads
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file() and path.suffix in {".json", ".jsonl", ".log", ".yaml", ".md"}:
            text = path.read_text()
            assert not any(record in text for record in _private_texts()), f"private text in {path}"
