"""Embedding throughput against the machine's arithmetic limit.

    .venv/bin/python benchmarks/embedding_limits.py [--texts 2000]

Embeds real Rotten Tomatoes reviews with the runs' default encoder (all-MiniLM-L6-v2 through
sentence-transformers, the run's own batch: 16 on a CPU) and compares texts/s with what the encoder's arithmetic allows
at the float32 matmul peak measured in the same process: per token, 2 x the encoder's non-embedding
parameters (the dense layers) plus 4 x layers x hidden x sequence length (attention scores and
mixing), over the padded sequence lengths sentence-transformers actually runs (it sorts texts by
length, so batches are padded to similar lengths). The ratio is time / limit; 1.0 would be the
matmul peak on every FLOP.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from machine_limits import matmul_peak

from dpsynth.data.corpora import get_corpus
from dpsynth.embed.sentence import SentenceTransformerEmbedder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=2000)
    args = parser.parse_args()
    corpus = get_corpus("rotten_tomatoes")
    texts = corpus.load().texts[: args.texts]
    embedder = SentenceTransformerEmbedder()
    model = embedder._model
    embedder.encode(texts[:64])  # warm-up: first-call allocations are not the steady state
    start = time.perf_counter()
    embedder.encode(texts)
    seconds = time.perf_counter() - start

    tokenizer, encoder = model.tokenizer, model[0].auto_model
    cfg = encoder.config
    dense = sum(p.numel() for name, p in encoder.named_parameters() if "embeddings" not in name)
    lengths = np.array([len(ids) for ids in tokenizer(texts, truncation=True, max_length=model.max_seq_length)
                        ["input_ids"]])
    order = np.argsort(-lengths)  # sentence-transformers batches texts of similar length together
    flops = 0.0
    for start_i in range(0, len(texts), 64):
        batch = lengths[order[start_i:start_i + 64]]
        padded = int(batch.max())
        flops += len(batch) * padded * (2 * dense + 4 * cfg.num_hidden_layers * cfg.hidden_size * padded)
    import torch

    peak = matmul_peak(square=lambda n: torch.randn(n, n))  # the encoder runs on torch's BLAS
    limit = flops / peak
    print(f"embedding {len(texts)} texts ({lengths.mean():.1f} tokens on average) with all-MiniLM-L6-v2: "
          f"{len(texts) / seconds:.0f} texts/s, {seconds:.2f} s")
    print(f"  limit: {flops / 1e9:.1f} GFLOP at the measured float32 matmul peak {peak / 1e9:.0f} GFLOP/s = "
          f"{limit:.2f} s; embedding takes {seconds / limit:.2f}x that")


if __name__ == "__main__":
    main()
