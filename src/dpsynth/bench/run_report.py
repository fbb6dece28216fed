"""`dpsynth report RUN_DIR`: one self-contained HTML page for one run (the bench has one per grid).

Everything on the page comes from the run's shareable files (privacy.json, metrics.json, eval.json
when `dpsynth eval` has scored it, synthetic.jsonl): privacy spent per release against the budget,
samples kept and PLM weights per iteration, the signal-to-noise diagnostic of each release (from noisy
values only), downstream scores per iteration with 95% intervals, and a few synthetic examples per
label. Plots are PNGs embedded in the page, so it opens anywhere without a network.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from dpsynth.bench.report import _png
from dpsynth.errors import DpsynthError
from dpsynth.fs import RunDir

EXAMPLES_PER_LABEL = 3

# Once every plot has decoded, the page says so on <body> (a headless browser's DOM dump shows it).
_RENDER_CHECK = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-plots-rendered', ok + '/' + imgs.length);
});
</script>"""


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DpsynthError(f"{path}: cannot be read ({err}); is the run finished?") from err


def _interval(accuracy: float, n: int) -> tuple[float, float]:
    """95% Wilson interval of an accuracy measured on n test examples."""
    z = 1.96
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def _figure():
    try:
        import matplotlib
    except ImportError as err:
        raise DpsynthError("the report's plots need matplotlib: pip install 'dpsynth[eval]'") from err

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations
    return plt, fig, ax


