"""Batching of the transformers backend (no model): runs of equal sampling settings, stop criterion per row."""

from __future__ import annotations

import torch

from dpsynth.llm.base import GenerationRequest
from dpsynth.llm.transformers_backend import StopAfterText, _batches


def test_batches_are_runs_of_equal_sampling_settings_at_most_size_long() -> None:
    temps = [1.0, 1.0, 1.0, 0.5, 0.5, 1.0]
    requests = [GenerationRequest(prompt="p", temperature=t, seed=i) for i, t in enumerate(temps)]
    batches = _batches(requests, 2)
    assert [(start, [r.seed for r in b]) for start, b in batches] == [(0, [0, 1]), (2, [2]), (3, [3, 4]), (5, [5])]
    assert _batches([], 4) == []


class _CharTokenizer:
    """One character per token id (ord), enough to test the rule on decoded text."""

    def batch_decode(self, ids: torch.Tensor, skip_special_tokens: bool = True) -> list[str]:
        return ["".join(chr(int(i)) for i in row) for row in ids]


def _ids(texts: list[str]) -> torch.Tensor:
    return torch.tensor([[ord(c) for c in t] for t in texts])


def test_a_row_stops_at_its_own_stop_after_text_only() -> None:
    criterion = StopAfterText(_CharTokenizer(), 2, [("\n",), ("\n",), ("\n",), ()])
    # prompt "P:" (2 tokens), then: a leading newline only / text then newline / text / a newline without stops
    done = criterion(_ids(["P:\n   ", "P:ab\nc", "P:abcd", "P:a\nbc"]), None)
    assert done.dtype == torch.bool and done.tolist() == [False, True, False, False]
