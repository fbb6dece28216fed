"""Hugging Face transformers models: a hub id, a local directory, or a GGUF file (de-quantised to fp32).

Requests are sampled in left-padded batches. Batches are formed from requests
in order, and each batch's sampling seed is derived from its requests' seeds,
so a rerun of the same requests is reproducible. A sequence stops decoding at its
first stop sequence after some text (`StopAfterText`), and a batch ends when all of
its sequences have: without that, every sequence ran to `max_tokens` and a newline-
stopped sample paid for about twice the tokens it kept. On two CPU cores one forward
pass over 32 sequences costs far less than 32 passes over one (the weights are read
once), hence the default batch of 32 (`benchmarks/transformers_generation.py`).

transformers' info logs and weight-loading progress bars are off unless `dpsynth --verbose`
(`dpsynth.llm.quiet`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest, GenerationResult, ResultCallback
from dpsynth.llm.model_files import file_fingerprint, folder_fingerprint
from dpsynth.llm.quiet import python_stderr_quiet, quiet_transformers


def load_causal_lm(model: str) -> tuple[Any, Any]:
    """(model, tokenizer) in fp32 from a hub id, a local directory or a GGUF file (de-quantised); the
    tokenizer pads with eos when it has no pad token. The one loader of the generator and of DP fine-tuning.

    A GGUF file is de-quantised once per process and each caller gets its own copy: de-quantising takes
    about 40 s for a 135M model on one core, a copy well under a second, and a preference-tuning run builds
    a model per round (training, then a merged generator)."""
    import copy

    path = Path(model).expanduser()
    if path.suffix != ".gguf":
        return _load(model)
    if not path.is_file():
        raise DpsynthError(f"model file {path} does not exist")
    return copy.deepcopy(_load_gguf(str(path.resolve()), path.stat().st_mtime_ns))


@lru_cache(maxsize=1)
def _load_gguf(path: str, mtime_ns: int) -> tuple[Any, Any]:
    """The de-quantised model of one GGUF file (the most recent one; `mtime_ns` keys a changed file anew)."""
    return _load(path)


def _load(model: str) -> tuple[Any, Any]:
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


class StopAfterText:
    """Per-sequence stopping criterion: row i is done once its generated text, leading whitespace dropped,
    contains one of its own stop sequences (`stops[i]`; the same rule as `_cut_at_stop`, so no token it
    would keep is cut off and a model that opens with a newline is not stopped before writing anything)."""

    def __init__(self, tokenizer: Any, prompt_length: int, stops: Sequence[Sequence[str]]) -> None:
        self._tok, self._start, self._stops = tokenizer, prompt_length, [tuple(s) for s in stops]

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        texts = self._tok.batch_decode(input_ids[:, self._start :], skip_special_tokens=True)
        done = [any(s in text.lstrip() for s in stops) for text, stops in zip(texts, self._stops)]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class TransformersGenerator:
    def __init__(self, model: str, *, name: str | None = None, chat: bool | None = None, batch_size: int = 32) -> None:
        import torch

        self._torch = torch
        path = Path(model).expanduser()
        self._model, self._tok = load_causal_lm(model)
        self._model.eval()
        self._tok.padding_side = "left"
        has_template = bool(getattr(self._tok, "chat_template", None))
        self._chat = has_template if chat is None else chat
        self._model_name = model
        self._identity: str | None = None  # model_id's content part, read on first use
        self.name = name or path.stem
        self._batch_size = batch_size
        self.device = "cpu"

    def to_device(self, device: str) -> None:
        """Sample on `device` ('cpu' or 'cuda'; the run's `device:` setting). The weights stay fp32, so a
        GPU samples from the same distribution; seeded draws differ across devices (different kernels)."""
        if device != self.device:
            self._model.to(device)
            self.device = device

    @property
    def model_id(self) -> str:
        """The model's name and what it is: a local file's or folder's content fingerprint (`model_files.py`), a
        Hub model's commit (a moving revision must not be served the previous commit's answers)."""
        if self._identity is None:
            path = Path(self._model_name).expanduser()
            if path.is_file():
                self._identity = file_fingerprint(path)
            elif path.is_dir():
                self._identity = folder_fingerprint(path)
            else:
                self._identity = str(getattr(self._model.config, "_commit_hash", None) or "")
        return f"transformers:{self._model_name}:{self._identity}"

    @property
    def chat(self) -> bool:
        return self._chat

    def prompt_text(self, request: GenerationRequest) -> str:
        """The exact text the model is given for a request (chat template applied): what preference training
        must condition on to train the distribution this generator samples from."""
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
        from transformers import StoppingCriteriaList

        torch = self._torch
        results: list[GenerationResult] = []
        for start, batch in _batches(requests, self._batch_size):
            first = batch[0]
            enc = self._tok([self.prompt_text(r) for r in batch], return_tensors="pt", padding=True).to(self.device)
            seed = int.from_bytes(hashlib.sha256(str([r.seed for r in batch]).encode()).digest()[:4], "big")
            torch.manual_seed(seed)
            prompt_len = enc["input_ids"].shape[1]
            criteria = StoppingCriteriaList([StopAfterText(self._tok, prompt_len, [r.stop for r in batch])])
            with torch.no_grad():
                out = self._model.generate(
                    **enc,
                    do_sample=first.temperature > 0,
                    temperature=max(first.temperature, 1e-5),
                    top_p=first.top_p,
                    max_new_tokens=max(r.max_tokens for r in batch),
                    pad_token_id=self._tok.pad_token_id,
                    stopping_criteria=criteria,
                )
            for j, request in enumerate(batch):
                new_tokens = out[j, prompt_len:][: request.max_tokens]
                new_tokens = new_tokens[new_tokens != self._tok.pad_token_id]
                text = _cut_at_stop(self._tok.decode(new_tokens, skip_special_tokens=True), request.stop)
                result = GenerationResult(text, int(enc["attention_mask"][j].sum()), int(len(new_tokens)))
                results.append(result)
                if on_result:
                    on_result(start + j, result)
        return results


def _batches(requests: Sequence[GenerationRequest], size: int) -> list[tuple[int, list[GenerationRequest]]]:
    """(index of the first request, requests): runs of consecutive requests, at most `size` long, that share
    their sampling settings (one `generate` call samples a whole batch with one temperature and top-p)."""
    out: list[tuple[int, list[GenerationRequest]]] = []
    for i, request in enumerate(requests):
        last = out[-1][1] if out else None
        if last and len(last) < size and (last[0].temperature, last[0].top_p) == (request.temperature, request.top_p):
            last.append(request)
        else:
            out.append((i, [request]))
    return out


def _cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """The text up to its first stop sequence; leading whitespace is dropped first, so a model that opens
    with a newline is not cut to nothing by a newline stop."""
    text = text.lstrip()
    cut = min((text.index(s) for s in stops if s in text), default=len(text))
    return text[:cut]
