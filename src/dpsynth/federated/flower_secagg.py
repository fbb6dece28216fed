"""Parties and server on Flower; sums through the SecAgg+ secure-aggregation protocol.

The whole run (generation, selection, weighting) executes inside the Flower ServerApp, so
one federation serves every round: each WASP / Pre-Text iteration broadcasts the
candidates' embeddings, every party answers with its noisy votes, and the server gets
the sum. With `secure=True` the uploads are masked by SecAgg+ (Bonawitz et al. 2017,
Bell et al. 2020) and the server only ever unmasks the sum; with `secure=False` the
server receives each party's vector (the baseline for measuring SecAgg+'s overhead,
and a mode whose parties must each add the full noise).

SecAgg+ details that matter for DP (see docs/federated.md):
- each client uploads weight * vector; we return num_examples=1 with max_weight=1.0 so
  the server's weighted mean times the number of contributors is the plain sum;
- entries are clipped to [-C, C] and stochastically rounded to `quantization_range`
  levels before masking; C is sized by `voting.clip_range` so clipping is a
  delta-accounted rare event, and the rounding step is reported;
- Flower's own threshold only counts key shares, and it halts *silently* (no exception):
  `ThresholdedSecAggPlus` also refuses to unmask unless at least `min_parties` parties
  contributed masked vectors, and a round without a sum raises here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from dpsynth.errors import DpsynthError
from dpsynth.federated.party import PartyShard, check_party_size, check_vote_request, noisy_votes
from dpsynth.federated.party_ledger import PartyLedger
from dpsynth.privacy.accountant import Adjacency
from dpsynth.voting.spec import VoteSpec

T = TypeVar("T")
MODULUS_RANGE = 2**32
MAX_QUANTIZATION_RANGE = 2**22
log = logging.getLogger("dpsynth.federated")


class FederationError(DpsynthError):
    """A round could not be aggregated safely (too few parties, protocol halted, party error)."""


@dataclass(frozen=True)
class VoteRound:
    """One aggregation: what the server broadcasts and how parties must answer."""

    release: str
    spec: VoteSpec
    candidates: np.ndarray  # public synthetic embeddings (N x d)
    candidate_labels: np.ndarray
    party_sigma: float
    clip: float
    parties: tuple[int, ...] | None = None  # the party ids asked (None: every party)
    min_parties: int | None = None  # fewest that must answer (None: the federation's setting)


@dataclass(frozen=True)
class TrainRound:
    """One FedAvg round of local DP training: the parties asked start from `adapter` and return their update.

    Each party runs `request.steps` DP-Adam steps on its own records and adds the full noise itself
    (local DP-SGD), so the update each party sends is already DP; the server averages the updates.
    """

    release: str
    round_index: int
    adapter: np.ndarray
    request: str  # finetune.request.AdapterTraining, as JSON
    noise_multiplier: float
    parties: tuple[int, ...]


@dataclass
class RoundResult:
    total: np.ndarray
    contributors: int
    bytes_down: dict[int, int]  # per party (node), server -> party, all protocol stages
    bytes_up: dict[int, int]  # per party, party -> server
    seconds: float


@dataclass(frozen=True)
class FederationSettings:
    parties: int
    min_parties: int
    secure: bool
    max_records: int
    timeout: float
    noise_seed: int | None = None
    party_data: dict[str, str] = field(default_factory=dict)  # how a deployed party reads its own file
    adjacency: str = "add_remove"  # the run's: a deployed party's own ledger must count at least as strictly
    device: str = "cpu"  # where a simulated party's DP training runs ('cpu' or 'cuda': the run's, resolved)


def quantization_range(parties: int) -> int:
    """Levels per entry such that the sum of all parties' entries cannot wrap the 2^32 modulus."""
    return int(min(MAX_QUANTIZATION_RANGE, 2 ** math.floor(math.log2(MODULUS_RANGE / (4 * parties)))))


