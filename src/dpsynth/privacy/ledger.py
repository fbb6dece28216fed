"""One privacy ledger per run: record before release, refuse to overspend.

The ledger holds the run's budget (epsilon, delta), the adjacency and unit of
privacy, and the list of events already spent. `record` is the only way to
spend: it computes what the run would have spent *with* the new event and
raises `BudgetExceededError` before any noise is drawn if that exceeds the
budget. Event names are unique, so a resumed run that tries to redo a release
it already paid for is stopped instead of silently spending twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from dpsynth.errors import DpsynthError
from dpsynth.fs import atomic_write_text
from dpsynth.privacy.accountant import Adjacency, EpsilonReport, account, epsilon_tight
from dpsynth.privacy.events import PrivacyEvent

_EVENTS = TypeAdapter(list[PrivacyEvent])

# the accountant is on the private side of the exact value; allow for float noise in the comparison only.
BUDGET_SLACK = 1e-6


class BudgetExceededError(DpsynthError):
    """A release would take the run past its privacy budget."""


class DoubleSpendError(DpsynthError):
    """An event with this name was already recorded (a resumed run re-releasing)."""


class Assumptions(BaseModel):
    """What the guarantee is about; written into every privacy report."""

    model_config = ConfigDict(extra="forbid")
    adjacency: Adjacency = Adjacency.ADD_REMOVE
    unit: str = Field("record", description="'record', 'person (<= k records)' or 'party (<= n records)'")
    sampler: str = Field("none (every private record votes in every release)")
    trust_model: str = Field("single trusted data party adds all noise")
    delta_convention: str = Field("delta chosen by the user for the whole run (not per iteration)")
    checked_on_private_data: str = Field(
        "not recorded (a run begun before dpsynth stated it)",
        description="what the data holder checks on the private records without noise before starting (a finished "
                    "run discloses that it holds)")


class PrivacyLedger:
    """The events a run has spent, its budget, and the accountant that composes them."""

    def __init__(
        self,
        epsilon_budget: float,
        delta: float,
        assumptions: Assumptions | None = None,
        events: Sequence[PrivacyEvent] = (),
        non_private_releases: Sequence[str] = (),
    ) -> None:
        if not epsilon_budget > 0:  # also NaN, which every later comparison would let through
            raise DpsynthError(f"epsilon must be > 0 (got {epsilon_budget}); use a positive budget such as 4")
        if not 0 < delta < 1:
            raise DpsynthError(f"delta must be in (0, 1) (got {delta}); a common choice is 1/(10*M) or 1e-5")
        self.epsilon_budget = float(epsilon_budget)
        self.delta = float(delta)
        self.assumptions = assumptions or Assumptions()
        self._events: list[PrivacyEvent] = list(events)
        self._non_private: list[str] = list(non_private_releases)

    @property
    def adjacency(self) -> Adjacency:
        return self.assumptions.adjacency

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        return tuple(self._events)

    @property
    def is_private(self) -> bool:
        """False once an un-noised release was made (an epsilon = inf reference run)."""
        return not self._non_private

    @property
    def non_private_releases(self) -> tuple[str, ...]:
        return tuple(self._non_private)

    def spent(self) -> EpsilonReport:
        """Epsilon spent so far at the run's delta, with the RDP cross-check."""
        if self._non_private:
            return EpsilonReport(epsilon=math.inf, epsilon_rdp=math.inf, delta=self.delta)
        return account(self._events, self.delta, self.adjacency)

    def epsilon_with(self, extra: Sequence[PrivacyEvent]) -> float:
        return epsilon_tight([*self._events, *extra], self.delta, self.adjacency)

    def record(self, event: PrivacyEvent) -> None:
        """Charge `event`; raises before anything is spent if the budget or uniqueness would break."""
        if any(e.name == event.name for e in self._events):
            raise DoubleSpendError(
                f"privacy event '{event.name}' is already in the ledger; refusing to release it twice"
            )
        after = self.epsilon_with([event])
        if after > self.epsilon_budget * (1 + BUDGET_SLACK):
            raise BudgetExceededError(
                f"release '{event.name}' would spend epsilon {after:.4f} > budget {self.epsilon_budget:g} "
                f"(delta={self.delta:g}); nothing was released. Raise the budget or the noise."
            )
        self._events.append(event)

    def record_non_private(self, name: str) -> None:
        """Charge an un-noised release: only a ledger opened with epsilon = inf accepts it.

        Used by the non-private reference runs of an epsilon sweep; the run's report then
        says epsilon = inf and "NOT DP" instead of a number.
        """
        if math.isfinite(self.epsilon_budget):
            raise BudgetExceededError(
                f"release '{name}' without noise needs an epsilon = inf (non-private) run; "
                f"this run's budget is {self.epsilon_budget:g}"
            )
        if name in self._non_private or any(e.name == name for e in self._events):
            raise DoubleSpendError(f"privacy event '{name}' is already in the ledger; refusing to release it twice")
        self._non_private.append(name)

    # -- persistence -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon_budget": self.epsilon_budget,
            "delta": self.delta,
            "assumptions": self.assumptions.model_dump(mode="json"),
            "events": _EVENTS.dump_python(self._events, mode="json"),
            "non_private_releases": list(self._non_private),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyLedger:
        return cls(
            epsilon_budget=data["epsilon_budget"],
            delta=data["delta"],
            assumptions=Assumptions.model_validate(data["assumptions"]),
            events=_EVENTS.validate_python(data["events"]),
            non_private_releases=data.get("non_private_releases", ()),
        )

    def save(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: Path) -> PrivacyLedger:
        return cls.from_dict(json.loads(Path(path).read_text()))
