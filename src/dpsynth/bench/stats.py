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
from collections.abc import Callable

import numpy as np


def _bootstrap(statistic: Callable[[np.ndarray, np.ndarray], float], n_seeds: int, n_test: int, *,
               draws: int, seed: int) -> tuple[float, float]:
    """95% interval of `statistic(rows, cols)` over resamples: seeds with replacement, then, within each drawn
    seed, test examples with replacement (the same examples for both methods)."""
    rng = np.random.default_rng(seed)
    stats = np.empty(draws)
    for i in range(draws):
        rows = rng.integers(0, n_seeds, size=n_seeds)
        cols = rng.integers(0, n_test, size=(n_seeds, n_test))
        stats[i] = statistic(rows, cols)
    low, high = np.percentile(stats, [2.5, 97.5])
    return float(low), float(high)


def paired_difference(a: dict[int, list[int]], b: dict[int, list[int]], *, draws: int = 2000,
                      seed: int = 0) -> dict:
    """Mean accuracy difference a - b over the seeds both have, with a 95% bootstrap interval."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("no seed in common")
    xa = np.asarray([a[s] for s in seeds], dtype=np.float64)  # seeds x test examples (0/1)
    xb = np.asarray([b[s] for s in seeds], dtype=np.float64)
    diff = xa - xb
    low, high = _bootstrap(lambda rows, cols: np.take_along_axis(diff[rows], cols, axis=1).mean(), *diff.shape,
                           draws=draws, seed=seed)
    return {"seeds": len(seeds), "difference": float(diff.mean()), "low": low, "high": high}


def _macro_f1(truth: np.ndarray, pred: np.ndarray, classes: int) -> float:
    """Macro-F1 over every class of the test split (sklearn's f1_score(average='macro', labels=all))."""
    tp = np.bincount(truth[truth == pred], minlength=classes)
    denominator = np.bincount(pred, minlength=classes) + np.bincount(truth, minlength=classes)
    return float(np.mean(np.divide(2 * tp, denominator, out=np.zeros(classes), where=denominator > 0)))


def paired_f1_difference(a: dict[int, list[str]], b: dict[int, list[str]], truth: list[str], *,
                         draws: int = 2000, seed: int = 0) -> dict:
    """Mean macro-F1 difference a - b over the seeds both have (predicted labels per test example), with a
    95% bootstrap interval: seeds and, within each, test examples resampled as for accuracy."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("no seed in common")
    names = sorted(set(truth))
    index = {name: i for i, name in enumerate(names)}
    y = np.array([index[t] for t in truth])
    pa = np.array([[index.get(p, -1) for p in a[s]] for s in seeds])
    pb = np.array([[index.get(p, -1) for p in b[s]] for s in seeds])
    if (pa < 0).any() or (pb < 0).any():
        raise ValueError("a prediction outside the test split's labels")
    k = len(names)

    def difference(rows: np.ndarray, cols: np.ndarray) -> float:
        return float(np.mean([_macro_f1(y[c], pa[r][c], k) - _macro_f1(y[c], pb[r][c], k)
                              for r, c in zip(rows, cols)]))

    point = difference(np.arange(len(seeds)), np.tile(np.arange(len(y)), (len(seeds), 1)))
    low, high = _bootstrap(difference, len(seeds), len(y), draws=draws, seed=seed)
    return {"seeds": len(seeds), "difference": point, "low": low, "high": high}


def paired_table(rows: list[dict], baseline: str | None, compare_with: dict[str, list[str]] | None = None, *,
                 truth: list[str] | None = None, prefix: str = "") -> list[dict]:
    """Each (variant, PLMs, epsilon) against its baseline variant (the bench's, or each of the variant's own
    `compare_with`), paired by seed and test example: accuracy, or macro-F1 when `truth` (the test labels)
    is given; of the probe, or of the classifier whose per-example columns carry `prefix` (`ft_`)."""
    compare_with = compare_with or {}
    key = prefix + ("correct" if truth is None else "predicted")
    groups: dict[tuple, dict[int, list]] = defaultdict(dict)
    for r in rows:
        if r.get(key):
            groups[(r["variant"], r["plms"], r["epsilon"])][r["seed"]] = r[key]
    out = []
    for (variant, plms, eps), by_seed in groups.items():
        for against in compare_with.get(variant) or ([baseline] if baseline is not None else []):
            base = {r["seed"]: r[key] for r in rows if r["variant"] == against and r.get(key)}
            if variant != against and set(by_seed) & set(base):
                diff = (paired_difference(by_seed, base) if truth is None
                        else paired_f1_difference(by_seed, base, truth))
                out.append({"variant": variant, "plms": plms, "epsilon": eps, "versus": against, **diff})
    return out


def paired_markdown(rows: list[dict], baseline: str | None, compare_with: dict[str, list[str]] | None = None, *,
                    truth: list[str] | None = None, prefix: str = "") -> str:
    table = paired_table(rows, baseline, compare_with, truth=truth, prefix=prefix)
    if not table:
        return ""
    metric = ("accuracy" if truth is None else "macro-F1") + (" of the fine-tuned encoder" if prefix else "")
    lines = [f"Paired difference in {metric} vs a baseline variant (percentage points; 95% bootstrap interval over "
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