@dataclass
class _Meter:
    """Bytes of every message content the server sends to / receives from each node."""

    down: dict[int, int] = field(default_factory=dict)
    up: dict[int, int] = field(default_factory=dict)

    def wrap(self, grid: Any) -> None:
        from flwr.common.serde import recorddict_to_proto

        inner = grid.send_and_receive

        def send_and_receive(messages, *args, **kwargs):
            messages = list(messages)
            for m in messages:
                self.down[m.metadata.dst_node_id] = (
                    self.down.get(m.metadata.dst_node_id, 0) + recorddict_to_proto(m.content).ByteSize())
            replies = list(inner(messages, *args, **kwargs))
            for r in replies:
                if r.has_content():
                    self.up[r.metadata.src_node_id] = (
                        self.up.get(r.metadata.src_node_id, 0) + recorddict_to_proto(r.content).ByteSize())
            return replies

        grid.send_and_receive = send_and_receive

    def take(self) -> tuple[dict[int, int], dict[int, int]]:
        down, up = self.down, self.up
        self.down, self.up = {}, {}
        return down, up


def _sum_strategy(arrays: list[np.ndarray], config: dict, settings: FederationSettings,
                  nodes: list[int] | None, on_exposed: Callable[[], None] | None = None):
    """A one-round strategy: broadcast `arrays` and `config` to `nodes` (None: all), sum the replies.
    `on_exposed()`, in plain aggregation, is called before the round is sent: each answer reaches the server as it
    arrives (Flower pulls replies while it waits for the rest), so from then on the server may hold some."""
    from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg

    class Sum(FedAvg):
        """Turns the (secure) aggregate into the sum of the parties' vectors; keeps who answered."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.total: np.ndarray | None = None
            self.contributors = 0
            self.failures: list = []
            self.replies: dict[int, list[np.ndarray]] = {}

        def configure_fit(self, server_round, parameters, client_manager):
            instructions = self._instructions(server_round, parameters, client_manager)
            if on_exposed is not None:  # given for plain rounds only (`FlowerAggregator._round`)
                on_exposed()
            return instructions

        def _instructions(self, server_round, parameters, client_manager):
            if nodes is None:  # the roster: every node connected once all parties are, or when the timeout ends
                # (Flower's own sampler would wait for all of them for up to a day)
                client_manager.wait_for(settings.parties, timeout=settings.timeout)
                proxies = list(client_manager.all().values())
                if len(proxies) > settings.parties:
                    raise FederationError(
                        f"{len(proxies)} nodes are connected for a run of {settings.parties} parties: a party "
                        "answering from two nodes would vote its records twice; stop the extra SuperNodes (a "
                        "restarted one's stale node leaves after Flower's heartbeat expires: then resume the run)")
                if not proxies:
                    raise FederationError(f"no party connected within federated.timeout={settings.timeout:g} s")
                return [(proxy, FitIns(parameters, dict(config))) for proxy in proxies]
            client_manager.wait_for(len(nodes), timeout=settings.timeout)
            by_node = {proxy.node_id: proxy for proxy in client_manager.all().values()}
            missing = [n for n in nodes if n not in by_node]
            if missing:
                raise FederationError(f"nodes {missing} of this round are not connected")
            return [(by_node[n], FitIns(parameters, dict(config))) for n in nodes]

        def aggregate_fit(self, server_round, results, failures):
            self.contributors, self.failures = len(results), list(failures)
            if not results:
                return None, {}
            arrays = [parameters_to_ndarrays(fit.parameters)[0] for _, fit in results]
            self.replies = {proxy.node_id: parameters_to_ndarrays(fit.parameters) for proxy, fit in results}
            # SecAgg+ hands every result the unmasked weighted mean (weights 1): sum = mean * count.
            self.total = arrays[0] * len(results) if settings.secure else np.sum(arrays, axis=0)
            return None, {}

    count = len(nodes) if nodes is not None else settings.parties
    return Sum(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=count, min_evaluate_clients=0,
        min_available_clients=count,
        # Always pass initial parameters: otherwise the workflow asks a party for its own, in the clear.
        initial_parameters=ndarrays_to_parameters(arrays),
        on_fit_config_fn=lambda _round: config,
    )


def _vote_config(vote_round: VoteRound, settings: FederationSettings) -> dict:
    return {
        "round": "votes",
        "release": vote_round.release,
        "spec": vote_round.spec.model_dump_json(exclude_defaults=True),  # a party of an earlier version reads it
        "party_sigma": float(vote_round.party_sigma),
        "max_records": int(settings.max_records),
        "min_parties": int(vote_round.min_parties or settings.min_parties),
        **settings.party_data,
    }


def _secagg_workflow(vote_round: VoteRound, settings: FederationSettings, n: int, fewest: int,
                     on_exposed: Callable[[], None] | None = None):
    """`on_exposed()` is called when unmasking starts: from the key shares it collects, the server can compute the
    sum (the masked vectors before it reveal nothing)."""
    from flwr.server.workflow import SecAggPlusWorkflow

    class ThresholdedSecAggPlus(SecAggPlusWorkflow):
        """SecAgg+ that never unmasks a sum of fewer than `fewest` parties' vectors."""

        def unmask_stage(self, grid, context, state) -> bool:
            if on_exposed is not None:
                on_exposed()
            return super().unmask_stage(grid, context, state)

        def _check_threshold(self, state) -> bool:
            if len(state.active_node_ids) < fewest:
                log.error("only %d parties active, fewer than min_parties=%d: not unmasking",
                          len(state.active_node_ids), fewest)
                return False
            return super()._check_threshold(state)

    return ThresholdedSecAggPlus(
        # Flower wants an integer number of shares > 2; 1.0 means "every party asked" (for 2 parties).
        num_shares=n if n > 2 else 1.0,
        # Flower's key-share threshold must be < num_shares; ours (fewest) is checked above.
        reconstruction_threshold=max(2, min(fewest, n - 1)),
        max_weight=1.0,
        clipping_range=vote_round.clip,
        quantization_range=quantization_range(settings.parties),
        modulus_range=MODULUS_RANGE,
        timeout=settings.timeout,
    )


