"""DP-Adam on a LoRA adapter: Poisson sampling, per-example clipping and Gaussian noise (Opacus), resumable.

Each step is one Poisson-subsampled Gaussian release: every example joins the batch
independently with probability `sampling_rate` (we sample, not a shuffled fixed-size loader,
because the accounting assumes Poisson sampling), Opacus clips each example's gradient to
`clip_norm`, sums them and adds N(0, (noise_multiplier * clip_norm)^2) per coordinate, and Adam
steps on that noisy sum. An empty batch is a valid step: the noise is still added and Adam still
steps, otherwise the batch size would show in the output.

Person-level DP-SGD (`groups`: each example's person): the Poisson draw is over persons, a sampled
person brings all of their examples, and the per-example gradients of one person are summed before
Opacus clips, so each person's whole contribution is clipped to `clip_norm`: the same subsampled
Gaussian event as the record-level case, with the person as the unit.

Why `expected_batch_size` is not the number of examples: Opacus divides the noisy sum by it for
`loss_reduction="mean"`, and the number of examples is private. We use `loss_reduction="sum"`
(expected batch size 1, a public constant): Adam's update m / (sqrt(v) + eps) is invariant to a
constant rescaling of the gradient (up to eps), so averaging would change nothing anyway.

Everything random is seeded from `settings.seed` and the step index (sampling, noise, LoRA
dropout), so a run resumed from a checkpoint with the same seed takes exactly the steps the
uninterrupted run would have; resumed with a fresh secret seed (the data holder's default), the
remaining steps get fresh randomness, and steps after the last checkpoint are redone: a caller
that shows each step's output saves every step (`checkpoint_every=1`), as the data holder does. A checkpoint
holds only DP-trained state (adapter, Adam's moments, the step) and a hash of
the settings: never texts, per-example gradients or the number of examples. Nothing about the
data is logged; `on_step` receives only the norm of the *noisy* gradient (post-processing of
the release).
"""

from __future__ import annotations

import hashlib
import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from pydantic import BaseModel, ConfigDict, Field

from dpsynth.errors import DpsynthError
from dpsynth.finetune.examples import encode_examples, sequence_losses
from dpsynth.finetune.model import (
    adapter_vector,
    load_adapter_vector,
    trainable_parameters,
)
from dpsynth.fs import atomic_write_bytes

CHECKPOINT_FILE = "dp_adam.pt"
_SAMPLING, _NOISE, _DROPOUT = 0, 1, 2  # independent random streams per step


class TrainSettings(BaseModel):
    """The DP training schedule; all public (the privacy accountant sees the same numbers).

    `seed` drives the Poisson sampling and the noise: it must stay secret (not in a published
    config) when the guarantee matters, since whoever knows it can regenerate the noise.
    `noise_multiplier=0` trains without privacy, for references and tests only.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(ge=1)
    sampling_rate: float = Field(gt=0.0, le=1.0)
    noise_multiplier: float = Field(ge=0.0)
    clip_norm: float = Field(gt=0.0)
    learning_rate: float = Field(gt=0.0)
    max_length: int = Field(ge=2)
    seed: int = Field(ge=0)
    checkpoint_every: int = Field(default=10, ge=1)

    def fingerprint(self) -> str:
        """Hash of the training schedule a checkpoint belongs to. Neither how often it is saved nor the
        seed is in it: the seed is secret (no artifact may depend on it), and a data holder that draws a
        fresh secret seed when it resumes continues the same schedule with fresh randomness, which is
        as private (the remaining steps are still independent Poisson samples with fresh noise)."""
        payload = self.model_dump_json(exclude={"checkpoint_every", "seed"})
        return hashlib.sha256(payload.encode()).hexdigest()


def poisson_batch(n: int, sampling_rate: float, seed: int, step: int) -> np.ndarray:
    """Indices of the examples in step `step`'s batch: each joins independently with probability `sampling_rate`."""
    return np.flatnonzero(step_stream(seed, step, _SAMPLING).random(n) < sampling_rate)


def step_stream(seed: int, step: int, stream: int) -> np.random.Generator:
    """One step's secret stream (its batch, its noise): PCG64DXSM under a SeedSequence whose pool keeps all 256
    bits of the training's seed (numpy's default pool keeps 128)."""
    return np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence([seed, step, stream], pool_size=8)))


