"""Label proportions: uniform, public, or a DP histogram charged to the ledger before the votes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dpsynth.data.public import task_for
from dpsynth.errors import DpsynthError
from dpsynth.methods.base import LABELS_RELEASE
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.private.dataset import load_private
from dpsynth.private.holder import CentralHolder
from dpsynth.private.releases import ReleaseStore
from dpsynth.runs.build import label_shares
from dpsynth.runs.config import parse_config
from dpsynth.runs.planning import plan_privacy
from dpsynth.voting.spec import VoteSpec


class _NoEmbedder:
    def encode(self, texts):
        return np.eye(len(texts), 4, dtype=np.float32)


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


def _holder(cfg, ledger: PrivacyLedger, knobs: dict[str, float], store: ReleaseStore | None = None) -> CentralHolder:
    plan = plan_privacy(cfg)
    return CentralHolder(load_private(cfg).records, task_for(cfg).label_names, _NoEmbedder(), ledger=ledger,
                         noise=NoiseSource(1), schedule=plan.schedule, knobs=knobs, store=store or ReleaseStore(None))


def test_dp_label_histogram_is_accounted_and_leaves_less_for_votes(tmp_path: Path) -> None:
    uniform = plan_privacy(parse_config(_config(tmp_path, "uniform")))
    dp_cfg = parse_config(_config(tmp_path, "dp"))
    dp = plan_privacy(dp_cfg)
    knobs = dp.calibrate()
    assert knobs["vote_sigma"] > uniform.calibrate()["vote_sigma"]
    assert knobs["label_sigma"] == 10.0
    ledger = PrivacyLedger(2.0, 1e-5)
    holder = _holder(dp_cfg, ledger, knobs)
    shares = label_shares(dp_cfg, task_for(dp_cfg), holder, (LABELS_RELEASE, None))
    assert [e.name for e in ledger.events] == [LABELS_RELEASE]
    assert sum(shares.values()) == pytest.approx(1.0) and shares["ham"] > shares["spam"]
    # the whole schedule (histogram + T-1 votes at the calibrated sigma) fits the budget
    spec, cand, labels = VoteSpec(kind="wasp", q=4), np.eye(6, 4, dtype=np.float32), np.array([0, 0, 0, 1, 1, 1])
    for t in range(2):
        holder.noisy_votes(spec, cand, labels, release=("wasp.votes", t))
    assert ledger.spent().epsilon == pytest.approx(2.0, rel=1e-3)


def test_public_proportions_are_used_and_checked(tmp_path: Path) -> None:
    cfg = parse_config(_config(tmp_path, {"spam": 1, "ham": 3}))
    ledger = PrivacyLedger(2.0, 1e-5)
    holder = _holder(cfg, ledger, plan_privacy(cfg).calibrate())
    assert label_shares(cfg, task_for(cfg), holder, None) == {"spam": 0.25, "ham": 0.75}
    assert not ledger.events, "public proportions cost nothing"
    bad = parse_config(_config(tmp_path, {"spam": 1}))
    with pytest.raises(DpsynthError, match="positive share for each"):
        label_shares(bad, task_for(bad), holder, None)


def test_infinite_epsilon_run_releases_votes_without_noise_and_says_not_dp(tmp_path: Path) -> None:
    raw = _config(tmp_path, "uniform")
    raw["privacy"]["epsilon"] = "inf"
    cfg = parse_config(raw)
    knobs = plan_privacy(cfg).calibrate()
    assert math.isinf(cfg.privacy.epsilon) and knobs == {"vote_sigma": 0.0}
    ledger = PrivacyLedger(cfg.privacy.epsilon, cfg.privacy.delta)
    holder = _holder(cfg, ledger, knobs)
    cand = np.eye(4, 4, dtype=np.float32)
    spec = VoteSpec(kind="rank", weights=(1.0,))
    votes = holder.noisy_votes(spec, cand, np.array([0, 0, 1, 1]), release=("wasp.votes", 0))
    assert votes.sum() == 40  # every record's clean Top-1 vote, un-noised
    assert not ledger.is_private and ledger.spent().epsilon == math.inf


def test_a_saved_noisy_release_without_its_values_is_refused_not_drawn_again(tmp_path: Path) -> None:
    """A release file whose event is there but whose values are gone (damaged, or edited) must stop the resume:
    read as an un-noised release, each later request would draw fresh noise that is never charged."""
    import json

    cfg = parse_config(_config(tmp_path, "dp"))
    knobs = plan_privacy(cfg).calibrate()
    store = ReleaseStore(tmp_path / "releases")
    holder = _holder(cfg, PrivacyLedger(2.0, 1e-5), knobs, store)
    label_shares(cfg, task_for(cfg), holder, (LABELS_RELEASE, None))
    (saved,) = (tmp_path / "releases").glob("*.json")
    data = json.loads(saved.read_text())
    assert data["event"] is not None and data["values"] is not None
    saved.write_text(json.dumps({**data, "values": None}))
    with pytest.raises(DpsynthError, match="damaged release checkpoint.*without its values"):
        ReleaseStore(tmp_path / "releases")


def test_an_un_noised_release_is_never_written_and_a_resume_computes_it_once(tmp_path: Path) -> None:
    """epsilon = inf: no partial state and no values on disk (they are clean private values); a resumed process
    recomputes the release once and answers later requests with those values (a non-DP adapter trained twice
    with fresh randomness would differ from the one the run's state describes)."""
    raw = _config(tmp_path, "uniform")
    raw["privacy"]["epsilon"] = "inf"
    cfg = parse_config(raw)
    knobs = plan_privacy(cfg).calibrate()
    store = ReleaseStore(tmp_path / "releases")
    assert store.work_dir("wasp.votes/0", noised=False) is None
    assert store.work_dir("wasp.votes/0", noised=True) is not None
    calls = []

    def draw(release, value: float) -> np.ndarray:
        calls.append(value)
        return np.random.default_rng().normal(size=3)

    first = _holder(cfg, PrivacyLedger(cfg.privacy.epsilon, cfg.privacy.delta), knobs, store)
    out = first._release(("wasp.votes", 0), draw)
    (saved,) = (tmp_path / "releases").glob("*.json")
    assert '"values": null' in saved.read_text() and not list((tmp_path / "releases").glob("*.partial"))
    assert not list((tmp_path / "releases").glob("*.npy"))

    resumed = _holder(cfg, PrivacyLedger(cfg.privacy.epsilon, cfg.privacy.delta), knobs,
                      ReleaseStore(tmp_path / "releases"))
    again = [resumed._release(("wasp.votes", 0), draw) for _ in range(3)]
    assert len(calls) == 2 and not np.array_equal(again[0], out)  # recomputed once, in the resumed process
    assert all(np.array_equal(a, again[0]) for a in again)