class FlowerAggregator:
    """Runs vote rounds on the federation the ServerApp was given (lives in the server thread)."""

    def __init__(self, grid: Any, context: Any, settings: FederationSettings) -> None:
        self.grid, self.context, self.settings = grid, context, settings
        self.meter = _Meter()
        self.meter.wrap(grid)
        self._roster: dict[int, int] | None = None  # party id -> Flower node id

    def preflight(self) -> None:
        """Before the first round that releases anything: every connected party checks its own records against
        the run's public preconditions (at most `max_records_per_party`; its file loads with the task's labels)
        and answers with its party id, in plain. A party that fails stops the run here, with nothing released.
        Why: a party that failed in a vote round instead would drop out, and the others' sum be released
        without its votes, so one record more (past the bound, or with a label not in the task) would remove a
        whole party's votes: far more than the record's sensitivity."""
        if self._roster is None:
            self._roster = self._ask_roster()

    def aggregate(self, vote_round: VoteRound, on_exposed: Callable[[], None] | None = None) -> RoundResult:
        """The (securely) summed noisy answers of the parties asked; refuses too few answers. `on_exposed()`: called
        once the answers (or their sum) may reach the server: before a plain round is sent, when SecAgg+ starts
        unmasking."""
        s = self.settings
        self.preflight()
        # every round goes to nodes that passed the preflight (a node that joined later is not asked); a round of
        # every party asks them all, whatever party ids they gave (party-id is needed for party groups only)
        assert self._roster is not None  # set by the preflight
        nodes = list(self._roster.values()) if vote_round.parties is None else self.nodes_of(vote_round.parties)
        asked = len(nodes)
        fewest = vote_round.min_parties or s.min_parties
        if asked < fewest:
            raise FederationError(f"round {vote_round.release}: {asked} parties connected, fewer than "
                                  f"min_parties={fewest}; nothing was released")
        arrays = [np.asarray(vote_round.candidates, dtype=np.float32), np.asarray(vote_round.candidate_labels)]
        workflow = _secagg_workflow(vote_round, s, asked, fewest, on_exposed) if s.secure else None
        result, strategy = self._round(arrays, _vote_config(vote_round, s), nodes, workflow, on_exposed=on_exposed)
        if strategy.total is None:
            raise FederationError(
                f"round {vote_round.release}: no aggregate ({strategy.contributors} of {asked} parties "
                f"contributed, at least {fewest} required); nothing was released"
                + _party_errors(strategy.failures))
        if strategy.contributors < fewest:  # plain mode has no protocol-level check
            raise FederationError(
                f"round {vote_round.release}: {strategy.contributors} parties answered, fewer than "
                f"min_parties={fewest}; the sum would carry too little noise and is discarded")
        return result

    def train(self, train_round: TrainRound, on_exposed: Callable[[], None] | None = None) -> RoundResult:
        """One FedAvg round: the mean of the asked parties' (locally DP) adapter updates, in plain aggregation.

        Local DP-SGD makes each update DP on its own, so the server may see them one by one; a party that
        fails is left out of the mean (its records then took fewer steps than accounted: never more).
        """
        config = {"round": "train", "release": train_round.release, "round_index": train_round.round_index,
                  "request": train_round.request, "noise_multiplier": float(train_round.noise_multiplier),
                  "max_records": int(self.settings.max_records), **self.settings.party_data}
        self.preflight()
        result, strategy = self._round([np.asarray(train_round.adapter, dtype=np.float32)], config,
                                       self.nodes_of(train_round.parties), None, plain=True, on_exposed=on_exposed)
        if strategy.total is None:
            raise FederationError(
                f"training round {train_round.round_index}: no training party answered"
                + _party_errors(strategy.failures))
        result.total = result.total / strategy.contributors
        return result

    def nodes_of(self, parties: tuple[int, ...]) -> list[int]:
        """Node ids of the connected parties among these party ids. Each party answers a roster round with its
        id, nothing else, once its own checks pass (one that fails them, or answers with an error, stops the run:
        `preflight`); asked again when a party is missing (it may have reconnected with a new node id). Parties
        not connected are left out: the round's own threshold decides whether enough answer."""
        if self._roster is None or set(parties) - set(self._roster):
            self._roster = self._ask_roster()
        missing = sorted(set(parties) - set(self._roster))
        if missing:
            log.warning("parties %s are not connected; asking the others", missing)
        nodes = [self._roster[p] for p in parties if p in self._roster]
        if not nodes:
            raise FederationError(f"none of the parties {sorted(parties)} is connected")
        return nodes

    def _ask_roster(self) -> dict[int, int]:
        """Party id -> node id of the connected parties, each having passed its checks (`preflight`)."""
        config = {"round": "roster", "max_records": int(self.settings.max_records),
                  "adjacency": self.settings.adjacency, **self.settings.party_data}
        _, strategy = self._round([np.zeros(1, dtype=np.float32)], config, None, None, plain=True)
        if strategy.failures:
            raise FederationError(
                f"{len(strategy.failures)} part{'y' if len(strategy.failures) == 1 else 'ies'} did not pass the "
                "preflight before any release (its own checks failed or it lost its connection; each party's "
                "SuperNode log says why); nothing was released: "
                + "; ".join(party_reason(f) for f in strategy.failures))
        roster: dict[int, int] = {}
        for node, arrays in strategy.replies.items():
            party = int(arrays[0][0])
            if party in roster:
                raise FederationError(f"two nodes claim party id {party}: give each SuperNode its own party-id")
            roster[party] = node
        return roster

    def _round(self, arrays: list[np.ndarray], config: dict, nodes: list[int] | None, workflow: Any,
               *, plain: bool = False, on_exposed: Callable[[], None] | None = None) -> tuple[RoundResult, Any]:
        from flwr.server import LegacyContext, ServerConfig
        from flwr.server.workflow import DefaultWorkflow

        s = self.settings if not plain else dataclasses.replace(self.settings, secure=False)
        t0 = time.perf_counter()
        strategy = _sum_strategy(arrays, config, s, nodes, on_exposed if workflow is None else None)
        legacy = LegacyContext(context=self.context, config=ServerConfig(num_rounds=1, round_timeout=s.timeout),
                               strategy=strategy)
        (DefaultWorkflow(fit_workflow=workflow) if workflow is not None else DefaultWorkflow())(self.grid, legacy)
        down, up = self.meter.take()
        total = np.asarray(strategy.total, dtype=np.float64) if strategy.total is not None else np.zeros(0)
        return RoundResult(total=total, contributors=strategy.contributors, bytes_down=down, bytes_up=up,
                           seconds=time.perf_counter() - t0), strategy