def train_adapter(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: list[str],
    texts: list[str],
    settings: TrainSettings,
    *,
    checkpoint_dir: Path | None,
    on_step: Callable[[int, float], None] | None = None,
    groups: np.ndarray | None = None,
    device: str = "cpu",
) -> np.ndarray:
    """Train the model's LoRA adapter in place with DP-Adam; returns the trained adapter vector.

    Resumes from `checkpoint_dir` when it holds a checkpoint of the same settings, and refuses
    one of other settings. `on_step(step, noisy_grad_norm)` is called after each step (1-based,
    after that step's checkpoint, if it is a checkpoint step, is written). `groups`: each example's unit of
    privacy as 0..U-1 (a person with several examples); None: every example is its own unit. The model is
    returned to its own train/eval mode and free of Opacus hooks, even when a step fails. `device` ('cpu' or
    'cuda'): where the model, the examples and the per-example gradients live; the model is moved there and
    stays. The batches and the noise are drawn on the CPU (numpy streams under the secret seed),
    so a seeded run draws the same on every device; LoRA dropout uses the device's own generator.
    """
    if len(prompts) != len(texts):
        raise ValueError("prompts and texts differ in length")
    units = np.arange(len(prompts)) if groups is None else np.asarray(groups, dtype=np.int64)
    if len(units) != len(prompts):
        raise ValueError("groups must give one unit per example")
    model.to(device)
    params = [p for _, p in trainable_parameters(model)]
    if not params:
        raise DpsynthError("the model has no trainable parameters: add a LoRA adapter first")
    adam = torch.optim.Adam(params, lr=settings.learning_rate)
    checkpoint = Path(checkpoint_dir) / CHECKPOINT_FILE if checkpoint_dir is not None else None
    unit = "record" if groups is None else "person"  # what the Poisson draw and the clipping are over
    start = _restore(checkpoint, settings, unit, model, adam) if checkpoint is not None and checkpoint.exists() else 0
    if start >= settings.steps:
        return adapter_vector(model)

    encoded = encode_examples(tokenizer, prompts, texts, settings.max_length, device)
    was_training = model.training
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
    optimizer = Float64NoiseOptimizer(
        adam,
        noise_multiplier=settings.noise_multiplier,
        max_grad_norm=settings.clip_norm,
        expected_batch_size=1,
        loss_reduction="sum",
    )
    gsm.train()
    try:
        for step in range(start, settings.steps):
            sampled = poisson_batch(int(units.max()) + 1 if len(units) else 0, settings.sampling_rate,
                                    settings.seed, step)
            batch = np.flatnonzero(np.isin(units, sampled))
            optimizer.noise = step_stream(settings.seed, step, _NOISE)
            with torch.random.fork_rng(devices=_cuda_index(device)):  # the secret seed leaves no RNG seeded
                torch.manual_seed(int(step_stream(settings.seed, step, _DROPOUT).integers(2**63)))
                grad_norm = _dp_step(gsm, optimizer, params, encoded, batch, units[batch])
            done = step + 1
            if checkpoint is not None and (done % settings.checkpoint_every == 0 or done == settings.steps):
                _save(checkpoint, settings, unit, model, adam, done)
            if on_step is not None:
                on_step(done, grad_norm)
    finally:
        _unwrap(gsm, optimizer)
        model.train(was_training)
    return adapter_vector(model)


class Float64NoiseOptimizer(DPOptimizer):
    """Opacus' DPOptimizer with the noise drawn in float64 from `noise` (a numpy stream under the step's secret
    seed) rather than torch's float32 generator: each coordinate gets the sum of 4 standard normal draws times
    sigma / 2 (N(0, sigma^2), the same distribution and accounting; Holohan and Braghin 2021, sec. 5.1), added
    to the clipped sum in float64 and rounded to the parameter's dtype afterwards. Opacus' own `secure_mode`
    draws its 4 in the parameters' float32, where the attack's cost is far lower, from torch's generator (a
    64-bit seed at most). Why not OpenDP's exact sampler: privacy/mechanisms.py (DP-SGD's noise)."""

    noise: np.random.Generator | None = None

    def add_noise(self) -> None:
        if self.noise is None:
            raise RuntimeError("Float64NoiseOptimizer.noise must be set to the step's stream before the step")
        sigma = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            if sigma == 0:  # training without privacy (references, tests): nothing to draw
                p.grad = p.summed_grad.view_as(p)
            else:
                clean = p.summed_grad.detach().to(torch.float64)
                draws = self.noise.standard_normal((4, *clean.shape))
                noise = torch.from_numpy(draws.sum(axis=0) * (sigma / 2.0)).to(clean.device)
                p.grad = (clean + noise).to(p.summed_grad.dtype).view_as(p)
            _mark_as_processed(p.summed_grad)
        self.noise = None  # each step sets its own stream: a step that did not is refused, never given the last


