"""Local generation against the machine's limits, and what sharing a prompt between samples buys.

    .venv/bin/python benchmarks/generation_limits.py [--requests 32] [--models smollm2-135m-instruct gemma3-270m]

In one process, on the same loaded weights, for each local model:
1. the machine's limits: memory bandwidth (a large numpy copy, read + write) and float32 matmul
   peak (numpy BLAS on this process's threads); batch-1 decoding reads every weight once per token,
   so it cannot beat bandwidth / weight bytes; prompt processing is arithmetic-bound, so it cannot
   beat peak / (2 x parameters outside the token embedding) tokens/s (no output head for prompt
   tokens; llama.cpp's quantised integer kernels may exceed the float32 peak; the ratio says how
   close the engine already is);
2. the two phases of generation measured apart: prompt processing (distinct prompts, one token
   each) and decoding (one short prompt, long continuations), each as tokens/s and as a share of
   its limit;
3. a WASP iteration's requests at the demo's settings (max_tokens 60): half zero-shot (one prompt
   per label, a seed per request), half contrastive prompts with S=4 examples the model itself
   wrote, first with one sample per contrastive prompt (WASP's default), then with four samples
   per prompt (`wasp.samples_per_prompt: 4`): llama.cpp reuses the cached prompt for the requests
   that repeat it, so the prompt is processed once for four samples. Prints completion tokens/s,
   the prompt tokens actually processed, and the ratios (rate and wall) against one sample per prompt.
Absolute times on shared machines are noise; the ratios within one run are the result.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from machine_limits import matmul_peak, memory_bandwidth

from dpsynth.data.corpora import get_corpus
from dpsynth.llm.base import GenerationRequest
from dpsynth.llm.llama_cpp_backend import LlamaCppGenerator, available_cores
from dpsynth.llm.local_models import resolve_local_model
from dpsynth.prompts.builder import PromptSettings, build_request


def wasp_mix(gen: LlamaCppGenerator, count: int, samples_per_prompt: int) -> list[GenerationRequest]:
    """Half zero-shot, half contrastive prompts whose examples the model wrote in the zero-shot half;
    `samples_per_prompt` consecutive contrastive requests share their examples, as WASP's option does."""
    task = get_corpus("rotten_tomatoes").task
    settings = PromptSettings(max_tokens=60)
    labels = task.label_names
    zero = [build_request(task, labels[i % len(labels)], chat=gen.chat, settings=settings, seed=i)
            for i in range(count // 2)]
    written = [r.text.strip() or "an empty review" for r in gen.generate(zero)]
    rng = np.random.default_rng(0)
    few: list[GenerationRequest] = []
    pick = rng.choice(len(written), size=4, replace=False)
    for i in range(count - len(zero)):
        if i % samples_per_prompt == 0:
            pick = rng.choice(len(written), size=4, replace=False)
        label = labels[(i // samples_per_prompt) % len(labels)]
        few.append(build_request(task, label, chat=gen.chat, good=[written[j] for j in pick[:2]],
                                 bad=[written[j] for j in pick[2:]], settings=settings, seed=1000 + i))
    return zero + few


def phase_rates(gen: LlamaCppGenerator, prompts: list[GenerationRequest]) -> tuple[float, float]:
    """(prompt tokens/s, decoded tokens/s) measured apart."""
    distinct = [GenerationRequest(prompt=r.prompt, messages=r.messages, max_tokens=1, seed=r.seed) for r in prompts]
    start = time.perf_counter()
    pp = sum(r.prompt_tokens for r in gen.generate(distinct))
    pp_rate = pp / (time.perf_counter() - start)
    long = [GenerationRequest(prompt=prompts[0].prompt, messages=prompts[0].messages, max_tokens=120, seed=s)
            for s in range(4)]
    start = time.perf_counter()
    tg = sum(r.completion_tokens for r in gen.generate(long))
    return pp_rate, tg / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    args = parser.parse_args()
    threads = available_cores()
    bandwidth, peak = memory_bandwidth(), matmul_peak()
    print(f"machine: {threads} core(s); memory bandwidth {bandwidth / 1e9:.1f} GB/s; float32 matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s (numpy; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})")
    for model in args.models:
        path, chat = resolve_local_model(model)
        gen = LlamaCppGenerator(path, chat=chat, n_threads=threads)
        model_info = gen._llm._model
        params, weight_bytes = model_info.n_params(), path.stat().st_size
        # Prompt tokens go through every layer but not the output head (logits only for the last one):
        # the token-embedding matrix (tied to the head in both local models) adds no arithmetic there.
        dense = params - model_info.n_vocab() * model_info.n_embd()
        one = wasp_mix(gen, args.requests, 1)
        four = wasp_mix(gen, args.requests, 4)
        print(f"\n{model}: {params / 1e6:.0f}M parameters, {weight_bytes / 2**20:.0f} MiB of weights")
        pp_rate, tg_rate = phase_rates(gen, one[len(one) // 2:])
        pp_limit, tg_limit = peak / (2 * dense), bandwidth / weight_bytes
        print(f"  prompt processing {pp_rate:6.1f} tokens/s = {pp_rate / pp_limit:4.2f} x its limit "
              f"({pp_limit:.0f} tokens/s, matmul peak / 2 x {dense / 1e6:.0f}M parameters outside the embedding)")
        print(f"  decoding          {tg_rate:6.1f} tokens/s = {tg_rate / tg_limit:4.2f} x its limit "
              f"({tg_limit:.0f} tokens/s, bandwidth / weight bytes)")
        base_rate = base_wall = None
        for label, requests in (("1 sample per prompt ", one), ("4 samples per prompt", four)):
            gen._llm.reset()  # no prompt left in the KV cache from the previous measurement
            start = time.perf_counter()
            results = gen.generate(requests)
            seconds = time.perf_counter() - start
            # Each distinct prompt is processed once (a repeat reuses llama.cpp's cached prompt).
            first = {r.prompt if r.prompt is not None else r.messages: i
                     for i, r in reversed(list(enumerate(requests)))}
            prompt = sum(results[i].prompt_tokens for i in first.values())
            completion = sum(r.completion_tokens for r in results)
            rate = completion / seconds
            base_rate, base_wall = base_rate or rate, base_wall or seconds
            print(f"  WASP mix, {label}: {len(requests)} requests, {prompt:5d} prompt tokens processed, "
                  f"{completion:4d} completion tokens: {rate:5.1f} completion tokens/s "
                  f"(ratio {rate / base_rate:4.2f}x), wall {seconds:5.1f} s (ratio {seconds / base_wall:4.2f}x)")


if __name__ == "__main__":
    main()
