"""What a resumed run must share with the run it continues, beyond its privacy schedule.

The plan's privacy fingerprint (`planning.Plan.fingerprint`) keeps the ledger honest; this one keeps the output
honest. A run resumed after its config.yaml was edited (the documented way to raise a spend cap) would otherwise
accept any other edit silently: iterations before the checkpoint made with one generator, data, task or method
option, later ones with another, and the card and metrics describing only the second. A DP-SGD release resumed
under other training settings is refused here too, before its own checkpoint is read, so nobody is led to delete a
partial training state whose steps were already shown (and charged once).

Everything in the config is fingerprinted except the settings listed below, which only change how the run is
carried out (caps, concurrency, retries, timeouts, threads, the context window, prices, where the server is, the
device), or what is scored after it (evaluate, data.test). Other methods' sections are not compared: a run reads
only its own. A model named by a file or folder is compared by content, not by path. The private data is
compared by its path and columns only: a hash of the records would be an un-noised function of them on disk.
A plan saved by a dpsynth before this check has no content fingerprint: the config of its first resume becomes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpsynth.config import RunConfig
from dpsynth.llm.model_files import file_fingerprint, folder_fingerprint
from dpsynth.methods.registry import method_names

EDITABLE_GENERATOR_SETTINGS = frozenset({
    "api_key_env", "base_url", "max_concurrency", "processes", "max_retries", "timeout", "transport", "threads",
    "n_ctx", "price_per_prompt_token", "price_per_completion_token", "max_requests", "max_total_tokens", "max_cost",
    "requests_per_minute", "tokens_per_minute",
})
EDITABLE_SETTINGS = frozenset({"device", "evaluate", "data.test", "federated.timeout"})


def editable_settings() -> str:
    """The settings a resume may change, as the refusal names them."""
    return (f"generators' {', '.join(sorted(EDITABLE_GENERATOR_SETTINGS))}; "
            f"{', '.join(sorted(EDITABLE_SETTINGS))}")


def content_fingerprint(config: RunConfig) -> dict[str, Any]:
    """The config as JSON without the settings a resume may change, and without other methods' sections."""
    dump = config.model_dump(mode="json")
    others = set(method_names()) - {config.method}
    kept = {key: value for key, value in dump.items() if key not in others}
    for path in EDITABLE_SETTINGS:
        section, _, name = path.rpartition(".")
        holder = kept.get(section) if section else kept
        if isinstance(holder, dict):
            holder.pop(name, None)
    kept["generators"] = [{k: (_local_model(v) if k == "model" else v) for k, v in g.items()
                           if k not in EDITABLE_GENERATOR_SETTINGS} for g in kept.get("generators", [])]
    if isinstance(kept.get("embedder"), str):
        kept["embedder"] = _local_model(kept["embedder"])
    task = kept.get("task")
    if isinstance(task, dict) and isinstance(task.get("labels"), dict):
        # in order: releases (the label counts, votes) are arrays by label index, and two dicts of the same
        # items in another order compare equal
        task["labels"] = [[name, meaning] for name, meaning in task["labels"].items()]
    return kept


def _local_model(model: str) -> str:
    """A model named by a file or folder is its content (`llm/model_files.py`): a run directory moved to another
    machine, with its model elsewhere, resumes; the same path holding another model does not."""
    path = Path(model).expanduser()
    if path.is_file():
        return f"file {file_fingerprint(path)}"
    if path.is_dir():
        return f"folder {folder_fingerprint(path)}"
    return model


def changed_settings(before: Any, now: Any) -> list[str]:
    """The settings (dotted paths) at which two content fingerprints differ; the labels are named once."""
    found = _differences(before, now)
    labels = [p for p in found if p.startswith("task.labels")]
    return [p for p in found if p not in labels] + (["task.labels (their order counts too)"] if labels else [])


def _differences(before: Any, now: Any, path: str = "") -> list[str]:
    """The settings (dotted paths) at which two fingerprints differ; a list of another length differs as a whole.
    A key only one side has is a setting another dpsynth version added or dropped (a config always holds every
    setting, defaults included): not compared."""
    if isinstance(before, dict) and isinstance(now, dict):
        found: list[str] = []
        for key in sorted(set(before) & set(now)):
            found += _differences(before.get(key), now.get(key), f"{path}{key}.")
        return found
    if isinstance(before, list) and isinstance(now, list) and len(before) == len(now):
        found = []
        for i, (a, b) in enumerate(zip(before, now)):
            found += _differences(a, b, f"{path[:-1]}[{i}].")
        return found
    return [] if before == now else [path.rstrip(".") or "(the whole config)"]
