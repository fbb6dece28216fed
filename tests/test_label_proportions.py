"""Label proportions: uniform, public, or a DP histogram charged to the ledger before the votes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth.errors import DpsynthError
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.runs.config import parse_config
from dpsynth.runs.run import LABELS_RELEASE, Run, prepare_data


def _config(tmp_path: Path, proportions) -> dict:
    rows = "text,label\n" + "".join(f"message {i},{'spam' if i % 4 == 0 else 'ham'}\n" for i in range(40))
    (tmp_path / "p.csv").write_text(rows)
    return {
        "data": {"private": str(tmp_path / "p.csv")},
        "task": {"text_kind": "sms", "labels": {"spam": "advertising", "ham": "a normal message"}},
        "generators": [{"model": "smollm2-135m-instruct"}],
        "wasp": {"n": 10, "iterations": 3, "q": 4},
        "privacy": {"epsilon": 2.0, "delta": 1e-5, "label_proportions": proportions, "noise_seed": 1},
    }


def test_dp_label_histogram_is_accounted_and_leaves_less_for_votes(tmp_path: Path) -> None:
    uniform = Run(parse_config(_config(tmp_path, "uniform")), tmp_path / "a")
    dp_cfg = parse_config(_config(tmp_path, "dp"))
    dp = Run(dp_cfg, tmp_path / "b")
    assert dp.calibrate() > uniform.calibrate()
    ledger = PrivacyLedger(2.0, 1e-5)
    shares = dp._label_shares(prepare_data(dp_cfg), ledger, NoiseSource(1))
    assert [e.name for e in ledger.events] == [LABELS_RELEASE]
    assert sum(shares.values()) == pytest.approx(1.0) and shares["ham"] > shares["spam"]
    # the whole schedule (histogram + T-1 votes at the calibrated sigma) fits the budget
    for event in dp.method.release_plan(dp_cfg).events(dp.calibrate()):
        ledger.record(event)
    assert ledger.spent().epsilon <= 2.0 * (1 + 1e-6)


def test_public_proportions_are_used_and_checked(tmp_path: Path) -> None:
    cfg = parse_config(_config(tmp_path, {"spam": 1, "ham": 3}))
    run = Run(cfg, tmp_path / "c")
    ledger = PrivacyLedger(2.0, 1e-5)
    assert run._label_shares(prepare_data(cfg), ledger, NoiseSource(1)) == {"spam": 0.25, "ham": 0.75}
    assert not ledger.events, "public proportions cost nothing"
    bad = parse_config(_config(tmp_path, {"spam": 1}))
    with pytest.raises(DpsynthError, match="positive share for each"):
        Run(bad, tmp_path / "d")._label_shares(prepare_data(bad), ledger, NoiseSource(1))


def test_infinite_epsilon_run_releases_votes_without_noise_and_says_not_dp(tmp_path: Path) -> None:
    import math

    import numpy as np

    from dpsynth.runs.run import RunContext

    raw = _config(tmp_path, "uniform")
    raw["privacy"]["epsilon"] = "inf"
    cfg = parse_config(raw)
    run = Run(cfg, tmp_path / "e")
    assert math.isinf(cfg.privacy.epsilon) and run.calibrate() == 0.0
    ledger = PrivacyLedger(cfg.privacy.epsilon, cfg.privacy.delta)
    ctx = RunContext(config=cfg, dir=tmp_path, data=prepare_data(cfg), generators={}, embedder=None,
                     synth_embedder=None, ledger=ledger, noise=NoiseSource(None),
                     plan=run.method.release_plan(cfg), sigma=0.0, label_shares={}, progress=None)
    votes = np.array([3.0, 0.0, 5.0])
    assert np.array_equal(ctx.release_votes(votes, 1), votes)
    assert not ledger.is_private and ledger.spent().epsilon == math.inf
