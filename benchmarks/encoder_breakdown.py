"""Where the run's sentence encoder spends its time, per batch, on the run's device (issue 37's embedding target).

    .venv/bin/python benchmarks/encoder_breakdown.py --sizes 120 --forward-sizes 32 64   # a quick look on a CPU
    python3 benchmarks/encoder_breakdown.py --device cuda --embedder DIR      # a lent GPU (device_scale.sh)

Why: on a lent H200 the encoder's peak in `api_scale.py` was 3,253 texts/s (all-MiniLM-L6-v2, fp16, batches of 256,
texts like the server's answers: two joined reviews, about 220 characters), and a run at N=600, whose iterations
embed 120 texts a call, reached 0.38-0.42 of that. A six-layer encoder of 22M parameters on that GPU should do
several times more, so something else sets the pace: the tokenizer on the CPU, the copies to and from the device,
the forward pass's kernel launches, or sentence-transformers' own work around them. Which one decides what can be
done (tokenizing the next batch while the GPU runs this one, larger batches, fewer calls), and a lent GPU's time is
too short to find it by trying fixes one by one. Printed:
- the run's embedder (`SentenceTransformerEmbedder.encode`) on calls of 120, 480 and 2,400 texts: texts/s;
- one batch of the run's batch size taken apart: tokenizing, moving to the device, the forward pass and bringing
  the embeddings back, each timed with the device synchronized; their sum against the whole `encode` of that batch
  (the rest is sentence-transformers' own work); and what tokenizing beside the device's work could reach at most
  (the batch's time without its tokenizing, or the tokenizing alone, whichever is longer);
- the tokenizer alone on that batch in a fresh process, with its own threads and on one: whether its
  threads help;
- the forward pass alone at batch sizes 32 to 1,024: its time a text, to tell launch-bound from compute-bound;
- a candidate fix measured beside the run's path in the same process (`pipelined_encode`: the next batch
  tokenized on a thread while the device runs this one; a 120-text call also in quarter batches), with the
  smallest cosine between its embeddings and the run's: if it pays on a GPU, it can move into the embedder.
On this 2-core machine the forward pass is nearly all of it (0.93 of a batch of 64); a GPU's figures are the point.
Nothing here is a test: no figure is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from api_scale import answer_text  # noqa: E402


def synchronized(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def median_seconds(fn: Callable[[], Any], sync: Callable[[], None], budget: float = 0.5, least: int = 3) -> float:
    """The median time of `fn` (device synchronized before and after) over about `budget` seconds, `least` times."""
    times: list[float] = []
    while len(times) < least or sum(times) < budget:
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--embedder", default="all-MiniLM-L6-v2", help="a model name or directory")
    parser.add_argument("--sizes", type=int, nargs="+", default=[120, 480, 2400], help="texts a call")
    parser.add_argument("--forward-sizes", type=int, nargs="+", default=[32, 128, 256, 512, 1024],
                        help="batch sizes of the forward pass alone")
    args = parser.parse_args()

    import torch

    from dpsynth.data.corpora import get_corpus
    from dpsynth.device import resolve_device
    from dpsynth.embed.sentence import SentenceTransformerEmbedder

    device = resolve_device(args.device)
    sync = synchronized(device)
    reviews = get_corpus("rotten_tomatoes").load().texts
    texts = [answer_text(reviews, int.from_bytes(hashlib.sha256(str(i).encode()).digest()[:8], "big"))
             for i in range(max(args.sizes + args.forward_sizes) + 256)]
    embedder = SentenceTransformerEmbedder(args.embedder, device=device)
    model, batch = embedder._model, embedder._batch_size  # noqa: SLF001 - the run's own encoder, taken apart
    tokenizer = model.tokenizer
    gpu = torch.cuda.get_device_name() if device == "cuda" else "-"
    print(f"device {device} ({gpu}); torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{os.cpu_count()} CPUs; tokenizer {type(tokenizer).__name__} fast={tokenizer.is_fast}; "
          f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', 'unset')}; batch size {batch}; "
          f"{sum(map(len, texts)) / len(texts):.0f} characters a text")
    embedder.encode(texts[:batch])  # warm-up: kernels, allocator

    print("\n| texts a call | texts/s |\n|---|---|")
    for size in args.sizes:
        call = texts[:size]
        print(f"| {size} | {size / median_seconds(partial(embedder.encode, call), sync):.0f} |")

    preprocess = getattr(model, "preprocess", None) or model.tokenize
    one = texts[:batch]
    features = preprocess(one)
    on_device = batch_to_device(features, device)
    with torch.inference_mode():
        out = model(on_device)["sentence_embedding"]
    phases = {
        "tokenize": median_seconds(lambda: preprocess(one), sync),
        "to device": median_seconds(lambda: batch_to_device(features, device), sync),
        "forward": median_seconds(lambda: _forward(model, on_device), sync),
        "to CPU": median_seconds(lambda: out.float().cpu().numpy(), sync),
    }
    whole = median_seconds(lambda: embedder.encode(one), sync)
    tokens = int(features["attention_mask"].sum())
    print(f"\none batch of {batch} texts ({tokens} tokens, padded to {features['input_ids'].shape[1]}): "
          f"the whole encode {whole * 1e3:.1f} ms ({batch / whole:.0f} texts/s)")
    print("| phase | ms | share of the whole encode |\n|---|---|---|")
    for name, seconds in phases.items():
        print(f"| {name} | {seconds * 1e3:.2f} | {seconds / whole:.2f} |")
    rest = whole - sum(phases.values())
    print(f"| sentence-transformers' own (the rest) | {rest * 1e3:.2f} | {rest / whole:.2f} |")
    overlapped = max(phases["tokenize"], whole - phases["tokenize"])
    print(f"tokenizing beside the device's work: at most {batch / overlapped:.0f} texts/s "
          f"({whole / overlapped:.2f}x this batch)")

    threads, one_thread = (_tokenize_ms(args.embedder, one, single) for single in (False, True))
    print(f"the tokenizer alone on that batch, in a fresh process: {threads:.2f} ms with its own threads, "
          f"{one_thread:.2f} ms on one")
    print("\n| batch | forward ms | forward ms a text |\n|---|---|---|")
    for size in args.forward_sizes:
        part = batch_to_device(preprocess(texts[:size]), device)
        seconds = median_seconds(partial(_forward, model, part), sync)
        print(f"| {size} | {seconds * 1e3:.2f} | {seconds * 1e3 / size:.3f} |")

    print("\na candidate, not the run's path: the next batch tokenized on a thread while the device runs this one "
          "(texts sorted by length, as sentence-transformers does; one copy back at the end)")
    print("| texts a call | batch | the run's encode texts/s | pipelined texts/s | ratio "
          "| smallest cosine to the run's |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        call = texts[:size]
        for part_size in sorted({batch, min(batch, max(8, size // 4))}):
            pipelined = partial(pipelined_encode, model, preprocess, call, part_size, device)
            ours, theirs = pipelined(), embedder.encode(call)
            cosine = float(np.min(np.sum(ours * theirs, axis=1) / (np.linalg.norm(ours, axis=1)
                                                                    * np.linalg.norm(theirs, axis=1))))
            run_rate = size / median_seconds(partial(embedder.encode, call), sync)
            rate = size / median_seconds(pipelined, sync)
            print(f"| {size} | {part_size} | {run_rate:.0f} | {rate:.0f} | {rate / run_rate:.2f} | {cosine:.6f} |")


def pipelined_encode(model: Any, preprocess: Callable[[list[str]], dict], texts: list[str], batch: int,
                     device: str) -> np.ndarray:
    """The embeddings of `texts` (rows in their order), each batch tokenized on a thread while the device runs the
    batch before it: the tokenizer is CPU work that releases the interpreter lock, and on a GPU the forward pass is
    queued work, so the two can overlap where sentence-transformers runs them one after the other."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    batches = [[texts[i] for i in order[start:start + batch]] for start in range(0, len(texts), batch)]
    outputs = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        ahead = pool.submit(preprocess, batches[0])
        for k in range(len(batches)):
            features = ahead.result()
            if k + 1 < len(batches):
                ahead = pool.submit(preprocess, batches[k + 1])
            with torch.inference_mode():
                outputs.append(model(batch_to_device(features, device))["sentence_embedding"])
    stacked = torch.cat(outputs).float().cpu().numpy()
    result = np.empty_like(stacked)
    result[order] = stacked
    return result


