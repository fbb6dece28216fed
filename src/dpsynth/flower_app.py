"""The Flower app for parties on separate machines (Flower's Deployment Runtime).

It sits above the run engine (its server side runs a whole dpsynth run), so it lives at the
top of the package, beside the CLI, not inside `dpsynth.federated`.

    flower-superlink --insecure                                   # the server machine
    flower-supernode --insecure --superlink HOST:9092 \\
        --node-config 'data-path="/data/party.csv" epsilon=4'     # each party's machine
    flwr run deploy/flower <connection> --run-config 'config="/path/run.yaml" out="/path/run-dir"'

The ServerApp runs the whole dpsynth run (generation, selection, ledger, outputs) with
`federated.partition: nodes`; it never loads private data. Each SuperNode's ClientApp
reads its own file, embeds it locally and answers vote rounds with its noisy votes,
masked by SecAgg+, each answer charged first to the party's own ledger (`party_ledger`).
Deployed parties always draw secure noise. See docs/federated.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.data.loaders import load_labelled
from dpsynth.data.records import LabelledTexts
from dpsynth.errors import DpsynthError
from dpsynth.federated.flower_secagg import party_client_app
from dpsynth.federated.party import PartyShard
from dpsynth.federated.party_ledger import PartyLedger
from dpsynth.privacy.accountant import Adjacency


class _NodeShard:
    """Loads and embeds this SuperNode's file once per process (Flower may reuse the process)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, PartyShard] = {}

    def __call__(self, context: Any, config: Any) -> PartyShard:
        from dpsynth.embed.sentence import SentenceTransformerEmbedder

        path = Path(str(context.node_config["data-path"]))
        key = (str(path), str(config["embedder"]), str(config["labels"]))
        if key not in self._cache:
            labels = json.loads(str(config["labels"]))
            data = _load_party_file(path, str(config["text_column"]), str(config["label_column"]), labels)
            emb = SentenceTransformerEmbedder(str(config["embedder"])).encode(data.texts)
            ids = np.array([labels.index(y) for y in data.labels], dtype=np.int64)
            # `party-id` in the node config names the party in a run's roles (e.g. fedgen's strong parties)
            party = int(context.node_config.get("party-id", int(context.node_id) % 2**31))
            self._cache[key] = PartyShard(party, emb, ids, tuple(data.texts))
        return self._cache[key]


def _load_party_file(path: Path, text_column: str, label_column: str, labels: list[str]) -> LabelledTexts:
    """The party's records, or an error that names none of its values. Why: Flower sends a ClientApp's exception
    text to the server, and a loader's message can quote the file (a headerless CSV's first row as its "columns",
    a wrong label column's values, i.e. private texts); the full message stays in the SuperNode's own log, as the
    cause of the error it sends."""
    try:
        data = load_labelled(path, text_column, label_column)
        unknown = sorted(set(data.labels) - set(labels))
        if unknown:
            raise DpsynthError(f"{path}: labels {unknown} are not among the run's task labels {labels}")
    except Exception as err:  # noqa: BLE001 - any loader error may quote the file (pandas, pyarrow, OS errors)
        raise DpsynthError(
            "this party could not load its private data file (its SuperNode's log says why; nothing of the file is "
            f"sent): check its data-path and the run's text_column '{text_column}', label_column '{label_column}' "
            f"and task labels {labels}") from err
    return data


def _server_app():
    from flwr.server import ServerApp

    from dpsynth.runs.config import load_config
    from dpsynth.runs.engine import Run, holds_a_run

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        out = Path(str(context.run_config["out"]))
        runner = (Run.resume(out) if holds_a_run(out)
                  else Run.create(load_config(Path(str(context.run_config["config"]))), out))
        runner.serve(grid, context)

    return app


server_app = _server_app()
def party_ledger(context: Any) -> PartyLedger:
    """This SuperNode's own ledger (federated/party_ledger.py), from its node config: `privacy-ledger` (the
    file; default beside the data file), `epsilon` (the party's budget over every run on this file; default
    inf: spend is recorded, not capped), `delta` (default 1e-5), `adjacency` (add_remove, the default, or
    replace: a run planned for replace neighbours is refused at its preflight by a party counting add/remove)
    and `trusted-parties` (the most noise shares it counts on in a sum, whatever the server's min_parties says;
    default: the server's word). A deployed party never answers without noise."""
    config = context.node_config
    data = Path(str(config["data-path"]))
    path = Path(str(config.get("privacy-ledger", data.with_name(data.name + ".privacy-ledger.json"))))
    adjacency = str(config.get("adjacency", Adjacency.ADD_REMOVE.value))
    if adjacency not in {a.value for a in Adjacency}:
        raise DpsynthError(f"node config adjacency={adjacency!r}: give add_remove or replace")
    trusted = config.get("trusted-parties")
    if trusted is not None and (isinstance(trusted, bool) or not str(trusted).isdecimal() or int(trusted) < 1):
        raise DpsynthError(f"node config trusted-parties={trusted!r}: give a whole number of parties, at least 1")
    return PartyLedger(path, float(config.get("epsilon", math.inf)), float(config.get("delta", 1e-5)),
                       Adjacency(adjacency), None if trusted is None else int(trusted))


def party_device(context: Any) -> str:
    """Where this SuperNode trains when it is a strong party: `device` in its node config (auto, cpu or cuda;
    default auto: its GPU if torch sees one), its own choice, not the server's."""
    from dpsynth.device import resolve_device

    return resolve_device(str(context.node_config.get("device", "auto")))


client_app = party_client_app(_NodeShard(), secure=True, noise_seed=None,
                              may_train=lambda context: str(context.node_config.get("role", "")) == "strong",
                              ledger_for=party_ledger, device_for=party_device)
