"""`dpsynth audit`: plant canaries, run the configured method on the private data with them, score, bound.

The audit directory belongs to the data holder: while the audited run is under way it holds the private
set with the canaries (`private-with-canaries.jsonl`, rebuilt identically on resume and deleted at the
end). What it leaves is the audited run (synthetic output, privacy.json with the audit next to the
claimed epsilon), `audit.json` and `canaries.jsonl` (the planted texts, their coins and scores: no private
record). The audited run resumes like any run, so an interrupted audit loses no paid-for generation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dpsynth.audit.bound import audit_scores
from dpsynth.audit.canaries import Canary, plant_canaries
from dpsynth.audit.signals import membership_scores
from dpsynth.config import RunConfig
from dpsynth.data.public import task_for
from dpsynth.embed.sentence import SentenceTransformerEmbedder
from dpsynth.errors import DpsynthError
from dpsynth.fs import RunDir, atomic_write_text
from dpsynth.private.dataset import load_private
from dpsynth.runs.config import dump_config, parse_config
from dpsynth.runs.engine import Run

DEFAULT_CANARIES = 64
PRIVATE_FILE = "private-with-canaries.jsonl"


def _audited_config(config: RunConfig, private_file: Path) -> RunConfig:
    """The same run on the private set with the included canaries (and no evaluation: the audit scores)."""
    task = task_for(config)
    raw = config.model_dump(mode="json")
    raw["data"] = {"private": str(private_file), "text_column": "text", "label_column": "label"}
    raw["task"] = {"text_kind": task.text_kind, "labels": task.labels, "description": task.description}
    raw["evaluate"] = False
    return parse_config(raw, "audited config")


def _write_private_with_canaries(config: RunConfig, canaries: list[Canary], path: Path, seed: int) -> None:
    records = load_private(config).records
    rows = [(t, y) for t, y in zip(records.texts, records.labels)] + [(c.text, c.label) for c in canaries
                                                                       if c.included]
    order = np.random.default_rng([seed, 0x5EED]).permutation(len(rows))
    atomic_write_text(path, "".join(json.dumps({"text": rows[i][0], "label": rows[i][1]}) + "\n" for i in order))


def run_audit(config: RunConfig, out: Path, *, canaries: int = DEFAULT_CANARIES, seed: int = 0,
              confidence: float = 0.95, reference_wall: float | None = None,
              progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Audit `config` in `out` (resumable); returns what audit.json holds.

    `reference_wall`: wall seconds of the run being audited (`--run DIR`), for the cost ratio.
    """
    if config.federated is not None and config.federated.partition in ("files", "nodes"):
        raise DpsynthError("an audit plants canaries in one private file; federated.partition "
                           f"'{config.federated.partition}' keeps the data with the parties: audit a simulation "
                           "with partition iid or dirichlet instead")
    if not 0.5 <= confidence < 1:
        raise DpsynthError(f"--confidence must be in [0.5, 1), got {confidence}")
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    planted = plant_canaries(task_for(config), canaries, seed)
    private_file = out / PRIVATE_FILE
    run_dir = RunDir(out / "run")
    if not run_dir.is_finished():
        _write_private_with_canaries(config, planted, private_file, seed)
        audited = _audited_config(config, private_file)
        runner = (Run.resume(run_dir.root, progress=progress) if run_dir.is_started()
                  else Run.create(audited, run_dir.root, progress=progress))
        runner.execute()
    private_file.unlink(missing_ok=True)
    run_seconds = json.loads(run_dir.metrics.read_text())["timings"]["wall"]

    synthetic = [json.loads(line)["text"] for line in run_dir.synthetic.read_text().splitlines() if line.strip()]
    embedder = SentenceTransformerEmbedder(config.embedder)
    texts = [c.text for c in planted]
    scores = membership_scores(texts, synthetic, embedder.encode(texts), embedder.encode(synthetic))
    privacy = json.loads(run_dir.privacy.read_text())
    claimed = privacy.get("epsilon")
    result = audit_scores(scores, np.array([c.included for c in planted]), delta=privacy["delta"],
                          beta=1 - confidence, seed=seed)
    wall = time.perf_counter() - t0
    result = {
        "claimed_epsilon": claimed,
        **result,
        "exceeds_claim": claimed is not None and result["epsilon_lower_bound"] > claimed,
        "method": config.method,
        "seed": seed,
        "synthetic_samples": len(synthetic),
        "cost": {"audited_run_seconds": run_seconds, "audit_seconds": wall,
                 **({"ratio_to_audited_run": wall / reference_wall} if reference_wall else {})},
    }
    atomic_write_text(out / "audit.json", json.dumps(result, indent=2))
    atomic_write_text(out / "canaries.jsonl", "".join(
        json.dumps({"text": c.text, "label": c.label, "kind": c.kind, "included": c.included,
                    **{k: float(v[i]) for k, v in scores.items()}}) + "\n" for i, c in enumerate(planted)))
    atomic_write_text(out / "config.yaml", dump_config(config))
    privacy["audit"] = audit_summary(result)
    atomic_write_text(run_dir.privacy, json.dumps(privacy, indent=2))
    return result


def audit_summary(result: dict[str, Any]) -> dict[str, Any]:
    """What privacy.json carries next to the claimed epsilon."""
    claimed = result["claimed_epsilon"]
    return {
        "epsilon_lower_bound": result["epsilon_lower_bound"],
        "confidence": result["confidence"],
        "canaries": result["canaries"],
        "claimed_epsilon": claimed,
        "line": audit_line(result),
    }


def audit_line(result: dict[str, Any]) -> str:
    claimed = result["claimed_epsilon"]
    claim = "inf" if claimed is None else f"{claimed:.2f}"
    best = result["best"]
    line = (f"claimed eps {claim}; audit lower bound {result['epsilon_lower_bound']:.2f} "
            f"({100 * result['confidence']:.0f}% confidence, {result['canaries']} canaries, best signal "
            f"{best['signal']}: {best['right']}/{best['guessed']} guesses right)")
    if result["exceeds_claim"]:
        line += ": THE RUN LEAKS MORE THAN IT CLAIMS"
    else:
        line += f"; {result['canaries']} canaries cannot refute more than {result['largest_possible_bound']:.2f}"
    return line
