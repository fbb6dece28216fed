"""Every method's request maker builds, for a plan with `start`, exactly the whole plan's requests from
there (captured from a real step through a monkeypatched generate_samples)."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from dpsynth.methods import generation
from dpsynth.methods.generation import GenerationPlan


def _check(make, plans) -> int:
    checked = 0
    for plan in plans:
        for attempt in (0, 1):
            whole = make(GenerationPlan(plan.plm, dict(plan.per_label)), attempt, True)
            idx = list(GenerationPlan(plan.plm, dict(plan.per_label)).indices())
            assert [label for label, _ in whole] == [label for label, _ in idx]
            for k in range(len(idx) + 1):  # every split point: a start per label
                start = {}
                for label, j in idx[:k]:
                    start[label] = j + 1
                tail = make(GenerationPlan(plan.plm, dict(plan.per_label), start=start), attempt, True)
                assert tail == whole[k:], (plan, start)
                checked += 1
            # a start beyond zero in a later label only
            labels = list(plan.per_label)
            if len(labels) > 1 and plan.per_label[labels[-1]] > 1:
                start = {labels[-1]: 1}
                want = [r for r, (label, j) in zip(whole, idx) if j >= start.get(label, 0)]
                assert make(GenerationPlan(plan.plm, dict(plan.per_label), start=start), attempt, True) == want
    return checked


@pytest.fixture
def captured(monkeypatch):
    seen: list = []
    real = generation.generate_samples

    def spy(t, *, plans, make_requests, **kw):
        seen.append(_check(make_requests, plans))
        return real(t, plans=plans, make_requests=make_requests, **kw)

    for mod in ("augpe", "dpga", "dpft", "wasp", "fusegen", "zero_shot", "popri"):
        m = importlib.import_module(f"dpsynth.methods.{mod}")
        if hasattr(m, "generate_samples"):
            monkeypatch.setattr(m, "generate_samples", spy)
    return seen


def _csv(tmp_path: Path) -> str:
    csv = tmp_path / "private.csv"
    csv.write_text("text,label\n" + "".join(f"private review {i} of a {'great' if i % 2 else 'poor'} film with "
                                            f"{i % 7 + 3} words,{'pos' if i % 2 else 'neg'}\n" for i in range(40)))
    return str(csv)


@pytest.mark.parametrize("method, options", [
    ("augpe", {"n": 8, "iterations": 2}),
    ("augpe", {"n": 8, "iterations": 2, "variation": "mixed"}),
    ("augpe", {"n": 9, "iterations": 2, "selection": "rank", "fuse": True}),  # dealt places, 5 and 4 a PLM
    ("dpga", {"n": 12, "generations": 2, "length_cap": 64, "keywords_asked": 5, "keywords_kept": 3}),
])
def test_a_methods_request_maker_honours_the_plans_start(method, options, tmp_path, monkeypatch, captured) -> None:
    from fakes import FakeGenerator

    from dpsynth.runs.config import parse_config
    from dpsynth.runs.engine import Run

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls, FakeGenerator.fail_after = [], None
    several = method == "dpga" or options.get("fuse", False)
    gens = [{"kind": "fake", "model": "a"}] + ([{"kind": "fake", "model": "b"}] if several else [])
    cfg = parse_config({"method": method, "data": {"private": _csv(tmp_path)},
                        "task": {"text_kind": "review", "labels": {"pos": "positive", "neg": "negative"}},
                        "generators": gens, method: options,
                        "privacy": {"epsilon": 4.0, "delta": 1e-3}, "evaluate": False, "seed": 3})
    Run.create(cfg, tmp_path / "run").execute()
    assert len(captured) >= 2 and all(c > 0 for c in captured)


def test_dpfts_request_maker_honours_the_plans_start(monkeypatch) -> None:
    """sample_from_adapter's maker, without a model: the adapter's generator and the generation are stubbed."""
    from types import SimpleNamespace

    from dpsynth.methods import dpft
    from dpsynth.methods.base import SamplingOptions

    monkeypatch.setattr(dpft, "adapter_generator", lambda *a, **k: (SimpleNamespace(name="g"), None))
    checked: list[int] = []

    def spy(t, *, plans, make_requests, **kw):
        checked.append(_check(make_requests, plans))
        return [], {}

    monkeypatch.setattr(dpft, "generate_samples", spy)
    ctx = SimpleNamespace(config=SimpleNamespace(seed=1), label_shares={"pos": 0.6, "neg": 0.4},
                          generation_progress=lambda t: None, add_time=lambda *a: None)
    request = SimpleNamespace(model="m", lora_r=4, lora_alpha=8, threads=None,
                              prompts={"pos": "positive review:", "neg": "negative review:"})
    dpft.sample_from_adapter(ctx, request, None, SamplingOptions(), 0, 9, tag="dpft")
    assert checked and checked[0] > 0
