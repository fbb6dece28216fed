"""The DP fine-tuned generator (method dpft): its privacy plan reproduces PRIVACY.md's vector, its
settings are checked, and a tiny real run (SmolLM2, LoRA, Opacus) trains once, generates from the
adapter, resumes after a crash without training (or paying) twice, and writes nothing private."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpsynth.errors import DpsynthError
from dpsynth.methods.dpft import NOISE_MULTIPLIER
from dpsynth.methods.resample import RESAMPLE_SIGMA
from dpsynth.runs.config import parse_config
from dpsynth.runs.planning import plan_for_method

CANARY = "Zyxqv canary gamma: the purple hippo reviewed the quantum lasagna"


def test_privacy_vector_of_papers_001() -> None:
    """PRIVACY.md: q = 4096/180000, 440 steps, delta 5e-7, total eps 6 with a sigma=10 histogram:
    PLD gives z = 0.8054; an RDP accountant would need z = 0.8445 for the same guarantee."""
    plan = plan_for_method("dpft", epsilon=6.0, delta=5e-7, options={"steps": 440, "sampling_rate": 4096 / 180000},
                           resample={"sigma": 10.0})
    knobs = plan.calibrate()
    assert knobs[NOISE_MULTIPLIER] == pytest.approx(0.8054, abs=5e-4)
    assert knobs[RESAMPLE_SIGMA] == 10.0
    assert plan.epsilon_of(knobs) == pytest.approx(6.0, abs=2e-3)
    rdp_needs = {**knobs, NOISE_MULTIPLIER: 0.8445}
    assert plan.epsilon_rdp_of(rdp_needs) == pytest.approx(6.0, abs=0.02)
    assert plan.epsilon_rdp_of(knobs) > 6.5, "RDP at the PLD noise overstates epsilon"


def _raw(tmp_path: Path, **dpft) -> dict:
    rows = [("An uplifting, warm and funny film with a terrific cast.", "positive"),
            ("A tedious mess that wastes its talented actors.", "negative")] * 6 + [(CANARY, "positive")]
    (tmp_path / "private.csv").write_text("text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows))
    return {
        "method": "dpft",
        "data": {"private": str(tmp_path / "private.csv")},
        "task": {"text_kind": "movie review", "labels": {"positive": "a positive review",
                                                         "negative": "a negative review"}},
        "generators": [{"model": "smollm2-135m-instruct", "name": "smol"}],
        "dpft": {"n": 6, "steps": 3, "sampling_rate": 0.5, "max_length": 32, "max_tokens": 16, **dpft},
        "privacy": {"epsilon": 4.0, "delta": 1e-3, "noise_seed": 5},
        "evaluate": False,
        "seed": 2,
    }


@pytest.mark.parametrize("change,message", [
    ({"privacy": {"max_records_per_user": 2}}, "needs data.person_column"),
    ({"generators": [{"kind": "openai", "model": "gpt-4o-mini"}]}, "local GGUF"),
    ({"generators": [{"model": "smollm2-135m-instruct", "name": "a"}, {"model": "gemma3-270m", "name": "b"}]},
     "exactly one PLM"),
])
def test_settings_dpft_cannot_run_are_one_line_errors(change: dict, message: str, tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    for key, value in change.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
    with pytest.raises(DpsynthError, match=message):
        parse_config(raw)


@pytest.mark.slow
def test_a_tiny_real_run_trains_once_generates_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth.methods.dpft import Dpft
    from dpsynth.runs.engine import Run

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    cfg = parse_config(_raw(tmp_path))
    original = Dpft.step

    def crash_before_generating(self, ctx, state, t):
        if t == 1:
            raise KeyboardInterrupt
        return original(self, ctx, state, t)

    monkeypatch.setattr(Dpft, "step", crash_before_generating)
    with pytest.raises(KeyboardInterrupt):
        Run.create(cfg, tmp_path / "run").execute()
    releases = tmp_path / "run" / "checkpoints" / "releases"
    adapter = releases / "dpft.training.npy"
    assert adapter.is_file() and not list(releases.glob("*.partial")), "the adapter is saved; partial state gone"
    trained = adapter.read_bytes()
    monkeypatch.setattr(Dpft, "step", original)
    result = Run.resume(tmp_path / "run").execute()
    assert adapter.read_bytes() == trained, "resuming never trains (or spends) again"
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    (event,) = privacy["events"]
    assert event["name"] == "dpft.training" and event["count"] == 3 and event["sampling_rate"] == 0.5
    assert event["sampler"] == "poisson" and privacy["epsilon"] == pytest.approx(4.0, rel=1e-3)
    assert "sum of 4 draws" in privacy["noise"]["dp_sgd"]  # the report says DP-SGD's noise is not exact
    assert "DP-SGD's noise: float64 Gaussian" in (tmp_path / "run" / "README.md").read_text()  # and the card
    from dpsynth.runs.planning import plan_privacy

    planned = plan_privacy(cfg)
    assert privacy["epsilon"] == pytest.approx(planned.epsilon_of(planned.calibrate()), abs=1e-4), \
        "the run pays what `dpsynth budget` plans"
    samples = [json.loads(line) for line in (tmp_path / "run" / "synthetic.jsonl").read_text().splitlines()]
    assert len(samples) >= 4 and all(s["text"].strip() for s in samples)
    assert result["metrics"]["iterations"][0]["training"]["sampler"] == "poisson"
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".log", ".yaml"):
            assert "Zyxqv" not in path.read_text(errors="ignore"), f"a private text reached {path}"


@pytest.mark.exhaustive
@pytest.mark.parametrize("epsilon,may_leak", [(4.0, False), (float("inf"), True)], ids=["DP eps=4", "no DP"])
def test_canary_is_not_reproduced_by_a_dp_adapter(epsilon: float, may_leak: bool, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The same training (full batches, 40 steps, high learning rate) with and without DP: without DP the
    adapter writes the planted canary back (300 samples); with DP at eps=4 it never does in 1,000 or more (issue
    11's bar). The pair is the check that the test can fail."""
    from dpsynth.runs.engine import Run

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    raw = _raw(tmp_path, n=300 if may_leak else 1000, steps=40, sampling_rate=1.0, learning_rate=1e-2,
               max_length=40, max_tokens=24)
    raw["privacy"] = {"epsilon": epsilon, "delta": 1e-3, "label_proportions": {"positive": 1.0, "negative": 1e-9}}
    Run.create(parse_config(raw), tmp_path / "run").execute()
    import sqlite3

    with sqlite3.connect(tmp_path / "cache" / "requests.sqlite") as db:  # every sample, also those deduplicated
        texts = [row[0] for row in db.execute("SELECT text FROM generations")]
    leaks = sum("quantum lasagna" in t for t in texts)
    if may_leak:
        assert leaks >= 3, f"the non-DP adapter should reproduce the canary (found {leaks} in {len(texts)})"
    else:
        assert len(texts) >= 1000 and leaks == 0, f"the DP adapter reproduced the canary {leaks} times"


