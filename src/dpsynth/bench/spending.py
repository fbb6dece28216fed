"""What a bench spends on the user's own records: every DP cell is a separate run on the same data.

A bench on a public corpus spends nothing private. On the user's own records each cell spends its own epsilon and
delta, and no ledger adds them up across cells; choosing a configuration by the cells' scores is not private either.
Stating the total (by basic composition, an upper bound) before the grid runs, and in its results, keeps that
from being a surprise (docs/choosing.md, "What a bench spends").
"""

from __future__ import annotations

import math

from pydantic import ValidationError

from dpsynth.bench.grid import PRIVATE_ONLY, BenchConfig, cells
from dpsynth.config import DataConfig, PrivacyConfig
from dpsynth.errors import DpsynthError


def _on_own_records(config: dict) -> bool:
    """A cell reads the user's records (a file, the Hub, records given in Python, or the parties' files), not a
    public corpus."""
    data = DataConfig.model_validate(config.get("data") or {})
    federated_files = (config.get("federated") or {}).get("partition") in ("files", "nodes")
    return data.corpus is None and (data.own or federated_files)


def spending_note(bench: BenchConfig) -> str | None:
    """One line on what the grid spends on the user's own records; None when its private data is a public corpus."""
    try:
        grid = cells(bench)
        own = [c for c in grid if _on_own_records(c["config"])]
        deltas = [PrivacyConfig.model_validate(c["config"].get("privacy") or {}).delta for c in own]
    except (ValidationError, DpsynthError):
        return None  # the grid's own check reports the bad field before any cell runs
    dp, plain = 0, 0
    epsilon = delta = 0.0
    for cell, cell_delta in zip(own, deltas):
        eps = cell["epsilon"]
        if cell["method"] == PRIVATE_ONLY or (eps is not None and math.isinf(eps)):
            plain += 1
        elif eps is not None:
            dp += 1
            epsilon += eps
            delta += cell_delta
    if dp == 0 and plain == 0:
        return None
    cells_word = "cell spends" if dp == 1 else "cells spend"
    parts = [f"this bench runs on your own records: its {dp} DP {cells_word} up to epsilon {epsilon:g}, delta "
             f"{delta:.1e} on them together (each cell is a separate run; basic composition; no ledger adds cells up)"]
    if plain:
        parts.append(f"{plain} cells read them without DP (private_only or epsilon .inf)")
    return "; ".join(parts) + ". Keep these records apart from the ones you release (docs/choosing.md)."