def batch_to_device(features: dict, device: str) -> dict:
    """The tokenizer's tensors on `device` (what sentence-transformers does before its forward pass)."""
    return {key: value.to(device) if hasattr(value, "to") else value for key, value in features.items()}


def _forward(model: Any, features: dict) -> Any:
    import torch

    with torch.inference_mode():
        return model(features)["sentence_embedding"]


def _tokenize_ms(embedder: str, texts: list[str], one_thread: bool) -> float:
    """The tokenizer alone on `texts` (median ms of 7), in a fresh process: with its own thread pool, or limited to
    one thread (RAYON_NUM_THREADS=1, read only when a process starts the pool)."""
    import json
    import subprocess

    code = ("import json, sys, time, statistics; from transformers import AutoTokenizer; "
            "from dpsynth.embed.sentence import resolve_model_path; "
            "tok = AutoTokenizer.from_pretrained(resolve_model_path(sys.argv[1])); texts = json.load(sys.stdin); "
            "tok(texts, padding=True, truncation=True, return_tensors='pt'); ts = []\n"
            "for _ in range(7):\n    a = time.perf_counter(); tok(texts, padding=True, truncation=True, "
            "return_tensors='pt'); ts.append(time.perf_counter() - a)\n"
            "print(statistics.median(ts) * 1e3)")
    env = {**os.environ, **({"RAYON_NUM_THREADS": "1"} if one_thread else {})}
    done = subprocess.run([sys.executable, "-c", code, embedder], input=json.dumps(texts), capture_output=True,
                          text=True, env=env, check=True)
    return float(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
