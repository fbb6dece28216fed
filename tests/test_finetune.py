"""DP fine-tuning of a LoRA adapter on the real SmolLM2 GGUF: sequences and masks, Poisson sampling, clipping,
noise on empty batches, resume, what checkpoints hold, and generation from the adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpsynth.errors import DpsynthError
from dpsynth.finetune.dp_adam import (
    CHECKPOINT_FILE,
    TrainSettings,
    poisson_batch,
    train_adapter,
)
from dpsynth.finetune.examples import control_prompt, encode_examples, sequence_losses
from dpsynth.finetune.generator import AdapterGenerator
from dpsynth.finetune.model import (
    adapter_hash,
    adapter_vector,
    add_lora,
    load_adapter_vector,
    load_base,
)
from dpsynth.llm.base import GenerationRequest
from dpsynth.llm.local_models import resolve_local_model
from dpsynth.llm.model_files import file_fingerprint

PROMPT = control_prompt("movie review", "positive", "a review that praises the film")
TEXTS = [
    "A warm, funny film with a great cast.",
    "Beautifully shot and surprisingly moving.",
    "The best thriller of the year.",
    "Smart writing and a brilliant lead performance.",
    "I laughed from start to finish.",
    "A gentle, charming story for all ages.",
    "Bold, fresh and full of heart.",
    "The music alone is worth the ticket.",
]


def settings(**overrides: Any) -> TrainSettings:
    base = {"steps": 2, "sampling_rate": 0.5, "noise_multiplier": 1.0, "clip_norm": 1.0, "learning_rate": 1e-3,
            "max_length": 32, "seed": 7, "checkpoint_every": 10}
    return TrainSettings(**{**base, **overrides})


@pytest.fixture(scope="module")
def gguf() -> Path:
    return resolve_local_model("smollm2-135m-instruct")[0]


@pytest.fixture(scope="module")
def base(gguf: Path) -> tuple[Any, Any, np.ndarray]:
    """(LoRA model, tokenizer, initial adapter), loaded once; tests reset the adapter with `fresh`."""
    torch.manual_seed(0)
    model, tokenizer = load_base(gguf)
    model = add_lora(model, r=4, alpha=8)
    return model, tokenizer, adapter_vector(model)


@pytest.fixture
def fresh(base: tuple[Any, Any, np.ndarray]) -> tuple[Any, Any, np.ndarray]:
    model, _, init = base
    load_adapter_vector(model, init)
    return base


def test_poisson_batches_vary_and_average_q_n() -> None:
    n, q, steps = 200, 0.1, 500
    sizes = np.array([len(poisson_batch(n, q, seed=3, step=t)) for t in range(steps)])
    assert len(set(sizes.tolist())) > 5  # variable, not a fixed batch size
    assert abs(sizes.mean() - q * n) < 1.0  # std of the mean is ~0.19
    members = np.concatenate([poisson_batch(n, q, seed=3, step=t) for t in range(steps)])
    assert abs(np.bincount(members, minlength=n).mean() / steps - q) < 0.01
    assert np.array_equal(poisson_batch(n, q, 3, 17), poisson_batch(n, q, 3, 17))  # resume replays it
    assert not np.array_equal(poisson_batch(n, q, 3, 17), poisson_batch(n, q, 3, 18))
    assert len(poisson_batch(8, 1e-9, 7, 0)) == 0 and len(poisson_batch(8, 1.0, 7, 0)) == 8


def test_settings_validate_and_fingerprint_ignores_checkpoint_frequency_and_the_secret_seed() -> None:
    with pytest.raises(ValueError):
        settings(sampling_rate=0.0)
    with pytest.raises(ValueError):
        settings(noise_multiplier=-1.0)
    assert settings(checkpoint_every=1).fingerprint() == settings(checkpoint_every=5).fingerprint()
    assert settings(seed=1).fingerprint() == settings(seed=2).fingerprint(), \
        "a resumed holder draws a fresh secret seed and continues the same schedule; no artifact depends on it"
    assert settings(steps=3).fingerprint() != settings(steps=4).fingerprint()


def test_missing_model_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(DpsynthError, match="does not exist"):
        load_base(tmp_path / "nope.gguf")


@pytest.mark.slow
def test_loss_only_on_text_and_final_eos(fresh: tuple[Any, Any, np.ndarray]) -> None:
    _, tok, _ = fresh
    texts = ["Great.", "A long and winding review of a film that goes on and on."]
    ids, attn, loss = encode_examples(tok, [PROMPT, PROMPT], texts, max_length=64)
    n_prompt = len(tok(PROMPT)["input_ids"])
    assert ids.shape == attn.shape == loss.shape and ids.shape[0] == 2
    for i, text in enumerate(texts):
        assert loss[i, :n_prompt].sum() == 0  # no loss on the control prompt
        learned = ids[i][loss[i] == 1]
        assert learned[-1] == tok.eos_token_id  # the end of the text is learned
        assert tok.decode(learned[:-1]) == text  # exactly the text's tokens
        assert tok.decode(ids[i][:n_prompt]) == PROMPT
    short = int(attn[0].sum())
    assert short < ids.shape[1]
    assert (attn[0, short:] == 0).all() and (loss[0, short:] == 0).all()  # padding is never learned
    assert (ids[0, short:] == tok.pad_token_id).all() and tok.pad_token_id == tok.eos_token_id  # hence the masks

    ids, attn, loss = encode_examples(tok, [PROMPT], [texts[1]], max_length=n_prompt + 4)
    assert ids.shape[1] == n_prompt + 4 and loss[0].sum() == 4  # truncated text: its first 4 tokens
    assert encode_examples(tok, [], [], 32)[0].shape == (0, 0)


@pytest.mark.slow
def test_adapter_vector_round_trips_in_sorted_name_order(fresh: tuple[Any, Any, np.ndarray]) -> None:
    model, _, init = fresh
    assert init.dtype == np.float32 and len(init) == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    shifted = init + np.arange(len(init), dtype=np.float32)
    load_adapter_vector(model, shifted)
    assert np.array_equal(adapter_vector(model), shifted) and adapter_hash(shifted) != adapter_hash(init)
    first = min(n for n, p in model.named_parameters() if p.requires_grad)
    assert float(dict(model.named_parameters())[first].detach().reshape(-1)[1]) == shifted[1]
    with pytest.raises(DpsynthError, match="another rank"):
        load_adapter_vector(model, init[:-1])


@pytest.mark.slow
def test_each_example_contributes_at_most_the_clip_norm(fresh: tuple[Any, Any, np.ndarray]) -> None:
    model, tok, init = fresh
    ids, attn, loss = encode_examples(tok, [PROMPT], [TEXTS[0]], max_length=32)
    sequence_losses(model, ids, attn, loss).sum().backward()
    raw = float(torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters() if p.requires_grad)))
    model.zero_grad(set_to_none=True)
    clip = 1e-3
    assert raw > 100 * clip  # so clipping binds

    norms: list[float] = []
    cfg = settings(steps=1, sampling_rate=1.0, noise_multiplier=0.0, clip_norm=clip)
    # Four copies of one example: aligned gradients, each clipped to exactly `clip`.
    train_adapter(model, tok, [PROMPT] * 4, [TEXTS[0]] * 4, cfg, checkpoint_dir=None,
                  on_step=lambda _, g: norms.append(g))
    assert norms[0] == pytest.approx(4 * clip, rel=1e-3)
    # A batch with one example of huge loss: it still moves the sum by at most `clip`.
    load_adapter_vector(model, init)
    gibberish = "zxq vlorp " * 6
    train_adapter(model, tok, [PROMPT] * 4, [TEXTS[0]] * 3 + [gibberish], cfg, checkpoint_dir=None,
                  on_step=lambda _, g: norms.append(g))
    assert norms[1] <= 4 * clip * (1 + 1e-4)
    assert not hasattr(model, "autograd_grad_sample_hooks")  # Opacus is gone from the model
    assert all(getattr(p, "summed_grad", None) is None for p in model.parameters())


def test_a_persons_examples_are_clipped_together(fresh: tuple[Any, Any, np.ndarray]) -> None:
    """Person-level DP-SGD (issue 36): the gradients of one person's examples are summed before clipping, so
    four aligned examples of one person move the sum by one clip norm, not four; two persons by two."""
    model, tok, init = fresh
    clip = 1e-3
    cfg = settings(steps=1, sampling_rate=1.0, noise_multiplier=0.0, clip_norm=clip)
    norms: list[float] = []
    for groups in ([0, 0, 0, 0], [0, 0, 1, 1]):
        load_adapter_vector(model, init)
        train_adapter(model, tok, [PROMPT] * 4, [TEXTS[0]] * 4, cfg, checkpoint_dir=None,
                      on_step=lambda _, g: norms.append(g), groups=np.array(groups))
    assert norms == pytest.approx([clip, 2 * clip], rel=1e-3)
    with pytest.raises(ValueError, match="one unit per example"):
        train_adapter(model, tok, [PROMPT] * 4, [TEXTS[0]] * 4, cfg, checkpoint_dir=None, groups=np.array([0]))


def test_per_example_gradients_are_summed_per_person() -> None:
    """What Opacus clips after `sum_per_unit`: one row per person, the sum of that person's rows."""
    from dpsynth.finetune.dp_adam import sum_per_unit

    units = np.array([0, 0, 1, 2, 2, 2])
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad_sample = torch.tensor([[1.0, 0], [2, 0], [0, 1], [1, 1], [1, 1], [1, 1]])
    sum_per_unit([p], units)
    assert torch.equal(p.grad_sample, torch.tensor([[3.0, 0], [0, 1], [3, 3]]))


