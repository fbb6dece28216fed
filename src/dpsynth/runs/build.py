"""Build a run's parts from its config: generators, the data holder and label proportions; and the checks made
before a run starts.

The engine makes only the ledger and the lazily loaded embedder itself, so it reads as the loop it is, and a test
can build the same parts without running anything.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpsynth.config import GeneratorConfig, RunConfig, records_per_unit
from dpsynth.data.corpora import get_corpus
from dpsynth.data.public import load_test, say_test_scores_are_unnoised, task_for
from dpsynth.data.records import TaskSpec
from dpsynth.device import resolve_device
from dpsynth.embed.sentence import Embedder
from dpsynth.errors import DpsynthError, require
from dpsynth.fs import cache_dir
from dpsynth.llm.base import Usage
from dpsynth.llm.cache import CachedGenerator
from dpsynth.llm.registry import build_generator, check_generator
from dpsynth.llm.request_store import RequestCache
from dpsynth.llm.spend import SpendGuard, SpendLimits
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.mechanisms import NoiseSource
from dpsynth.private.dataset import check_private, load_private, open_central_holder
from dpsynth.private.holder import DataHolder, ReleasingHolder
from dpsynth.private.releases import ReleaseStore
from dpsynth.runs.planning import PrivacyPlan


def prices(g: GeneratorConfig) -> dict[str, float]:
    out = {}
    if g.price_per_prompt_token is not None:
        out["prompt"] = g.price_per_prompt_token
    if g.price_per_completion_token is not None:
        out["completion"] = g.price_per_completion_token
    return out


def open_request_cache() -> RequestCache:
    """The user-wide request cache every run's generators share (`DPSYNTH_CACHE` moves it)."""
    return RequestCache(cache_dir() / "requests.sqlite")


def build_generators(config: RunConfig, usage: dict[str, Usage], run_id: str | None = None
                     ) -> dict[str, CachedGenerator]:
    """Every generator behind the persistent request cache, counting into `usage`; with `run_id`, the answers
    each pays for are stored as paid by `<run_id>/<generator name>` (CachedGenerator.count_unrecorded_payments)."""
    cache = open_request_cache()
    out = {}
    for i, g in enumerate(config.generators):
        limits = SpendLimits.of(g)
        guard = SpendGuard(g.display_name, limits, usage[g.display_name], f"generators[{i}]") if limits.caps else None
        backend = build_generator(g)
        if hasattr(backend, "to_device"):  # torch backends follow the run's device; llama.cpp and APIs have none
            backend.to_device(resolve_device(config.device))
        payer = None if run_id is None else f"{run_id}/{g.display_name}"
        out[g.display_name] = CachedGenerator(backend, cache, usage[g.display_name], guard, payer=payer)
    return out


def build_holder(plan: PrivacyPlan, *, knobs: dict[str, float], ledger: PrivacyLedger, store: ReleaseStore,
                 task: TaskSpec, embedder: Embedder, given: Any = None) -> ReleasingHolder:
    """The central holder (it loads and checks the private records), or for a `federated:` run the holder
    whose releases the parties compute (in a simulation they load their shards when it starts). `given`: the
    records handed over in Python (data.in_memory)."""
    config, method = plan.config, plan.method
    common = dict(ledger=ledger, noise=NoiseSource(config.privacy.noise_seed), schedule=plan.schedule, knobs=knobs,
                  store=store, records_per_unit=records_per_unit(config))
    if config.federated is not None:
        from dpsynth.federated.holder import FederatedHolder

        return FederatedHolder(config.federated, plan.clip_delta, groups=method.party_groups(), **common)
    return open_central_holder(config, task, min_records=method.min_private_records(), load=plan.reads_private_records,
                               embedder=embedder, given=given, device=resolve_device(config.device), **common)


def check_packages(plan: PrivacyPlan) -> None:
    """The optional packages the run will import, looked for before it starts or resumes (`errors.require`)."""
    config = plan.config
    for module, extra in plan.method.needs_packages:
        require(module, extra, f"method {plan.method.name}")
    if config.resample is not None:
        require("faiss", "local", "resample: (its k-means)")
    fed = config.federated
    if fed is not None:
        require("flwr", "federated", "federated:")
        if plan.method.trains_in_simulation and fed.partition != "nodes":  # deployed: the parties train
            require("opacus", "finetune", f"method {plan.method.name} (its simulated parties' DP-Adam)")


def check_before_start(plan: PrivacyPlan, given: Any = None) -> None:
    """What the run will find wrong with the task or the user's private file, found before its directory exists
    (issue 33): the data holder's own load and checks, run once ahead and kept nowhere."""
    config = plan.config
    resolve_device(config.device)  # `cuda` without a GPU fails here
    for generator in config.generators:
        check_generator(generator)
    if config.data.corpus is not None:
        get_corpus(config.data.corpus)  # an unknown name fails here (the corpus itself loads with the holder)
    check_packages(plan)
    task = task_for(config)
    plan.method.check_task(task)
    if config.evaluate and config.data.test is not None:
        if len(task.labels) < 2:
            raise DpsynthError("data.test: evaluation trains a classifier over the task's labels, and the task has "
                               "one: every score would be 1.0 whatever the texts; set evaluate: false")
        test = load_test(config)  # a missing or unreadable test file fails here, not after the run
        foreign = sorted(set(test.labels) - set(task.labels)) if test is not None else []
        if foreign:  # the run writes none of them, so each such test example would only ever count as an error
            raise DpsynthError(f"data.test: labels {foreign} are not among the task's labels "
                               f"({', '.join(task.labels)}); give the test set of this task (or its label_column)")
        say_test_scores_are_unnoised(str(config.data.test))
    fed = config.federated
    users_records = config.data.own or (fed is not None and fed.partition == "files")
    # a simulated federation's records too (a deployed one's parties check their own, before any release)
    if users_records and plan.reads_private_records and (fed is None or fed.partition != "nodes"):
        private = load_private(config, quiet=True, given=given)
        check_private(config, private, task, min_records=plan.method.min_private_records())
        if fed is not None:
            from dpsynth.federated.shards import checked_parts

            checked_parts(config, private, task.label_names)


def label_shares(config: RunConfig, task: TaskSpec, holder: DataHolder,
                 release: tuple[str, int | None] | None) -> dict[str, float]:
    """Label proportions to generate: public ({label: share}), a DP histogram (`release`), or uniform."""
    p, labels = config.privacy, task.label_names
    if isinstance(p.label_proportions, dict):
        if set(p.label_proportions) != set(labels) or any(v <= 0 for v in p.label_proportions.values()):
            raise DpsynthError(f"privacy.label_proportions must give a positive share for each of {labels}")
        total = sum(p.label_proportions.values())
        return {c: p.label_proportions[c] / total for c in labels}
    if release is None:
        return {c: 1.0 / len(labels) for c in labels}
    noisy = holder.noisy_label_counts(labels, release=release)
    clipped = np.clip(noisy, 1.0, None)  # post-processing of the noisy counts
    return {c: float(v / clipped.sum()) for c, v in zip(labels, clipped)}
