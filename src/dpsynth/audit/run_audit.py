"""`dpsynth audit`: plant canaries, run the configured method on the private data with them, score, bound.

The audit directory belongs to the data holder. The private set with the canaries is built in memory and
handed to the audited run's data holder (`data.in_memory`): it is never written. A resume rebuilds it
identically (`audit-params.json` pins the seed, the number of canaries and the set's hash, and a resume
that would rebuild a different set is refused). The audited run in `run/`
is a release computed from the real private records (plus canaries): its output costs privacy like the
run it audits, so share `audit.json`, not `run/`. `canaries.jsonl` holds the planted texts, their coins
and scores (no private record). The audited run resumes like any run: an interrupted audit loses no
paid-for generation.

Person-level runs (`data.person_column`, k = `privacy.max_records_per_user`): each canary is a person of its
own with k identical records, the strongest person the run promises to hide, and the real records keep
their persons (unbounded: the audited run's data holder bounds them like the run's own would). The audit
then tests the person-level claim.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.audit.bound import audit_scores
from dpsynth.audit.canaries import Canary, plant_canaries
from dpsynth.audit.signals import membership_scores
from dpsynth.config import RunConfig
from dpsynth.data.public import task_for
from dpsynth.embed.sentence import SentenceTransformerEmbedder
from dpsynth.errors import DpsynthError
from dpsynth.fs import RunDir, atomic_write_text, lock_run_dir
from dpsynth.privacy.accountant import Adjacency
from dpsynth.private.dataset import load_private, read_private_file
from dpsynth.runs.build import check_before_start
from dpsynth.runs.config import dump_config, parse_config
from dpsynth.runs.engine import Run, holds_a_run
from dpsynth.runs.planning import plan_privacy

DEFAULT_CANARIES = 64
PARAMS_FILE = "audit-params.json"


def _audited_config(config: RunConfig) -> RunConfig:
    """The same run on the private set with the included canaries, given in memory (and no evaluation: the
    audit scores)."""
    task = task_for(config)
    raw = config.model_dump(mode="json")
    raw["data"] = {"in_memory": True, "text_column": "text", "label_column": "label",
                   **({"person_column": "person"} if config.data.person_column else {})}
    raw["task"] = {"text_kind": task.text_kind, "labels": task.labels, "description": task.description}
    raw["evaluate"] = False
    return parse_config(raw, "audited config")


def _private_with_canaries(config: RunConfig, canaries: list[Canary], seed: int) -> list[dict[str, str]]:
    """The real records and every canary shuffled once, then the held-out canaries dropped: the records'
    order does not depend on the coins, so adding a canary changes nothing but its own presence. With a
    person column, each canary is k records of a new person."""
    if config.data.person_column is None:
        records, persons = load_private(config).records, None
    else:
        loaded = read_private_file(config)
        records, persons = loaded.records, loaded.persons
    copies = config.privacy.max_records_per_user if persons is not None else 1
    rows = [(t, y, None if persons is None else persons[i], True)
            for i, (t, y) in enumerate(zip(records.texts, records.labels))]
    rows += [(c.text, c.label, None if persons is None else f"dpsynth-canary-{seed}-{j}", c.included)
             for j, c in enumerate(canaries) for _ in range(copies)]
    order = np.random.default_rng([seed, 0x5EED]).permutation(len(rows))
    return [{"text": rows[i][0], "label": rows[i][1], **({} if rows[i][2] is None else {"person": rows[i][2]})}
            for i in order if rows[i][3]]


def _check_params(out: Path, params: dict[str, Any]) -> None:
    """An audit directory belongs to one (seed, canaries, private set): refuse to resume with others."""
    path = out / PARAMS_FILE
    if path.exists():
        before = json.loads(path.read_text())
        changed = [k for k in params if before.get(k) != params[k]]
        if len(changed) > 1:  # other canaries make another file: name the setting, not its consequence
            changed.remove("private_sha256")
        if changed:
            what = ", ".join("the private data" if k == "private_sha256" else f"--{k}" for k in changed)
            raise DpsynthError(f"{out}: {what} changed since this audit started; its run used other canaries. "
                               "Use another -o directory (or the audit's own settings, in audit-params.json)")
    else:
        atomic_write_text(path, json.dumps(params, indent=2))


def run_audit(config: RunConfig, out: Path, *, canaries: int = DEFAULT_CANARIES, seed: int = 0,
              confidence: float = 0.95, reference_wall: float | None = None,
              progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Audit `config` in `out` (resumable); returns what audit.json holds.

    `reference_wall`: wall seconds of the run being audited (`--run DIR`), for the cost ratio.
    """
    if config.federated is not None and config.federated.partition in ("files", "nodes"):
        raise DpsynthError("an audit plants canaries in one central private set; federated.partition "
                           f"'{config.federated.partition}' keeps the data with the parties: audit a simulation "
                           "with partition iid or dirichlet instead")
    if config.privacy.adjacency != Adjacency.ADD_REMOVE:
        raise DpsynthError("the audit adds or removes canaries, which tests add/remove adjacency; this run is "
                           "accounted under replace adjacency, whose epsilon does not bound add/remove's: audit it "
                           "with privacy.adjacency: add_remove")
    if not 0.5 <= confidence < 1:
        raise DpsynthError(f"--confidence must be in [0.5, 1), got {confidence}")
    t0 = time.perf_counter()
    out = Path(out)
    # what the audited run would find wrong with the user's own data, model or device fails before the audit's
    # folder exists (and names the user's file, not the canaried copy the run is handed in memory); a finished
    # audit is only scored again, and needs none of it
    holder_time = 0.0  # reading the private records: it grows with M, so audit.json's cost leaves it out
    if not RunDir(out / "run").is_finished():
        started = time.perf_counter()
        check_before_start(plan_privacy(config.model_copy(update={"evaluate": False})))  # the audit scores itself
        holder_time += time.perf_counter() - started
    lock = lock_run_dir(RunDir(out))  # one audit per directory: its run and privacy.json are shared
    try:
        planted = plant_canaries(task_for(config), canaries, seed)
        run_dir = RunDir(out / "run")
        started = time.perf_counter()
        rows = _private_with_canaries(config, planted, seed)
        text = "".join(json.dumps(row) + "\n" for row in rows)
        digest = hashlib.sha256(text.encode()).hexdigest()
        holder_time += time.perf_counter() - started
        _check_params(out, {"seed": seed, "canaries": canaries, "private_sha256": digest})
        run_time = 0.0
        if not run_dir.is_finished():
            started = time.perf_counter()
            frame = pd.DataFrame(rows, columns=["text", "label", *(["person"] if config.data.person_column else [])])
            try:
                runner = (Run.resume(run_dir.root, progress=progress, private=frame) if holds_a_run(run_dir.root)
                          else Run.create(_audited_config(config), run_dir.root, progress=progress, private=frame))
                runner.execute()
            finally:
                run_time = time.perf_counter() - started
        result = _score(config, run_dir, planted, seed=seed, confidence=confidence)
        # the audited run's wall (across interruptions; the run's metrics leave its data holder's time out) plus
        # everything else the audit did in this call, less its own reading of the private records
        wall = result["cost"]["audited_run_seconds"] + time.perf_counter() - t0 - run_time - holder_time
        result["cost"]["audit_seconds"] = wall
        if reference_wall:
            result["cost"]["ratio_to_audited_run"] = wall / reference_wall
        atomic_write_text(out / "audit.json", json.dumps(result, indent=2))
        atomic_write_text(out / "config.yaml", dump_config(config))
        privacy = json.loads(run_dir.privacy.read_text())
        privacy["audit"] = audit_summary(result)
        atomic_write_text(run_dir.privacy, json.dumps(privacy, indent=2))
        return result
    finally:
        if lock is not None:
            lock.close()


