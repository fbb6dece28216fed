"""The privacy report: everything a user needs to recompute and trust the epsilon.

`privacy.json` lists every event, the accountant and its settings, epsilon at
delta with the RDP cross-check, the assumptions, the noise mode, and what the
method's paper would have used for the same setting. `summary_lines` renders
the same content for the terminal.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

from dpsynth.privacy.accountant import PLD_DISCRETIZATION, gaussian_mu
from dpsynth.privacy.ledger import PrivacyLedger, atomic_write_text
from dpsynth.privacy.plans import ReleasePlan


def privacy_report(
    ledger: PrivacyLedger,
    *,
    noise_mode: str,
    plan: ReleasePlan | None = None,
    sigma: float | None = None,
) -> dict[str, Any]:
    spent = ledger.spent()
    private = ledger.is_private
    report: dict[str, Any] = {
        # JSON has no infinity: a non-private run reports epsilon null and says so.
        "differentially_private": private,
        "epsilon": spent.epsilon if private else None,
        "delta": ledger.delta,
        "epsilon_budget": ledger.epsilon_budget if math.isfinite(ledger.epsilon_budget) else None,
        "within_budget": spent.epsilon <= ledger.epsilon_budget * (1 + 1e-6),
        "accountant": {
            "primary": f"PLD (dp-accounting {version('dp-accounting')}), pessimistic, "
            f"discretisation {PLD_DISCRETIZATION:g}",
            "cross_check": "RDP (dp-accounting), an upper bound",
            "epsilon_rdp": spent.epsilon_rdp if private else None,
            "gaussian_dp_mu": gaussian_mu(ledger.events) or None,
        },
        "assumptions": ledger.assumptions.model_dump(mode="json"),
        "noise": {
            "mode": noise_mode,
            "for_release": not noise_mode.startswith("seeded"),
        },
        "events": ledger.to_dict()["events"],
    }
    if not private:
        report["non_private_releases"] = list(ledger.non_private_releases)
        report["warning"] = "NOT DP: votes were released without noise (epsilon = inf reference run)"
    if plan is not None and sigma and math.isfinite(ledger.epsilon_budget):
        paper = plan.paper(ledger.epsilon_budget, ledger.delta)
        report["plan"] = {
            "method": plan.method,
            "iterations": plan.iterations,
            "noisy_releases": plan.noisy_releases,
            "sensitivity_l2": plan.sensitivity,
            "sigma_per_release": sigma,
            "parties": plan.parties,
            "party_sigma": plan.party_sigma(sigma) if plan.parties > 1 else None,
        }
        report["paper_formula"] = {
            **asdict(paper),
            "epsilon_of_paper_sigma": (
                plan.epsilon_for(paper.sigma_for_target, ledger.delta) if paper.sigma_for_target else None
            ),
        }
    return report


def write_privacy_report(path: Path, report: dict[str, Any]) -> None:
    import json

    atomic_write_text(path, json.dumps(report, indent=2))


def summary_lines(report: dict[str, Any]) -> list[str]:
    acc = report["accountant"]
    if not report["differentially_private"]:
        return [report["warning"], f"un-noised releases: {', '.join(report['non_private_releases'])}"]
    lines = [
        f"epsilon spent: {report['epsilon']:.4f} at delta={report['delta']:g} "
        f"(budget {report['epsilon_budget'] or 'inf'}; RDP cross-check {_fmt(acc['epsilon_rdp'])})",
        f"accountant: {acc['primary']}",
        f"noise: {report['noise']['mode']}",
        "assumptions: " + "; ".join(f"{k}={v}" for k, v in report["assumptions"].items()),
    ]
    plan = report.get("plan")
    if plan:
        lines.append(
            f"{plan['noisy_releases']} noisy releases of {plan['method']} votes, L2 sensitivity "
            f"{plan['sensitivity_l2']:.5f}, sigma {plan['sigma_per_release']:.4f} each"
        )
    paper = report.get("paper_formula")
    if paper and paper.get("sigma_for_target"):
        lines.append(
            f"the paper's formula would use sigma {paper['sigma_for_target']:.4f} "
            f"(sensitivity {paper['sensitivity']:g}); at that sigma the true epsilon is "
            f"{_fmt(paper['epsilon_of_paper_sigma'])}"
        )
    lines.append(f"events: {len(report['events'])} (listed in privacy.json)")
    return lines


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
