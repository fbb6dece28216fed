"""What a finished run writes: synthetic.jsonl and synthetic.parquet, privacy.json (checked before release),
README.md (the dataset card with the privacy statement), metrics.json."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from dpsynth.config import RunConfig
from dpsynth.data.records import LabelledTexts, TaskSpec
from dpsynth.embed.sentence import Embedder, embed_test_set
from dpsynth.errors import DpsynthError
from dpsynth.evaluate.downstream import probe_scores
from dpsynth.fs import RunDir, atomic_write_bytes, atomic_write_text
from dpsynth.llm.base import Usage
from dpsynth.methods.base import StepContext
from dpsynth.methods.generation import SyntheticSample, sample_weights
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.report import privacy_report, write_privacy_report
from dpsynth.runs.card import PARQUET, dataset_card

# time inside the data holder, which depends on the private set's size: its releases (voting, training) and its
# own work outside them (loading and checking the private records, the label counts, a federation's shards)
DATA_HOLDER_TIME = "data_holder"
PRIVATE_TIMINGS = ("voting", "training", DATA_HOLDER_TIME)


def write_synthetic(run_dir: RunDir, samples: list[SyntheticSample]) -> None:
    weighted = any(x.weight is not None for x in samples)
    rows = [{"text": x.text, "label": x.label, "plm": x.plm, "iteration": x.iteration,
             **({"weight": x.weight} if weighted else {})} for x in samples]
    atomic_write_text(run_dir.synthetic, "".join(json.dumps(row) + "\n" for row in rows))
    atomic_write_bytes(run_dir.root / PARQUET, parquet_bytes(rows))


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    """The synthetic rows as a Parquet file (columns text, label, plm, iteration, and weight when weighted)."""
    import io

    import pandas as pd

    buf = io.BytesIO()
    columns = ["text", "label", "plm", "iteration"] + (["weight"] if rows and "weight" in rows[0] else [])
    frame = pd.DataFrame(rows, columns=columns).astype({"iteration": "int64"})
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def write_card(run_dir: RunDir, config: RunConfig, task: TaskSpec, report: dict,
               samples: list[SyntheticSample]) -> None:
    weighted = any(x.weight is not None for x in samples)
    card = dataset_card(config, task, report, [x.label for x in samples], weighted=weighted)
    atomic_write_text(run_dir.root / "README.md", card)


def checked_privacy(ledger: PrivacyLedger, noise_mode: str, plan: dict | None, private_records_read: bool = True,
                    run_delta: float | None = None) -> dict:
    """The privacy report, computed (with the accountants' cross-check) and checked against the budget before any
    output is written: a run over its budget writes nothing. `private_records_read` says whether the data holder
    opened the private data at all (a method without private releases, e.g. zero-shot or FuseGen, never does)."""
    report = {**privacy_report(ledger, noise_mode=noise_mode, plan=plan, run_delta=run_delta),
              "private_records_read": private_records_read}
    if not report["within_budget"]:
        raise DpsynthError(f"the ledger exceeds the budget at release (epsilon {report['epsilon']} of "
                           f"{report['epsilon_budget']}): nothing was written; this is a dpsynth bug, please report it")
    return report


def write_privacy(run_dir: RunDir, report: dict) -> None:
    write_privacy_report(run_dir.privacy, report)


def evaluate_sets(ctx: StepContext, embedder: Embedder, test: LabelledTexts,
                  sets: dict[str, list[SyntheticSample]], seed: int) -> dict[str, Any]:
    """Probe accuracy on the real test split for the final set and the method's reference sets. Its time is
    evaluation less the synthetic sets' embedding (timed as embedding: counted once)."""
    t0 = time.perf_counter()
    embedding_before = ctx.timings.get("embedding", 0.0)
    test_emb = embed_test_set(embedder, test.texts)
    out: dict[str, Any] = {"classifier": "logistic regression on sentence embeddings"}
    for name, subset in sets.items():
        emb = ctx.embed_synthetic(subset)
        # per test example (public test split): lets a bench pair the final set with each reference set
        out[name] = probe_scores(emb, [x.label for x in subset], test_emb, test.labels, seed=seed,
                                 sample_weight=sample_weights(subset))
    ctx.add_time("evaluation", t0)
    ctx.timings["evaluation"] -= ctx.timings.get("embedding", 0.0) - embedding_before
    return out


def write_metrics(run_dir: RunDir, *, method: str, history: list[dict], samples: list[SyntheticSample],
                  usage: dict[str, Usage], timings: dict[str, float], wall: float, evaluation: dict | None,
                  federated: dict | None) -> dict:
    metrics: dict[str, Any] = {
        "method": method,
        "iterations": history,
        "samples_per_plm": {k: sum(1 for x in samples if x.plm == k) for k in usage},
        "usage": {k: {**asdict(u), "cost": u.cost} for k, u in usage.items()},
        "timings": {**timings, "wall": wall, "generator_calls": sum(u.generation_seconds for u in usage.values())},
        "evaluation": evaluation,
    }
    if federated is not None:
        metrics["federated"] = federated
    # metrics.json is meant to be shared: it leaves out the time spent on private data (it grows with the
    # number of private records); the caller, the data holder, still gets it in the returned metrics
    # and its wall time is the run's minus that private time
    timings = metrics["timings"]
    private = sum(timings.get(k, 0.0) for k in PRIVATE_TIMINGS)
    shared = {**metrics, "timings": {**{k: v for k, v in timings.items() if k not in PRIVATE_TIMINGS},
                                     "wall": timings["wall"] - private}}
    if federated is not None:  # a round's time holds the parties' work on their records: the same private time
        shared["federated"] = {**{k: v for k, v in federated.items() if k != "aggregation_seconds"},
                               "rounds": _untimed(federated["rounds"])}
        shared["iterations"] = [{**h, "federated_rounds": _untimed(h["federated_rounds"])}
                                if "federated_rounds" in h else h for h in history]
    atomic_write_text(run_dir.metrics, json.dumps(shared, indent=2))
    return metrics


def _untimed(rounds: list[dict]) -> list[dict]:
    """Federated rounds without their time (the parties' work on their records is in it)."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rounds]


def federated_summary(config, plan_description: dict, history: list[dict]) -> dict:
    """Communication per party per round (the WASP paper's Table 11, measured)."""
    fed = config.federated
    rounds = [r for h in history for r in h.get("federated_rounds", [])]
    groups: dict[str, dict[str, float]] = {}
    for r in rounds:  # parties of one role answer the same rounds, so their bytes add up per role
        g = groups.setdefault(r.get("parties", "all"), {"rounds": 0, "download_bytes_per_party": 0.0,
                                                         "upload_bytes_per_party": 0.0})
        g["rounds"] += 1
        g["download_bytes_per_party"] += r["download_bytes_per_party"]
        g["upload_bytes_per_party"] += r["upload_bytes_per_party"]
    votes = next((k for k in plan_description["knobs"] if k["releases"]), None)
    return {
        "parties": fed.parties, "aggregation": fed.aggregation, "partition": fed.partition,
        "alpha": fed.alpha if fed.partition == "dirichlet" else None, "min_parties": plan_description["min_parties"],
        "unit": fed.unit, "sigma_sum": votes["value"] if votes else None,
        "sigma_per_party": (votes["party_value"] or 0.0) if votes else 0.0,
        "rounds": rounds,
        "download_bytes_per_party": sum(r["download_bytes_per_party"] for r in rounds),
        "upload_bytes_per_party": sum(r["upload_bytes_per_party"] for r in rounds),
        "aggregation_seconds": sum(r["seconds"] for r in rounds),
        **({"by_round_kind": groups} if len(groups) > 1 else {}),
    }
