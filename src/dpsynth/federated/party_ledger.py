"""A data party's own privacy ledger: every answer it gives, charged in its own accounting, across runs.

The run's ledger lives with the server. A party that relied on it alone would trust the server to
ask only for the rounds its plan accounts for, and to run a study on the party's file only once. A
deployed party therefore keeps a ledger of its own, a file beside its data: before it computes an
answer it derives the answer's privacy event from what it is itself about to add (its noise share,
the fewest parties whose shares the sum is promised to carry, the vote's sensitivity computed here
from the vote definition, never taken from the server; no subsampling, since a party votes with
every record), charges it, and refuses the answer if that
would take it past its own budget. A repeated round (a server resuming after a crash) is a new
answer with fresh noise and is charged again.

Trust model of the charge: votes and profiles count the noise of the `min_parties` shares the
SecAgg+ sum is promised to contain (honest parties, a server that follows the protocol); training
updates are locally DP, so their charge holds against any server. `min_parties` comes with the
server's request: a party that will not take its word for it caps it (`trusted_parties`, node config
`trusted-parties`): the charge then holds if each sum carries at least that many honest parties' shares of
at least this party's size, under a server that otherwise runs SecAgg+ as specified (Flower's SecAgg+ is
secure against an honest-but-curious server only). Only `trusted_parties=1`, its own share alone (a
local-DP charge), holds against a server that deviates.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dpsynth.errors import DpsynthError
from dpsynth.fs import exclusive_lock, make_dir
from dpsynth.privacy.accountant import Adjacency
from dpsynth.privacy.events import GaussianEvent, PrivacyEvent
from dpsynth.privacy.ledger import Assumptions, PrivacyLedger
from dpsynth.privacy.schedule import dp_sgd_events
from dpsynth.privacy.sensitivity import vote_sensitivity
from dpsynth.voting.spec import VoteSpec


def trust_model(trusted_parties: int | None) -> str:
    """The trust model a party's ledger states, with its cap on the shares it counts."""
    if trusted_parties == 1:
        votes = "votes and profiles count this party's own noise share alone (local DP, any server)"
    else:
        cap = ("" if trusted_parties is None else f", at most {trusted_parties} (node config trusted-parties; an "
               "answer charged under a cap names the shares it counted)")
        votes = (f"votes and profiles count the noise of the min_parties shares the SecAgg+ sum promises{cap} "
                 "(honest parties, a protocol-following server)")
    return f"this party's own ledger: {votes}; training is local DP-SGD"


class PartyLedger:
    """The party's ledger file: loaded, charged and saved under a file lock for every answer.

    `epsilon` may be inf: the party then records what it spends without refusing for the amount. An
    answer without noise is always refused: a deployed party never releases its records' votes or updates
    un-noised (an epsilon = inf reference run is a simulation, whose parties keep no ledger of their own).
    """

    def __init__(self, path: Path, epsilon: float, delta: float,
                 adjacency: Adjacency = Adjacency.ADD_REMOVE, trusted_parties: int | None = None) -> None:
        if not epsilon > 0 or not 0 < delta < 1:
            raise DpsynthError(f"a party's budget needs epsilon > 0 and delta in (0, 1) (got {epsilon}, {delta})")
        if trusted_parties is not None and (type(trusted_parties) is not int or trusted_parties < 1):
            raise DpsynthError(f"a party's trusted-parties must be a whole number >= 1 (got {trusted_parties!r})")
        self.path = Path(path)
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.adjacency = adjacency
        self.trusted_parties = trusted_parties

    def charge_votes(self, spec: VoteSpec, *, release: str, party_sigma: float, min_parties: int) -> None:
        """Charge one vote (or label-count) answer before it is computed; raises if it would break the budget."""
        if min_parties < 1:
            raise DpsynthError(f"round {release}: min_parties must be >= 1 (got {min_parties})")
        if spec.sampling_rate < 1:  # refused here too, so the refused answer is never charged
            raise DpsynthError(f"round {release}: subsampled votes have no federated form (a party votes with "
                               "every record)")

        # the fewest shares the sum carries, as far as this party believes the server
        counted = min_parties if self.trusted_parties is None else min(min_parties, self.trusted_parties)

        def event(name: str) -> PrivacyEvent | None:
            if party_sigma <= 0:
                return None
            sens = vote_sensitivity(spec, self.adjacency)
            return GaussianEvent(name=name, sensitivity=sens, sigma=party_sigma * math.sqrt(counted))

        # an answer charged under the cap says so in its name: the ledger's trust model is the node config's now,
        # and a party may change its cap between runs on the same file
        capped = f" (counted {counted} of the {min_parties} shares claimed)" if counted < min_parties else ""
        self._charge(release, event, capped)

    def charge_training(self, *, release: str, round_index: int, steps: int, sampling_rate: float,
                        noise_multiplier: float) -> None:
        """Charge one round of local DP-SGD (Poisson sampling, per-example clipping) before it runs."""

        def event(name: str) -> PrivacyEvent | None:
            if noise_multiplier <= 0:
                return None
            return dp_sgd_events(steps, sampling_rate)(name, noise_multiplier)

        self._charge(f"{release}/round{round_index}", event)

    def spent(self) -> float:
        """Epsilon the party has spent so far at its delta."""
        with self._locked():
            return self._load().spent().epsilon

    def _charge(self, what: str, event_for, note: str = "") -> None:
        with self._locked():
            ledger = self._load()
            name = f"{what}/answer{len(ledger.events) + len(ledger.non_private_releases) + 1}{note}"
            event = event_for(name)
            if event is None:
                raise DpsynthError(f"{what}: this party refuses to answer without noise")
            ledger.record(event)  # BudgetExceededError (a DpsynthError) before anything is computed
            ledger.save(self.path)

    def _load(self) -> PrivacyLedger:
        assumptions = Assumptions(adjacency=self.adjacency, unit="record of this party",
                                  sampler="as each answer states (Poisson for training and subsampled votes)",
                                  trust_model=trust_model(self.trusted_parties))
        if not self.path.exists():
            return PrivacyLedger(self.epsilon, self.delta, assumptions)
        saved = PrivacyLedger.load(self.path)
        return PrivacyLedger(self.epsilon, self.delta, assumptions, events=saved.events,
                             non_private_releases=saved.non_private_releases)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive lock on a side file: two answers of one party (Flower may run them in two processes)
        must not both read the ledger before either has saved its charge."""
        make_dir(self.path.parent)
        handle = exclusive_lock(self.path.with_name(self.path.name + ".lock"), wait=True)
        assert handle is not None  # a waiting lock is always granted
        try:
            yield
        finally:
            handle.close()
