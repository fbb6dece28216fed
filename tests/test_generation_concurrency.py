"""API generators of one iteration are asked side by side; local models one after another; the samples are the
same either way (cleaned and de-duplicated in plan order, not in the order answers arrive)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from dpsynth.llm.base import GenerationRequest, GenerationResult, ResultCallback
from dpsynth.llm.cache import CachedGenerator, RequestCache
from dpsynth.methods.generation import GenerationPlan, generate_samples, zero_shot_requests
from dpsynth.prompts.builder import PromptSettings
from tests.test_fusegen import TASK


class _Recorder:
    """A backend that records when it is busy; `remote` backends meet at a barrier, which only works if they
    are asked at the same time."""

    def __init__(self, name: str, remote: bool, barrier: threading.Barrier | None, busy: list, dup: bool = False):
        self.name, self.runs_remotely, self._barrier, self._busy, self._dup = name, remote, barrier, busy, dup

    model_id = property(lambda self: f"rec:{self.name}")
    chat = True

    def generate(self, requests: Sequence[GenerationRequest],
                 on_result: ResultCallback | None = None) -> list[GenerationResult]:
        start = time.monotonic()
        if self._barrier is not None:  # the first batches only (a re-ask may be one PLM's alone)
            barrier, self._barrier = self._barrier, None
            barrier.wait()  # raises BrokenBarrierError after its timeout if the other never comes
        time.sleep(0.05)
        out = []
        for i, r in enumerate(requests):
            text = "the same words for everyone" if self._dup and i == 0 else f"{self.name} says {r.seed}"
            self._dup = self._dup and i != 0  # in the first batch only
            out.append(GenerationResult(text, 3, 5))
            if on_result:
                on_result(i, out[-1])
        self._busy.append((self.name, start, time.monotonic()))
        return out


def _generators(tmp_path: Path, remote: bool, barrier: threading.Barrier | None, busy: list,
                dup: bool = False) -> dict[str, CachedGenerator]:
    cache = RequestCache(tmp_path / "cache.sqlite")
    return {n: CachedGenerator(_Recorder(n, remote, barrier, busy, dup), cache) for n in ("a", "b")}


def _run(generators: dict[str, CachedGenerator]):
    plans = [GenerationPlan("a", {"positive": 2, "negative": 2}), GenerationPlan("b", {"positive": 2, "negative": 2})]
    return generate_samples(0, plans=plans, generators=generators, existing=[], max_attempts=3,
                            make_requests=zero_shot_requests(TASK, PromptSettings(), 0, "t"))


def test_api_generators_are_asked_side_by_side(tmp_path: Path) -> None:
    busy: list = []
    samples, stats = _run(_generators(tmp_path, True, threading.Barrier(2, timeout=10), busy))
    assert len(samples) == 8 and stats["a"]["short_by"] == 0 == stats["b"]["short_by"]


def test_local_generators_take_turns(tmp_path: Path) -> None:
    busy: list = []
    _run(_generators(tmp_path, False, None, busy))
    (_, _, end_a), (_, start_b, _) = sorted(busy, key=lambda b: b[1])
    assert start_b >= end_a, "a local model waits for the other"


def test_samples_do_not_depend_on_who_answers_first(tmp_path: Path) -> None:
    """Both PLMs write the same text once: the first plan keeps it, the second re-asks, in either mode."""
    side_by_side, _ = _run(_generators(tmp_path / "p", True, threading.Barrier(2, timeout=10), [], dup=True))
    one_by_one, _ = _run(_generators(tmp_path / "s", False, None, [], dup=True))
    key = [(x.id, x.plm, x.label, x.text) for x in side_by_side]
    assert key == [(x.id, x.plm, x.label, x.text) for x in one_by_one]
    assert sum(x.text == "the same words for everyone" for x in side_by_side) == 1
    assert [x.plm for x in side_by_side] == ["a"] * 4 + ["b"] * 4


@pytest.fixture(autouse=True)
def _tmp_dirs(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "s").mkdir()
