"""Privacy events: the unit of record in a run's ledger.

Every mechanism that touches private data describes itself as one of these
events *before* it releases anything. Events are plain, JSON-serialisable
records so that a privacy report can list them and anyone can recompute the
epsilon from the report alone.

One convention for sensitivities, stated per kind, so that accountants never guess:
- Gaussian and Laplace events carry the sensitivity *under the ledger's adjacency* (e.g. sqrt(2) for a
  one-hot histogram under replacement): the accountant treats them as a shift of that size.
- A subsampled Gaussian carries `noise_multiplier` = sigma / *one unit's own bound* (a record's clip norm,
  or a person's), and the accountant applies the adjacency itself through dp_accounting's neighbouring
  relation, because subsampling amplification is defined per relation (add/remove; replacement is the
  remove-then-add composition). `privacy.sensitivity` derives the first kind; the methods that record the
  second (dpft, fedgen, DPGA's subsampled votes) pass the per-unit bound.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(description="What the release is, e.g. 'wasp.votes[iter=1]'.")
    count: PositiveInt = Field(1, description="How many identical releases this event stands for.")
    scope: str = Field(
        "all", description="Which records the release touches: 'all', or a named group of records disjoint from "
        "every other named group (e.g. 'parties:strong'). The accountant composes each group's events with the "
        "'all' events and reports the largest (parallel composition); see dpsynth.privacy.accountant.")


class GaussianEvent(_Event):
    """Gaussian mechanism: vector with L2 sensitivity `sensitivity`, noise N(0, sigma^2) per coordinate."""

    kind: Literal["gaussian"] = "gaussian"
    sensitivity: PositiveFloat
    sigma: PositiveFloat

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.sensitivity


class SubsampledGaussianEvent(_Event):
    """Poisson-subsampled Gaussian (DP-SGD step or subsampled vote), `count` = steps.

    `noise_multiplier` is sigma divided by the per-record L2 bound (clip norm).
    Only Poisson sampling is accounted this way: shuffled fixed-size batches are
    a different sampler and must not be recorded as this event.
    """

    kind: Literal["subsampled_gaussian"] = "subsampled_gaussian"
    sampling_rate: Annotated[float, Field(gt=0, le=1)]
    noise_multiplier: PositiveFloat
    sampler: Literal["poisson"] = "poisson"


class LaplaceEvent(_Event):
    """Laplace mechanism: L1 sensitivity `sensitivity`, noise Laplace(0, scale) per coordinate."""

    kind: Literal["laplace"] = "laplace"
    sensitivity: PositiveFloat
    scale: PositiveFloat


class PureDpEvent(_Event):
    """A mechanism with a pure epsilon-DP proof (sparse vector, exponential mechanism)."""

    kind: Literal["pure_dp"] = "pure_dp"
    epsilon: PositiveFloat
    mechanism: Literal["svt", "exponential", "other"] = "other"


PrivacyEvent = Annotated[
    GaussianEvent | SubsampledGaussianEvent | LaplaceEvent | PureDpEvent,
    Field(discriminator="kind"),
]
