"""The privacy report: everything a user needs to recompute and trust the epsilon.

`privacy.json` lists every event, the accountant and its settings, epsilon at
delta with the RDP cross-check, the assumptions, the noise mode, and what the
method's paper would have used for the same setting. `summary_lines` renders
the same content for the terminal.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dpsynth.fs import atomic_write_text
from dpsynth.privacy.accountant import (
    epsilon_tight,
    gaussian_mu,
    membership_test_power,
    primary_accountant,
    scope_groups,
)
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.mechanisms import DPSGD_NOISE


def privacy_report(ledger: PrivacyLedger, *, noise_mode: str, plan: dict[str, Any] | None = None,
                   run_delta: float | None = None) -> dict[str, Any]:
    """The report of a finished run; `plan` is the run's schedule as described by its planner. `run_delta`: the
    delta the run's guarantee holds at, where the accountant's is smaller (a SecAgg+ federation keeps a share of
    delta for the chance that clipping changes a noisy vote: federated/clipping.py). The report's `delta` is the
    guarantee's, never the smaller one, and `accounting_delta` then says what the epsilon was computed at."""
    spent = ledger.spent()
    groups = scope_groups(ledger.events)
    private = ledger.is_private
    report: dict[str, Any] = {
        # JSON has no infinity: a non-private run reports epsilon null and says so.
        "differentially_private": private,
        "epsilon": spent.epsilon if private else None,
        "delta": ledger.delta if run_delta is None else run_delta,
        **({"accounting_delta": ledger.delta} if run_delta is not None and run_delta != ledger.delta else {}),
        "epsilon_budget": ledger.epsilon_budget if math.isfinite(ledger.epsilon_budget) else None,
        "within_budget": spent.epsilon <= ledger.epsilon_budget * (1 + 1e-6),
        "accountant": {
            "primary": primary_accountant(ledger.events),
            "cross_check": "RDP (dp-accounting), an upper bound",
            "epsilon_rdp": spent.epsilon_rdp if private else None,
            "gaussian_dp_mu": max(gaussian_mu(g) for g in groups.values()) or None,
        },
        **({"per_scope_epsilon": {s: epsilon_tight(g, ledger.delta, ledger.adjacency) for s, g in groups.items()},
            "composition": "parallel over disjoint scopes of records: the run's epsilon is the largest "
                           "group's (each group sees the 'all' events and its own)"}
           if private and len(groups) > 1 else {}),
        "assumptions": ledger.assumptions.model_dump(mode="json"),
        "noise": {
            "mode": noise_mode,
            "for_release": not noise_mode.startswith("seeded"),
            # DP-SGD does not use the exact samplers (privacy/mechanisms.py says why): the report must not imply it
            **({"dp_sgd": DPSGD_NOISE} if any(_is_training(e.name) for e in ledger.events) else {}),
        },
        "events": ledger.to_dict()["events"],
    }
    if private and ledger.events:
        report["membership_test"] = membership_test(ledger, report["delta"])
    if not private:
        report["non_private_releases"] = list(ledger.non_private_releases)
        report["warning"] = "NOT DP: votes were released without noise (epsilon = inf reference run)"
    if plan is not None and plan["releases"]:
        report["plan"] = {k: v for k, v in plan.items() if k != "paper_formula"}
        if "paper_formula" in plan and private:
            report["paper_formula"] = plan["paper_formula"]
    return report


FALSE_ALARM_RATE = 0.05


def percent_at_most(share: float) -> str:
    """A bound as a percentage rounded up (to 0.1%), never below the bound it states: 0.0841 -> '8.5%'."""
    return f"{math.ceil(round(share * 1000, 9)) / 10:.1f}%"


def membership_test(ledger: PrivacyLedger, run_delta: float) -> dict[str, Any]:
    """The guarantee in plain words: the most a membership test can catch at a 5% false-alarm rate. Where the run's
    delta exceeds the accountant's (a SecAgg+ reserve r: with probability r clipping changes a noisy vote), the
    events' trade-off is taken at 5% + r and r added: that event may move either error rate by r."""
    reserve = max(0.0, run_delta - ledger.delta)
    power = min(1.0, membership_test_power(ledger.events, FALSE_ALARM_RATE + reserve, ledger.adjacency) + reserve)
    return {"false_alarm_rate": FALSE_ALARM_RATE, "detection_rate_at_most": power,
            "meaning": "any test of whether one unit of privacy (a record, or a person's records) was in the private "
                       "data, run on everything this run released, that wrongly says 'in' for 5% of those not in it "
                       "says 'in' for at most this share of those in it (guessing: 5%)"}


def _is_training(release: str) -> bool:
    """A DP-SGD release: the methods name it `<method>.training` (dpft, fedgen)."""
    return release.split("[", 1)[0].endswith(".training")


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
        *([f"in plain words: a test of whether a {report['assumptions'].get('unit', 'record').split(' ')[0]} was "
           f"in the private data that wrongly says yes for 5% of those not in it catches at most "
           f"{percent_at_most(report['membership_test']['detection_rate_at_most'])} of those in it"]
          if report.get("membership_test") else []),
        f"noise: {report['noise']['mode']}",
        "assumptions: " + "; ".join(f"{k}={v}" for k, v in report["assumptions"].items()),
    ]
    for knob in (report.get("plan") or {}).get("knobs", []):
        label = knob.get("sensitivity_label", "sensitivity")  # privacy.json written before it was stated
        sens = f", {label} {knob['sensitivity']:.5f}" if knob["sensitivity"] else ""
        party = f" ({knob['party_value']:.4f} per party)" if knob.get("party_value") else ""
        lines.append(f"{knob['releases']} release(s) on {knob['name']} = {knob['value']:.4f}{party} "
                     f"[{knob['how']}{sens}]")
    paper = report.get("paper_formula")
    if paper:
        lines.append(
            f"the paper's formula would use {paper['knob']} {paper['value']:.4f} "
            f"(sensitivity {paper['sensitivity']:g}); at that value the true epsilon is "
            f"{_fmt(paper['epsilon_of_paper_value'])}"
        )
    lines.append(f"events: {len(report['events'])} (listed in privacy.json)")
    return lines


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
