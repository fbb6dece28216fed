"""`dpsynth audit`: the one-run bound against brute force and simulations, the membership signals, canaries,
and the audit end to end: it refutes a run that leaks, and does not refute a DP run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeGenerator

from dpsynth.audit.bound import audit_scores, epsilon_lower_bound, p_value
from dpsynth.audit.canaries import plant_canaries
from dpsynth.audit.signals import bigram_overlap, char_ngram_loglik, nearest_similarity
from dpsynth.data.records import TaskSpec
from dpsynth.errors import DpsynthError
from dpsynth.methods.zero_shot import ZeroShot, ZeroShotOptions
from dpsynth.methods.generation import SyntheticSample
from dpsynth.methods.registry import register
from dpsynth.runs.config import parse_config

TASK = TaskSpec("movie review", {"pos": "a positive review", "neg": "a negative review"})


def test_p_value_is_the_binomial_tail_without_delta() -> None:
    m, r, v, eps = 40, 20, 15, 0.7
    q = 1 / (1 + math.exp(-eps))
    brute = sum(math.comb(r, k) * q**k * (1 - q) ** (r - k) for k in range(v, r + 1))
    assert p_value(m, r, v, eps, 0.0) == pytest.approx(brute, rel=1e-9)
    assert p_value(m, r, v, eps, 1e-3) > p_value(m, r, v, eps, 0.0)  # delta only makes refuting harder


def test_all_guesses_right_gives_the_closed_form_bound() -> None:
    # delta 0, v = r: p(eps) = q^r, so the bound is logit(beta^(1/r))
    r, beta = 50, 0.05
    q = beta ** (1 / r)
    assert epsilon_lower_bound(100, r, r, 0.0, beta) == pytest.approx(math.log(q / (1 - q)), abs=1e-6)
    assert epsilon_lower_bound(100, r, r // 2, 0.0, beta) == 0.0  # chance-level guessing refutes nothing
    assert epsilon_lower_bound(100, r, r, 1e-5, beta) <= epsilon_lower_bound(100, r, r, 0.0, beta)


@pytest.mark.parametrize("true_epsilon", [0.5, 1.0, 2.0])
def test_bound_stays_below_the_truth_for_randomized_response(true_epsilon: float) -> None:
    """Randomized response is exactly eps-DP per canary: at 95% confidence the bound may refute the truth in
    ~5% of audits and no more (at most 2 of 30 seeded audits here), and comes close to it with many canaries."""
    rng = np.random.default_rng(0)
    m, q = 1000, 1 / (1 + math.exp(-true_epsilon))
    bounds = []
    for _ in range(30):
        included = rng.random(m) < 0.5
        answer = np.where(rng.random(m) < q, included, ~included)  # the run's output: a noisy copy
        bounds.append(audit_scores({"rr": answer.astype(float)}, included, delta=0.0, beta=0.05,
                                   seed=1)["epsilon_lower_bound"])
    assert sum(b > true_epsilon for b in bounds) <= 2, bounds
    assert np.median(bounds) > 0.5 * true_epsilon


def test_a_leak_is_refuted_beyond_its_claim() -> None:
    rng = np.random.default_rng(1)
    included = rng.random(64) < 0.5
    result = audit_scores({"perfect": included.astype(float), "noise": rng.random(64)}, included, delta=1e-5,
                          beta=0.05, seed=0)
    assert result["epsilon_lower_bound"] > 1.5 and result["best"]["signal"] == "perfect"
    assert result["signals"]["perfect"]["auc"] == 1.0


def test_the_printed_lower_bound_is_rounded_down() -> None:
    """1.996 printed as 2.00 would show, beside a claim of 2.00, a bound the audit did not reach."""
    from dpsynth.audit.run_audit import audit_line

    result = {"claimed_epsilon": 2.0, "epsilon_lower_bound": 1.996, "confidence": 0.95, "canaries": 64,
              "best": {"signal": "nearest", "right": 30, "guessed": 32}, "exceeds_claim": False,
              "largest_possible_bound": 2.47}
    assert "audit lower bound 1.99 " in audit_line(result)
    leak = {**result, "claimed_epsilon": 3.9998, "epsilon_lower_bound": 4.004, "exceeds_claim": True}
    assert "claimed eps 3.9998; audit lower bound 4.0040 " in audit_line(leak)  # not "4.00" beside "4.00"


def test_signals_rank_a_copied_canary_above_an_absent_one() -> None:
    canaries = ["the zorbix fleemut of quarnis stays", "the plavok driment of sutherby stays"]
    synthetic = ["A warm film.", "I loved the zorbix fleemut of quarnis stays with me", "Dull and slow."]
    assert bigram_overlap(canaries, synthetic)[0] > bigram_overlap(canaries, synthetic)[1]
    assert char_ngram_loglik(canaries, synthetic)[0] > char_ngram_loglik(canaries, synthetic)[1]
    emb = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert list(nearest_similarity(emb, np.array([[0.9, 0.1]]))) == pytest.approx([0.9 / math.hypot(0.9, 0.1),
                                                                                   0.1 / math.hypot(0.9, 0.1)])


def test_canaries_are_seeded_distinct_and_take_turns() -> None:
    a, b = plant_canaries(TASK, 40, seed=3), plant_canaries(TASK, 40, seed=3)
    assert a == b and a != plant_canaries(TASK, 40, seed=4)
    assert len({c.text for c in a}) == 40
    assert [c.label for c in a[:4]] == ["pos", "neg", "pos", "neg"]
    assert {c.kind for c in a} == {"random_words", "rare_phrase"}
    assert 10 <= sum(c.included for c in a) <= 30


class _LeakyFewShot(ZeroShot):
    """A broken method for the audit to catch: it claims no private data (epsilon 0) but puts private records
    in its prompts, and its model copies them (here the copy is made directly)."""

    name = "test-leaky-fewshot"
    Options = ZeroShotOptions

    def step(self, ctx, state, t):
        record = super().step(ctx, state, t)
        rows = AUDITED_ROWS  # what a leak would copy: the holder's records (with the canaries)
        state.samples = state.samples + [SyntheticSample(10_000 + i, f"Like this one: {row['text']}", row["label"],
                                                         "leaky", t) for i, row in enumerate(rows)]
        return record


def _config(tmp_path: Path, method: str, epsilon: float) -> dict:
    csv = tmp_path / "private.csv"
    csv.write_text("text,label\n" + "".join(f"private review number {i} about a {'great' if i % 3 else 'poor'} "
                                            f"film,{'pos' if i % 3 else 'neg'}\n" for i in range(30)))
    return {
        "method": method,
        "data": {"private": str(csv)},
        "task": {"text_kind": "review", "labels": {"pos": "a positive review", "neg": "a negative review"}},
        "generators": [{"kind": "fake", "model": "a"}],
        method: {"n": 40} if method != "augpe" else {"n": 24, "iterations": 3},
        "privacy": {"epsilon": epsilon, "delta": 1e-4},
        "seed": 2,
    }


AUDITED_ROWS: list[dict] = []  # the audited private set, as the broken methods' leak reads it


@pytest.fixture
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The broken methods are registered only while a test of this module runs (registering them at import
    would add them to other modules' every-method tests). The audit hands its private set to the run in
    memory; the broken methods "leak" it through AUDITED_ROWS, filled where the audit builds the set."""
    from dpsynth.audit import run_audit as audit_module
    from dpsynth.methods import registry

    build = audit_module._private_with_canaries

    def capture(*args, **kwargs):
        rows = build(*args, **kwargs)
        AUDITED_ROWS[:] = rows
        return rows

    monkeypatch.setattr(audit_module, "_private_with_canaries", capture)
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls = []
    registry.method_names()  # load the built-in methods first
    for cls in (_LeakyFewShot, _FewShotPromptLeak):
        register(cls)
    yield
    for cls in (_LeakyFewShot, _FewShotPromptLeak):
        registry._METHODS.pop(cls.name, None)