@pytest.mark.slow
def test_training_is_reproducible_under_a_seed(tmp_path: Path) -> None:
    """Issue 33: two trainings with the same secret seed and public init seed write the same adapter (the
    LoRA start was drawn from torch's unseeded global stream); another init seed gives another adapter."""
    from dpsynth.finetune.request import AdapterTraining
    from dpsynth.llm.local_models import resolve_local_model
    from dpsynth.private.training import train_on_records

    model = str(resolve_local_model("smollm2-135m-instruct")[0])
    request = AdapterTraining(model=model, lora_r=2, lora_alpha=4, steps=2, sampling_rate=1.0, clip_norm=1.0,
                              learning_rate=1e-3, max_length=24, prompts={"a": "review (a):\n"}, init_seed=3)
    texts, labels = ["a warm and funny film", "a dull film"], ["a", "a"]
    runs = [train_on_records(request, texts, labels, noise_multiplier=1.0, seed=7, work_dir=None) for _ in range(2)]
    assert (runs[0] == runs[1]).all()
    other = train_on_records(request.model_copy(update={"init_seed": 4}), texts, labels, noise_multiplier=1.0,
                             seed=7, work_dir=None)
    assert not (other == runs[0]).all()


def _progress_calls(step_seconds: float, account_seconds: float, steps: int,
                    first: int = 1) -> tuple[list[int], list[float]]:
    """The steps at which DP-SGD's progress line accounted epsilon, and what it showed after each step from
    `first` on (a resumed release starts later), with a clock that each step and each accounting move on by the
    given seconds."""
    from dpsynth.private.holder import EpsilonSoFar

    now = [0.0]
    accounted: list[int] = []

    def account(step: int) -> float:
        accounted.append(step)
        now[0] += account_seconds
        return float(step)

    so_far = EpsilonSoFar(account, steps, clock=lambda: now[0])
    shown = []
    for step in range(first, steps + 1):
        now[0] += step_seconds
        shown.append(so_far(step))
    return accounted, shown


def test_progress_accounting_keeps_to_its_share_of_the_time() -> None:
    """Slow steps (a CPU's 1.3 s) are accounted every 10 steps, as before; fast ones (a GPU's 0.05 s beside a
    0.6 s PLD) only as often as keeps the accounting under 5% of the time (it was 10 times the training); the
    first and the last step always, and each step shows the latest figure."""
    slow, shown = _progress_calls(1.3, 0.6, 100)
    assert slow == [1, *range(11, 100, 10), 100]
    assert shown[:12] == [1.0] * 10 + [11.0, 11.0]
    fast, shown = _progress_calls(0.05, 0.57, 1000)
    assert fast == [1, 218, 435, 652, 869, 1000]  # every 217 steps: 10.85 s of steps to 0.57 s of accounting
    accounting, training = 0.57 * len(fast), 0.05 * 1000
    assert accounting / (accounting + training) < 0.07  # 5%, and the first and last step on top
    assert shown[-1] == 1000.0 and shown == sorted(shown)
    resumed, shown = _progress_calls(1.3, 0.6, 40, first=7)  # a release resumed from its checkpoint at step 7
    assert resumed == [7, 17, 27, 37, 40] and shown[0] == 7.0