def check_party_ledger(ledger: PartyLedger | None, run_adjacency: str) -> None:
    """The preflight's check of a deployed party's own ledger (built here, so a bad budget in its node config
    stops the run before any release): it must count neighbours at least as strictly as the run (replace
    neighbours have the larger sensitivities), or its figure could fall below the run's for the same answers."""
    if ledger is not None and run_adjacency == "replace" and ledger.adjacency != Adjacency.REPLACE:
        raise DpsynthError("this party's ledger counts add/remove neighbours and the run is planned for replace: "
                           "set adjacency=\"replace\" in its node config")


def _party_errors(failures: list) -> str:
    """The parties' failures for a round's error, each one line (`party_reason`), or nothing."""
    return f"; party errors: {'; '.join(party_reason(f) for f in failures)}" if failures else ""


def party_reason(failure: Any) -> str:
    """A party's failure as one short line: the dpsynth message it raised, as a deployed SuperNode sends it
    (`<class '...DpsynthError'>:<'message'>`, the exception's own text, never its chained cause) or as the
    simulation's Ray traceback ends (`DpsynthError: message`); for anything else, its kind only (another
    library's message could quote the party's data). A party's own messages name no private value
    (flower_app's loader)."""
    text = str(failure)
    deployed = re.search(r"DpsynthError'>:<'(.*?)'>", text, flags=re.DOTALL)
    if deployed:
        return deployed.group(1).strip()[:300]
    marker = "DpsynthError: "
    if marker in text:
        return text[text.rindex(marker) + len(marker):].splitlines()[0].split("\\n")[0].strip(" '\"")[:300]
    kind = re.search(r"<class '([\w.]+)'>", text)
    return f"{kind.group(1) if kind else 'an error'} (the party's own log has its message)"


