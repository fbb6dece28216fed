"""`dpsynth budget`: plan a run's privacy before spending anything."""

from __future__ import annotations

import time
from enum import Enum
from typing import Optional

import typer

from dpsynth.errors import DpsynthError
from dpsynth.privacy.accountant import Adjacency, epsilon_rdp
from dpsynth.privacy.plans import ReleasePlan, augpe_plan, wasp_plan


class Method(str, Enum):
    wasp = "wasp"
    augpe = "augpe"


def budget(
    method: Method = typer.Argument(..., help="wasp, or augpe (Aug-PE / Pre-Text)."),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="Target epsilon: prints the sigma to use."),
    sigma: Optional[float] = typer.Option(None, "--sigma", help="Noise per release: prints the epsilon spent."),
    delta: float = typer.Option(1e-5, "--delta"),
    iterations: int = typer.Option(5, "--iterations", "-T", help="All iterations, including zero-shot iteration 0."),
    q: int = typer.Option(8, "--q", help="WASP's Top-Q."),
    max_records_per_user: int = typer.Option(1, "--max-records-per-user", help="User-level DP: records per user."),
    parties: int = typer.Option(1, "--parties", help="Federated: number of data parties (secure aggregation)."),
    min_parties: Optional[int] = typer.Option(None, "--min-parties", help="Fewest parties a round may finish with."),
    adjacency: Adjacency = typer.Option(Adjacency.ADD_REMOVE, "--adjacency"),
) -> None:
    """Calibrate sigma for a target epsilon, or compute the epsilon of a sigma."""
    if (epsilon is None) == (sigma is None):
        raise DpsynthError("give exactly one of --epsilon (to get sigma) or --sigma (to get epsilon)")
    for flag, value in (("--epsilon", epsilon), ("--sigma", sigma)):
        if value is not None and value <= 0:
            raise DpsynthError(f"{flag} must be > 0 (got {value})")
    common = dict(
        adjacency=adjacency, max_records_per_user=max_records_per_user, parties=parties, min_parties=min_parties
    )
    plan: ReleasePlan = wasp_plan(iterations, q, **common) if method is Method.wasp else augpe_plan(iterations, **common)
    unit = "record" if max_records_per_user == 1 else f"user with <= {max_records_per_user} records"
    typer.echo(
        f"method: {method.value}; T={iterations} iterations -> {plan.noisy_releases} noisy releases "
        "(iteration 0 is zero-shot and uses no private data)"
    )
    typer.echo(f"L2 sensitivity per release: {plan.sensitivity:.5f} ({adjacency.value}, unit: {unit})")
    if epsilon is not None:
        start = time.perf_counter()
        sigma = plan.sigma_for(epsilon, delta, adjacency)
        took = time.perf_counter() - start
        typer.echo(f"sigma per noisy release: {sigma:.3f}")
        typer.echo(
            f"  (PLD bisection in {took:.2f}s; Gaussian-DP closed form {plan.sigma_closed_form(epsilon, delta):.3f})"
        )
        paper = plan.paper(epsilon, delta)
        if paper.sigma_for_target is not None:
            typer.echo(f"paper's sigma: {paper.sigma_for_target:.3f} [{paper.description}]")
            typer.echo(
                f"  true epsilon at the paper's sigma: {plan.epsilon_for(paper.sigma_for_target, delta):.3f}; "
                f"paper sigma / tight sigma = {paper.sigma_for_target / sigma:.2f}x"
            )
    assert sigma is not None
    spent = plan.epsilon_for(sigma, delta, adjacency)
    rdp = epsilon_rdp(plan.events(sigma), delta, adjacency)
    typer.echo(f"epsilon spent: {spent:.3f} at delta={delta:g} (PLD; RDP cross-check {rdp:.3f})" if rdp else
               f"epsilon spent: {spent:.3f} at delta={delta:g} (PLD)")
    if parties > 1:
        typer.echo(
            f"federated: each of {parties} parties adds sigma {plan.party_sigma(sigma):.3f} "
            f"(sized for {plan.min_parties or parties} surviving parties); the sum is private only under "
            "secure aggregation"
        )
        typer.echo(
            f"  without secure aggregation a server seeing one party's histogram gets epsilon "
            f"{plan.epsilon_single_party_view(sigma, delta):.3f}"
        )
