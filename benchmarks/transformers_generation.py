"""The transformers backend's batched sampling against its former settings and against llama.cpp.

    .venv/bin/python benchmarks/transformers_generation.py [--requests 64] [--mix control|wasp]

Generates the same requests, with the same seeds, in one process on one loaded model:
- "before": batches of 8 decoded to `max_tokens` and cut at the stop afterwards (the backend
  until now: every newline-stopped sample paid for `max_tokens` tokens);
- "now": batches of 32 that stop each row at its first stop after some text (`StopAfterText`);
- "llama.cpp": dpsynth's default local backend, one request at a time, on the model's GGUF.
`control` is the DP fine-tuned generator's request mix (control-code completion prompts, the
prompts the `dpft` and `fedgen` methods sample from); `wasp` is a WASP iteration's chat requests
(zero-shot and contrastive, as `generator_throughput.py`). Prints wall time, kept characters and
ratios of kept characters per second against "before" and against llama.cpp (the backends sample
different texts from the same seeds, and llama.cpp stops a sample that opens with a newline at once,
so time alone would flatter it; absolute times are noise on shared machines).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from generator_throughput import requests_for

from dpsynth.data.corpora import get_corpus
from dpsynth.finetune.examples import control_prompt
from dpsynth.llm.base import GenerationRequest, GenerationResult
from dpsynth.llm.llama_cpp_backend import LlamaCppGenerator
from dpsynth.llm.local_models import resolve_local_model
from dpsynth.llm.transformers_backend import TransformersGenerator, _cut_at_stop


def control_requests(count: int) -> list[GenerationRequest]:
    task = get_corpus("rotten_tomatoes").task
    prompts = [control_prompt(task.text_kind, c, task.labels[c]) for c in task.label_names]
    return [GenerationRequest(prompt=prompts[i % len(prompts)], max_tokens=60, temperature=1.0, stop=("\n",), seed=i)
            for i in range(count)]


def timed(generate, requests) -> tuple[float, list[GenerationResult]]:
    start = time.perf_counter()
    results = generate(requests)
    return time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--mix", choices=["control", "wasp"], default="control")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    path, chat = resolve_local_model(args.model)
    if args.mix == "control":
        requests, chat = control_requests(args.requests), False
    else:
        requests = requests_for(get_corpus("rotten_tomatoes").task, chat, args.requests)

    before_gen = TransformersGenerator(str(path), chat=chat, batch_size=8)
    t_before, before = timed(before_gen.generate, [replace(r, stop=()) for r in requests])
    before_texts = [_cut_at_stop(b.text, r.stop) for b, r in zip(before, requests)]
    now_gen = TransformersGenerator(str(path), chat=chat, batch_size=32)
    t_now, now = timed(now_gen.generate, requests)
    t_llama, llama = timed(LlamaCppGenerator(path, chat=chat).generate, requests)

    print(f"{args.model}, {len(requests)} {args.mix} requests (max_tokens {requests[0].max_tokens})")
    rates = {}
    for name, seconds, texts in (("transformers before (batch 8, decode to max_tokens)", t_before, before_texts),
                                 ("transformers now (batch 32, stop per row)", t_now, [r.text for r in now]),
                                 ("llama.cpp backend (one request at a time)", t_llama, [r.text for r in llama])):
        kept = sum(map(len, texts))
        rates[name.split(" (")[0]] = kept / seconds
        print(f"  {name:52s} {seconds:7.1f} s, {kept:6d} characters kept, {kept / seconds:6.1f} per s, "
              f"{sum(not t.strip() for t in texts)} empty")
    now_rate = rates["transformers now"]
    print(f"  kept characters/s, now vs before: {now_rate / rates['transformers before']:.2f}x; "
          f"now vs llama.cpp: {now_rate / rates['llama.cpp backend']:.2f}x")


if __name__ == "__main__":
    main()