@pytest.mark.slow
def test_empty_batches_still_add_noise(fresh: tuple[Any, Any, np.ndarray]) -> None:
    model, tok, init = fresh
    cfg = settings(steps=1, sampling_rate=1e-9, noise_multiplier=1.0)
    assert len(poisson_batch(len(TEXTS), cfg.sampling_rate, cfg.seed, 0)) == 0
    noisy = train_adapter(model, tok, [PROMPT] * 8, TEXTS, cfg, checkpoint_dir=None)
    # Adam's first step on pure noise moves every coordinate by about the learning rate.
    moved = np.abs(noisy - init)
    assert np.quantile(moved, 0.01) > 0.9 * cfg.learning_rate and moved.max() < 1.01 * cfg.learning_rate

    load_adapter_vector(model, init)
    silent = settings(steps=1, sampling_rate=1e-9, noise_multiplier=0.0)
    assert np.array_equal(train_adapter(model, tok, [PROMPT] * 8, TEXTS, silent, checkpoint_dir=None), init)


def test_dp_sgd_noise_is_the_float64_sum_of_four_draws_from_the_steps_stream() -> None:
    """Each coordinate's noise is sigma/2 times the sum of 4 standard normals drawn in float64 from the step's
    stream (the floating-point defence at float64, not the parameters' float32), added to the float64 clipped
    sum and only then rounded; a step without its stream is refused rather than drawn from elsewhere."""
    from opacus import GradSampleModule

    from dpsynth.finetune.dp_adam import Float64NoiseOptimizer, step_stream

    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    gsm = GradSampleModule(layer, batch_first=True, loss_reduction="sum")
    optimizer = Float64NoiseOptimizer(torch.optim.SGD(layer.parameters(), lr=0.0), noise_multiplier=1.5,
                                      max_grad_norm=0.7, expected_batch_size=1, loss_reduction="sum")
    gsm(torch.randn(4, 3)).sum().backward()
    with pytest.raises(RuntimeError, match="stream"):
        optimizer.step()
    optimizer.zero_grad()
    gsm(torch.randn(4, 3)).sum().backward()

    def stream() -> np.random.Generator:
        return step_stream(2**200 + 11, 0, 1)

    optimizer.noise = stream()
    optimizer.step()
    assert optimizer.noise is None  # the next step must set its own
    rebuilt = stream()
    for p in optimizer.params:
        expected = p.summed_grad.to(torch.float64) + torch.from_numpy(
            rebuilt.standard_normal((4, *p.shape)).sum(axis=0) * (1.5 * 0.7 / 2))
        assert torch.equal(p.grad, expected.to(torch.float32))


