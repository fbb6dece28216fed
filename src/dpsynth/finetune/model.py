"""The trainable model: a GGUF causal LM de-quantised to fp32 by transformers, with a LoRA adapter.

Only the adapter is trained, so the adapter alone (a flat float32 vector) is the fine-tuned
state: it is what checkpoints store, what the generator is built from and what its cache key
hashes. The order of the vector is the sorted parameter names, so it does not depend on module
registration order.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from dpsynth.errors import DpsynthError
from dpsynth.llm.transformers_backend import load_causal_lm

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def load_base(gguf_path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) in fp32 from a GGUF file, by the generator backend's loader."""
    return load_causal_lm(str(gguf_path))


def add_lora(model: Any, r: int, alpha: int, dropout: float = 0.0) -> PeftModel:
    """LoRA on the attention projections; peft freezes everything else, so only the adapter is trainable."""
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(LORA_TARGETS),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21 asks transformers 5 a deprecated question (is_gradient_checkpointing); harmless.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        return get_peft_model(model, config)


def initial_adapter(gguf_path: Path, r: int, alpha: int, seed: int) -> np.ndarray:
    """The LoRA initialisation (random A, zero B) drawn from a public seed: federated rounds start from it."""
    model, _ = load_base(gguf_path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return adapter_vector(add_lora(model, r, alpha))


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The trainable parameters sorted by name: the one order of the adapter vector and of Adam's state."""
    return sorted((name, p) for name, p in model.named_parameters() if p.requires_grad)


def adapter_vector(model: torch.nn.Module) -> np.ndarray:
    """All trainable (LoRA) parameters flattened into one float32 vector, by sorted parameter name."""
    params = trainable_parameters(model)
    if not params:
        raise DpsynthError("the model has no trainable parameters: add a LoRA adapter first")
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for _, p in params]).to(torch.float32).cpu().numpy().copy()


def load_adapter_vector(model: torch.nn.Module, vec: np.ndarray) -> None:
    """Write a vector from `adapter_vector` back into the model's trainable parameters."""
    params = trainable_parameters(model)
    size = sum(p.numel() for _, p in params)
    flat = np.asarray(vec, dtype=np.float32).reshape(-1)
    if flat.size != size:
        raise DpsynthError(
            f"adapter has {flat.size} values but the model's LoRA parameters have {size}: "
            "it was trained with another rank or base model"
        )
    source = torch.from_numpy(flat)
    offset = 0
    with torch.no_grad():
        for _, p in params:
            p.copy_(source[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def adapter_hash(vec: np.ndarray) -> str:
    """Short content hash of an adapter (its float32 bytes): tells adapters apart in model ids and caches."""
    return hashlib.sha256(np.ascontiguousarray(vec, dtype=np.float32).tobytes()).hexdigest()[:16]
