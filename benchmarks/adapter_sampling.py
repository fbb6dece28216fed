"""Sampling from a LoRA-tuned local model: the routes POPri (method popri) can take, measured side by side.

    .venv/bin/python benchmarks/adapter_sampling.py [--requests 64] [--model smollm2-135m-instruct]

The same zero-shot chat requests (POPri's candidates: one prompt per label, seeds differ), one adapter
(LoRA r=8 on q/k/v/o with random B, so it changes the model), one thread:
- "transformers": the adapter merged into the de-quantised fp32 weights, batches of 32 that stop each
  row at its first stop (`finetune.generator.AdapterGenerator`, the route popri uses today);
- "llama.cpp + LoRA GGUF": the adapter written as a llama.cpp LoRA GGUF (`finetune.gguf_lora`) and
  applied by llama.cpp to the quantised base model, one request at a time; the export is timed too.
Prints wall time, kept characters per second and the ratio llama.cpp / transformers. Model loads are
timed apart (transformers de-quantises a GGUF once per process; later loads are copies).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from dpsynth.data.corpora import get_corpus
from dpsynth.finetune.generator import AdapterGenerator
from dpsynth.finetune.gguf_lora import export_lora_gguf, gguf_architecture
from dpsynth.finetune.model import adapter_vector, add_lora, load_base
from dpsynth.llm.base import GenerationRequest
from dpsynth.llm.llama_cpp_backend import LlamaCppGenerator
from dpsynth.llm.local_models import resolve_local_model
from dpsynth.prompts.builder import PromptSettings, build_request


def requests(count: int, max_tokens: int) -> list[GenerationRequest]:
    task = get_corpus("rotten_tomatoes").task
    settings = PromptSettings(max_tokens=max_tokens, temperature=1.0, top_p=0.95)
    labels = task.label_names
    return [build_request(task, labels[i % len(labels)], chat=True, settings=settings, seed=i) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    torch.set_num_threads(1)
    path, _ = resolve_local_model(args.model)
    reqs = requests(args.requests, args.max_tokens)

    model, _ = load_base(path)
    torch.manual_seed(0)
    peft = add_lora(model, 8, 16)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    vector = adapter_vector(peft)

    t0 = time.perf_counter()
    hf = AdapterGenerator(path, vector, r=8, alpha=16, chat=True, batch_size=32)
    t_hf_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf_out = hf.generate(reqs)
    t_hf = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        lora = export_lora_gguf(peft, gguf_architecture(path), 16, Path(tmp) / "adapter.gguf")
        t_export = time.perf_counter() - t0
        t0 = time.perf_counter()
        lc = LlamaCppGenerator(path, chat=True, n_threads=1, lora_path=lora)
        t_lc_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        lc_out = lc.generate(reqs)
        t_lc = time.perf_counter() - t0

    rate_hf = sum(len(r.text) for r in hf_out) / t_hf
    rate_lc = sum(len(r.text) for r in lc_out) / t_lc
    print(f"{args.requests} zero-shot chat requests, {args.model}, max_tokens {args.max_tokens}, 1 thread")
    print(f"transformers (merged adapter, batch 32): {t_hf:7.1f} s  {rate_hf:7.1f} chars/s  (load {t_hf_load:.1f} s)")
    print(f"llama.cpp + LoRA GGUF (one at a time):   {t_lc:7.1f} s  {rate_lc:7.1f} chars/s  "
          f"(load {t_lc_load:.1f} s, export {t_export:.2f} s)")
    print(f"ratio llama.cpp / transformers, kept characters per second: {rate_lc / rate_hf:.2f}x")


if __name__ == "__main__":
    main()