def test_dp_sgd_noise_has_the_accounted_scale() -> None:
    """sigma/2 times a sum of 4 standard normals is N(0, sigma^2): what the accountant assumed."""
    from dpsynth.finetune.dp_adam import Float64NoiseOptimizer

    weight = torch.nn.Parameter(torch.zeros(200_000))
    optimizer = Float64NoiseOptimizer(torch.optim.SGD([weight], lr=0.0), noise_multiplier=2.0, max_grad_norm=0.5,
                                      expected_batch_size=1, loss_reduction="sum")
    weight.summed_grad = torch.zeros(200_000)
    optimizer.noise = np.random.Generator(np.random.PCG64DXSM(5))
    optimizer.add_noise()
    assert abs(float(weight.grad.std()) - 1) < 0.01 and abs(float(weight.grad.mean())) < 0.01


class Interrupted(Exception):
    pass


@pytest.mark.slow
def test_resume_reproduces_an_uninterrupted_run(fresh: tuple[Any, Any, np.ndarray], tmp_path: Path) -> None:
    model, tok, init = fresh
    cfg = settings(steps=4, checkpoint_every=2)
    prompts = [PROMPT] * len(TEXTS)
    whole = train_adapter(model, tok, prompts, TEXTS, cfg, checkpoint_dir=tmp_path / "whole")

    def crash_at_3(step: int, _: float) -> None:
        if step == 3:
            raise Interrupted

    load_adapter_vector(model, init)
    with pytest.raises(Interrupted):
        train_adapter(model, tok, prompts, TEXTS, cfg, checkpoint_dir=tmp_path / "cut", on_step=crash_at_3)
    assert torch.load(tmp_path / "cut" / CHECKPOINT_FILE, weights_only=True)["step"] == 2

    load_adapter_vector(model, np.zeros_like(init))  # only the checkpoint can bring back the trained state
    steps: list[int] = []
    resumed = train_adapter(model, tok, prompts, TEXTS, cfg, checkpoint_dir=tmp_path / "cut",
                            on_step=lambda s, _: steps.append(s))
    assert steps == [3, 4]
    assert np.array_equal(resumed, whole)
    assert not np.array_equal(whole, init)


