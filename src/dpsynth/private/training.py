"""DP fine-tuning on the private records, inside the data holder: the adapter is the only output.

The holder calls this for a release of kind Poisson-subsampled Gaussian (DP-SGD steps); the
records, their per-example gradients and the Poisson batches never leave this call. What is
written while it runs is the partial DP state of `dpsynth.finetune.dp_adam` (adapter, Adam
moments, step), which is as public as the final adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from dpsynth.finetune.dp_adam import TrainSettings, train_adapter
from dpsynth.finetune.model import add_lora, load_base
from dpsynth.finetune.request import AdapterTraining


def train_on_records(request: AdapterTraining, texts: list[str], labels: list[str], *, noise_multiplier: float,
                     seed: int, work_dir: Path | None,
                     on_step: Callable[[int, float], None] | None = None,
                     groups: np.ndarray | None = None, device: str = "cpu") -> np.ndarray:
    """The LoRA adapter of `request.model` trained with DP-Adam on (control prompt of label, text); `groups`:
    each record's person, for person-level sampling and clipping; `device`: where DP-SGD runs (the run's
    `device:` setting, as the holder's votes)."""
    import torch

    if request.threads is not None:
        torch.set_num_threads(request.threads)
    model, tokenizer = load_base(Path(request.model))
    with torch.random.fork_rng(devices=[]):  # the LoRA start from the request's public seed: reproducible
        torch.manual_seed(request.init_seed)
        model = add_lora(model, request.lora_r, request.lora_alpha)
    settings = TrainSettings(steps=request.steps, sampling_rate=request.sampling_rate,
                             noise_multiplier=noise_multiplier, clip_norm=request.clip_norm,
                             learning_rate=request.learning_rate, max_length=request.max_length, seed=seed,
                             checkpoint_every=1)  # every step whose noisy norm was shown is saved: a resume
    # after Ctrl-C never redoes (with fresh secret randomness) a step whose output was already seen
    prompts = [request.prompts[label] for label in labels]
    vector = train_adapter(model, tokenizer, prompts, texts, settings, checkpoint_dir=work_dir, on_step=on_step,
                          groups=groups, device=device)
    return np.asarray(vector, dtype=np.float64)