ShardSource = Callable[[Any, Any], PartyShard]  # (Flower context, round config) -> the party's shard


PLAIN_ROUNDS = ("roster", "train")  # rounds whose answers are public (a party id) or already DP on their own


def party_client_app(shard_for: ShardSource, *, secure: bool, noise_seed: int | None,
                     may_train: Callable[[Any], bool] = lambda context: True,
                     ledger_for: Callable[[Any], PartyLedger | None] = lambda context: None,
                     device_for: Callable[[Any], str] = lambda context: "cpu"):
    """The ClientApp every party runs: its noisy votes for each round, masked by SecAgg+ if `secure`;
    its party id for the roster round; its locally DP adapter update for a training round, if
    `may_train(context)` (a deployed party trains only when its node config makes it a strong party).
    If `ledger_for` gives the party its own ledger (a deployed party always has one), every vote and
    training answer is charged there before it is computed, and refused past the party's own budget
    (or without noise, unless the ledger allows it). `device_for(context)`: where the party trains ('cpu' or
    'cuda')."""
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    class Party(NumPyClient):
        def __init__(self, context: Any) -> None:
            self.context = context

        def fit(self, parameters, config):
            kind = str(config.get("round", "votes"))
            shard = shard_for(self.context, config)
            if kind == "roster":  # the preflight: the party's own checks, then its id
                check_party_size(shard, int(config["max_records"]))
                check_party_ledger(ledger_for(self.context), str(config.get("adjacency", "add_remove")))
                return [np.array([shard.party_id], dtype=np.float64)], 1, {}
            if kind == "train":
                from dpsynth.federated.party_training import training_answer

                if not may_train(self.context):
                    raise DpsynthError("this party is not a training party (node config role=\"strong\")")
                (adapter,) = parameters
                return [training_answer(shard, adapter, config, ledger=ledger_for(self.context),
                                        noise_seed=noise_seed, device=device_for(self.context))], 1, {}
            candidates, labels = parameters
            spec = VoteSpec.model_validate_json(str(config["spec"]))
            party_sigma = float(config["party_sigma"])
            ledger = ledger_for(self.context)
            # before charging: a refused answer costs nothing
            check_party_size(shard, int(config["max_records"]))
            check_vote_request(shard, spec, candidates, labels)
            if ledger is not None:
                ledger.charge_votes(spec, release=str(config["release"]), party_sigma=party_sigma,
                                    min_parties=int(config["min_parties"]))
            vec = noisy_votes(
                shard, spec, candidates, labels, release=str(config["release"]), party_sigma=party_sigma,
                max_records=int(config["max_records"]), noise_seed=noise_seed,
            )
            return [vec], 1, {}

    def client_fn(context):
        return Party(context).to_client()

    def secure_unless_public(msg, ctxt, call_next):
        """SecAgg+ for vote rounds; roster and training rounds (public or locally DP answers) pass in plain.
        A vote round that arrives without SecAgg+ is refused: its share of the noise is too small alone."""
        if msg.metadata.message_type == "train" and RECORD_KEY_CONFIGS not in msg.content.config_records:
            fit_config = msg.content.config_records.get("fitins.config", {})
            if str(fit_config.get("round", "votes")) not in PLAIN_ROUNDS:
                raise DpsynthError("this party answers vote rounds only through SecAgg+; the server asked in plain")
            return call_next(msg, ctxt)
        return secaggplus_mod(msg, ctxt, call_next)

    return ClientApp(client_fn=client_fn, mods=[secure_unless_public] if secure else [])


