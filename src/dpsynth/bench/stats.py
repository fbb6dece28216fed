"""Paired comparisons for bench tables: mean differences with 95% intervals, bootstrapped over seeds
and test examples.

Every comparison pairs the same seed (same private sample, same request seeds where methods share
them) and the same test examples. The interval resamples seeds with replacement and, within each
drawn seed, test examples with replacement (the same examples for both methods), so it carries
both the seed-to-seed spread and the test-set sampling error; with few seeds it is wide, as it
should be.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def paired_difference(a: dict[int, list[int]], b: dict[int, list[int]], *, draws: int = 2000,
                      seed: int = 0) -> dict:
    """Mean accuracy difference a - b over the seeds both have, with a 95% bootstrap interval."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("no seed in common")
    xa = np.asarray([a[s] for s in seeds], dtype=np.float64)  # seeds x test examples (0/1)
    xb = np.asarray([b[s] for s in seeds], dtype=np.float64)
    diff = xa - xb
    rng = np.random.default_rng(seed)
    n_seeds, n_test = diff.shape
    stats = np.empty(draws)
    for i in range(draws):
        rows = rng.integers(0, n_seeds, size=n_seeds)
        cols = rng.integers(0, n_test, size=(n_seeds, n_test))
        stats[i] = np.take_along_axis(diff[rows], cols, axis=1).mean()
    low, high = np.percentile(stats, [2.5, 97.5])
    return {"seeds": len(seeds), "difference": float(diff.mean()), "low": float(low), "high": float(high)}


def paired_table(rows: list[dict], baseline: str, compare_with: dict[str, list[str]] | None = None) -> list[dict]:
    """Each (variant, PLMs, epsilon) against its baseline variant (the bench's, or each of the variant's own
    `compare_with`), paired by seed and test example."""
    compare_with = compare_with or {}
    groups: dict[tuple, dict[int, list[int]]] = defaultdict(dict)
    for r in rows:
        if r.get("correct"):
            groups[(r["variant"], r["plms"], r["epsilon"])][r["seed"]] = r["correct"]
    out = []
    for (variant, plms, eps), by_seed in groups.items():
        for against in compare_with.get(variant) or [baseline]:
            base = {r["seed"]: r["correct"] for r in rows if r["variant"] == against and r.get("correct")}
            if variant != against and set(by_seed) & set(base):
                out.append({"variant": variant, "plms": plms, "epsilon": eps, "versus": against,
                            **paired_difference(by_seed, base)})
    return out


def paired_markdown(rows: list[dict], baseline: str, compare_with: dict[str, list[str]] | None = None) -> str:
    table = paired_table(rows, baseline, compare_with)
    if not table:
        return ""
    lines = ["Paired difference in accuracy vs a baseline variant (percentage points; 95% bootstrap interval over "
             "seeds and test examples):", "", "| method | PLMs | eps | vs | seeds | difference | 95% interval |",
             "|---|---|---|---|---|---|---|"]
    for t in table:
        eps = "" if t["epsilon"] is None else f"{t['epsilon']:g}"
        sign = " *" if t["low"] > 0 or t["high"] < 0 else ""
        sign += " †" if t["seeds"] < 2 else ""
        lines.append(f"| {t['variant']} | {t['plms']} | {eps} | {t['versus']} | {t['seeds']} | "
                     f"{100 * t['difference']:+.2f}{sign} | [{100 * t['low']:+.2f}, {100 * t['high']:+.2f}] |")
    lines.append("\n* the interval excludes 0. † one seed: the interval covers test-set sampling only, not the "
                 "seed-to-seed spread, so it cannot carry a conclusion about the method.")
    return "\n".join(lines)
