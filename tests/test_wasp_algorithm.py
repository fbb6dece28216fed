"""WASP's pieces: allocation, selection, PLM weights, prompts, generation loop (with a test double)."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.data.records import TaskSpec
from dpsynth.llm.base import GenerationRequest, GenerationResult
from dpsynth.llm.cache import CachedGenerator
from dpsynth.llm.request_store import RequestCache
from dpsynth.methods.generation import (
    GenerationPlan,
    SyntheticSample,
    generate_samples,
    plan_counts,
    split_count,
)
from dpsynth.methods.wasp import (
    WaspState,
    build_requests,
    iteration_size,
    plm_weights,
    select_top,
)
from dpsynth.prompts.builder import PromptSettings

TASK = TaskSpec("movie review", {"positive": "a positive review", "negative": "a negative review"},
                description="Short movie reviews.")


def test_split_count_and_iteration_sizes() -> None:
    assert split_count(10, [1, 1, 1]) == [4, 3, 3]
    assert sum(split_count(17, [0.2, 0.5, 0.3])) == 17
    assert [iteration_size(100, 3, t) for t in range(3)] == [33, 33, 34]
    plans = plan_counts(iteration_size(100, 4, 1), {"a": 0.75, "b": 0.25}, {"positive": 0.5, "negative": 0.5})
    assert [sum(p.per_label.values()) for p in plans] == [19, 6]


def _samples() -> list[SyntheticSample]:
    return [SyntheticSample(i, f"text {i}", "positive" if i % 2 == 0 else "negative", "a" if i < 4 else "b", 0)
            for i in range(8)]


def test_select_top_per_label() -> None:
    samples = _samples()
    noisy = np.array([5.0, 1.0, 3.0, 9.0, -1.0, 2.0, 7.0, 0.0])
    top = select_top(noisy, samples, ["positive", "negative"], 2)
    assert top == {"positive": [6, 0], "negative": [3, 5]}


def test_plm_weights_clip_negative_floor_and_normalise() -> None:
    samples = _samples()
    noisy = np.array([4.0, 4.0, 4.0, 4.0, -3.0, -3.0, -3.0, -3.0])
    w = plm_weights(noisy, samples, ["a", "b"], min_weight=0.1)
    assert w["a"] + w["b"] == pytest.approx(1.0)
    assert w["b"] == pytest.approx(0.1 / 1.1)  # floored, not starved
    assert plm_weights(-np.ones(8), samples, ["a", "b"], 0.05) == {"a": 0.5, "b": 0.5}
    even = plm_weights(np.ones(8), samples, ["a", "b"], 0.05)
    assert even["a"] == pytest.approx(0.5)


def test_plm_weights_follow_the_votes_through_noise_at_scale() -> None:
    """Each model's summed noisy votes are clipped, not each vote: with a pool of 1,200 samples from 6 models,
    noise sigma 3.5 and 200 votes of which model "m0" draws 60%, its weight stays near its share (clipping each
    vote at 0 first gave about 0.19, almost the uniform 1/6)."""
    rng = np.random.default_rng(0)
    plms = [f"m{k}" for k in range(6)]
    samples = [SyntheticSample(i, f"t{i}", "positive", plms[i % 6], 1) for i in range(1_200)]
    clean = np.zeros(1_200)
    for i in rng.choice(np.arange(0, 1_200, 6), size=120):
        clean[i] += 1.0
    for i in rng.choice(np.flatnonzero(np.arange(1_200) % 6 != 0), size=80):
        clean[i] += 1.0
    weights = [plm_weights(clean + rng.normal(0, 3.5, 1_200), samples, plms, 0.05)["m0"] for _ in range(50)]
    assert np.mean(weights) > 0.35


def _state_with_selection() -> WaspState:
    samples = [SyntheticSample(i, f"example number {i}", "positive", "a", 0) for i in range(8)]
    return WaspState(samples=samples, weights={"a": 1.0}, good={"positive": [0, 1, 2, 3]},
                     bad={"positive": [4, 5, 6, 7]})


@pytest.mark.parametrize("chat", [True, False])
def test_contrastive_prompts_mix_good_and_bad(chat: bool) -> None:
    state = _state_with_selection()
    pairs = build_requests(GenerationPlan("a", {"positive": 3}), t=1, attempt=0, seed=0, task=TASK, chat=chat,
                           state=state, s=5, contrastive=True, samples_per_prompt=1, settings=PromptSettings())
    for _, req in pairs:
        text = req.prompt_text()
        good = sum(f"example number {i}" in text for i in range(4))
        bad = sum(f"example number {i}" in text for i in range(4, 8))
        assert (good, bad) == (3, 2)  # S - S//2 good, S//2 bad
        assert ("bad" in text) and ("good" in text)
    assert len({r.seed for _, r in pairs}) == 3


def test_a_plans_start_builds_the_same_requests_as_the_whole_plan_from_there() -> None:
    """Requests are built in blocks (`GenerationPlan.start`): a request depends on its index, not on the block."""
    state = _state_with_selection()

    def build(plan: GenerationPlan) -> list:
        return build_requests(plan, t=1, attempt=0, seed=0, task=TASK, chat=True, state=state, s=4,
                              contrastive=True, samples_per_prompt=2, settings=PromptSettings())

    whole = build(GenerationPlan("a", {"positive": 7, "negative": 5}))
    tail = build(GenerationPlan("a", {"positive": 7, "negative": 5}, start={"positive": 3, "negative": 5}))
    assert tail == whole[3:7]


def test_non_contrastive_and_zero_shot() -> None:
    state = _state_with_selection()
    pairs = build_requests(GenerationPlan("a", {"positive": 2}), t=1, attempt=0, seed=0, task=TASK, chat=True,
                           state=state, s=4, contrastive=False, samples_per_prompt=1, settings=PromptSettings())
    for _, req in pairs:
        text = req.prompt_text()
        assert sum(f"example number {i}" in text for i in range(4)) == 4
        assert not any(f"example number {i}" in text for i in range(4, 8))
    zero = build_requests(GenerationPlan("a", {"positive": 1}), t=0, attempt=0, seed=0, task=TASK, chat=False,
                          state=state, s=4, contrastive=True, samples_per_prompt=1, settings=PromptSettings())
    assert "example number" not in zero[0][1].prompt_text()
    assert zero[0][1].stop == ('"', "\n")


class ScriptedGenerator:
    """Test double: answers from a script, counting calls (the real backends are covered end to end)."""

    name = "fake"
    model_id = "fake:1"
    chat = True

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls = 0

    def generate(self, requests, on_result=None):
        out = []
        for i, _ in enumerate(requests):
            self.calls += 1
            result = GenerationResult(self.answers.pop(0) if self.answers else "a fine new movie review here", 10, 5)
            out.append(result)
            if on_result:
                on_result(i, result)
        return out


def test_generation_cleans_counts_and_reasks(tmp_path) -> None:
    fake = ScriptedGenerator(["", "Here is a review:", "good good good good good good good good good good good good",
                              "A truly moving film about loss.", "A truly moving film about loss."])
    gen = CachedGenerator(fake, RequestCache(tmp_path / "c.sqlite"))
    state = WaspState(weights={"fake": 1.0})

    def make_requests(plan, attempt, chat):
        return build_requests(plan, t=0, attempt=attempt, seed=0, task=TASK, chat=chat, state=state, s=4,
                              contrastive=True, samples_per_prompt=1, settings=PromptSettings())

    new, stats = generate_samples(0, plans=[GenerationPlan("fake", {"positive": 2})], generators={"fake": gen},
                                  existing=state.samples, make_requests=make_requests, max_attempts=4)
    assert [x.text for x in new] == ["A truly moving film about loss.", "a fine new movie review here"]
    dropped = stats["fake"]["dropped"]
    assert dropped == {"empty": 1, "preamble_only": 1, "degenerate": 1, "duplicate": 1}
    assert stats["fake"]["short_by"] == 0


def test_cache_serves_repeats_and_counts_usage(tmp_path) -> None:
    fake = ScriptedGenerator([])
    cache = RequestCache(tmp_path / "c.sqlite")
    gen = CachedGenerator(fake, cache)
    reqs = [GenerationRequest(messages=(("user", "hi"),), seed=s) for s in range(3)]
    gen.generate(reqs)
    again = CachedGenerator(fake, RequestCache(tmp_path / "c.sqlite"))
    results = again.generate(reqs)
    assert fake.calls == 3 and all(r.cached for r in results)
    assert gen.usage.prompt_tokens == 30 and again.usage.prompt_tokens == 0 and again.usage.cached == 3


def test_results_are_cached_as_they_arrive_even_if_the_batch_fails(tmp_path) -> None:
    class Failing(ScriptedGenerator):
        def generate(self, requests, on_result=None):
            on_result(0, GenerationResult("paid for", 1, 1))
            raise RuntimeError("connection lost")

    cache = RequestCache(tmp_path / "c.sqlite")
    reqs = [GenerationRequest(prompt="p", seed=s) for s in range(2)]
    with pytest.raises(RuntimeError):
        CachedGenerator(Failing([]), cache).generate(reqs)
    assert cache.get_many([reqs[0].cache_key("fake:1")])
