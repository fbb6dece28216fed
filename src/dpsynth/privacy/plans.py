"""Release plans: the schedule of noisy releases a method will make, before it runs.

A plan knows the per-release sensitivity and how many releases there are, so it
can calibrate sigma for a target (epsilon, delta), compute the epsilon of a
given sigma, and say what the method's paper would have used for the same
setting. `dpsynth budget` and the algorithms use the same plans, so what a user
plans is what the run charges.

`iterations` counts every iteration including the zero-shot one, which uses no
private data: T iterations make T-1 noisy releases, for every method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dpsynth.errors import DpsynthError
from dpsynth.privacy.accountant import Adjacency, epsilon_pld
from dpsynth.privacy.calibrate import calibrate_noise, gaussian_sigma_closed_form
from dpsynth.privacy.events import GaussianEvent
from dpsynth.privacy.sensitivity import pe_top1_sensitivity, wasp_topq_sensitivity


@dataclass(frozen=True)
class PaperFormula:
    """What a paper's own privacy analysis prescribes for the same setting."""

    description: str
    sensitivity: float
    sigma_for_target: float | None = None


@dataclass(frozen=True)
class ReleasePlan:
    """T-1 Gaussian releases of a vote vector with one L2 sensitivity, total noise sigma each."""

    method: str
    iterations: int
    sensitivity: float
    parties: int = 1
    min_parties: int | None = None
    max_records_per_user: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.iterations < 2:
            raise DpsynthError(
                f"iterations must be >= 2 (got {self.iterations}): iteration 0 is zero-shot and uses no private data"
            )
        if self.parties < 1:
            raise DpsynthError("parties must be >= 1")
        if self.min_parties is not None and not 1 <= self.min_parties <= self.parties:
            raise DpsynthError(f"min parties must be in [1, {self.parties}]")

    @property
    def noisy_releases(self) -> int:
        return self.iterations - 1

    def release_name(self, iteration: int) -> str:
        return f"{self.method}.votes[iteration={iteration}]"

    def events(self, sigma: float) -> list[GaussianEvent]:
        return [
            GaussianEvent(name=self.release_name(t), sensitivity=self.sensitivity, sigma=sigma)
            for t in range(1, self.iterations)
        ]

    def sigma_for(self, epsilon: float, delta: float, adjacency: Adjacency = Adjacency.ADD_REMOVE) -> float:
        """Total sigma per release reaching exactly (epsilon, delta), by bisection on the ledger's PLD."""
        if epsilon <= 0:
            raise DpsynthError(f"epsilon must be > 0 (got {epsilon})")
        guess = gaussian_sigma_closed_form(epsilon, delta, [self.sensitivity] * self.noisy_releases)
        return calibrate_noise(self.events, epsilon, delta, adjacency=adjacency, guess=guess)

    def sigma_closed_form(self, epsilon: float, delta: float) -> float:
        return gaussian_sigma_closed_form(epsilon, delta, [self.sensitivity] * self.noisy_releases)

    def epsilon_for(self, sigma: float, delta: float, adjacency: Adjacency = Adjacency.ADD_REMOVE) -> float:
        return epsilon_pld(self.events(sigma), delta, adjacency)

    def party_sigma(self, sigma: float) -> float:
        """Each party's share of the noise under secure aggregation.

        Shares are sized for the fewest parties that may survive a round
        (`min_parties`), so the sum of any allowed set of survivors carries at
        least sigma of noise.
        """
        return sigma / math.sqrt(self.min_parties or self.parties)

    def epsilon_single_party_view(self, sigma: float, delta: float) -> float:
        """Epsilon if the server saw one party's noisy histogram (no secure aggregation)."""
        return self.epsilon_for(self.party_sigma(sigma), delta)

    def paper(self, epsilon: float | None, delta: float) -> PaperFormula:
        return _PAPER_FORMULAS[self.method](self, epsilon, delta)


def wasp_plan(
    iterations: int,
    q: int,
    *,
    adjacency: Adjacency = Adjacency.ADD_REMOVE,
    max_records_per_user: int = 1,
    parties: int = 1,
    min_parties: int | None = None,
) -> ReleasePlan:
    return ReleasePlan(
        method="wasp",
        iterations=iterations,
        sensitivity=wasp_topq_sensitivity(q, adjacency, max_records_per_user=max_records_per_user),
        parties=parties,
        min_parties=min_parties,
        max_records_per_user=max_records_per_user,
        notes=(f"Top-{q} nearest+furthest votes, weights 1..2^-{q - 1}",),
    )


def augpe_plan(
    iterations: int,
    *,
    adjacency: Adjacency = Adjacency.ADD_REMOVE,
    max_records_per_user: int = 1,
    parties: int = 1,
    min_parties: int | None = None,
) -> ReleasePlan:
    return ReleasePlan(
        method="augpe",
        iterations=iterations,
        sensitivity=pe_top1_sensitivity(adjacency, max_records_per_user=max_records_per_user),
        parties=parties,
        min_parties=min_parties,
        max_records_per_user=max_records_per_user,
        notes=("Top-1 (or L2-normalised k-NN) votes",),
    )


def _wasp_paper(plan: ReleasePlan, epsilon: float | None, delta: float) -> PaperFormula:
    # Paper (Alg. 1/2 line 2): sigma = 4 sqrt(2 ln(1.25/delta_iter)) sqrt(T-1) / (eps sqrt(L)) per party,
    # with delta_iter = delta as in the paper's experiments and Delta = 4 (times m at user level: 32 for m=8).
    paper_sensitivity = 4.0 * plan.max_records_per_user
    sigma = None
    if epsilon is not None:
        sigma = (
            paper_sensitivity * math.sqrt(2 * math.log(1.25 / delta)) * math.sqrt(plan.noisy_releases) / epsilon
        )
    return PaperFormula(
        description=(
            f"WASP paper: Delta=4 per record (L1 bound; x{plan.max_records_per_user} records per user), "
            "classical Gaussian formula "
            "sigma = Delta*sqrt(2 ln(1.25/delta_iter))*sqrt(T-1)/eps with delta_iter = delta"
        ),
        sensitivity=paper_sensitivity,
        sigma_for_target=sigma,
    )


def _augpe_paper(plan: ReleasePlan, epsilon: float | None, delta: float) -> PaperFormula:
    return PaperFormula(
        description="Aug-PE/PE: sensitivity 1, exact Gaussian-DP composition (same as ours)",
        sensitivity=1.0,
        sigma_for_target=None if epsilon is None else plan.sigma_closed_form(epsilon, delta),
    )


_PAPER_FORMULAS = {"wasp": _wasp_paper, "augpe": _augpe_paper}