@contextmanager
def _variable_kept(name: str) -> Iterator[None]:
    """The environment variable `name` as it was before the block: a library call must not change the caller's
    environment (Flower's Ray backend rewrites PYTHONPATH for good, which later subprocesses then inherit)."""
    before = os.environ.get(name)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def run_federation(shards: list[PartyShard], settings: FederationSettings,
                   program: Callable[[FlowerAggregator], T],
                   ledger_for: Callable[[int], PartyLedger | None] = lambda party_id: None) -> T:
    """Start a Flower simulation of the parties and run `program` as its ServerApp; return its result.
    `ledger_for(party_id)`: a simulated party's own ledger, as a deployed party keeps (flower_app). `dpsynth run`
    gives none (one process: the run's ledger is the only one); tests give one to run a deployed party's
    charges and refusals through the real Flower runtime without deploying.

    Flower's simulation runtime logs server-side exceptions instead of raising them, so the
    program's outcome (result or exception) is carried out through a closure and re-raised.
    """
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    from flwr.server import ServerApp
    from flwr.simulation import run_simulation

    if len(shards) != settings.parties:
        raise DpsynthError(f"{len(shards)} shards for {settings.parties} parties")
    outcome: dict[str, Any] = {}
    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        try:
            outcome["result"] = program(FlowerAggregator(grid, context, settings))
        except BaseException as err:  # carried to the caller below
            outcome["error"] = err

    # Flower logs every protocol stage at INFO; failures are turned into exceptions above.
    logging.getLogger("flwr").setLevel(logging.WARNING)
    with _variable_kept("PYTHONPATH"):  # Ray's backend sets it for its workers, in this process's environment
        run_simulation(
            server_app=app, num_supernodes=settings.parties,
            client_app=party_client_app(
                lambda context, _config: shards[int(context.node_config["partition-id"])],
                secure=settings.secure, noise_seed=settings.noise_seed,
                ledger_for=lambda context: ledger_for(shards[int(context.node_config["partition-id"])].party_id),
                device_for=lambda context: settings.device),
            # Ray hides the GPU from a party that asks for none: on `cuda` the parties share it
            backend_config={"client_resources": {
                                "num_cpus": 1,
                                "num_gpus": 1.0 / settings.parties if settings.device == "cuda" else 0.0},
                            "init_args": {"include_dashboard": False, "log_to_driver": False}},
        )
    if "error" in outcome:
        raise outcome["error"]
    if "result" not in outcome:
        raise FederationError("the Flower simulation ended without running the server program")
    return outcome["result"]
