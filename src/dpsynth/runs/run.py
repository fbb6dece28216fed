"""A run on disk, for any method: configure, execute with checkpoints, resume, report.

Run directory:
  config.yaml       resolved configuration
  checkpoints/      state after every iteration (synthetic samples, selections made from noisy
                    votes, weights, the ledger); written atomically
  cache/            embeddings of synthetic texts
  synthetic.jsonl   text, label, source PLM, iteration
  privacy.json      the privacy report
  metrics.json      per-iteration counts and weights, token usage, timings, downstream scores
  run.log           what happened (never private text, never un-noised statistics)

Generation requests are cached persistently outside the run (the user cache), so a crash
or Ctrl-C loses nothing paid for; `resume` continues from the last checkpoint and the
ledger it holds. A method (WASP, Aug-PE, FuseGen) supplies its release plan, its state and
one `step` per iteration; everything else lives here, once.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from dpsynth.algorithms.common import SyntheticSample
from dpsynth.data.corpora import cache_dir, get_corpus, sample_private, split
from dpsynth.data.loaders import load_labelled
from dpsynth.data.records import LabelledTexts, TaskSpec
from dpsynth.embed.sentence import CachedEmbedder, SentenceTransformerEmbedder
from dpsynth.errors import DpsynthError
from dpsynth.evaluate.downstream import probe_scores
from dpsynth.llm.base import Usage
from dpsynth.llm.cache import CachedGenerator, RequestCache
from dpsynth.privacy.calibrate import calibrate_noise
from dpsynth.privacy.events import GaussianEvent
from dpsynth.privacy.ledger import Assumptions, PrivacyLedger, atomic_write_text
from dpsynth.privacy.mechanisms import NoiseSource, gaussian_release
from dpsynth.privacy.plans import ReleasePlan
from dpsynth.privacy.report import privacy_report, summary_lines, write_privacy_report
from dpsynth.privacy.sensitivity import histogram_sensitivity
from dpsynth.runs.config import RunConfig, dump_config, load_config, records_per_unit
from dpsynth.voting.spec import VoteSpec, compute_votes

if TYPE_CHECKING:
    from dpsynth.federated.voting import FederatedVoting

LABELS_RELEASE = "labels.histogram"
log = logging.getLogger("dpsynth.run")
Progress = Callable[[str, int, int], None]


@dataclass
class PreparedData:
    private: LabelledTexts
    test: LabelledTexts | None
    task: TaskSpec
    party_of: np.ndarray | None = None  # per-party files: each record's party


def _task(config: RunConfig) -> TaskSpec:
    assert config.task is not None
    return TaskSpec(config.task.text_kind, config.task.labels, description=config.task.description)


def _load_test(config: RunConfig) -> LabelledTexts | None:
    d = config.data
    return load_labelled(d.test, d.text_column, d.label_column) if d.test else None


def prepare_data(config: RunConfig) -> PreparedData:
    """Load the private set (and a real test set, if any) and check them against the task."""
    party_of = None
    if config.federated is not None and config.federated.partition == "nodes":
        # Deployment server: the private data stays at the SuperNodes; they check it themselves.
        return PreparedData(LabelledTexts([], []), _load_test(config), _task(config))
    if config.data.corpus is not None:
        corpus = get_corpus(config.data.corpus)
        splits = split(corpus.load(), seed=0)
        private = sample_private(splits.train, config.data.m or 0, seed=config.seed)
        test: LabelledTexts | None = splits.test
        task = corpus.task if config.task is None else _task(config)
    elif config.federated is not None and config.federated.partition == "files":
        parts = [load_labelled(Path(f), config.data.text_column, config.data.label_column)
                 for f in config.federated.party_files or []]
        private = LabelledTexts([t for p in parts for t in p.texts], [y for p in parts for y in p.labels])
        party_of = np.concatenate([np.full(len(p), i) for i, p in enumerate(parts)])
        test = _load_test(config)
        task = _task(config)
    else:
        assert config.data.private is not None
        private = load_labelled(config.data.private, config.data.text_column, config.data.label_column)
        test = _load_test(config)
        task = _task(config)
    where = config.data.private or f"corpus {config.data.corpus}"
    unknown = sorted(set(private.labels) - set(task.labels))
    if unknown:
        raise DpsynthError(
            f"{where}: labels {unknown} are not described in task.labels ({', '.join(task.labels)}); add them"
        )
    missing = [c for c in task.labels if c not in set(private.labels)]
    if missing:
        raise DpsynthError(
            f"{where}: label(s) {missing} have no private samples; remove them from task.labels or add data"
        )
    m = len(private)
    q = config.wasp.q if config.method == "wasp" else 1
    if m < q:
        raise DpsynthError(f"{where}: M={m} private samples is smaller than Q={q}; lower wasp.q")
    if config.privacy.delta >= 1.0 / m:
        raise DpsynthError(
            f"privacy.delta={config.privacy.delta:g} is not < 1/M = {1 / m:.3g}; such a delta allows leaking "
            "a whole record. Use e.g. 1e-5"
        )
    return PreparedData(private, test, task, party_of if config.federated is not None else None)


class MethodState(Protocol):
    next_iteration: int
    history: list[dict]

    def to_dict(self) -> dict: ...


class Method(Protocol):
    """What a generation method contributes to a run."""

    name: str

    def iterations(self, config: RunConfig) -> int: ...

    def release_plan(self, config: RunConfig) -> ReleasePlan | None: ...

    def new_state(self, config: RunConfig) -> MethodState: ...

    def load_state(self, data: dict) -> MethodState: ...

    def step(self, ctx: "RunContext", state: Any, t: int) -> dict: ...

    def final_samples(self, state: Any) -> list[SyntheticSample]: ...

    def reference_sets(self, state: Any) -> dict[str, list[SyntheticSample]]:
        """Subsets evaluated next to the final set (e.g. the zero-shot samples)."""
        ...


@dataclass
class RunContext:
    """Resources a method's step uses; private data is reachable only through `votes`-style helpers."""

    config: RunConfig
    dir: Path
    data: PreparedData
    generators: dict[str, CachedGenerator]
    embedder: SentenceTransformerEmbedder
    synth_embedder: CachedEmbedder
    ledger: PrivacyLedger
    noise: NoiseSource
    plan: ReleasePlan | None
    sigma: float | None
    label_shares: dict[str, float]
    progress: Progress | None
    timings: dict[str, float] = field(default_factory=dict)
    federation: FederatedVoting | None = None  # when the private data sits with several parties
    _private_emb: np.ndarray | None = None

    def add_time(self, key: str, since: float) -> None:
        self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - since

    def phase(self, what: str, done: int) -> None:
        if self.progress is not None:
            self.progress(what, done, 1)

    def generation_progress(self, t: int) -> Progress | None:
        if self.progress is None:
            return None
        report = self.progress
        return lambda plm, done, total: report(f"iteration {t}: {plm}", done, total)

    def embed_synthetic(self, samples: list[SyntheticSample]) -> np.ndarray:
        t0 = time.perf_counter()
        out = self.synth_embedder.encode([x.text for x in samples])
        self.add_time("embedding", t0)
        return out

    def private_embeddings(self) -> np.ndarray:
        """Computed once per process, held in memory only (never cached: they are private)."""
        if self.federation is not None:
            raise AssertionError("federated run: private embeddings exist only at the parties")
        if self._private_emb is None:
            t0 = time.perf_counter()
            self._private_emb = self.embedder.encode(self.data.private.texts)
            self.add_time("embedding", t0)
        return self._private_emb

    def label_ids(self, samples: list[SyntheticSample]) -> np.ndarray:
        labels = self.data.task.label_names
        return np.array([labels.index(x.label) for x in samples], dtype=np.int64)

    def noisy_votes(self, spec: VoteSpec, synthetic: np.ndarray, synthetic_labels: np.ndarray,
                    iteration: int) -> np.ndarray:
        """The plan's noisy votes on the candidates, from the one data holder or from the parties."""
        t0 = time.perf_counter()
        if self.federation is not None:
            assert self.plan is not None
            name = self.plan.release_name(iteration)
            self._charge(name)  # before anything is released
            out = self.federation.noisy_sum(spec, synthetic, synthetic_labels, name)
        else:
            labels = self.data.private.label_ids(self.data.task.label_names)
            votes = compute_votes(spec, self.private_embeddings(), labels, synthetic, synthetic_labels)
            out = self.release_votes(votes, iteration)  # the clean vector never leaves this function
        self.add_time("voting", t0)
        return out

    def release_votes(self, votes: np.ndarray, iteration: int) -> np.ndarray:
        """The plan's noisy release for `iteration`: charged to the ledger, then noised.

        sigma 0 only happens in an epsilon = inf run, whose ledger then reports "NOT DP".
        """
        assert self.plan is not None and self.sigma is not None
        name = self.plan.release_name(iteration)
        if self.sigma == 0.0:
            self._charge(name)
            return np.asarray(votes, dtype=np.float64)
        return gaussian_release(self.ledger, self.noise, votes, name=name, sensitivity=self.plan.sensitivity,
                                sigma=self.sigma)

    def _charge(self, name: str) -> None:
        """Record a vote release whose noise is not drawn here (the parties' shares, or none at eps=inf).

        Raises before anything is released if the budget would be exceeded.
        """
        assert self.plan is not None and self.sigma is not None
        if self.sigma == 0.0:
            self.ledger.record_non_private(name)
        else:
            self.ledger.record(GaussianEvent(name=name, sensitivity=self.plan.sensitivity, sigma=self.sigma))