def _finish(plt, fig, ax, xlabel: str, ylabel: str, legend: str = "best") -> str:
    """Label, add the legend, and return the figure as base64 PNG (closing it)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc=legend)
    out = _png(fig)
    plt.close(fig)
    return out


def _privacy_plot(history: list[dict], budget: float | None) -> str | None:
    points = [(h["iteration"], h["epsilon_spent"]) for h in history if "epsilon_spent" in h]
    if not points:
        return None
    plt, fig, ax = _figure()
    ax.step([p[0] for p in points], [p[1] for p in points], where="post", marker="o", label="epsilon spent")
    if budget is not None:
        ax.axhline(budget, ls="--", color="grey", label=f"budget {budget:g}")
    return _finish(plt, fig, ax, "iteration", "epsilon (at the run's delta)")


def _samples_plot(history: list[dict]) -> str | None:
    its = [h for h in history if "generated" in h]
    if not its:
        return None
    plt, fig, ax = _figure()
    plms = sorted({p for h in its for p in h["generated"]})
    for plm in plms:
        ax.plot([h["iteration"] for h in its], [h["generated"].get(plm, {}).get("kept", 0) for h in its],
                marker="o", label=f"{plm}: kept")
    weighted = [h for h in its if "weights_used" in h]
    if weighted and len(plms) > 1:
        twin = ax.twinx()
        for plm in plms:
            twin.plot([h["iteration"] for h in weighted], [h["weights_used"].get(plm, 0.0) for h in weighted],
                      ls=":", marker=".", label=f"{plm}: weight")
        twin.set_ylabel("PLM weight (dotted)")
    return _finish(plt, fig, ax, "iteration", "samples kept", legend="lower left")


def _scores_plot(evaluation: dict) -> str:
    plt, fig, ax = _figure()
    its = evaluation["iterations"]
    n = evaluation["test_size"]
    xs = [e["up_to_iteration"] for e in its]
    acc = [e["probe"]["accuracy"] for e in its]
    low, high = zip(*(_interval(a, n) for a in acc))
    ax.errorbar(xs, acc, yerr=[[a - lo for a, lo in zip(acc, low)], [hi - a for a, hi in zip(acc, high)]],
                marker="o", capsize=3, label="probe accuracy (95% interval over test examples)")
    ref = evaluation.get("reference") or {}
    if isinstance(ref, dict) and "majority" in ref:
        ax.axhline(ref["majority"], ls="--", color="grey", label="majority class")
    return _finish(plt, fig, ax, "iteration (samples up to it)", "accuracy on the real test split")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def run_report(run_dir: Path) -> str:
    """The HTML page of a finished run."""
    d = RunDir(run_dir)
    if not d.metrics.is_file():
        raise DpsynthError(f"{d.root}: no metrics.json; report on a finished run (or resume it first)")
    privacy, metrics = _read(d.privacy), _read(d.metrics)
    history = metrics["iterations"]
    samples = [json.loads(line) for line in d.synthetic.read_text(encoding="utf-8").splitlines() if line.strip()]
    eps = privacy.get("epsilon")
    budget = privacy.get("epsilon_budget")
    parts = [f"<h1>dpsynth run: {html.escape(metrics['method'])}</h1>",
             f"<p>{len(samples)} synthetic samples; epsilon {'inf (NOT DP)' if eps is None else f'{eps:.4f}'} "
             f"at delta {privacy['delta']:g} (budget {budget if budget is not None else 'inf'}); "
             f"within budget: {privacy['within_budget']}.</p>"]
    if privacy.get("warning"):
        parts.append(f"<p class='warn'>{html.escape(privacy['warning'])}</p>")
    if privacy.get("audit"):
        parts.append(f"<p>Audit: {html.escape(privacy['audit']['line'])}</p>")

    parts.append("<h2>Privacy spent per release</h2>")
    parts.append(_table(["release", "mechanism", "noise", "sensitivity", "count", "sampling rate"],
                        [[e["name"], e["kind"], _fmt(_noise_of(e)),
                          _fmt(e.get("sensitivity", "")), e.get("count", 1),
                          _fmt(e.get("sampling_rate", ""))]
                         for e in privacy["events"]]))
    plot = _privacy_plot(history, budget)
    if plot:
        parts.append(f"<img alt='epsilon spent per iteration' src='data:image/png;base64,{plot}'/>")

    parts.append("<h2>Samples and PLM weights per iteration</h2>")
    plot = _samples_plot(history)
    if plot:
        parts.append(f"<img alt='samples and weights per iteration' src='data:image/png;base64,{plot}'/>")
    rows = [[h["iteration"], p, g["kept"], ", ".join(f"{k} {v}" for k, v in g.get("dropped", {}).items()) or "-",
             _fmt(h.get("weights_used", {}).get(p, ""))]
            for h in history if "generated" in h for p, g in h["generated"].items()]
    if rows:
        parts.append(_table(["iteration", "PLM", "kept", "dropped (reason)", "weight"], rows))

    releases = [(h["iteration"], name, r) for h in history for name, r in h.get("releases", {}).items()]
    parts.append("<h2>Signal to noise of each release (from noisy values only)</h2>")
    if releases:
        parts.append(_table(["iteration", "release", "entries", "noise", "share above 3 noise", "max / noise"],
                            [[t, name, r.get("entries", ""), _fmt(r.get("noise", "")),
                              _fmt(r.get("above_3_noise", "")), _fmt(r.get("max_over_noise", ""))]
                             for t, name, r in releases]))
        parts.append("<p>Entries far above the noise carry the private data's signal; when few are, the "
                     "release is mostly noise: fewer candidates per release, more records, a larger epsilon "
                     "or cluster-level votes (resample:) help.</p>")
    else:
        parts.append("<p>No release recorded a diagnostic (a run without noisy votes).</p>")

    parts.append("<h2>Downstream scores</h2>")
    if d.evaluation.is_file():
        evaluation = _read(d.evaluation)
        parts.append(f"<img alt='accuracy per iteration' src='data:image/png;base64,{_scores_plot(evaluation)}'/>")
    scores = metrics.get("evaluation") or {}
    final = [[name, _fmt(s["accuracy"]), _fmt(s["macro_f1"]), s["train_size"],
              "[{:.3f}, {:.3f}]".format(*_interval(s["accuracy"], s["test_size"]))]
             for name, s in scores.items() if isinstance(s, dict) and "accuracy" in s]
    if final:
        parts.append(_table(["set", "accuracy", "macro-F1", "train size", "95% interval (test examples)"], final))
    if not final and not d.evaluation.is_file():
        parts.append("<p>Not evaluated: run with evaluate: true, or score it with <code>dpsynth eval</code>.</p>")

    parts.append("<h2>Synthetic examples</h2>")
    by_label: dict[str, list[dict]] = {}
    for s in samples:
        by_label.setdefault(s["label"], []).append(s)
    for label, items in by_label.items():
        parts.append(f"<h3>{html.escape(label)} ({len(items)})</h3><ul>" + "".join(
            f"<li>{html.escape(x['text'])} <small>({html.escape(x['plm'])}, iteration {x['iteration']})</small></li>"
            for x in items[::max(1, len(items) // EXAMPLES_PER_LABEL)][:EXAMPLES_PER_LABEL]) + "</ul>")
    style = ("<style>body{font-family:sans-serif;max-width:60em;margin:auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}.warn{color:#b00;font-weight:bold}</style>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>dpsynth run report</title>{style}"
            f"{_RENDER_CHECK}</head><body>{''.join(parts)}</body></html>")


def _noise_of(event: dict) -> object:
    """An event's noise parameter, whichever its mechanism names it (sigma, noise multiplier, Laplace scale)."""
    return event.get("sigma", event.get("noise_multiplier", event.get("scale", f"eps {event.get('epsilon')}")))
