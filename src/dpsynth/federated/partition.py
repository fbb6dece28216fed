"""Splitting a private set across data parties, as in the papers' federated experiments.

Dirichlet over labels (Hsu et al. 2019; WASP uses alpha = 1.0): for every label a share
vector p ~ Dir(alpha * 1_L) divides that label's records among the L parties, so parties
get different label mixes and sizes. Every party receives at least one record (a party
with nothing to vote on is not a party); the split is redrawn until that holds.
"""

from __future__ import annotations

import numpy as np

from dpsynth.errors import DpsynthError

MAX_DRAWS = 1000


def iid_partition(n: int, parties: int, seed: int) -> list[np.ndarray]:
    """Shuffle and deal out: sizes differ by at most one."""
    _check(n, parties)
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(part) for part in np.array_split(order, parties)]


def dirichlet_partition(label_ids: np.ndarray, parties: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Per-label Dirichlet(alpha) shares; every party non-empty."""
    labels = np.asarray(label_ids)
    _check(len(labels), parties)
    rng = np.random.default_rng(seed)
    for _ in range(MAX_DRAWS):
        parts: list[list[int]] = [[] for _ in range(parties)]
        for label in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == label))
            shares = rng.dirichlet(np.full(parties, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).round().astype(int)
            for party, chunk in enumerate(np.split(idx, cuts)):
                parts[party].extend(chunk.tolist())
        if all(parts):
            return [np.array(sorted(p), dtype=np.int64) for p in parts]
    raise DpsynthError(
        f"could not give each of {parties} parties a record with Dirichlet alpha={alpha} in {MAX_DRAWS} draws; "
        "use fewer parties or a larger alpha"
    )


def _check(n: int, parties: int) -> None:
    if parties < 2:
        raise DpsynthError(f"a federation needs at least 2 parties (got {parties})")
    if n < parties:
        raise DpsynthError(f"{n} private records cannot be split across {parties} parties")