class Run:
    """Executes (or resumes) one run of `config.method` in `run_dir`."""

    def __init__(self, config: RunConfig, run_dir: Path, *, progress: Progress | None = None) -> None:
        from dpsynth.algorithms import method_for

        self.config = config
        self.dir = Path(run_dir)
        self.progress = progress
        self.method: Method = method_for(config.method)
        self._wall_before = 0.0
        self._start = time.perf_counter()

    @classmethod
    def create(cls, config: RunConfig, run_dir: Path, **kw: Any) -> "Run":
        run_dir = Path(run_dir)
        if (run_dir / "checkpoints" / "state.json").exists():
            raise DpsynthError(f"{run_dir} already holds a run; resume it with `dpsynth run --resume {run_dir}`")
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.yaml", dump_config(config))
        return cls(config, run_dir, **kw)

    @classmethod
    def resume(cls, run_dir: Path, **kw: Any) -> "Run":
        run_dir = Path(run_dir)
        if not (run_dir / "config.yaml").is_file():
            raise DpsynthError(f"{run_dir}: no config.yaml; not a dpsynth run directory")
        return cls(load_config(run_dir / "config.yaml"), run_dir, **kw)

    # -- privacy set-up ----------------------------------------------------------
    def _label_event(self) -> GaussianEvent | None:
        p = self.config.privacy
        if p.label_proportions != "dp":
            return None
        return GaussianEvent(
            name=LABELS_RELEASE,
            sensitivity=histogram_sensitivity(p.adjacency, max_records_per_user=p.max_records_per_user),
            sigma=p.label_histogram_sigma,
        )

    def calibrate(self) -> float | None:
        """Vote sigma for the budget left after any fixed releases (the DP label histogram)."""
        plan = self.method.release_plan(self.config)
        if plan is None:
            return None
        p = self.config.privacy
        if math.isinf(p.epsilon):
            return 0.0  # non-private reference run: votes are released without noise
        fixed = [e for e in (self._label_event(),) if e is not None]
        delta = self.accounting_delta()
        guess = plan.sigma_closed_form(p.epsilon, delta)
        return calibrate_noise(plan.events, p.epsilon, delta, adjacency=p.adjacency, fixed_events=fixed, guess=guess)

    def accounting_delta(self) -> float:
        """The run's delta minus what SecAgg+ clipping may cost (federated runs only)."""
        from dpsynth.federated.voting import clip_delta

        fed, delta = self.config.federated, self.config.privacy.delta
        return delta if fed is None else delta - clip_delta(fed, delta)

    def _assumptions(self) -> Assumptions:
        p, fed = self.config.privacy, self.config.federated
        records = records_per_unit(self.config)
        if fed is None:
            unit = "record" if records == 1 else f"user (<= {records} records)"
            return Assumptions(adjacency=p.adjacency, unit=unit)
        unit = f"party (<= {records} records)" if fed.unit == "party" else "record"
        if fed.aggregation == "secagg+":
            trust = (f"{fed.parties} parties, Flower SecAgg+: the server sees only the sum of >= {fed.threshold} "
                     f"parties' votes, each noised with sigma/sqrt({fed.threshold}); honest-but-curious server, "
                     "parties follow the protocol and do not collude with it (colluders' noise shares can be "
                     "subtracted); per-party clipping and stochastic rounding before masking (see federated metrics)")
            convention = (f"run delta {p.delta:g} = {self.accounting_delta():g} (accountant) + "
                          f"{p.delta - self.accounting_delta():g} (probability that SecAgg+ clips a noisy vote)")
            return Assumptions(adjacency=p.adjacency, unit=unit, trust_model=trust, delta_convention=convention)
        trust = (f"{fed.parties} parties, no secure aggregation: the server sees every party's vector, so each "
                 "party adds the full sigma (disjoint data: the composition is the same as central)")
        return Assumptions(adjacency=p.adjacency, unit=unit, trust_model=trust)

    def _label_shares(self, data: PreparedData, ledger: PrivacyLedger, noise: NoiseSource) -> dict[str, float]:
        p, labels = self.config.privacy, data.task.label_names
        if p.label_proportions == "uniform":
            return {c: 1.0 / len(labels) for c in labels}
        if isinstance(p.label_proportions, dict):
            if set(p.label_proportions) != set(labels) or any(v <= 0 for v in p.label_proportions.values()):
                raise DpsynthError(f"privacy.label_proportions must give a positive share for each of {labels}")
            total = sum(p.label_proportions.values())
            return {c: p.label_proportions[c] / total for c in labels}
        event = self._label_event()
        assert event is not None
        counts = np.bincount(data.private.label_ids(labels), minlength=len(labels))
        noisy = gaussian_release(ledger, noise, counts, name=event.name, sensitivity=event.sensitivity,
                                 sigma=event.sigma)
        clipped = np.clip(noisy, 1.0, None)
        return {c: float(v / clipped.sum()) for c, v in zip(labels, clipped)}

    # -- execution ----------------------------------------------------------------
    def execute(self) -> dict:
        """Run (or resume) to the end; a federated run starts a Flower simulation of its parties."""
        fed = self.config.federated
        if fed is not None and fed.partition == "nodes":
            raise DpsynthError("federated.partition 'nodes' runs on a Flower deployment (SuperLink + one SuperNode "
                               "per party): start it with `flwr run`, see docs/federated.md")
        ctx, state, usage = self._context()
        if fed is None:
            return self._iterate(ctx, state, usage)
        return self._iterate_federated(ctx, state, usage)

    def serve(self, grid: Any, flower_context: Any) -> dict:
        """Run as the ServerApp of a deployed Flower federation (parties on their own machines)."""
        from dpsynth.federated.flower_secagg import FlowerAggregator
        from dpsynth.federated.voting import FederatedVoting

        fed = self.config.federated
        if fed is None:
            raise DpsynthError("this run config has no federated: section")
        ctx, state, usage = self._context()
        assert ctx.plan is not None and ctx.sigma is not None
        aggregator = FlowerAggregator(grid, flower_context, self._federation_settings(deployed=True))
        ctx.federation = FederatedVoting(aggregator, fed, ctx.plan, ctx.sigma, self.config.privacy.delta)
        return self._iterate(ctx, state, usage)

    def _context(self) -> tuple[RunContext, MethodState, dict[str, Usage]]:
        cfg = self.config
        self._start = time.perf_counter()
        self._setup_logging()
        data = prepare_data(cfg)
        noise = NoiseSource(cfg.privacy.noise_seed)
        plan = self.method.release_plan(cfg)
        saved = self._load_checkpoint()
        if saved is None:
            sigma = self.calibrate()
            ledger = PrivacyLedger(cfg.privacy.epsilon, self.accounting_delta(), self._assumptions())
            state = self.method.new_state(cfg)
            shares = self._label_shares(data, ledger, noise)
            usage_saved: dict = {}
            timings: dict[str, float] = {}
            # The exact number of private records is itself an un-noised count: never logged.
            log.info("start %s: sigma=%s", cfg.method, sigma)
        else:
            sigma = saved["sigma"]
            ledger = PrivacyLedger.from_dict(saved["ledger"])
            state = self.method.load_state(saved["state"])
            shares = saved["label_shares"]
            usage_saved, timings = saved["usage"], dict(saved["timings"])
            self._wall_before = saved["wall_seconds"]
            log.info("resume at iteration %d with epsilon %.4f spent", state.next_iteration, ledger.spent().epsilon)
        usage = {g.display_name: Usage(prices=_prices(g)) for g in cfg.generators}
        for name, u in usage_saved.items():
            if name in usage:
                usage[name] = Usage(**u)
        t0 = time.perf_counter()
        embedder = SentenceTransformerEmbedder(cfg.embedder)
        ctx = RunContext(
            config=cfg, dir=self.dir, data=data, generators=self._generators(usage), embedder=embedder,
            synth_embedder=CachedEmbedder(embedder, self.dir / "cache" / "embeddings.sqlite"), ledger=ledger,
            noise=noise, plan=plan, sigma=sigma, label_shares=shares, progress=self.progress, timings=timings,
        )
        ctx.add_time("load_models", t0)
        return ctx, state, usage

    def _iterate(self, ctx: RunContext, state: MethodState, usage: dict[str, Usage]) -> dict:
        for t in range(state.next_iteration, self.method.iterations(self.config)):
            record = self.method.step(ctx, state, t)
            if ctx.plan is not None:
                record["epsilon_spent"] = ctx.ledger.spent().epsilon
            if ctx.federation is not None and ctx.federation.rounds:
                record["federated_round"] = ctx.federation.rounds.pop()
            log.info("iteration %d: %s", t, {k: v["kept"] for k, v in record.get("generated", {}).items()})
            state.history.append(record)
            state.next_iteration = t + 1
            self._save_checkpoint(ctx, state, usage)
        return self._finish(ctx, state, usage)

    def _iterate_federated(self, ctx: RunContext, state: MethodState, usage: dict[str, Usage]) -> dict:
        """Run the iterations as the ServerApp of a Flower simulation of the parties."""
        from dpsynth.federated.flower_secagg import run_federation
        from dpsynth.federated.shards import party_shards
        from dpsynth.federated.voting import FederatedVoting

        fed = self.config.federated
        assert fed is not None and ctx.plan is not None and ctx.sigma is not None
        t0 = time.perf_counter()
        shards = party_shards(self.config, ctx.data, ctx.embedder)
        ctx.add_time("embedding", t0)

        def server_program(aggregator) -> dict:
            ctx.federation = FederatedVoting(aggregator, fed, ctx.plan, ctx.sigma, self.config.privacy.delta)
            return self._iterate(ctx, state, usage)

        return run_federation(shards, self._federation_settings(deployed=False), server_program)

    def _federation_settings(self, *, deployed: bool):
        from dpsynth.federated.flower_secagg import FederationSettings

        fed, cfg = self.config.federated, self.config
        assert fed is not None
        secure = fed.aggregation == "secagg+"
        return FederationSettings(
            parties=fed.parties,
            # without SecAgg+ every party carries the full sigma, so any number of answers is safe
            min_parties=fed.threshold if secure else 1,
            secure=secure, max_records=fed.max_records_per_party, timeout=fed.timeout,
            # deployed parties always draw secure noise: a seed known to the server would let it remove the noise
            noise_seed=None if deployed else cfg.privacy.noise_seed,
            party_data={"text_column": cfg.data.text_column, "label_column": cfg.data.label_column,
                        "labels": json.dumps(list(cfg.task.labels) if cfg.task else []), "embedder": cfg.embedder},
        )

    def _generators(self, usage: dict[str, Usage]) -> dict[str, CachedGenerator]:
        from dpsynth.llm.factory import build_generator

        cache = RequestCache(cache_dir() / "requests.sqlite")
        return {
            g.display_name: CachedGenerator(build_generator(g), cache, usage[g.display_name])
            for g in self.config.generators
        }

    def _setup_logging(self) -> None:
        handler = logging.FileHandler(self.dir / "run.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.handlers[:] = [handler]
        log.setLevel(logging.INFO)
        log.propagate = False

    def _wall(self) -> float:
        """Wall time of the whole run, across interruptions."""
        return self._wall_before + time.perf_counter() - self._start

    # -- checkpoints --------------------------------------------------------------
    def _save_checkpoint(self, ctx: RunContext, state: MethodState, usage: dict[str, Usage]) -> None:
        payload = {
            "sigma": ctx.sigma,
            "ledger": ctx.ledger.to_dict(),
            "state": state.to_dict(),
            "label_shares": ctx.label_shares,
            "usage": {k: asdict(u) for k, u in usage.items()},
            "timings": ctx.timings,
            "wall_seconds": self._wall(),
        }
        text = json.dumps(payload)
        atomic_write_text(self.dir / "checkpoints" / f"iteration_{state.next_iteration - 1}.json", text)
        atomic_write_text(self.dir / "checkpoints" / "state.json", text)

    def _load_checkpoint(self) -> dict | None:
        path = self.dir / "checkpoints" / "state.json"
        return json.loads(path.read_text()) if path.exists() else None

    # -- outputs ------------------------------------------------------------------
    def _finish(self, ctx: RunContext, state: Any, usage: dict[str, Usage]) -> dict:
        samples = self.method.final_samples(state)
        tmp = self.dir / "synthetic.jsonl.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            for x in samples:
                fh.write(json.dumps({"text": x.text, "label": x.label, "plm": x.plm, "iteration": x.iteration}) + "\n")
        tmp.replace(self.dir / "synthetic.jsonl")
        report = privacy_report(ctx.ledger, noise_mode=ctx.noise.mode, plan=ctx.plan, sigma=ctx.sigma)
        if not report["within_budget"]:
            raise AssertionError("ledger exceeds the budget at release: refusing to write outputs")
        write_privacy_report(self.dir / "privacy.json", report)
        evaluation = None
        if self.config.evaluate and ctx.data.test is not None:
            ctx.phase("evaluation on the real test split", 0)
            evaluation = self._evaluate(ctx, samples, self.method.reference_sets(state))
            ctx.phase("evaluation on the real test split", 1)
        metrics = {
            "method": self.config.method,
            "iterations": state.history,
            "samples_per_plm": {k: sum(1 for x in samples if x.plm == k) for k in usage},
            "usage": {k: {**asdict(u), "cost": u.cost} for k, u in usage.items()},
            "timings": {**ctx.timings, "wall": self._wall(),
                        "generator_calls": sum(u.generation_seconds for u in usage.values())},
            "evaluation": evaluation,
        }
        if self.config.federated is not None:
            metrics["federated"] = self._federated_summary(ctx, state)
        atomic_write_text(self.dir / "metrics.json", json.dumps(metrics, indent=2))
        log.info("finished: %d samples, epsilon %.4f", len(samples), report["epsilon"])
        return {"privacy": report, "metrics": metrics, "summary": summary_lines(report)}

    def _federated_summary(self, ctx: RunContext, state: Any) -> dict:
        """Communication per party per round (the WASP paper's Table 11, measured)."""
        fed = self.config.federated
        assert fed is not None and ctx.plan is not None
        rounds = [h["federated_round"] for h in state.history if h.get("federated_round")]
        return {
            "parties": fed.parties, "aggregation": fed.aggregation, "partition": fed.partition,
            "alpha": fed.alpha if fed.partition == "dirichlet" else None, "min_parties": ctx.plan.min_parties,
            "unit": fed.unit, "sigma_sum": ctx.sigma,
            "sigma_per_party": ctx.plan.party_sigma(ctx.sigma) if ctx.sigma else 0.0,
            "rounds": rounds,
            "download_bytes_per_party": sum(r["download_bytes_per_party"] for r in rounds),
            "upload_bytes_per_party": sum(r["upload_bytes_per_party"] for r in rounds),
            "aggregation_seconds": sum(r["seconds"] for r in rounds),
        }

    def _evaluate(self, ctx: RunContext, samples: list[SyntheticSample],
                  references: dict[str, list[SyntheticSample]]) -> dict:
        t0 = time.perf_counter()
        test = ctx.data.test
        assert test is not None
        test_emb = CachedEmbedder(ctx.embedder, cache_dir() / "embeddings-public.sqlite").encode(test.texts)
        out: dict[str, Any] = {"classifier": "logistic regression on sentence embeddings"}
        for name, subset in {self.config.method: samples, **references}.items():
            emb = ctx.embed_synthetic(subset)
            out[name] = probe_scores(emb, [x.label for x in subset], test_emb, test.labels, seed=self.config.seed)
        ctx.add_time("evaluation", t0)
        return out


def _prices(g) -> dict[str, float]:
    prices = {}
    if g.price_per_prompt_token is not None:
        prices["prompt"] = g.price_per_prompt_token
    if g.price_per_completion_token is not None:
        prices["completion"] = g.price_per_completion_token
    return prices