def _dp_step(
    gsm: GradSampleModule,
    optimizer: DPOptimizer,
    params: list[torch.nn.Parameter],
    encoded: tuple[torch.Tensor, ...],
    batch: np.ndarray,
    batch_units: np.ndarray,
) -> float:
    """One clipped, noised Adam step on `batch`, clipped per unit; returns the norm of the noisy gradient sum."""
    optimizer.zero_grad()
    if len(batch) == 0:
        # No forward pass, so no hook sets per-example gradients: an empty set of them lets
        # Opacus clip nothing, add the noise to a zero sum and step.
        for p in params:
            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)  # type: ignore[attr-defined]  # Opacus' field
    else:
        index = torch.from_numpy(batch).to(encoded[0].device)
        input_ids, attention_mask, loss_mask = (t[index] for t in encoded)
        width = int(attention_mask.sum(dim=1).max())  # right padding: trim to this batch's longest
        losses = sequence_losses(gsm, input_ids[:, :width], attention_mask[:, :width], loss_mask[:, :width])
        with warnings.catch_warnings():
            # Expected: the first layer's LoRA input (frozen embeddings) needs no gradient, and
            # Opacus' full backward hook only needs the gradient of the module's output.
            warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
            losses.sum().backward()
        sum_per_unit(params, batch_units)
    optimizer.step()
    with torch.no_grad():
        return float(torch.sqrt(torch.stack([p.grad.pow(2).sum() for p in params if p.grad is not None]).sum()))


def sum_per_unit(params: list[torch.nn.Parameter], units: np.ndarray) -> None:
    """Replace the per-example gradients by per-unit sums (rows of one person added), so that Opacus clips a
    person's whole contribution; a no-op when every example is its own unit."""
    _, row_unit = np.unique(units, return_inverse=True)
    if len(row_unit) == len(np.unique(row_unit)):
        return
    count = int(row_unit.max()) + 1
    for p in params:
        per_example = p.grad_sample  # type: ignore[attr-defined]  # Opacus' per-example gradients
        index = torch.from_numpy(row_unit.astype(np.int64)).to(per_example.device)
        summed = torch.zeros((count, *per_example.shape[1:]), dtype=per_example.dtype,
                             device=per_example.device).index_add_(0, index, per_example)
        p.grad_sample = summed  # type: ignore[attr-defined]


def _unwrap(gsm: GradSampleModule, optimizer: DPOptimizer) -> None:
    """Remove Opacus' hooks and every un-noised quantity it attached to the model.

    The clipped gradient sum (`summed_grad`) and, after a failed step, stored activations are
    functions of private examples without noise: they must not outlive training on the model.
    """
    optimizer.zero_grad(set_to_none=True)
    for module in gsm.to_standard_module().modules():
        if hasattr(module, "activations"):
            del module.activations


def _cuda_index(device: str) -> list[int]:
    """The CUDA device `fork_rng` must also save and restore (torch.manual_seed seeds it too); none on a CPU."""
    d = torch.device(device)
    return [d.index if d.index is not None else torch.cuda.current_device()] if d.type == "cuda" else []


def _save(path: Path, settings: TrainSettings, unit: str, model: torch.nn.Module, adam: torch.optim.Optimizer,
          step: int) -> None:
    """One file, written atomically: DP-trained state only (adapter, Adam's moments, step), the settings hash and
    the unit the steps so far were sampled and clipped over ('record' or 'person')."""
    state = {
        "settings": settings.fingerprint(),
        "unit": unit,
        "step": step,
        "adapter": torch.from_numpy(adapter_vector(model)),
        "adam": adam.state_dict(),
    }
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def _restore(path: Path, settings: TrainSettings, unit: str, model: torch.nn.Module,
             adam: torch.optim.Optimizer) -> int:
    """Load a checkpoint of these settings and this unit into the model and Adam; returns the number of steps it
    holds. A checkpoint written before the unit was saved has none to compare: its settings decide."""
    try:
        # on the CPU whatever device wrote it: Adam's load_state_dict moves its moments to the parameters' device,
        # so a run trained on a GPU resumes on a CPU (and back) without redoing a shown step
        state = torch.load(path, weights_only=True, map_location="cpu")
    except (OSError, RuntimeError) as err:
        raise DpsynthError(f"cannot read training checkpoint {path}: {str(err).splitlines()[0]}") from err
    if state.get("settings") != settings.fingerprint():
        raise DpsynthError(  # never "remove it": its steps were shown (their noisy norms) and charged once; a
            # fresh start in the same run would take them again, uncharged
            f"training checkpoint {path} was written with other training settings (steps, sampling rate, noise, "
            "clip norm, learning rate, max_length, or a dpsynth version that trains differently); resume with the "
            "settings it was written with, or start a new run (its steps were already released)"
        )
    if state.get("unit", unit) != unit:
        raise DpsynthError(
            f"training checkpoint {path} was trained with each {state['unit']} as the unit of privacy, this run "
            f"trains per {unit}; the steps already taken would not carry this run's guarantee: start a new run"
        )
    load_adapter_vector(model, state["adapter"].numpy())
    adam.load_state_dict(state["adam"])
    return int(state["step"])
