"""A run's privacy schedule: named releases, the noise knobs they use, and how knobs are calibrated.

A release is one thing that leaves the data holder (a noisy vote vector, a noisy label
histogram, a DP-SGD phase, ...). It names the knob whose value sets its noise and turns that
value into a privacy event. Knobs are calibrated jointly on the ledger's accountant:

- a *fixed* knob has a value the user chose (e.g. the DP label histogram's sigma);
- a knob with a *share* is calibrated alone so that its releases spend `share * epsilon`
  (a stated split of the budget, as the DPGA paper splits it between metadata and votes):
  pure-DP releases (Laplace, sparse vector) by their pure epsilons, which add up exactly as
  the papers split them; others on the accountant at the run's delta;
- exactly one *free* knob takes whatever the rest leaves: it is calibrated on the whole
  schedule so the run spends exactly epsilon. When releases touch disjoint groups of records
  (event scopes, composed in parallel), each group may have its own free knob, calibrated on
  the releases that group sees.

Methods ask the data holder for `("votes", t)`, never for a noise value; `dpsynth budget`
and the run build the very same schedule (`dpsynth.runs.planning`), so what a user plans is
what the run pays. A knob value of 0 means "no noise" and exists only in epsilon = inf
(non-private reference) runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dpsynth.errors import DpsynthError
from dpsynth.privacy.accountant import ALL_RECORDS, Adjacency, epsilon_tight
from dpsynth.privacy.calibrate import calibrate_noise
from dpsynth.privacy.events import PrivacyEvent

EventMaker = Callable[[str, float], PrivacyEvent]


def release_name(kind: str, index: int | None = None) -> str:
    """The ledger name of a release: 'wasp.votes[iteration=2]', 'labels.histogram'."""
    return kind if index is None else f"{kind}[iteration={index}]"


@dataclass(frozen=True)
class Knob:
    """A noise parameter (sigma, Laplace scale, noise multiplier) shared by one or more releases."""

    name: str
    share: float | None = None  # calibrated alone for share * epsilon
    value: float | None = None  # fixed by the user
    guess: float | None = None  # a good starting point for the search (e.g. a closed form)
    description: str = ""

    def __post_init__(self) -> None:
        if self.share is not None and not 0 < self.share < 1:
            raise DpsynthError(f"knob {self.name}: share must be in (0, 1), got {self.share}")
        if self.share is not None and self.value is not None:
            raise DpsynthError(f"knob {self.name}: give a share or a fixed value, not both")

    @property
    def free(self) -> bool:
        return self.share is None and self.value is None


@dataclass(frozen=True)
class Release:
    """One named release: the knob it uses and its privacy event at a knob value."""

    kind: str
    index: int | None
    knob: str
    make_event: EventMaker
    sensitivity: float  # L2 (Gaussian) or L1 (Laplace); for the report

    @property
    def name(self) -> str:
        return release_name(self.kind, self.index)

    def event(self, value: float) -> PrivacyEvent:
        return self.make_event(self.name, value)

    @property
    def scope(self) -> str:
        """The records the release touches (its event's scope; the same at every knob value)."""
        return self.event(1.0).scope


@dataclass(frozen=True)
class Schedule:
    """Every release a run may make, and its knobs."""

    releases: tuple[Release, ...]
    knobs: tuple[Knob, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        names = [r.name for r in self.releases]
        if len(set(names)) != len(names):
            raise DpsynthError(f"release names must be unique, got {names}")
        known = {k.name for k in self.knobs}
        missing = {r.knob for r in self.releases} - known
        if missing:
            raise DpsynthError(f"releases use undeclared knobs {sorted(missing)}")
        free_scopes = [self.scope_of(k.name) for k in self.knobs if k.free]
        if len(free_scopes) > 1 and (len(set(free_scopes)) != len(free_scopes) or ALL_RECORDS in free_scopes):
            raise DpsynthError("a schedule has at most one free knob per disjoint scope of records; give the "
                               "others a share or a value")

    def __add__(self, other: Schedule) -> Schedule:
        return Schedule(self.releases + other.releases, self.knobs + other.knobs, self.notes + other.notes)

    @property
    def is_empty(self) -> bool:
        return not self.releases

    def get(self, kind: str, index: int | None = None) -> Release:
        name = release_name(kind, index)
        for r in self.releases:
            if r.name == name:
                return r
        raise KeyError(f"release '{name}' is not in the run's schedule ({', '.join(r.name for r in self.releases)})")

    def by_name(self, name: str) -> Release:
        for r in self.releases:
            if r.name == name:
                return r
        raise KeyError(name)

    def scope_of(self, knob: str) -> str:
        """The records a knob's releases touch: one named scope, or "all" (also for mixed or unused knobs)."""
        scopes = {r.scope for r in self.uses(knob)}
        return scopes.pop() if len(scopes) == 1 else ALL_RECORDS

    def knob(self, name: str) -> Knob:
        return next(k for k in self.knobs if k.name == name)

    def uses(self, knob: str) -> list[Release]:
        return [r for r in self.releases if r.knob == knob]

    def events(self, values: dict[str, float]) -> list[PrivacyEvent]:
        """The events of every noised release at these knob values (un-noised ones have no event)."""
        return [r.event(values[r.knob]) for r in self.releases if values[r.knob] > 0]

    def epsilon(self, values: dict[str, float], delta: float, adjacency: Adjacency = Adjacency.ADD_REMOVE) -> float:
        if any(values[r.knob] == 0 for r in self.releases):
            return math.inf
        return epsilon_tight(self.events(values), delta, adjacency)

    def calibrate(self, epsilon: float, delta: float, adjacency: Adjacency = Adjacency.ADD_REMOVE) -> dict[str, float]:
        """Knob values for (epsilon, delta): fixed as given, shares alone, then the free knob on the whole."""
        values: dict[str, float] = {k.name: k.value for k in self.knobs if k.value is not None}
        if math.isinf(epsilon):
            return {k.name: values.get(k.name, 0.0) for k in self.knobs}
        for k in self.knobs:
            if k.share is not None:
                values[k.name] = self._search(k, epsilon * k.share, delta, adjacency, fixed=[])
        # A free knob takes what its records' group leaves: free knobs of disjoint scopes never meet.
        for knob in (k for k in self.knobs if k.free):
            scope = self.scope_of(knob.name)
            fixed = [r.event(values[r.knob]) for r in self.releases
                     if r.knob != knob.name and r.knob in values
                     and (scope == ALL_RECORDS or r.event(values[r.knob]).scope in (ALL_RECORDS, scope))]
            values[knob.name] = self._search(knob, epsilon, delta, adjacency, fixed=fixed)
        total = self.epsilon(values, delta, adjacency)
        if total > epsilon * (1 + 1e-6):
            raise DpsynthError(f"the schedule's shares and fixed noise spend epsilon {total:.4f} > {epsilon:g}; "
                               "lower the shares or raise the fixed noise")
        return values

    def _search(self, knob: Knob, epsilon: float, delta: float, adjacency: Adjacency,
                fixed: Sequence[PrivacyEvent]) -> float:
        uses = self.uses(knob.name)
        if not uses:
            return 1.0  # declared but unused (e.g. no iteration casts votes): any value spends nothing
        if not fixed and all(pure_epsilon(r.event(1.0)) is not None for r in uses):
            return _solve_pure([r.make_event for r in uses], [r.name for r in uses], epsilon)
        try:
            return calibrate_noise(lambda x: [r.event(x) for r in uses], epsilon, delta, adjacency=adjacency,
                                   fixed_events=fixed, guess=knob.guess or 1.0)
        except ValueError as err:
            raise DpsynthError(f"cannot calibrate {knob.name} for epsilon {epsilon:g}: {err}") from err


# The event makers: the one place a release's knob value becomes its privacy event. Each follows
# privacy/events.py's convention for its kind (enforced over every kind by
# tests/test_privacy_accounting.py::test_every_event_kind_follows_its_stated_sensitivity_convention).

def gaussian_events(sensitivity: float) -> EventMaker:
    """Gaussian noise of std `sigma` (the knob) on a vector whose L2 sensitivity, already scaled for the
    adjacency, is `sensitivity`."""
    from dpsynth.privacy.events import GaussianEvent

    def make(name: str, sigma: float) -> PrivacyEvent:
        return GaussianEvent(name=name, sensitivity=sensitivity, sigma=sigma)

    return make


def laplace_events(sensitivity: float) -> EventMaker:
    """Laplace noise of scale `b` (the knob) on a histogram whose L1 sensitivity, already scaled for the
    adjacency, is `sensitivity`."""
    from dpsynth.privacy.events import LaplaceEvent

    def make(name: str, scale: float) -> PrivacyEvent:
        return LaplaceEvent(name=name, sensitivity=sensitivity, scale=scale)

    return make


def sparse_vector_events(sensitivity: float) -> EventMaker:
    """The sparse-vector technique with Laplace scale `b` (the knob) on threshold and queries: pure
    2 x sensitivity / b (Lyu, Su and Li 2017, Alg. 1 with one answer)."""
    from dpsynth.privacy.events import PureDpEvent

    def make(name: str, scale: float) -> PrivacyEvent:
        return PureDpEvent(name=name, epsilon=2 * sensitivity / scale, mechanism="svt")

    return make


def subsampled_gaussian_events(sampling_rate: float, sensitivity: float) -> EventMaker:
    """Poisson-subsampled Gaussian votes with noise std `sigma` (the knob): the event carries the noise
    multiplier sigma / (one unit's own L2 norm), and the PLD applies the adjacency itself."""
    from dpsynth.privacy.events import SubsampledGaussianEvent

    def make(name: str, sigma: float) -> PrivacyEvent:
        return SubsampledGaussianEvent(name=name, sampling_rate=sampling_rate, noise_multiplier=sigma / sensitivity)

    return make


def dp_sgd_events(steps: int, sampling_rate: float, scope: str = ALL_RECORDS) -> EventMaker:
    """`steps` Poisson-subsampled DP-SGD steps with noise multiplier `z` (the knob: sigma / clip norm). Each unit's
    (record's or person's) summed gradient is clipped to the clip norm, so the clip norm is the per-unit bound and
    the multiplier is the noise in its units; the PLD applies the adjacency itself. The one derivation of a
    training release's event: the central holder's runs (dpft), fedgen's strong parties and each party's own
    ledger use it."""
    from dpsynth.privacy.events import SubsampledGaussianEvent

    def make(name: str, z: float) -> PrivacyEvent:
        return SubsampledGaussianEvent(name=name, count=steps, sampling_rate=sampling_rate, noise_multiplier=z,
                                       scope=scope)

    return make


def gaussian_releases(kind: str, indices: Sequence[int | None], knob: str,
                      sensitivity: float) -> tuple[Release, ...]:
    """Gaussian releases of a vector with L2 `sensitivity`, one per index, all on `knob` (sigma)."""
    make = gaussian_events(sensitivity)
    return tuple(Release(kind, t, knob, make, sensitivity) for t in indices)


def pure_epsilon(event: PrivacyEvent) -> float | None:
    """The pure epsilon of a Laplace or pure-DP event (None for events with a delta)."""
    from dpsynth.privacy.events import LaplaceEvent, PureDpEvent

    if isinstance(event, LaplaceEvent):
        return event.count * event.sensitivity / event.scale
    if isinstance(event, PureDpEvent):
        return event.count * event.epsilon
    return None


def _solve_pure(makers: Sequence[EventMaker], names: Sequence[str], epsilon: float) -> float:
    """The noise value whose pure-DP releases add up to `epsilon` (they are monotone in it)."""

    def total(x: float) -> float:
        return sum(pure_epsilon(make(name, x)) or 0.0 for make, name in zip(makers, names))

    hi = 1.0
    while total(hi) > epsilon:
        hi *= 2
    lo = hi
    while total(lo) <= epsilon:
        lo /= 2
    while hi - lo > 1e-12 * hi:  # invariant: total(lo) > epsilon >= total(hi)
        mid = (lo + hi) / 2
        if total(mid) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


FINAL_STAGE_SHARE = 0.2  # of epsilon, for a final stage beside another part of the run with its own free knob


class StageNoise(Protocol):
    """A final stage's noise setting (`config.FinalStageNoise`)."""

    sigma: float | None
    share: float | None


def final_stage_knob(name: str, noise: StageNoise, before: Schedule, section: str, what: str) -> Knob:
    """The noise knob of a final stage's release (`resample:`, `relabel:`): the user's fixed `noise.sigma`, their
    `noise.share` of epsilon, a default share when the rest of the run (`before`) already has a free knob, or else
    the whole budget (one free knob per schedule)."""
    if noise.sigma is not None:
        return Knob(name, value=noise.sigma, description=f"{what} ({section}.sigma)")
    if noise.share is not None or any(k.free for k in before.knobs):
        share = noise.share if noise.share is not None else FINAL_STAGE_SHARE
        return Knob(name, share=share, description=f"{what} ({section}.share {share:g} of epsilon)")
    return Knob(name, description=f"{what} (the whole budget)")
