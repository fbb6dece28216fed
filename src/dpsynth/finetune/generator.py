"""A DP fine-tuned model as a dpsynth Generator: the GGUF base with a trained LoRA adapter merged in.

Sampling (left-padded batches, per-batch seeds from the requests' seeds) is the transformers
backend's; only the weights differ. The adapter is merged into the base weights once, so
generation costs the same as the base model. Prompts are completion prompts (the control
prompt of `dpsynth.finetune.examples`), whatever chat template the base model has: the adapter
was trained on completions. A preference-tuned adapter (method popri) was trained on the chat prompts
the base model's template makes, so it is built with `chat=True`.

The model id names the adapter by its content hash (and the LoRA scaling, which changes the
merged weights for the same vector), so the persistent request cache never serves one
adapter's text for another's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpsynth.finetune.model import adapter_hash, add_lora, load_adapter_vector
from dpsynth.llm.model_files import file_fingerprint
from dpsynth.llm.transformers_backend import TransformersGenerator


class AdapterGenerator(TransformersGenerator):
    def __init__(
        self,
        gguf_path: Path,
        adapter: np.ndarray,
        *,
        r: int,
        alpha: int,
        name: str | None = None,
        batch_size: int = 8,
        chat: bool = False,
    ) -> None:
        gguf_path = Path(gguf_path)
        super().__init__(str(gguf_path), name=name or f"dpft-{gguf_path.stem}", chat=chat, batch_size=batch_size)
        with_lora = add_lora(self._model, r, alpha)
        load_adapter_vector(with_lora, adapter)
        self._model = with_lora.merge_and_unload().eval()
        self._model_id = f"dpft:{gguf_path.name}:{file_fingerprint(gguf_path)}:{adapter_hash(adapter)}:r{r}a{alpha}"

    @property
    def model_id(self) -> str:
        return self._model_id
