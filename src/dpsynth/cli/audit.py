"""`dpsynth audit`: an empirical lower bound on a run configuration's epsilon from planted canaries."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dpsynth.errors import DpsynthError
from dpsynth.fs import RunDir
from dpsynth.runs.config import load_config


def audit(
    config: Path | None = typer.Argument(None, help="Run configuration (YAML) to audit."),
    run_dir: Path | None = typer.Option(None, "--run", help="Audit the configuration of this existing run."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Audit directory (default: RUN/audit or "
                                       "audits/CONFIG); an interrupted audit resumes there."),
    canaries: int = typer.Option(64, "--canaries", min=2, help="Canaries planted (each in or out by a fair coin)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the canaries and their coins (recorded in audit.json)."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the lower bound."),
) -> None:
    """Plant canaries, run the method on the private data with them, and bound epsilon from below."""
    from dpsynth.audit.run_audit import audit_line, run_audit
    from dpsynth.cli.runs import console, progress_bars

    if (config is None) == (run_dir is None):
        raise DpsynthError("give either CONFIG or --run RUN_DIR")
    if not 0.5 <= confidence < 1:
        raise DpsynthError(f"--confidence must be in [0.5, 1), got {confidence}")
    reference_wall = None
    if run_dir is not None:
        d = RunDir(run_dir)
        if not d.config.is_file():
            raise DpsynthError(f"{run_dir}: no config.yaml; not a dpsynth run directory")
        cfg = load_config(d.config, other_methods="drop")
        if d.metrics.is_file():
            reference_wall = json.loads(d.metrics.read_text())["timings"]["wall"]
        out = out or d.root / "audit"
    else:
        assert config is not None
        cfg = load_config(config)
        out = out or Path("audits") / config.stem
    console.print(f"audit directory: {out} (the data holder's: its run/ is computed from the private records and "
                  "the canaries; share audit.json)")
    with progress_bars() as (_, report):
        result = run_audit(cfg, out, canaries=canaries, seed=seed, confidence=confidence,
                           reference_wall=reference_wall, progress=report)
    console.rule("dpsynth audit")
    console.print(audit_line(result))
    for name, signal in result["signals"].items():
        auc = "n/a" if signal["auc"] is None else f"{signal['auc']:.3f}"
        console.print(f"  {name}: AUC {auc}; bounds {[round(g['epsilon_lower_bound'], 2) for g in signal['guesses']]}")
    ratio = result["cost"].get("ratio_to_audited_run")
    if ratio is not None:
        console.print(f"cost: {ratio:.2f}x the audited run's wall time")
    console.print(f"written: {out}/audit.json, canaries.jsonl, run/privacy.json (with the audit)")
    console.print("[dim]The bound is a floor, not an estimate: a low value says this attack found little, not that "
                  "nothing leaks; a value above the claim means the run leaks more than its guarantee allows.[/dim]")
