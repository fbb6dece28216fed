"""The non-private reference of a benchmark: a classifier trained on the private records themselves.

It is NOT DP and labelled so wherever it appears; it lives with the data holder because it
reads private records. Private embeddings stay in memory, as everywhere else.
"""

from __future__ import annotations

from dpsynth.config import RunConfig
from dpsynth.data.public import task_for
from dpsynth.data.records import LabelledTexts
from dpsynth.embed.sentence import SentenceTransformerEmbedder, embed_test_set
from dpsynth.evaluate.downstream import probe_scores
from dpsynth.private.dataset import check_private, load_private


def private_only_scores(config: RunConfig, test: LabelledTexts, *, seed: int) -> dict:
    private = load_private(config)
    check_private(config, private, task_for(config), min_records=(1, "1"))
    emb = SentenceTransformerEmbedder(config.embedder)
    test_emb = embed_test_set(emb, test.texts)
    return probe_scores(emb.encode(private.records.texts), private.records.labels, test_emb, test.labels, seed=seed)
