"""What a training party runs in a FedAvg round: local DP-Adam steps on its own records (papers/004, A.3).

The party starts from the broadcast adapter, takes `request.steps` DP-Adam steps with Poisson
sampling, per-example clipping and the full Gaussian noise (local DP-SGD: its update is DP on
its own, whatever the server or the other parties do), and returns only the update. Its records,
their gradients and its secret seed stay here. The base model is loaded once per process (Flower
reuses a party's process across rounds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.errors import DpsynthError, require
from dpsynth.federated.party import PartyShard, check_party_size
from dpsynth.federated.party_ledger import PartyLedger
from dpsynth.finetune.request import AdapterTraining
from dpsynth.privacy.mechanisms import NoiseSource

_MODELS: dict[tuple[str, int, int], tuple[Any, Any]] = {}


def training_answer(shard: PartyShard, adapter: np.ndarray, config: Any, *, ledger: PartyLedger | None,
                    noise_seed: int | None, device: str = "cpu") -> np.ndarray:
    """The party's answer to a training round: the round charged on its own ledger first (which refuses it
    past the party's budget, or without noise unless the party allows that), then its local update.

    Without a party ledger (a simulation, where the run's ledger is the only one and already holds the
    release, noiseless at epsilon = inf) the round runs as the run asked; a deployed party always has one."""
    # before charging, what can fail without the party's noise: a refused answer costs nothing
    check_party_size(shard, int(config["max_records"]))
    check_training_shard(shard)
    request = AdapterTraining.model_validate_json(str(config["request"]))
    require("opacus", "finetune", "a training party's DP-Adam")  # imported by local_update, after the charge
    _model(request)  # loaded (once per process) before the charge: a wrong model path is not paid for
    if ledger is not None:
        ledger.charge_training(release=str(config["release"]), round_index=int(config["round_index"]),
                               steps=request.steps, sampling_rate=request.sampling_rate,
                               noise_multiplier=float(config["noise_multiplier"]))
    return local_update(shard, adapter, config, noise_seed=noise_seed, device=device)


def local_update(shard: PartyShard, adapter: np.ndarray, config: Any, *, noise_seed: int | None,
                 device: str = "cpu") -> np.ndarray:
    """The party's adapter after its local DP steps, minus the adapter it started from (float32). `device`
    ('cpu' or 'cuda'): where this party's DP-SGD runs, the party's own choice (a simulation's parties use the
    run's `device:`; a deployed party its node config's `device`)."""
    import torch

    from dpsynth.finetune.dp_adam import TrainSettings, train_adapter
    from dpsynth.finetune.model import load_adapter_vector

    request = AdapterTraining.model_validate_json(str(config["request"]))
    check_party_size(shard, int(config["max_records"]))
    check_training_shard(shard)
    labels = json.loads(str(config["labels"]))
    if request.threads is not None:
        torch.set_num_threads(request.threads)
    model, tokenizer = _model(request)
    load_adapter_vector(model, adapter)
    # secret unless the simulation is seeded for reproducibility (then the report says NOT FOR RELEASE)
    stream = f"{config['release']}/round{int(config['round_index'])}/party{shard.party_id}"
    seed = NoiseSource(noise_seed).secret_seed(stream)
    settings = TrainSettings(steps=request.steps, sampling_rate=request.sampling_rate,
                             noise_multiplier=float(config["noise_multiplier"]), clip_norm=request.clip_norm,
                             learning_rate=request.learning_rate, max_length=request.max_length, seed=seed)
    prompts = [request.prompts[labels[int(i)]] for i in shard.label_ids]
    trained = train_adapter(model, tokenizer, prompts, list(shard.texts), settings, checkpoint_dir=None,
                            device=device)
    return (trained - np.asarray(adapter, dtype=np.float32)).astype(np.float32)


def check_training_shard(shard: PartyShard) -> None:
    if len(shard.texts) != len(shard):
        raise DpsynthError(f"party {shard.party_id} has no texts to train on (its shard holds embeddings only)")


def _model(request: AdapterTraining) -> tuple[Any, Any]:
    from dpsynth.finetune.model import add_lora, load_base

    key = (request.model, request.lora_r, request.lora_alpha)
    if key not in _MODELS:
        model, tokenizer = load_base(Path(request.model))
        _MODELS[key] = (add_lora(model, request.lora_r, request.lora_alpha), tokenizer)
    return _MODELS[key]
