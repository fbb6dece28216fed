"""Hugging Face transformers models: a hub id, a local directory, or a GGUF file (de-quantised to fp32).

Requests are sampled in left-padded batches. Batches are formed from requests
in order, and each batch's sampling seed is derived from its requests' seeds,
so a rerun of the same requests is reproducible.

transformers' info logs and weight-loading progress bars are off unless `dpsynth --verbose`
(`dpsynth.llm.quiet`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest, GenerationResult, ResultCallback
from dpsynth.llm.quiet import python_stderr_quiet, quiet_transformers


def load_causal_lm(model: str) -> tuple[Any, Any]:
    """(model, tokenizer) in fp32 from a hub id, a local directory or a GGUF file (de-quantised); the
    tokenizer pads with eos when it has no pad token. The one loader of the generator and of DP fine-tuning."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise DpsynthError("the transformers backend needs: pip install 'dpsynth[transformers]'") from err
    quiet_transformers()
    path = Path(model).expanduser()
    kwargs: dict = {}
    source = model
    if path.suffix == ".gguf":
        if not path.is_file():
            raise DpsynthError(f"model file {path} does not exist")
        source, kwargs = str(path.parent), {"gguf_file": path.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        with python_stderr_quiet():  # transformers' GGUF de-quantising bar
            loaded = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32, **kwargs)
    except (OSError, ValueError, RuntimeError) as err:
        first_line = (str(err).splitlines() or [type(err).__name__])[0]
        raise DpsynthError(f"cannot load transformers model '{model}': {first_line}") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return loaded, tokenizer


class TransformersGenerator:
    def __init__(self, model: str, *, name: str | None = None, chat: bool | None = None, batch_size: int = 8) -> None:
        import torch

        self._torch = torch
        path = Path(model).expanduser()
        self._model, self._tok = load_causal_lm(model)
        self._model.eval()
        self._tok.padding_side = "left"
        has_template = bool(getattr(self._tok, "chat_template", None))
        self._chat = has_template if chat is None else chat
        self._model_name = model
        self.name = name or path.stem
        self._batch_size = batch_size

    @property
    def model_id(self) -> str:
        return f"transformers:{self._model_name}"

    @property
    def chat(self) -> bool:
        return self._chat

    def _text(self, request: GenerationRequest) -> str:
        if request.messages is None:
            return request.prompt or ""
        if not self._chat:
            raise DpsynthError(f"{self.name} is a base model: it takes completion prompts, not chat messages")
        return self._tok.apply_chat_template(
            [{"role": r, "content": c} for r, c in request.messages], tokenize=False, add_generation_prompt=True
        )

    def generate(
        self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None = None
    ) -> list[GenerationResult]:
        torch = self._torch
        results: list[GenerationResult] = []
        for start in range(0, len(requests), self._batch_size):
            batch = list(requests[start : start + self._batch_size])
            first = batch[0]
            enc = self._tok([self._text(r) for r in batch], return_tensors="pt", padding=True)
            seed = int.from_bytes(hashlib.sha256(str([r.seed for r in batch]).encode()).digest()[:4], "big")
            torch.manual_seed(seed)
            with torch.no_grad():
                out = self._model.generate(
                    **enc,
                    do_sample=first.temperature > 0,
                    temperature=max(first.temperature, 1e-5),
                    top_p=first.top_p,
                    max_new_tokens=max(r.max_tokens for r in batch),
                    pad_token_id=self._tok.pad_token_id,
                )
            prompt_len = enc["input_ids"].shape[1]
            for j, request in enumerate(batch):
                new_tokens = out[j, prompt_len:][: request.max_tokens]
                new_tokens = new_tokens[new_tokens != self._tok.pad_token_id]
                text = _cut_at_stop(self._tok.decode(new_tokens, skip_special_tokens=True), request.stop)
                result = GenerationResult(text, int(enc["attention_mask"][j].sum()), int(len(new_tokens)))
                results.append(result)
                if on_result:
                    on_result(start + j, result)
        return results


def _cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """The text up to its first stop sequence; leading whitespace is dropped first, so a model that opens
    with a newline is not cut to nothing by a newline stop."""
    text = text.lstrip()
    cut = min((text.index(s) for s in stops if s in text), default=len(text))
    return text[:cut]
