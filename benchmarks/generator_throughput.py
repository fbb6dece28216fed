"""Generator throughput: dpsynth's llama.cpp backend (through the request cache) vs raw llama-cpp-python.

    .venv/bin/python benchmarks/generator_throughput.py [--requests 24]

Builds the prompts a WASP iteration sends (zero-shot and contrastive), then generates them
twice in this process on the same loaded model with the same seeds: once through
`CachedGenerator(LlamaCppGenerator)` with an empty cache, once with plain
`Llama.create_chat_completion` / `create_completion` calls. Prints tokens/s and the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from dpsynth.data.corpora import get_corpus
from dpsynth.llm.cache import CachedGenerator
from dpsynth.llm.llama_cpp_backend import LlamaCppGenerator
from dpsynth.llm.local_models import resolve_local_model
from dpsynth.llm.request_store import RequestCache
from dpsynth.prompts.builder import PromptSettings, build_request


def requests_for(task, chat: bool, count: int):
    examples = [
        "A sharp, funny and surprisingly tender film.",
        "Beautifully shot, but the story never comes alive.",
        "An overlong, joyless slog with nothing to say.",
        "The cast is terrific and the script crackles.",
    ]
    out = []
    for i in range(count):
        label = task.label_names[i % 2]
        good, bad = (examples[:2], examples[2:]) if i % 3 else ((), ())
        out.append(build_request(task, label, chat=chat, good=good, bad=bad, settings=PromptSettings(max_tokens=48),
                                 seed=i))
    return out


def raw_generate(llm, requests):
    tokens = 0
    for r in requests:
        params = dict(max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p, stop=list(r.stop) or None,
                      seed=r.seed)
        if r.messages is not None:
            out = llm.create_chat_completion(messages=[{"role": a, "content": b} for a, b in r.messages], **params)
        else:
            out = llm.create_completion(prompt=r.prompt, **params)
        tokens += out["usage"]["completion_tokens"]
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=24)
    args = parser.parse_args()
    task = get_corpus("rotten_tomatoes").task
    for model in ("smollm2-135m-instruct", "gemma3-270m"):
        path, chat = resolve_local_model(model)
        backend = LlamaCppGenerator(path, chat=chat)
        requests = requests_for(task, backend.chat, args.requests)
        with tempfile.TemporaryDirectory() as tmp:
            gen = CachedGenerator(backend, RequestCache(Path(tmp) / "c.sqlite"))
            start = time.perf_counter()
            results = gen.generate(requests)
            t_ours = time.perf_counter() - start
        tok_ours = sum(r.completion_tokens for r in results)
        start = time.perf_counter()
        tok_raw = raw_generate(backend._llm, requests)
        t_raw = time.perf_counter() - start
        print(f"{model}: {len(requests)} requests")
        print(f"  raw llama-cpp-python : {tok_raw / t_raw:7.1f} completion tokens/s ({t_raw:.1f} s)")
        print(f"  dpsynth backend+cache: {tok_ours / t_ours:7.1f} completion tokens/s ({t_ours:.1f} s)")
        print(f"  throughput ratio dpsynth/raw = {(tok_ours / t_ours) / (tok_raw / t_raw):.2f}")


if __name__ == "__main__":
    main()
