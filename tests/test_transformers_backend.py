"""The transformers backend with a real model (SmolLM2's GGUF de-quantised by transformers)."""

from __future__ import annotations

import pytest

from dpsynth.config import GeneratorConfig
from dpsynth.data.records import TaskSpec
from dpsynth.llm.registry import build_generator
from dpsynth.prompts.builder import build_request

pytestmark = pytest.mark.slow


def test_generates_chat_samples_reproducibly() -> None:
    gen = build_generator(GeneratorConfig(kind="transformers", model="smollm2-135m-instruct", name="hf-smol"))
    assert gen.chat and gen.model_id.startswith("transformers:")
    task = TaskSpec("movie review", {"positive": "a positive review"}, description="Short movie reviews.")
    requests = [build_request(task, "positive", chat=True, seed=s) for s in range(3)]
    requests = [r.__class__(**{**r.__dict__, "max_tokens": 16}) for r in requests]
    first = gen.generate(requests)
    again = gen.generate(requests)
    assert [r.text for r in first] == [r.text for r in again]
    assert all(r.completion_tokens > 0 and r.text.strip() for r in first)


def test_a_leading_newline_is_not_cut_by_a_newline_stop() -> None:
    from dpsynth.llm.transformers_backend import _cut_at_stop

    assert _cut_at_stop("\n A warm film.\nNext", ("\n",)) == "A warm film."
    assert _cut_at_stop("plain", ("\n",)) == "plain"


def test_stopping_at_the_stop_keeps_every_text_and_decodes_fewer_tokens() -> None:
    """Each sequence stops decoding at its own first stop after some text; the batch's random draws do not
    depend on when rows stop, so the kept texts equal those of decoding every row to max_tokens and cutting."""
    from dataclasses import replace

    from dpsynth.llm.base import GenerationRequest
    from dpsynth.llm.transformers_backend import TransformersGenerator, _cut_at_stop
    from dpsynth.llm.local_models import resolve_local_model

    gen = TransformersGenerator(str(resolve_local_model("smollm2-135m-instruct")[0]), chat=False)
    prompts = ["Movie review (positive):\n", "Movie review (negative):\n"]
    stopped = [GenerationRequest(prompt=prompts[i % 2], max_tokens=40, temperature=1.0, stop=("\n",), seed=i)
               for i in range(6)]
    full = gen.generate([replace(r, stop=()) for r in stopped])
    early = gen.generate(stopped)
    assert [r.text for r in early] == [_cut_at_stop(r.text, ("\n",)) for r in full]
    assert any("\n" in r.text.strip() for r in full)  # some rows had text past a stop: the test can fail
    assert sum(r.completion_tokens for r in early) < sum(r.completion_tokens for r in full)
