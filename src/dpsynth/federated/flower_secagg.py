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
  `_ThresholdedSecAggPlus` also refuses to unmask unless at least `min_parties` parties
  contributed masked vectors, and a round without a sum raises here.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import numpy as np

from dpsynth.errors import DpsynthError
from dpsynth.federated.party import PartyShard, noisy_votes
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


def _vote_sum_strategy(vote_round: VoteRound, settings: FederationSettings):
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg

    class VoteSum(FedAvg):
        """Broadcasts the candidates; turns the (secure) aggregate into the sum of party votes."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.total: np.ndarray | None = None
            self.contributors = 0
            self.failures: list = []

        def aggregate_fit(self, server_round, results, failures):
            self.contributors, self.failures = len(results), list(failures)
            if not results:
                return None, {}
            arrays = [parameters_to_ndarrays(fit.parameters)[0] for _, fit in results]
            # SecAgg+ hands every result the unmasked weighted mean (weights 1): sum = mean * count.
            self.total = arrays[0] * len(results) if settings.secure else np.sum(arrays, axis=0)
            return None, {}

    config = {
        "release": vote_round.release,
        "spec": vote_round.spec.model_dump_json(),
        "party_sigma": float(vote_round.party_sigma),
        "max_records": int(settings.max_records),
        **settings.party_data,
    }
    return VoteSum(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=settings.parties, min_evaluate_clients=0,
        min_available_clients=settings.parties,
        # Always pass initial parameters: otherwise the workflow asks a party for its own, in the clear.
        initial_parameters=ndarrays_to_parameters(
            [np.asarray(vote_round.candidates, dtype=np.float32), np.asarray(vote_round.candidate_labels)]),
        on_fit_config_fn=lambda _round: config,
    )


def _secagg_workflow(vote_round: VoteRound, settings: FederationSettings):
    from flwr.server.workflow import SecAggPlusWorkflow

    class ThresholdedSecAggPlus(SecAggPlusWorkflow):
        """SecAgg+ that never unmasks a sum of fewer than `min_parties` parties' vectors."""

        def _check_threshold(self, state) -> bool:
            if len(state.active_node_ids) < settings.min_parties:
                log.error("only %d parties active, fewer than min_parties=%d: not unmasking",
                          len(state.active_node_ids), settings.min_parties)
                return False
            return super()._check_threshold(state)

    n = settings.parties
    return ThresholdedSecAggPlus(
        num_shares=n,
        # Flower's key-share threshold must be < num_shares; ours (min_parties) is checked above.
        reconstruction_threshold=max(2, min(settings.min_parties, n - 1)),
        max_weight=1.0,
        clipping_range=vote_round.clip,
        quantization_range=quantization_range(n),
        modulus_range=MODULUS_RANGE,
        timeout=settings.timeout,
    )


class FlowerAggregator:
    """Runs vote rounds on the federation the ServerApp was given (lives in the server thread)."""

    def __init__(self, grid: Any, context: Any, settings: FederationSettings) -> None:
        self.grid, self.context, self.settings = grid, context, settings
        self.meter = _Meter()
        self.meter.wrap(grid)

    def aggregate(self, vote_round: VoteRound) -> RoundResult:
        from flwr.server import LegacyContext, ServerConfig
        from flwr.server.workflow import DefaultWorkflow

        s = self.settings
        t0 = time.perf_counter()
        strategy = _vote_sum_strategy(vote_round, s)
        legacy = LegacyContext(context=self.context, config=ServerConfig(num_rounds=1, round_timeout=s.timeout),
                               strategy=strategy)
        workflow = DefaultWorkflow(fit_workflow=_secagg_workflow(vote_round, s)) if s.secure else DefaultWorkflow()
        workflow(self.grid, legacy)
        down, up = self.meter.take()
        if strategy.total is None:
            raise FederationError(
                f"round {vote_round.release}: no aggregate ({strategy.contributors} of {s.parties} parties "
                f"contributed, at least {s.min_parties} required); nothing was released"
                + (f"; party errors: {[str(f)[:200] for f in strategy.failures]}" if strategy.failures else ""))
        if strategy.contributors < s.min_parties:  # plain mode has no protocol-level check
            raise FederationError(
                f"round {vote_round.release}: {strategy.contributors} parties answered, fewer than "
                f"min_parties={s.min_parties}; the sum would carry too little noise and is discarded")
        return RoundResult(total=np.asarray(strategy.total, dtype=np.float64), contributors=strategy.contributors,
                           bytes_down=down, bytes_up=up, seconds=time.perf_counter() - t0)


ShardSource = Callable[[Any, Any], PartyShard]  # (Flower context, round config) -> the party's shard


def party_client_app(shard_for: ShardSource, *, secure: bool, noise_seed: int | None):
    """The ClientApp every party runs: its noisy votes for each round, masked by SecAgg+ if `secure`."""
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp

    class Party(NumPyClient):
        def __init__(self, context: Any) -> None:
            self.context = context

        def fit(self, parameters, config):
            candidates, labels = parameters
            vec = noisy_votes(
                shard_for(self.context, config), VoteSpec.model_validate_json(str(config["spec"])), candidates,
                labels, release=str(config["release"]), party_sigma=float(config["party_sigma"]),
                max_records=int(config["max_records"]), noise_seed=noise_seed,
            )
            return [vec], 1, {}

    def client_fn(context):
        return Party(context).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod] if secure else [])


def run_federation(shards: list[PartyShard], settings: FederationSettings,
                   program: Callable[[FlowerAggregator], T]) -> T:
    """Start a Flower simulation of the parties and run `program` as its ServerApp; return its result.

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
    run_simulation(
        server_app=app, num_supernodes=settings.parties,
        client_app=party_client_app(lambda context, _config: shards[int(context.node_config["partition-id"])],
                                    secure=settings.secure, noise_seed=settings.noise_seed),
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                        "init_args": {"include_dashboard": False, "log_to_driver": False}},
    )
    if "error" in outcome:
        raise outcome["error"]
    if "result" not in outcome:
        raise FederationError("the Flower simulation ended without running the server program")
    return outcome["result"]
