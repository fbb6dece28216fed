"""Bench outputs: a Table-1-shaped markdown table (mean +- std over seeds) and an HTML report with plots."""

from __future__ import annotations

import base64
import html
import io
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def _group(rows: list[dict]) -> dict[tuple[str, str], dict]:
    groups: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[(r["variant"], r["plms"])][r["epsilon"]].append(r)
    return groups


def _fmt(values: list[float]) -> str:
    arr = np.asarray(values, dtype=float) * 100
    return f"{arr.mean():.2f} ± {arr.std(ddof=1) if len(arr) > 1 else 0.0:.2f}"


def markdown_table(rows: list[dict], metric: str = "accuracy") -> str:
    rows = [r for r in rows if r.get(metric) is not None]  # e.g. cells not (yet) scored by the fine-tuned encoder
    if not rows:
        return ""
    eps_values = sorted({r["epsilon"] for r in rows if r["epsilon"] is not None})
    seeds = len({r["seed"] for r in rows})

    def cell(group: list[dict]) -> str:  # cells with fewer seeds than the grid say how many
        text = _fmt([r[metric] for r in group])
        return text if len(group) == seeds else f"{text} (n={len(group)})"

    head = ["method", "PLMs", *[f"eps={e:g}" for e in eps_values], "no private data / non-DP"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (variant, plms), by_eps in _group(rows).items():
        cells = [variant, plms]
        for e in eps_values:
            cells.append(cell(by_eps[e]) if e in by_eps else "")
        cells.append(cell(by_eps[None]) if None in by_eps else "")
        lines.append("| " + " | ".join(cells) + " |")
    name = f"the fine-tuned encoder's {metric[3:]}" if metric.startswith("ft_") else metric
    lines.append(f"\n{name} (%) on the real test split, mean ± std over {seeds} seeds (n= where fewer); "
                 "private_only is NOT DP.")
    return "\n".join(lines)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _add_chart(images: list[tuple[str, str]], title: str, fig, ax, legend_size: int) -> None:
    """The chart, with its legend, where something was drawn on it (a bench with no scored cell, or no WASP cell,
    gets no empty chart); the figure is closed either way."""
    import matplotlib.pyplot as plt

    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend_size)
        images.append((title, _png(fig)))
    plt.close(fig)


def html_report(rows: list[dict], out_dir: Path, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images: list[tuple[str, str]] = []
    fig, ax = plt.subplots(figsize=(6, 4))
    finite = sorted({r["epsilon"] for r in rows if r["epsilon"] is not None and np.isfinite(r["epsilon"])})
    inf_at = 2 * finite[-1] if finite else 1.0  # eps = inf (non-private) drawn one step right of the largest
    for (variant, plms), by_eps in _group(rows).items():
        eps = sorted(e for e in by_eps if e is not None)
        if eps:
            means = [np.mean([r["accuracy"] for r in by_eps[e]]) for e in eps]
            ax.errorbar([e if np.isfinite(e) else inf_at for e in eps], means,
                        yerr=[np.std([r["accuracy"] for r in by_eps[e]]) for e in eps], marker="o",
                        label=f"{variant} ({plms})", capsize=3)
        elif None in by_eps:
            ax.axhline(np.mean([r["accuracy"] for r in by_eps[None]]), ls="--", label=f"{variant} ({plms})")
    ax.set_xscale("log", base=2)
    has_inf = any(r["epsilon"] == np.inf for r in rows)
    ax.set_xticks(finite + [inf_at] * has_inf, [f"{e:g}" for e in finite] + ["inf"] * has_inf)
    ax.set_xlabel("epsilon (inf = non-private)")
    ax.set_ylabel("test accuracy")
    _add_chart(images, "accuracy vs epsilon", fig, ax, 7)

    for metric in ("accuracy", "fid"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in rows:
            path = out_dir / "cells" / r["name"] / "eval.json"
            if not path.exists():
                continue
            its = json.loads(path.read_text())["iterations"]
            ys = [e["probe"]["accuracy"] if metric == "accuracy" else (e["fid"] if e["fid"] is not None else np.nan)
                  for e in its]
            ax.plot([e["up_to_iteration"] for e in its], ys, marker=".", alpha=0.6, label=r["name"])
        ax.set_xlabel("iteration (cumulative samples)")
        ax.set_ylabel(metric)
        _add_chart(images, f"{metric} vs iteration", fig, ax, 5)

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        path = out_dir / "cells" / r["name"] / "metrics.json"
        if r["method"] != "wasp" or not path.exists():
            continue
        its = [i for i in json.loads(path.read_text())["iterations"] if "generated" in i]
        for plm in its[0]["generated"]:
            ax.plot([i["iteration"] for i in its], [i["generated"][plm]["kept"] for i in its], marker=".",
                    alpha=0.6, label=f"{r['name']}: {plm}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("samples kept")
    _add_chart(images, "samples per PLM per iteration (WASP)", fig, ax, 5)

    body = [f"<h1>{html.escape(title)}</h1>", "<pre>" + html.escape(markdown_table(rows)) + "</pre>"]
    body += [f"<h2>{html.escape(t)}</h2><img src='data:image/png;base64,{img}'/>" for t, img in images]
    return "<html><head><meta charset='utf-8'><title>dpsynth bench</title></head><body>" + "".join(body) + \
        "</body></html>"
