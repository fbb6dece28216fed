"""Paired comparisons for bench tables: mean differences with 95% intervals over seeds and test examples.

Every comparison pairs the same seed (same private sample, same request seeds where methods share them) and the
same test examples. The difference of a seed is the metric's difference on the whole test split; the interval is

    mean over seeds  +-  t(0.975, seeds - 1) * sqrt(var_seeds / seeds + var_test)

where var_seeds is the sample variance of the per-seed differences (generation, the private sample and the noise
vary with the seed) and var_test the variance of the mean difference when the test examples are resampled, the
same draw for every seed (the test split is one sample of the task's texts, shared by every seed). Both parts
count the seed-by-example interaction (for 0/1 correctness mostly the per-cell noise) once each, and the t
quantile widens the test part too, so the interval is conservative: a review's simulation (2026-11-29) put its
coverage at 99.7-100% at 3-10 seeds where that interaction dominates, up to about sqrt(2) too wide (about 2x at
2 seeds), and 94-98% in a design like this project's, where the seed spread dominates. A star is therefore
valid; a comparison not shown may still be a real difference. It replaced a
percentile bootstrap over seeds and, within each, examples, which covered the true difference 77% of the time at
3 seeds, 87% at 5 and 91% at 10 in simulation (nominal 95%): a bootstrap over few seeds is too narrow (it has no
t quantile, and its spread is shrunk by sqrt((S-1)/S)), and per-seed example draws shrink a test-set effect shared
by every seed by 1/S. With one seed there is no seed-to-seed spread to estimate: the interval covers the test set
only, and tables mark it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np
from scipy import stats as scipy_stats


def _interval(per_seed: np.ndarray, of_examples: Callable[[np.ndarray], float], n_test: int, *, draws: int,
              seed: int) -> tuple[float, float]:
    """95% interval of the mean of `per_seed` (each seed's difference on the whole test split). `of_examples(cols)`
    is the mean difference over seeds on the test examples `cols` (one draw, shared by every seed)."""
    rng = np.random.default_rng(seed)
    resampled = np.array([of_examples(rng.integers(0, n_test, size=n_test)) for _ in range(draws)])
    variance = float(resampled.var(ddof=1))
    n_seeds, mean = len(per_seed), float(per_seed.mean())
    if n_seeds > 1:
        variance += float(per_seed.var(ddof=1)) / n_seeds
        half = float(scipy_stats.t.ppf(0.975, n_seeds - 1)) * variance ** 0.5
    else:
        half = float(scipy_stats.norm.ppf(0.975)) * variance ** 0.5
    return mean - half, mean + half


def paired_difference(a: dict[int, list[int]], b: dict[int, list[int]], *, draws: int = 2000,
                      seed: int = 0) -> dict:
    """Mean accuracy difference a - b over the seeds both have, with its 95% interval (module docstring)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("no seed in common")
    xa = np.asarray([a[s] for s in seeds], dtype=np.float64)  # seeds x test examples (0/1)
    xb = np.asarray([b[s] for s in seeds], dtype=np.float64)
    diff = xa - xb
    by_example = diff.mean(axis=0)  # the mean over seeds of each example's difference
    low, high = _interval(diff.mean(axis=1), lambda cols: float(by_example[cols].mean()), diff.shape[1],
                          draws=draws, seed=seed)
    return {"seeds": len(seeds), "difference": float(diff.mean()), "low": low, "high": high}


def _macro_f1(truth: np.ndarray, pred: np.ndarray, classes: int) -> float:
    """Macro-F1 over every class of the test split (sklearn's f1_score(average='macro', labels=all))."""
    tp = np.bincount(truth[truth == pred], minlength=classes)
    denominator = np.bincount(pred, minlength=classes) + np.bincount(truth, minlength=classes)
    return float(np.mean(np.divide(2 * tp, denominator, out=np.zeros(classes), where=denominator > 0)))


def paired_f1_difference(a: dict[int, list[str]], b: dict[int, list[str]], truth: list[str], *,
                         draws: int = 2000, seed: int = 0) -> dict:
    """Mean macro-F1 difference a - b over the seeds both have (predicted labels per test example), with its 95%
    interval: each seed's macro-F1 difference, and the test examples resampled as for accuracy."""
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

    def difference(cols: np.ndarray) -> float:
        return float(np.mean([_macro_f1(y[cols], pa[r][cols], k) - _macro_f1(y[cols], pb[r][cols], k)
                              for r in range(len(seeds))]))

    per_seed = np.array([_macro_f1(y, pa[r], k) - _macro_f1(y, pb[r], k) for r in range(len(seeds))])
    low, high = _interval(per_seed, difference, len(y), draws=draws, seed=seed)
    return {"seeds": len(seeds), "difference": float(per_seed.mean()), "low": low, "high": high}


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
            base = _comparator_cells(rows, against, plms, key)
            if variant != against and set(by_seed) & set(base):
                diff = (paired_difference(by_seed, base) if truth is None
                        else paired_f1_difference(by_seed, base, truth))
                out.append({"variant": variant, "plms": plms, "epsilon": eps, "versus": against, **diff})
    return out


def _comparator_cells(rows: list[dict], against: str, plms: str, key: str) -> dict[int, list]:
    """The comparator's cells by seed: those with the same PLMs, or its only PLMs (a fusion of every PLM against
    a one-model method's cells); none when it has cells for several PLMs and none is this one (which seed's cell
    to pair would otherwise depend on the rows' order)."""
    by_plms: dict[str, dict[int, list]] = defaultdict(dict)
    for r in rows:
        if r["variant"] == against and r.get(key):
            by_plms[r["plms"]][r["seed"]] = r[key]
    if plms in by_plms:
        return by_plms[plms]
    return next(iter(by_plms.values())) if len(by_plms) == 1 else {}


def paired_markdown(rows: list[dict], baseline: str | None, compare_with: dict[str, list[str]] | None = None, *,
                    truth: list[str] | None = None, prefix: str = "") -> str:
    table = paired_table(rows, baseline, compare_with, truth=truth, prefix=prefix)
    if not table:
        return ""
    metric = ("accuracy" if truth is None else "macro-F1") + (" of the fine-tuned encoder" if prefix else "")
    lines = [f"Paired difference in {metric} vs a baseline variant (percentage points; 95% interval: t over seeds "
             "plus the test set's sampling error):", "",
             "| method | PLMs | eps | vs | seeds | difference | 95% interval |",
             "|---|---|---|---|---|---|---|"]
    for t in table:
        eps = "" if t["epsilon"] is None else f"{t['epsilon']:g}"
        # one seed: the interval misses the seed-to-seed spread (it covered a simulated truth 29% of the time)
        sign = " †" if t["seeds"] < 2 else (" *" if t["low"] > 0 or t["high"] < 0 else "")
        lines.append(f"| {t['variant']} | {t['plms']} | {eps} | {t['versus']} | {t['seeds']} | "
                     f"{100 * t['difference']:+.2f}{sign} | [{100 * t['low']:+.2f}, {100 * t['high']:+.2f}] |")
    lines.append("\n* the interval excludes 0 (two seeds or more). † one seed: the interval covers test-set sampling "
                 "only, not the seed-to-seed spread, so it cannot carry a conclusion about the method (no *).")
    return "\n".join(lines)
