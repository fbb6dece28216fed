"""Connect a run's federated holder to a federation: a Flower simulation, or a real deployment.

In a simulation the experiment's private set is split into party shards on this machine and
the run executes as the ServerApp; in a deployment (`partition: nodes`) the parties are
SuperNodes on their own machines and the server never loads private data.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from dpsynth.config import RunConfig
from dpsynth.data.records import TaskSpec
from dpsynth.device import resolve_device
from dpsynth.embed.sentence import Embedder
from dpsynth.federated.flower_secagg import (
    FederationSettings,
    FlowerAggregator,
    run_federation,
)
from dpsynth.federated.holder import FederatedHolder
from dpsynth.federated.shards import party_shards
from dpsynth.private.dataset import check_private, load_private

T = TypeVar("T")


def settings_for(config: RunConfig, holder: FederatedHolder, labels: list[str], *,
                 deployed: bool) -> FederationSettings:
    """How the parties answer: noise shares, bounds, and how a party reads its records (`labels` in the
    order the run numbers them: a corpus's labels come from the corpus, not the config)."""
    fed = config.federated
    assert fed is not None
    return FederationSettings(
        parties=fed.parties, min_parties=holder.min_parties, secure=fed.aggregation == "secagg+",
        max_records=fed.max_records_per_party, timeout=fed.timeout,
        # deployed parties always draw secure noise: a seed known to the server would let it remove the noise
        noise_seed=None if deployed else config.privacy.noise_seed,
        device="cpu" if deployed else resolve_device(config.device),  # deployed parties choose their own
        adjacency=config.privacy.adjacency.value,
        party_data={"text_column": config.data.text_column, "label_column": config.data.label_column,
                    "labels": json.dumps(labels),
                    "embedder": config.embedder},
    )


def simulate(config: RunConfig, task: TaskSpec, embedder: Embedder, holder: Any, program: Callable[[], T],
             *, min_records: tuple[int, str], on_embedded: Callable[[], None] | None = None,
             given: Any = None) -> T:
    """Run `program` (the run's iterations) as the ServerApp of a Flower simulation of the parties.

    The experiment's private set is loaded, checked and split into party shards here, on the party
    side of the simulation; the run engine never holds it. `given`: records handed over in Python.
    """
    assert isinstance(holder, FederatedHolder)
    private = load_private(config, given=given)
    check_private(config, private, task, min_records=min_records)
    shards = party_shards(config, private, task.label_names, embedder)
    if on_embedded is not None:
        on_embedded()

    def server_program(aggregator: FlowerAggregator) -> T:
        holder.connect(aggregator)
        return program()

    return run_federation(shards, settings_for(config, holder, task.label_names, deployed=False), server_program)


def connect_deployed(config: RunConfig, holder: Any, grid: Any, flower_context: Any) -> None:
    """Attach a deployed federation (SuperLink + SuperNodes) to the run's holder."""
    from dpsynth.data.public import task_for

    assert isinstance(holder, FederatedHolder)
    labels = task_for(config).label_names
    holder.connect(FlowerAggregator(grid, flower_context, settings_for(config, holder, labels, deployed=True)))
