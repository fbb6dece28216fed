"""Cost of a DP-Adam step (per-example gradients, clipping, noise) vs a plain Adam step, on SmolLM2 + LoRA.

    .venv/bin/python benchmarks/dp_step_cost.py                  # 16 examples x 48 tokens, 5 steps each
    .venv/bin/python benchmarks/dp_step_cost.py --steps 3 --threads 1

Both train the same LoRA adapter (r=8 on q/k/v/o) from the same start on the same fixed batch of
real Rotten Tomatoes reviews (every example in every step: sampling rate 1) with the same
per-sequence loss; the first step of each is a warm-up and not timed. Prints seconds per step,
their ratio and the process's peak RSS after each phase. On a machine shared with other work,
`--threads 1` avoids torch's threads spinning against other processes (2 threads there can be 20x slower).
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import torch

from dpsynth.data.corpora import get_corpus
from dpsynth.finetune.dp_adam import TrainSettings, train_adapter
from dpsynth.finetune.examples import control_prompt, encode_examples, sequence_losses
from dpsynth.finetune.model import (
    adapter_vector,
    add_lora,
    load_adapter_vector,
    load_base,
)
from dpsynth.llm.local_models import resolve_local_model


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def batch_texts(tokenizer, count: int, tokens: int) -> list[str]:
    """`count` texts of at least `tokens` tokens each, made of consecutive real reviews."""
    reviews = iter(get_corpus("rotten_tomatoes").load().texts)
    texts = []
    for _ in range(count):
        text = next(reviews)
        while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < tokens:
            text += " " + next(reviews)
        texts.append(text)
    return texts


def plain_adam_seconds(model, encoded, steps: int, lr: float) -> list[float]:
    """Non-private reference: Adam on the summed per-sequence losses of the whole batch."""
    params = [p for p in model.parameters() if p.requires_grad]
    adam = torch.optim.Adam(params, lr=lr)
    model.train()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        adam.zero_grad()
        sequence_losses(model, *encoded).sum().backward()
        adam.step()
        times.append(time.perf_counter() - start)
    model.eval()
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5, help="timed steps + 1 warm-up, per optimizer")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48, help="sequence length (prompt + text), all full")
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    path, _ = resolve_local_model("smollm2-135m-instruct")
    start = time.perf_counter()
    model, tokenizer = load_base(path)
    torch.manual_seed(0)
    model = add_lora(model, r=args.r, alpha=2 * args.r)
    init = adapter_vector(model)
    print(f"SmolLM2-135M + LoRA r={args.r} ({init.size:,} trainable) loaded in {time.perf_counter() - start:.1f} s; "
          f"peak RSS {peak_rss_mib():,.0f} MiB; torch threads {torch.get_num_threads()}")

    prompt = control_prompt("movie review", "review", "a film critic's short review")
    texts = batch_texts(tokenizer, args.batch, args.tokens)
    prompts = [prompt] * args.batch
    encoded = encode_examples(tokenizer, prompts, texts, args.tokens)
    assert encoded[1].sum() == args.batch * args.tokens  # every sequence is full length
    lr = 1e-3

    plain = plain_adam_seconds(model, encoded, args.steps + 1, lr)[1:]
    rss_plain = peak_rss_mib()

    load_adapter_vector(model, init)
    settings = TrainSettings(steps=args.steps + 1, sampling_rate=1.0, noise_multiplier=1.0, clip_norm=1.0,
                             learning_rate=lr, max_length=args.tokens, seed=0)
    stamps = [time.perf_counter()]
    train_adapter(model, tokenizer, prompts, texts, settings, checkpoint_dir=None,
                  on_step=lambda _step, _norm: stamps.append(time.perf_counter()))
    dp = np.diff(stamps)[1:].tolist()
    rss_dp = peak_rss_mib()

    t_plain, t_dp = float(np.mean(plain)), float(np.mean(dp))
    print(f"batch {args.batch} x {args.tokens} tokens, {args.steps} timed steps each")
    print(f"  Adam    (non-private): {t_plain:6.2f} s/step   peak RSS {rss_plain:,.0f} MiB")
    print(f"  DP-Adam (Opacus)     : {t_dp:6.2f} s/step   peak RSS {rss_dp:,.0f} MiB")
    print(f"  DP / non-DP time ratio {t_dp / t_plain:.2f}x")


if __name__ == "__main__":
    main()