@pytest.mark.slow
def test_checkpoint_holds_only_dp_trained_state(fresh: tuple[Any, Any, np.ndarray], tmp_path: Path) -> None:
    model, tok, _ = fresh
    texts = [f"Quintessaurus review {i}: the zebrafinch scene was perfect." for i in range(13)]
    cfg = settings(steps=2, checkpoint_every=1)
    trained = train_adapter(model, tok, [PROMPT] * 13, texts, cfg, checkpoint_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_FILE]  # no stray temporary files
    raw = (tmp_path / CHECKPOINT_FILE).read_bytes()
    for word in ("Quintessaurus", "zebrafinch", "review", "perfect"):
        assert word.encode() not in raw and word.encode("utf-16-le") not in raw

    state = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    assert set(state) == {"settings", "unit", "step", "adapter", "adam"}
    assert state["step"] == 2 and state["settings"] == cfg.fingerprint() and state["unit"] == "record"
    assert np.array_equal(state["adapter"].numpy(), trained)
    assert {k for s in state["adam"]["state"].values() for k in s} == {"step", "exp_avg", "exp_avg_sq"}
    shapes = {tuple(t.shape) for s in state["adam"]["state"].values() for t in s.values()}
    assert all(13 not in shape for shape in shapes)  # no per-example tensors
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state["adam"]["param_groups"]]
    scalars = [state["step"], *_leaves(groups), *(float(s["step"]) for s in state["adam"]["state"].values())]
    assert 13 not in scalars  # the number of examples is nowhere

    with pytest.raises(DpsynthError, match="other training settings"):
        train_adapter(model, tok, [PROMPT] * 13, texts, settings(steps=3), checkpoint_dir=tmp_path)
    # steps sampled and clipped per record do not go on as person-level training (nor the other way round)
    with pytest.raises(DpsynthError, match="each record as the unit of privacy"):
        train_adapter(model, tok, [PROMPT] * 13, texts, cfg, checkpoint_dir=tmp_path, groups=np.arange(13) // 2)


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [leaf for key, value in obj.items() for leaf in [key, *_leaves(value)]]
    if isinstance(obj, (list, tuple)):
        return [leaf for value in obj for leaf in _leaves(value)]
    return [obj]


@pytest.mark.slow
def test_adapter_generator_names_its_adapter_and_writes(gguf: Path, base: tuple[Any, Any, np.ndarray]) -> None:
    _, _, init = base
    other = init + np.float32(0.01)
    gen = AdapterGenerator(gguf, init, r=4, alpha=8)
    assert not gen.chat
    assert gen.model_id.startswith(f"dpft:{gguf.name}:{file_fingerprint(gguf)}:{adapter_hash(init)}")
    assert AdapterGenerator(gguf, other, r=4, alpha=8).model_id != gen.model_id
    requests = [GenerationRequest(prompt=PROMPT, max_tokens=12, seed=s) for s in range(2)]
    results = gen.generate(requests)
    assert all(r.text.strip() and r.completion_tokens > 0 for r in results)
