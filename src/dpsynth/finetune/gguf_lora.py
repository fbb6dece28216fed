"""A trained LoRA adapter as a llama.cpp LoRA GGUF file, so llama.cpp (faster on CPU than transformers'
sampling) can generate from the base GGUF with the adapter applied.

llama.cpp's adapter format (`llama-adapter.cpp`, written by llama.cpp's `convert_lora_to_gguf.py`):
`general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, the base model's
`general.architecture`, and per adapted weight `<gguf tensor name>.lora_a` (numpy shape r x in) and
`.lora_b` (out x r); llama.cpp scales by alpha / r like PEFT. For llama-architecture models the GGUF
conversion permutes the rows of q and k for its rotary layout (transformers undoes that when it
de-quantises the file, so the PEFT adapter is in the Hugging Face layout): the rows of B are
permuted the same way. `tests/test_gguf_lora.py` checks llama.cpp with the exported adapter
against the transformers model with the adapter merged.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.fs import make_dir

_PROJ = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
_LAYER = re.compile(r"layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj)$")
ROTARY_PERMUTED = ("llama",)  # architectures whose GGUF conversion permutes q/k rows


def permute_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """The row permutation llama.cpp's HF-to-GGUF conversion applies to q/k projections (per head, the two
    rotary halves interleaved), applied to the output rows of a LoRA B matrix."""
    out = weights.shape[0]
    return weights.reshape(n_head, 2, out // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def export_lora_gguf(peft_model: Any, architecture: str, alpha: float, path: Path) -> Path:
    """Write the LoRA weights of `peft_model` (a peft model on the de-quantised GGUF base) to `path`."""
    import gguf

    config = peft_model.base_model.model.config
    n_head = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_head
    writer = gguf.GGUFWriter(str(path), arch=architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    count = 0
    for name, module in peft_model.named_modules():
        found = _LAYER.search(name)
        if found is None or not hasattr(module, "lora_A"):
            continue
        layer, proj = int(found.group(1)), found.group(2)
        a = module.lora_A["default"].weight.detach().to("cpu").float().numpy()
        b = module.lora_B["default"].weight.detach().to("cpu").float().numpy()
        if architecture in ROTARY_PERMUTED and proj in ("q_proj", "k_proj"):
            b = permute_rows(b, n_head if proj == "q_proj" else n_kv)
        base = f"blk.{layer}.{_PROJ[proj]}.weight"
        writer.add_tensor(f"{base}.lora_a", np.ascontiguousarray(a, dtype=np.float32))
        writer.add_tensor(f"{base}.lora_b", np.ascontiguousarray(b, dtype=np.float32))
        count += 1
    if count == 0:
        raise ValueError("the model has no LoRA layers on q/k/v/o projections to export")
    make_dir(path.parent)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_architecture(gguf_path: Path) -> str:
    """The `general.architecture` of a GGUF file (e.g. 'llama', 'gemma3')."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()
