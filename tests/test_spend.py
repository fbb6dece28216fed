"""Spend caps and the client-side rate limit (issue 36), with a fake clock: no timing in the assertions."""

from __future__ import annotations

import pytest

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest, GenerationResult, Usage
from dpsynth.llm.spend import RatePacer, SpendCapReached, SpendGuard, SpendLimits, worst_case
from dpsynth.runs.config import parse_config


def _request(chars: int = 30, max_tokens: int = 10) -> GenerationRequest:
    return GenerationRequest(prompt="x" * chars, max_tokens=max_tokens)


def test_caps_admit_only_what_cannot_cross_them() -> None:
    usage = Usage(prices={"prompt": 0.01, "completion": 0.02})
    p, c = worst_case(_request())
    assert (p, c) == (30 + 16, 10)  # UTF-8 bytes + chat markup: an upper bound for byte-level BPE
    per_request = p * 0.01 + c * 0.02
    guard = SpendGuard("g", SpendLimits(max_cost=2.5 * per_request), usage, "generators[0]")
    assert guard.admit([_request()] * 5) == 2
    usage.add(GenerationResult("t", 46, 10))
    usage.add(GenerationResult("t", 46, 10))
    with pytest.raises(SpendCapReached, match=r"g: the next request could cross its cap \(max_cost"):
        guard.admit([_request()])
    usage.add(GenerationResult("t", 0, 0, cached=True))  # a cached answer costs nothing
    assert SpendGuard("g", SpendLimits(max_requests=3), usage, "x").admit([_request()] * 5) == 1
    with pytest.raises(SpendCapReached):
        SpendGuard("g", SpendLimits(max_total_tokens=112 + 50), usage, "x").admit([_request()])
    assert SpendGuard("g", SpendLimits(), usage, "x").admit([_request()] * 7) == 7


def test_the_rate_limit_paces_requests_over_a_sliding_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("dpsynth.llm.spend.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("dpsynth.llm.spend.time.sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    pacer = RatePacer(SpendLimits(requests_per_minute=2))
    sent = []
    for _ in range(5):
        pacer.pace(_request())
        sent.append(clock[0])
    assert sent == [0.0, 0.0, 60.0, 60.0, 120.0]
    clock[0] = 0.0
    tokens = RatePacer(SpendLimits(tokens_per_minute=120))  # 56 tokens per request: two per minute
    sent = []
    for _ in range(3):
        tokens.pace(_request())
        sent.append(clock[0])
    assert sent == [0.0, 0.0, 60.0]


@pytest.mark.parametrize("field,value,message", [
    ("max_cost", 0, "greater than 0"), ("max_requests", -1, "greater than 0"),
    ("requests_per_minute", 0, "greater than 0"), ("max_cost", 1.0, "max_cost needs the generator's prices"),
])
def test_bad_caps_are_one_line_errors(field: str, value: float, message: str) -> None:
    with pytest.raises(DpsynthError, match=message):
        parse_config({"data": {"corpus": "trec", "m": 50}, "generators": [{"model": "m", field: value}]})
