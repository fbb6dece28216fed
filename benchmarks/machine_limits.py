"""The machine's limits that benchmarks compare against, measured in the benchmark's own process.

Absolute speeds on shared machines are noise; a phase's time divided by its limit, both measured
in one run, is the figure that means something.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Shortest wall time of `repeats` calls (the least disturbed by other work on the machine)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(gib: float = 0.5, repeats: int = 5) -> float:
    """Bytes/s moved by a large array copy (one read + one write per element)."""
    a = np.ones(int(gib * 2**30) // 8)
    b = np.empty_like(a)
    return 2 * a.nbytes / best_time(lambda: np.copyto(b, a), repeats)


def matmul_peak(n: int = 1536, repeats: int = 5, square: Callable[[int], Any] | None = None) -> float:
    """Float32 FLOP/s of an n x n matmul on this process's threads; `square(n)` makes the matrix
    (default numpy; pass e.g. `lambda n: torch.randn(n, n)` for the BLAS a torch model uses)."""
    a = square(n) if square is not None else np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    return 2 * n**3 / best_time(lambda: a @ a, repeats)
