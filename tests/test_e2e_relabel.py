"""DP label correction end to end with the real local models (llama.cpp) at tiny sizes: zero-shot fusion of
SmolLM2 and Gemma, then `relabel:`. The texts are exactly the zero-shot run's (the stage adds no generator call,
the second run is served from the request cache), only labels move; the one release is noisy and is what
`budget` plans; no private substring reaches a prompt or a file of the run, also with the cluster histogram's
weights (`resample: {weights: true}`) stacked after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_e2e_wasp import CANARIES, _config, _finish, _prompts, _run, _substrings

pytestmark = pytest.mark.slow


def _zero_shot(tmp_path: Path, **extra) -> dict:
    raw = _config(tmp_path)
    raw.pop("wasp")
    return {**raw, "method": "zero-shot", "zero-shot": {"n": 16, "max_tokens": 32}, **extra}


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "synthetic.jsonl").read_text().splitlines() if x.strip()]


def test_relabelling_changes_only_labels_and_releases_one_noisy_vector(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plain, relabelled = tmp_path / "plain.yaml", tmp_path / "relabel.yaml"
    plain.write_text(yaml.safe_dump(_zero_shot(tmp_path)))
    relabelled.write_text(yaml.safe_dump(_zero_shot(tmp_path, relabel={"margin": 0.0, "subspace": 4})))
    _finish(_run(["run", str(plain), "-o", str(tmp_path / "plain")], cache, tmp_path))
    paid = len(_prompts(cache))
    out = _finish(_run(["run", str(relabelled), "-o", str(tmp_path / "relabel")], cache, tmp_path))
    assert len(_prompts(cache)) == paid, "the stage adds no generator call"

    before, after = _rows(tmp_path / "plain"), _rows(tmp_path / "relabel")
    assert [r["text"] for r in before] == [r["text"] for r in after]
    stage = json.loads((tmp_path / "relabel" / "metrics.json").read_text())["iterations"][-1]["relabel"]
    assert stage["moved"] == sum(a["label"] != b["label"] for a, b in zip(before, after))

    privacy = json.loads((tmp_path / "relabel" / "privacy.json").read_text())
    assert [e["name"] for e in privacy["events"]] == ["relabel.centroids"]
    budget = _finish(_run(["budget", "--config", str(relabelled)], cache, tmp_path))
    assert f"epsilon spent: {privacy['epsilon']:.4f}" in budget and "epsilon spent" in out
    flat = " ".join(out.split())  # the summary wraps at the terminal's width
    assert f"label correction (private): {stage['moved']} of 16 samples moved" in flat

    (release,) = (tmp_path / "relabel" / "checkpoints" / "releases").glob("*.json")
    values = json.loads(release.read_text())["values"]
    assert len(values) == 2 * 384  # one row of sums per label (their noise is checked against the clean sums in
    # tests/test_relabel.py)

    # both final stages stacked, the cluster histogram's weights after the correction: one more release on the
    # same ledger, what budget plans, still no generator call
    stacked = tmp_path / "stacked.yaml"
    stacked.write_text(yaml.safe_dump(_zero_shot(tmp_path, relabel={"margin": 0.0, "subspace": 4},
                                                 resample={"clusters": 2, "weights": True})))
    _finish(_run(["run", str(stacked), "-o", str(tmp_path / "stacked")], cache, tmp_path))
    assert len(_prompts(cache)) == paid
    both = json.loads((tmp_path / "stacked" / "privacy.json").read_text())
    assert [e["name"] for e in both["events"]] == ["relabel.centroids", "resample.histogram"]
    assert f"epsilon spent: {both['epsilon']:.4f}" in _finish(_run(["budget", "--config", str(stacked)], cache,
                                                                    tmp_path))
    weighted = _rows(tmp_path / "stacked")
    assert [r["text"] for r in weighted] == [r["text"] for r in before] and all("weight" in r for r in weighted)

    needles = set().union(*(_substrings(t) for t in CANARIES))
    for run_dir in ("relabel", "stacked"):
        for path in (p for p in (tmp_path / run_dir).rglob("*") if p.is_file()):
            text = path.read_bytes().decode("utf-8", errors="ignore")
            assert not any(n in text for n in needles), f"{run_dir}/{path.name} contains private text"
