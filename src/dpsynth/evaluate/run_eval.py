"""`dpsynth eval`: score a finished run's synthetic data against a real test set.

Downstream classifier (probe or fine-tuned encoder) trained on the synthetic
data only; distribution metrics against the real test set; per-label counts;
all of it per iteration (cumulative) where the method iterates. Written to
`eval.json` in the run directory.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
import yaml

from dpsynth.data.records import LabelledTexts
from dpsynth.embed.sentence import (
    DEFAULT_EMBEDDER,
    CachedEmbedder,
    SentenceTransformerEmbedder,
    embed_test_set,
)
from dpsynth.errors import DpsynthError
from dpsynth.evaluate.distribution import distribution_report, knn_squared_radii
from dpsynth.evaluate.downstream import probe_scores
from dpsynth.evaluate.self_boosting import self_boosting_weights
from dpsynth.fs import RunDir, atomic_write_text

# how the final set's classifier weights its samples: the run's own weights if it wrote any (FuseGen's), none,
# or FuseGen's self-boosting weights computed here for any method's set (post-processing: no privacy cost)
SampleWeights = Literal["auto", "none", "swa"]


def read_synthetic(run_dir: Path) -> list[dict]:
    """The run's synthetic samples; a damaged file is a one-line error naming the file and line."""
    path = RunDir(run_dir).synthetic
    if not path.is_file():
        raise DpsynthError(f"{run_dir}: no synthetic.jsonl; is the run finished?")
    fix = ("the file is cut short or damaged: copy it again from the run's machine, or rerun; "
           "each line must be one JSON sample")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DpsynthError(f"{path}, line {line}: not valid UTF-8; {fix}") from err
    rows = []
    for number, row_text in enumerate(text.splitlines(), start=1):
        if not row_text.strip():
            continue
        try:
            row = json.loads(row_text)
        except json.JSONDecodeError as err:
            raise DpsynthError(
                f"{path}, line {number}: not valid JSON ({err.msg}, column {err.colno}); {fix}"
            ) from err
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or "label" not in row:
            raise DpsynthError(f"{path}, line {number}: not a synthetic sample (a JSON object with text and label); "
                               f"{fix}")
        rows.append(row)
    return rows


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """A run's settings (embedder, seed) and its synthetic samples, checked; cheap: no model is loaded."""
    run_dir = Path(run_dir)
    config = _run_settings(RunDir(run_dir))
    rows = read_synthetic(run_dir)
    if not rows:
        raise DpsynthError(f"{run_dir}: synthetic.jsonl is empty")
    return config, rows


def _run_settings(run_dir: RunDir) -> dict:
    """The embedder, seed and data section (its test set and columns) of a run, from its resolved config.yaml
    (the rest is not needed here)."""
    if not run_dir.config.is_file():
        raise DpsynthError(f"{run_dir.root}: no config.yaml; not a dpsynth run directory")
    try:
        raw = yaml.safe_load(run_dir.config.read_text(encoding="utf-8")) or {}
        if not isinstance(raw, dict):
            raise TypeError("not a YAML mapping")
        data = raw.get("data") or {}
        if not isinstance(data, dict):
            raise TypeError("data: not a YAML mapping")
        return {"embedder": str(raw.get("embedder", DEFAULT_EMBEDDER)), "seed": int(raw.get("seed", 0)),
                "data": data}
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, TypeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DpsynthError(
            f"{run_dir.config}: not a valid run config ({reason}); the run directory is damaged"
        ) from err