def _score(config: RunConfig, run_dir: RunDir, planted: list[Canary], *, seed: int,
           confidence: float) -> dict[str, Any]:
    """Membership scores of every canary from the synthetic output alone, and the bound they give."""
    synthetic = [json.loads(line)["text"] for line in run_dir.synthetic.read_text().splitlines() if line.strip()]
    embedder = SentenceTransformerEmbedder(config.embedder)
    texts = [c.text for c in planted]
    scores = membership_scores(texts, synthetic, embedder.encode(texts), embedder.encode(synthetic))
    claimed = json.loads(run_dir.privacy.read_text()).get("epsilon")
    # the run's full delta (the SecAgg+ clipping reserve included), the one its guarantee is stated at
    result = audit_scores(scores, np.array([c.included for c in planted]), delta=config.privacy.delta,
                          beta=1 - confidence, seed=seed)
    atomic_write_text(run_dir.root.parent / "canaries.jsonl", "".join(
        json.dumps({"text": c.text, "label": c.label, "kind": c.kind, "included": c.included,
                    **{k: float(v[i]) for k, v in scores.items()}}) + "\n" for i, c in enumerate(planted)))
    return {
        "claimed_epsilon": claimed,
        **result,
        "exceeds_claim": claimed is not None and result["epsilon_lower_bound"] > claimed,
        "method": config.method,
        "seed": seed,
        "synthetic_samples": len(synthetic),
        "cost": {"audited_run_seconds": json.loads(run_dir.metrics.read_text())["timings"]["wall"]},
    }


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
    digits = 4 if result["exceeds_claim"] else 2  # a bound just above its claim shows the difference
    claim = "inf" if claimed is None else f"{claimed:.{digits}f}"
    best = result["best"]
    # a lower bound is shown rounded down: 1.996 printed as 2.00 would claim more than was shown
    scale = 10 ** digits
    shown = math.floor(scale * result["epsilon_lower_bound"] + 1e-9) / scale  # 0.29 stays 0.29 (float error)
    line = (f"claimed eps {claim}; audit lower bound {shown:.{digits}f} "
            f"({100 * result['confidence']:.0f}% confidence, {result['canaries']} canaries, best signal "
            f"{best['signal']}: {best['right']}/{best['guessed']} guesses right)")
    if result["exceeds_claim"]:
        line += ": THE RUN LEAKS MORE THAN IT CLAIMS"
    else:
        line += f"; {result['canaries']} canaries cannot refute more than {result['largest_possible_bound']:.2f}"
    return line
