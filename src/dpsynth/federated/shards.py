"""Each party's shard of a run's private data: the user's per-party files or an experiment split."""

from __future__ import annotations

import numpy as np

from dpsynth.config import RunConfig
from dpsynth.embed.sentence import Embedder
from dpsynth.errors import DpsynthError
from dpsynth.federated.partition import dirichlet_partition, iid_partition
from dpsynth.federated.party import PartyShard
from dpsynth.private.dataset import PrivateData


def party_indices(config: RunConfig, label_ids: np.ndarray, party_of: np.ndarray | None) -> list[np.ndarray]:
    fed = config.federated
    assert fed is not None
    if fed.partition == "files":
        assert party_of is not None
        return [np.flatnonzero(party_of == i) for i in range(fed.parties)]
    if fed.partition == "iid":
        return iid_partition(len(label_ids), fed.parties, seed=config.seed)
    return dirichlet_partition(label_ids, fed.parties, fed.alpha, seed=config.seed)


def checked_parts(config: RunConfig, data: PrivateData, label_names: list[str]) -> list[np.ndarray]:
    """Each party's record indices, refused if a party holds more than the public bound (also run before the
    run's directory exists: `runs.build.check_before_start`)."""
    fed = config.federated
    assert fed is not None
    parts = party_indices(config, np.asarray(data.records.label_ids(label_names)), data.party_of)
    if any(len(p) > fed.max_records_per_party for p in parts):
        # Only the fact is reported: a party's exact size is itself private.
        raise DpsynthError(
            f"a party holds more than federated.max_records_per_party={fed.max_records_per_party} records; "
            "raise the bound (it sets the SecAgg+ clipping range and the party-level sensitivity)")
    return parts


def party_shards(config: RunConfig, data: PrivateData, label_names: list[str],
                 embedder: Embedder) -> list[PartyShard]:
    """Shards with embeddings, in memory only. (On real separate machines each party embeds its own.)"""
    label_ids = np.asarray(data.records.label_ids(label_names))
    parts = checked_parts(config, data, label_names)
    embeddings = embedder.encode(data.records.texts)
    texts = data.records.texts
    return [PartyShard(i, embeddings[idx], label_ids[idx], tuple(texts[j] for j in idx))
            for i, idx in enumerate(parts)]