def evaluate_run(
    run_dir: Path,
    test: LabelledTexts,
    *,
    classifier: str = "probe",
    with_mauve: bool = True,
    per_iteration: bool = True,
    weights: SampleWeights = "auto",
) -> dict:
    run_dir = Path(run_dir)
    config, rows = load_run(run_dir)  # a damaged run fails here, before any model loads
    embedder = SentenceTransformerEmbedder(config["embedder"])
    synth = CachedEmbedder(embedder, RunDir(run_dir).synthetic_embeddings)
    test_emb = embed_test_set(embedder, test.texts)
    emb = synth.encode([r["text"] for r in rows])
    iterations = sorted({r.get("iteration", 0) for r in rows})
    cutoffs = iterations if per_iteration else iterations[-1:]
    final_weights, used = _final_weights(rows, emb, weights, config["seed"])
    test_sq_radii = knn_squared_radii(test_emb)  # the test set's k-NN balls, shared by every cut-off
    out: dict = {"test_size": len(test), "reference": "real test set (not the private data)",
                 "sample_weights": used, "iterations": []}
    for last in cutoffs:
        idx = [i for i, r in enumerate(rows) if r.get("iteration", 0) <= last]
        texts = [rows[i]["text"] for i in idx]
        labels = [rows[i]["label"] for i in idx]
        entry = {
            "up_to_iteration": last,
            "samples": len(idx),
            "per_label": dict(Counter(labels)),
            # the weights belong to the final set: earlier cut-offs are scored unweighted
            "probe": probe_scores(emb[idx], labels, test_emb, test.labels, seed=config["seed"],
                                  sample_weight=final_weights if last == cutoffs[-1] else None),
            **distribution_report(emb[idx], texts, test_emb, with_mauve=with_mauve, seed=config["seed"],
                                 real_sq_radii=test_sq_radii),
        }
        out["iterations"].append(entry)
    for entry in out["iterations"][:-1]:
        entry["probe"].pop("correct")  # kept for the final set only (paired comparisons in bench)
        entry["probe"].pop("predicted")
    out["final"] = out["iterations"][-1]
    atomic_write_text(RunDir(run_dir).evaluation, json.dumps(out, indent=2, default=float))
    return add_finetuned(run_dir, test) if classifier == "finetune" else out


def _final_weights(rows: list[dict], emb: np.ndarray, mode: SampleWeights, seed: int
                   ) -> tuple[np.ndarray | None, str]:
    """The final set's sample weights and where they came from ("run", "swa" or "none")."""
    has = [r.get("weight") is not None for r in rows]
    if mode == "none" or (mode == "auto" and not any(has)):
        return None, "none"
    if mode == "auto":
        if not all(has):
            raise DpsynthError("synthetic.jsonl gives a weight to some samples only; the file is damaged")
        return np.array([float(r["weight"]) for r in rows]), "run"
    labels = sorted({r["label"] for r in rows})
    y = np.array([labels.index(r["label"]) for r in rows])
    return self_boosting_weights(emb, y, len(labels), seed=seed).weights, "swa"


def evaluated_weights(run_dir: Path) -> str | None:
    """Which weights an evaluated run's eval.json used (None: not evaluated)."""
    path = RunDir(run_dir).evaluation
    return json.loads(path.read_text()).get("sample_weights", "none") if path.is_file() else None


def add_finetuned(run_dir: Path, test: LabelledTexts) -> dict:
    """Adds the fine-tuned encoder's scores on the final set to an evaluated run's eval.json (kept apart from
    `evaluate_run` so that a bench can add the slower classifier to runs it already scored with the probe)."""
    from dpsynth.evaluate.finetune_classifier import FinetuneSettings, finetune_scores

    config, rows = load_run(run_dir)
    out = json.loads(RunDir(run_dir).evaluation.read_text())
    if out.get("test_size") != len(test):
        raise DpsynthError(f"{run_dir}: eval.json was scored on another test set ({out.get('test_size')} examples, "
                           f"not {len(test)}); run dpsynth eval again")
    weights = None
    if out.get("sample_weights", "none") != "none":  # the probe's weights, for the same final set
        emb = CachedEmbedder(SentenceTransformerEmbedder(config["embedder"]), RunDir(run_dir).synthetic_embeddings)
        weights, _ = _final_weights(rows, emb.encode([r["text"] for r in rows]),
                                    "auto" if out["sample_weights"] == "run" else "swa", config["seed"])
    out["final"]["finetuned_encoder"] = finetune_scores(
        [r["text"] for r in rows], [r["label"] for r in rows], test.texts, test.labels,
        FinetuneSettings(seed=config["seed"]), sample_weight=weights,
    )
    atomic_write_text(RunDir(run_dir).evaluation, json.dumps(out, indent=2, default=float))
    return out


def summary_rows(result: dict) -> list[str]:
    lines = []
    for e in result["iterations"]:
        mauve = f", MAUVE {e['mauve']:.3f}" if "mauve" in e else ""
        lines.append(
            f"iteration <= {e['up_to_iteration']}: n={e['samples']}, accuracy {e['probe']['accuracy']:.4f}, "
            f"macro-F1 {e['probe']['macro_f1']:.4f}, FID {_num(e['fid'])}{mauve}, precision {e['precision']:.3f}, "
            f"recall {e['recall']:.3f}, distinct-2 {e['distinct_2']:.3f}"
        )
    ft = result["final"].get("finetuned_encoder")
    if ft:
        lines.append(f"fine-tuned encoder: accuracy {ft['accuracy']:.4f}, macro-F1 {ft['macro_f1']:.4f}")
    return lines




def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