def test_audit_refutes_a_method_that_leaks_private_records_into_its_prompts(tmp_path: Path, _isolated) -> None:
    from dpsynth.audit.run_audit import run_audit

    result = run_audit(parse_config(_config(tmp_path, "test-leaky-fewshot", 1.0)), tmp_path / "audit", canaries=64)
    print(result["best"], {k: v["auc"] for k, v in result["signals"].items()})
    assert result["claimed_epsilon"] == 0.0
    assert result["exceeds_claim"] and result["epsilon_lower_bound"] > 1.5, result["best"]
    assert result["signals"]["ngrams"]["auc"] == 1.0
    privacy = json.loads((tmp_path / "audit" / "run" / "privacy.json").read_text())
    assert "LEAKS MORE THAN IT CLAIMS" in privacy["audit"]["line"]
    private = (tmp_path / "private.csv").read_text().splitlines()[1:]
    for name in ("audit.json", "canaries.jsonl", "audit-params.json"):
        text = (tmp_path / "audit" / name).read_text()
        assert not any(row.split(",")[0] in text for row in private), f"a private record in {name}"


def test_the_audit_cost_leaves_out_reading_the_private_records(tmp_path: Path, _isolated,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """audit.json is shared, so its audit_seconds must not grow with the number of private records (as
    metrics.json's wall leaves the data holder's time out): on a clock that moves only while the audit reads and
    checks the private records, it is exactly the audited run's wall."""
    from types import SimpleNamespace

    from dpsynth.audit import run_audit as audit_module

    clock = [0.0]
    monkeypatch.setattr(audit_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def reading(f):
        def wrapped(*args, **kwargs):
            clock[0] += 100.0
            return f(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(audit_module, "_private_with_canaries", reading(audit_module._private_with_canaries))
    monkeypatch.setattr(audit_module, "check_before_start", reading(audit_module.check_before_start))
    result = audit_module.run_audit(parse_config(_config(tmp_path, "test-leaky-fewshot", 1.0)), tmp_path / "audit",
                                    canaries=16)
    assert clock[0] == 200.0 and result["cost"]["audit_seconds"] == result["cost"]["audited_run_seconds"]


def test_person_level_audit_plants_each_canary_as_k_records_of_one_person(tmp_path: Path, _isolated) -> None:
    """Issue 36: with data.person_column the canaries are persons of k identical records; the real records keep
    their persons; a leak is still refuted (against the person-level claim), and a DP run is not."""
    from dpsynth.audit.canaries import plant_canaries
    from dpsynth.audit.run_audit import _private_with_canaries, run_audit
    from dpsynth.data.public import task_for

    raw = _config(tmp_path, "test-leaky-fewshot", 1.0)
    csv = tmp_path / "private.csv"
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join([lines[0] + ",who"] + [f"{row},person{i % 7}" for i, row in enumerate(lines[1:])]))
    raw["data"]["person_column"] = "who"
    raw["privacy"]["max_records_per_user"] = 3
    config = parse_config(raw)
    planted = plant_canaries(task_for(config), 16, 0)
    rows = _private_with_canaries(config, planted, 0)
    for j, canary in enumerate(planted):
        mine = [r for r in rows if r["person"] == f"dpsynth-canary-0-{j}"]
        assert len(mine) == (3 if canary.included else 0) and all(r["text"] == canary.text for r in mine)
    assert sum(1 for r in rows if r["person"].startswith("person")) == 30  # every real record, unbounded

    result = run_audit(config, tmp_path / "audit", canaries=64)
    assert result["exceeds_claim"], result["best"]
    privacy = json.loads((tmp_path / "audit" / "run" / "privacy.json").read_text())
    assert privacy["assumptions"]["unit"] == "person (<= 3 records)"
    raw = {**raw, "method": "augpe", "augpe": {"n": 24, "iterations": 3}}
    raw.pop("test-leaky-fewshot")
    result = run_audit(parse_config(raw), tmp_path / "audit-dp", canaries=64)
    assert not result["exceeds_claim"] and result["epsilon_lower_bound"] <= 1.0, result["best"]


def test_audit_refuses_replace_adjacency(tmp_path: Path, _isolated) -> None:
    from dpsynth.audit.run_audit import run_audit

    raw = _config(tmp_path, "augpe", 1.0)
    raw["privacy"]["adjacency"] = "replace"
    with pytest.raises(DpsynthError, match="add/remove adjacency"):
        run_audit(parse_config(raw), tmp_path / "audit")


def test_audit_does_not_refute_a_dp_run_and_resumes(tmp_path: Path, _isolated) -> None:
    from dpsynth.audit.run_audit import run_audit

    config = parse_config(_config(tmp_path, "augpe", 1.0))
    FakeGenerator.fail_after = 30  # the audited run crashes midway; the audit resumes it
    try:
        with pytest.raises(KeyboardInterrupt):
            run_audit(config, tmp_path / "audit", canaries=64)
    finally:
        FakeGenerator.fail_after = None
    _no_private_record_in(tmp_path / "audit")
    with pytest.raises(DpsynthError, match="--seed changed since this audit started"):
        run_audit(config, tmp_path / "audit", canaries=64, seed=1)  # other coins: another dataset mid-run
    paid = len(FakeGenerator.calls)
    result = run_audit(config, tmp_path / "audit", canaries=64)
    print(result["best"], {k: v["auc"] for k, v in result["signals"].items()})
    assert 0 < result["claimed_epsilon"] <= 1.0 + 1e-6
    assert not result["exceeds_claim"] and result["epsilon_lower_bound"] <= 1.0, result["best"]
    events = json.loads((tmp_path / "audit" / "run" / "privacy.json").read_text())["events"]
    assert len({e["name"] for e in events}) == len(events), "the resumed audit spent nothing twice"
    usage = json.loads((tmp_path / "audit" / "run" / "metrics.json").read_text())["usage"]
    assert paid > 0 and sum(u["cached"] for u in usage.values()) > 0, "the resume reused generations paid before"


class _FewShotPromptLeak(ZeroShot):
    """A broken method with a real model: every private record goes into a prompt ("a review like this one"),
    and whatever the model writes is output, while the method claims it uses no private data."""

    name = "test-fewshot-prompt-leak"
    Options = ZeroShotOptions

    def step(self, ctx, state, t):
        from dpsynth.llm.base import GenerationRequest

        rows = AUDITED_ROWS
        generator = next(iter(ctx.generators.values()))
        requests = [GenerationRequest(messages=(("user", f"Here is a movie review:\n{row['text']}\n\nWrite it out "
                                                          "again, word for word."),), max_tokens=48, seed=i)
                    for i, row in enumerate(rows)]
        results = generator.generate(requests)
        state.samples = [SyntheticSample(i, " ".join(r.text.split()), row["label"], generator.name, t)
                         for i, (row, r) in enumerate(zip(rows, results)) if r.text.strip()]
        return {"iteration": t}


@pytest.mark.slow
def test_audit_refutes_a_prompt_leak_with_the_real_smollm2(tmp_path: Path, _isolated) -> None:
    from dpsynth.audit.run_audit import run_audit

    raw = _config(tmp_path, "test-fewshot-prompt-leak", 1.0)
    raw["generators"] = [{"model": "smollm2-135m-instruct", "name": "smol"}]
    raw["data"]["private"] = str(tmp_path / "few.csv")
    (tmp_path / "few.csv").write_text("text,label\n" + "".join(
        f"{'A warm and funny film' if i % 2 else 'A dull and slow film'} number {i},{'pos' if i % 2 else 'neg'}\n"
        for i in range(12)))
    result = run_audit(parse_config(raw), tmp_path / "audit", canaries=64)
    print(result["best"], {k: v["auc"] for k, v in result["signals"].items()})
    assert result["exceeds_claim"] and result["epsilon_lower_bound"] > 0.5, result["best"]  # claim: 0


def test_sigterm_mid_audit_leaves_no_private_record_on_disk(tmp_path: Path) -> None:
    """The audited set (records + canaries) is handed to the run in memory, never written; a scheduler's stop
    (SIGTERM) mid-run unwinds like Ctrl-C, and no file of the audit directory holds a private record."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    config = tmp_path / "augpe.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path, "augpe", 1.0)))
    driver = (f"import sys, time; sys.path.insert(0, {str(Path(__file__).parent)!r}); import fakes, dpsynth.cli\n"
              "slow = fakes.FakeGenerator.generate\n"
              "fakes.FakeGenerator.generate = lambda self, r, on_result=None: "
              "(time.sleep(5), slow(self, r, on_result))[1]\n"
              f"sys.argv = ['dpsynth', 'audit', {str(config)!r}, '-o', {str(tmp_path / 'audit')!r}]; dpsynth.cli.app()")
    proc = subprocess.Popen([sys.executable, "-c", driver], env={**os.environ, "DPSYNTH_CACHE": str(tmp_path / "c")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started = tmp_path / "audit" / "run" / "config.yaml"
    deadline = time.monotonic() + 120
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.05)
    time.sleep(1.0)  # inside the audited run: the holder has the records in memory
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    _no_private_record_in(tmp_path / "audit")
    assert "in_memory: true" in started.read_text()


def _no_private_record_in(directory: Path) -> None:
    private = [row.split(",")[0] for row in (directory.parent / "private.csv").read_text().splitlines()[1:]]
    for path in directory.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(text.encode() in data for text in private), f"a private record in {path}"
