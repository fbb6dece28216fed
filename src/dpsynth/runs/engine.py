"""A run on disk, for any method: create or resume, iterate with checkpoints, write outputs.

Layout of the run directory: `dpsynth.fs.RunDir`. After every iteration the checkpoint
holds the method's state (synthetic samples, selections made from noisy releases), the
ledger, the calibrated knobs and the plan's fingerprint; every release is also saved the
moment it is drawn (`dpsynth.private.releases`), so a crash between a release and the next
checkpoint never draws it again. Generation requests are cached outside the run, so a crash
or Ctrl-C loses nothing paid for.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from dpsynth.config import RunConfig, votes_clipped_per_person
from dpsynth.data.public import load_test, task_for
from dpsynth.data.records import LabelledTexts
from dpsynth.device import resolve_device
from dpsynth.embed.sentence import CachedEmbedder, Embedder, LazyEmbedder, check_embedder_available
from dpsynth.errors import DpsynthError
from dpsynth.fs import (
    RunDir,
    atomic_write_text,
    cache_dir,
    create_owner_only,
    ensure_writable_dir,
    lock_run_dir,
    refuse_foreign_entries,
)
from dpsynth.llm.base import Usage
from dpsynth.llm.cache import CachedGenerator
from dpsynth.methods.base import MethodState, StepContext, add_time
from dpsynth.methods.generation import SyntheticSample
from dpsynth.methods.relabel import RELABEL, RELABEL_SIGMA, relabel_stage
from dpsynth.methods.resample import RESAMPLE, RESAMPLE_SIGMA, resample_stage
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.report import summary_lines
from dpsynth.private.holder import DataHolder, HolderRequests, ReleasingHolder
from dpsynth.private.releases import ReleaseStore
from dpsynth.runs import outputs
from dpsynth.runs.build import (
    build_generators,
    build_holder,
    check_before_start,
    check_packages,
    label_shares,
    open_request_cache,
    prices,
)
from dpsynth.runs.config import dump_config, load_config
from dpsynth.runs.planning import PrivacyPlan, plan_privacy
from dpsynth.runs.resume_check import changed_settings, content_fingerprint, editable_settings

CHECKPOINT_FORMAT = 2
log = logging.getLogger("dpsynth.run")
Progress = Callable[[str, int, int], None]


@dataclass
class _Live:
    """The parts of a started run."""

    ctx: StepContext
    state: MethodState
    usage: dict[str, Usage]
    knobs: dict[str, float]
    ledger: PrivacyLedger
    holder: ReleasingHolder
    embedder: Embedder
    test: LabelledTexts | None
    synthetic_embeddings: CachedEmbedder

    def close(self) -> None:
        """Close the run's SQLite connections (request cache, embedding cache): a bench opens them once per cell,
        and a process that runs many would otherwise hold them until the garbage collector finds them."""
        _close_request_caches(self.ctx.generators)
        self.synthetic_embeddings.close()


def _request_caches(generators: dict[str, CachedGenerator]) -> list:
    """The request caches behind the run's generators, each once (they usually share one file)."""
    return list({id(g.cache): g.cache for g in generators.values()}.values())


def _close_request_caches(generators: dict[str, CachedGenerator]) -> None:
    for cache in _request_caches(generators):
        cache.close()


def _sync_request_caches(generators: dict[str, CachedGenerator]) -> None:
    """Before a private release: the answers its candidates came from survive a power loss as the release will."""
    for cache in _request_caches(generators):
        cache.sync()


def _hint_for_a_file(path: Path) -> str:
    """What a user who gave `--resume` a file meant: the run holding it (its config.yaml, say), or a new run from
    a config; nothing for a data file."""
    if RunDir(path.parent).config.is_file():
        return f" (to resume the run holding it: `dpsynth run --resume {path.parent}`)"
    if path.suffix.lower() in (".yaml", ".yml"):
        return f" (to start a new run from this config: `dpsynth run {path}`)"
    return ""


class Run:
    """Executes (or resumes) one run of `config.method` in `run_dir`."""

    def __init__(self, config: RunConfig, run_dir: Path, *, progress: Progress | None = None,
                 private: Any = None) -> None:
        """`private`: the records as a pandas DataFrame or datasets Dataset, for a config with data.in_memory
        (held for the data holder only; never written)."""
        self.config = config
        self._given = private
        self.dir = RunDir(run_dir)
        self._lock = lock_run_dir(self.dir)  # one process per run directory, until execute() returns
        self.progress = progress
        try:
            self.plan: PrivacyPlan = plan_privacy(config)
        except BaseException:
            self.close()
            raise
        self.method = self.plan.method
        self._wall_before = 0.0
        self._start = time.perf_counter()

    @classmethod
    def create(cls, config: RunConfig, run_dir: Path, **kw: Any) -> Run:
        d = RunDir(run_dir)
        if d.root.exists() and not d.root.is_dir():
            raise DpsynthError(f"{d.root} is a file; give a directory for the run's outputs")
        # settings that fail without spending fail before the run directory exists: nothing is left behind
        ensure_writable_dir(cache_dir())
        check_embedder_available(config.embedder)
        check_before_start(plan_privacy(config), kw.get("private"))
        # every run takes its `.lock` first and writes its plan before anything else in `checkpoints/` (a name
        # other projects use too): a run started in a project folder used to overwrite its README.md and config.yaml
        refuse_foreign_entries(d.root, (d.lock, d.plan, d.state), "run")
        run = cls(config, d.root, **kw)  # takes the directory's lock before looking at what it holds
        try:
            if holds_a_run(d.root):
                raise DpsynthError(f"{d.root} already holds a run; resume it with `dpsynth run --resume {d.root}`, "
                                   "or give another directory for a new run")
            if d.plan.exists():  # the plan of a run that stopped before spending anything: this one starts afresh
                d.plan.unlink()
            atomic_write_text(d.config, dump_config(config))
        except BaseException:
            run.close()
            raise
        return run

    @classmethod
    def resume(cls, run_dir: Path, **kw: Any) -> Run:
        d = RunDir(run_dir)
        if d.root.is_file():
            raise DpsynthError(f"{d.root} is a file, not a run directory{_hint_for_a_file(d.root)}")
        if not d.config.is_file():
            hint = (" (a run stopped before it wrote its config spent nothing: start it again with `dpsynth run "
                    f"CONFIG -o {d.root}`)" if d.lock.exists() else "")
            raise DpsynthError(f"{d.root}: no config.yaml; not a dpsynth run directory{hint}")
        run = cls(load_config(d.config, other_methods="drop"), d.root, **kw)  # "in use" and such come first
        if not d.is_finished():
            try:  # a missing package fails here, not after the resumed generations
                check_packages(run.plan)
            except BaseException:
                run.close()
                raise
        return run

    def close(self) -> None:
        """Let another process run or resume the directory (also happens when this process exits)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # -- execution ----------------------------------------------------------------
    def execute(self) -> dict:
        """Run (or resume) to the end; a federated run starts a Flower simulation of its parties."""
        try:
            return self._execute()
        finally:
            self.close()

    def _execute(self) -> dict:
        fed = self.config.federated
        if fed is not None and fed.partition == "nodes":
            raise DpsynthError("federated.partition 'nodes' runs on a Flower deployment (SuperLink + one SuperNode "
                               "per party): start it with `flwr run`, see docs/federated.md")
        live = self._start_run()
        try:
            if fed is None:
                return self._iterate(live)
            from dpsynth.federated.simulation import simulate

            t0 = time.perf_counter()
            return simulate(self.config, live.ctx.task, live.embedder, live.holder, lambda: self._iterate(live),
                            min_records=self.method.min_private_records(),
                            on_embedded=lambda: live.ctx.add_time(outputs.DATA_HOLDER_TIME, t0), given=self._given)
        finally:
            live.close()

    def serve(self, grid: Any, flower_context: Any) -> dict:
        """Run as the ServerApp of a deployed Flower federation (parties on their own machines)."""
        from dpsynth.federated.simulation import connect_deployed

        try:
            if self.config.federated is None:
                raise DpsynthError("this run config has no federated: section")
            live = self._start_run()
            try:
                connect_deployed(self.config, live.holder, grid, flower_context)
                return self._iterate(live)
            finally:
                live.close()
        finally:
            self.close()

    def calibrate(self) -> dict[str, float]:
        """Every knob of the run's schedule for its (epsilon, delta)."""
        return self.plan.calibrate()

    def _start_run(self) -> _Live:
        cfg = self.config
        self._start = time.perf_counter()
        self._setup_logging()
        task = task_for(cfg)
        self.method.check_task(task)  # settings that cannot work fail before anything is spent
        knobs, run_id = self._knobs()  # checks (or fixes) the privacy plan before anything is released
        saved = self._load_checkpoint()
        if saved is None:
            ledger = PrivacyLedger(cfg.privacy.epsilon, self.plan.accounting_delta, self.plan.assumptions())
            state = self.method.new_state()
            usage_saved: dict = {}
            timings: dict[str, float] = {}
            # The exact number of private records is itself an un-noised count: never logged.
            log.info("start %s: knobs %s", cfg.method, knobs)
        else:
            try:
                ledger = PrivacyLedger.from_dict(saved["ledger"])
                state = self.method.load_state(saved["state"])
                usage_saved, timings = saved["usage"], dict(saved["timings"])
                self._wall_before = float(saved["wall_seconds"])
                if not isinstance(saved["label_shares"], dict):
                    raise TypeError("label_shares is not a mapping")
            except (KeyError, TypeError, ValueError) as err:  # pydantic's ValidationError is a ValueError
                raise DpsynthError(f"{self.dir.state}: damaged checkpoint ({type(err).__name__}: "
                                   f"{str(err).splitlines()[0]}); the run cannot be resumed") from err
        store = ReleaseStore(self.dir.releases)
        self._check_saved_releases(store, knobs)
        restored = store.restore_into(ledger)
        if saved is not None or restored:
            log.info("resume at iteration %d with epsilon %.4f spent (%d release(s) restored from release files)",
                     state.next_iteration, ledger.spent().epsilon, len(restored))
        usage = {g.display_name: Usage(prices=prices(g)) for g in cfg.generators}
        if self.dir.usage_at_stop.exists():  # the run stopped mid-step: the requests it paid for still count
            stopped, wall_at_stop = _read_usage_at_stop(self.dir.usage_at_stop)
            # unless the file predates the checkpoint (a kill between writing a checkpoint and removing it): the
            # checkpoint's usage, later, counts it already
            if not (saved is not None and 0 < wall_at_stop <= self._wall_before):
                usage_saved = stopped
                # and so does its time, or the generator time it carries would exceed the wall time
                self._wall_before = max(self._wall_before, wall_at_stop)
        for name, u in usage_saved.items():
            if name in usage:
                try:
                    usage[name] = Usage(**u)
                except TypeError as err:
                    raise DpsynthError(f"{self.dir.checkpoints}: damaged checkpoint (the usage of {name}: {err}); "
                                       "the run cannot be resumed") from err
        t0 = time.perf_counter()
        # loads at its first use, after the cheap checks below
        # its load is model loading, not the embedding, voting or evaluation step whose first call triggers it
        loads: list[tuple[float, float]] = []
        embedder = LazyEmbedder(cfg.embedder, device=resolve_device(cfg.device),
                                on_load=lambda seconds: _count_load(timings, loads, seconds))
        # the holder's own time (loading and checking the private records, the label counts) grows with the
        # number of private records: kept apart from model loading, and out of what the run shares
        since = time.perf_counter()
        holder = build_holder(self.plan, knobs=knobs, ledger=ledger, store=store, task=task, embedder=embedder,
                              given=self._given)
        private_seconds = add_time(timings, loads, outputs.DATA_HOLDER_TIME, since)
        generators = build_generators(cfg, usage, run_id)  # a bad model file or key fails before any model loads
        try:
            for name, generator in generators.items():
                unrecorded = generator.count_unrecorded_payments()
                if unrecorded:
                    log.warning("%s: %d answer(s) paid for before the run was killed are counted from the request "
                                "cache (its spend caps include them)", name, unrecorded)
            # A federated run's private label proportions are a round of the federation, which starts later.
            requests = cast(DataHolder, holder)  # a central or federated holder: both answer every request
            since = time.perf_counter()
            shares = (saved["label_shares"] if saved is not None else {} if cfg.federated is not None
                      else label_shares(cfg, task, requests, self.method.label_release()))
            private_seconds += add_time(timings, loads, outputs.DATA_HOLDER_TIME, since)
            synth = CachedEmbedder(embedder, self.dir.synthetic_embeddings)

            def on_time(key: str, began: float) -> None:  # the holder's requests: voting or training, kept private
                add_time(timings, loads, key, began)

            door = HolderRequests(requests, on_time=on_time, before=lambda: _sync_request_caches(generators))
            ctx = StepContext(config=cfg, task=task, label_shares=shares, generators=generators,
                              holder=door, embed=synth.encode, progress=self.progress, timings=timings,
                              files=self.dir.method_files, knobs=dict(knobs), loads=loads)
            ctx.add_time("load_models", t0)
            timings["load_models"] -= private_seconds
            return _Live(ctx, state, usage, knobs, ledger, holder, embedder, load_test(cfg), synth)
        except BaseException:  # the caches of a run that never started are closed here, not by `_Live.close`
            _close_request_caches(generators)
            raise

    def _knobs(self) -> tuple[dict[str, float], str]:
        """The calibrated knobs: computed and saved with the plan's fingerprint before the first release,
        or read back on resume after checking that nothing the schedule depends on was edited. Also the run's
        id, saved with them: the request cache names the payer of each answer by it (a plan saved by an older
        dpsynth gains one)."""
        path = self.dir.plan
        if path.exists():
            try:
                saved = json.loads(path.read_text())
                before, knobs, run_id = saved["fingerprint"], saved["knobs"], saved.get("run_id")
            except (ValueError, KeyError, TypeError) as err:
                raise DpsynthError(f"{path}: damaged checkpoint ({err}); the run cannot be resumed") from err
            changed = _changed_fields(before, self.plan.fingerprint())
            if changed:
                raise DpsynthError(f"{self.dir.config}: {changed} changed since the run started; the privacy "
                                   "schedule depends on it, so the run cannot resume with it (restore it or start "
                                   "a new run; if the config is unchanged, this version of dpsynth plans it "
                                   "differently, e.g. a tighter sensitivity)")
            content = content_fingerprint(self.config)
            edited = changed_settings(saved.get("content", content), content)
            if edited:
                raise DpsynthError(f"{self.dir.config}: {', '.join(edited)} changed since the run started; the "
                                   "samples made before and after would come from different settings (restore it or "
                                   f"start a new run; a resume may change only {editable_settings()})")
            if not isinstance(run_id, str) or "content" not in saved:  # a plan saved by an older dpsynth: its
                run_id = run_id if isinstance(run_id, str) else uuid.uuid4().hex  # answers from now on are named,
                atomic_write_text(path, json.dumps({**saved, "run_id": run_id, "content": content}))  # and checked
            return knobs, run_id
        if self.dir.state.exists():
            raise DpsynthError(f"{self.dir.root}: checkpoint written by an older dpsynth (before format "
                               f"{CHECKPOINT_FORMAT}); it cannot be resumed by this version: start a new run")
        knobs = self.calibrate()
        run_id = uuid.uuid4().hex
        atomic_write_text(path, json.dumps({"format": CHECKPOINT_FORMAT, "fingerprint": self.plan.fingerprint(),
                                            "content": content_fingerprint(self.config), "knobs": knobs,
                                            "run_id": run_id}))
        return knobs, run_id

    def _check_saved_releases(self, store: ReleaseStore, knobs: dict[str, float]) -> None:
        """Every saved release must be one the schedule makes, at the saved knobs."""
        for name, event in store.events().items():
            try:
                release = self.plan.schedule.by_name(name)
            except KeyError:
                raise DpsynthError(f"{self.dir.releases}: release {name} is not in this run's schedule; the "
                                   "run cannot resume safely") from None
            value = knobs[release.knob]
            expected = release.event(value) if value > 0 else None
            if expected != event:
                raise DpsynthError(f"{self.dir.releases}: release {name} does not match this run's schedule; "
                                   "the run cannot resume safely")

    def _iterate(self, live: _Live) -> dict:
        stages = self._final_stages()
        steps = self.method.iterations() + len(stages)
        if not live.ctx.label_shares:
            # a federation's label counts are a round of it, asked once the parties are up: through the door, so
            # their time is the holder's (private), like every other request
            live.ctx.label_shares = label_shares(self.config, live.ctx.task, cast(DataHolder, live.ctx.holder),
                                                 self.method.label_release())
        for t in range(live.state.next_iteration, steps):
            paid_before = _paid(live.usage)
            try:
                record = self.method.step(live.ctx, live.state, t) if t < self.method.iterations() \
                    else stages[t - self.method.iterations()](live, t)
                self._close_step(live, t, record)
            except BaseException:
                # a spend cap, Ctrl-C, a scheduler's SIGTERM, a server that stopped answering, a full disk at the
                # checkpoint: what this step paid for is in the request cache, where a resume finds it at no cost;
                # keep its count, so that the resumed run's spend caps still count everything the run paid (a
                # SIGKILL's is recovered from the cache's payers at resume: count_unrecorded_payments). A step that
                # paid nothing leaves no file: the run may start afresh.
                if _paid(live.usage) != paid_before:
                    atomic_write_text(self.dir.usage_at_stop, json.dumps({
                        "format": USAGE_AT_STOP_FORMAT, "wall_seconds": self._wall(),
                        "usage": {k: asdict(u) for k, u in live.usage.items()}}))
                raise
        return self._finish(live)

    def _close_step(self, live: _Live, t: int, record: dict) -> None:
        """Add what the step's releases and rounds showed to its record, then checkpoint it."""
        if not self.plan.schedule.is_empty:
            record["epsilon_spent"] = live.ledger.spent().epsilon
        if live.holder.diagnostics:
            record["releases"] = dict(live.holder.diagnostics)
            live.holder.diagnostics.clear()
        rounds = getattr(live.holder, "rounds", None)
        if rounds:
            record["federated_rounds"] = list(rounds)
            rounds.clear()
        log.info("iteration %d: kept %s; API retries so far %s", t,
                 {k: v["kept"] for k, v in record.get("generated", {}).items()},
                 {k: u.retries for k, u in live.usage.items()})
        live.state.history.append(record)
        live.state.next_iteration = t + 1
        self._save_checkpoint(live)

    def _final_stages(self) -> list[Callable[[_Live, int], dict]]:
        """The stages after the method's iterations, in order: label correction, then resampling (which then
        clusters the corrected labels)."""
        stage = {"relabel": self._relabel, "resample": self._resample}
        return [stage[name] for name in self.plan.final_stages()]

    def _stage_input(self, live: _Live) -> list[SyntheticSample]:
        """What a final stage starts from: the corrected set once `relabel:` ran, else the method's own."""
        s = live.state
        return s.relabelled if s.relabelled is not None else self.method.final_samples(s)

    def _relabel(self, live: _Live, t: int) -> dict:
        """The final DP label-correction stage (`relabel:`): one noisy release of per-label embedding sums (none
        for the public control), then post-processing."""
        ctx, samples = live.ctx, self._stage_input(live)
        assert self.config.relabel is not None  # only runs with a relabel: stage get here
        ctx.phase("correcting labels with DP label centroids", 0)
        embeddings = ctx.embed_synthetic(samples)
        task = ctx.task
        chosen, stats = relabel_stage(
            self.config.relabel, samples=samples, embeddings=embeddings, label_ids=ctx.label_ids(samples),
            label_names=task.label_names, holder=ctx.holder, release=(RELABEL, None),
            sigma=live.knobs.get(RELABEL_SIGMA, 0.0),
            public_centroids=lambda: ctx.embed([f"{task.text_kind} ({c}: {task.labels[c]})" for c in task.label_names]))
        live.state.relabelled = chosen
        ctx.phase("correcting labels with DP label centroids", 1)
        return {"iteration": t, "relabel": stats}

    def _resample(self, live: _Live, t: int) -> dict:
        """The final DP resampling stage (`resample:`): one noisy cluster histogram, then post-processing."""
        ctx, samples = live.ctx, self._stage_input(live)
        assert self.config.resample is not None  # only runs with a resample: stage get here
        ctx.phase("resampling to a DP cluster histogram", 0)
        embeddings = ctx.embed_synthetic(samples)
        chosen, stats = resample_stage(self.config.resample, samples=samples, embeddings=embeddings,
                                       label_ids=ctx.label_ids(samples), labels=len(ctx.task.label_names),
                                       holder=ctx.holder, release=(RESAMPLE, None),
                                       sigma=live.knobs[RESAMPLE_SIGMA], seed=self.config.seed,
                                       clip_per_person=votes_clipped_per_person(self.config))
        live.state.resampled = chosen
        ctx.phase("resampling to a DP cluster histogram", 1)
        return {"iteration": t, "resample": stats}

    def _setup_logging(self) -> None:
        handler = logging.FileHandler(create_owner_only(self.dir.log), encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.handlers[:] = [handler]
        log.setLevel(logging.INFO)
        log.propagate = False

    def _wall(self) -> float:
        """Wall time of the whole run, across interruptions."""
        return self._wall_before + time.perf_counter() - self._start

    # -- checkpoints --------------------------------------------------------------
    def _save_checkpoint(self, live: _Live) -> None:
        payload = {
            "format": CHECKPOINT_FORMAT,
            "ledger": live.ledger.to_dict(),
            "state": live.state.model_dump(mode="json"),
            "label_shares": live.ctx.label_shares,
            "usage": {k: asdict(u) for k, u in live.usage.items()},
            "timings": live.ctx.timings,
            "wall_seconds": self._wall(),
        }
        text = json.dumps(payload)
        atomic_write_text(self.dir.iteration_checkpoint(live.state.next_iteration - 1), text)
        atomic_write_text(self.dir.state, text)
        self.dir.usage_at_stop.unlink(missing_ok=True)  # counted in the checkpoint's usage from now on

    def _load_checkpoint(self) -> dict | None:
        path = self.dir.state
        if not path.exists():
            return None
        try:
            saved = json.loads(path.read_text())
        except ValueError as err:
            raise DpsynthError(f"{path}: damaged checkpoint ({err}); the run cannot be resumed") from err
        if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
            raise DpsynthError(f"{self.dir.root}: checkpoint written by an older dpsynth (before format "
                               f"{CHECKPOINT_FORMAT}); it cannot be resumed by this version: start a new run")
        return saved

    # -- outputs ------------------------------------------------------------------
    def _finish(self, live: _Live) -> dict:
        cfg, ctx = self.config, live.ctx
        before = self.method.final_samples(live.state)
        state = live.state
        samples = state.resampled if state.resampled is not None else \
            state.relabelled if state.relabelled is not None else before
        description = self.plan.describe(live.knobs)
        report = outputs.checked_privacy(live.ledger, live.holder.noise.mode, description,
                                         private_records_read=self.plan.reads_private_records,
                                         run_delta=cfg.privacy.delta)  # before anything is written
        outputs.write_synthetic(self.dir, samples)
        outputs.write_privacy(self.dir, report)
        outputs.write_card(self.dir, cfg, ctx.task, report, samples)
        evaluation = None
        if cfg.evaluate and live.test is not None:
            ctx.phase("evaluation on the real test split", 0)
            sets = {cfg.method: samples, **self.method.reference_sets(live.state)}
            if state.relabelled is not None:
                sets["before_relabelling"] = before
            if state.resampled is not None:
                sets["before_resampling"] = self._stage_input(live)
            evaluation = outputs.evaluate_sets(ctx, live.embedder, live.test, sets, cfg.seed)
            ctx.phase("evaluation on the real test split", 1)
        federated = (outputs.federated_summary(cfg, description, live.state.history)
                     if cfg.federated is not None else None)
        metrics = outputs.write_metrics(self.dir, method=cfg.method, history=live.state.history, samples=samples,
                                        usage=live.usage, timings=ctx.timings, wall=self._wall(),
                                        evaluation=evaluation, federated=federated)
        epsilon = report["epsilon"]
        log.info("finished: %d samples, epsilon %s", len(samples), "inf" if epsilon is None else f"{epsilon:.4f}")
        return {"privacy": report, "metrics": metrics, "summary": summary_lines(report)}


def _changed_fields(before: dict, now: dict) -> str:
    """Names of the privacy settings that differ between a checkpoint and the current config."""
    names = {"epsilon": "privacy.epsilon", "delta": "privacy.delta", "adjacency": "privacy.adjacency",
             "federation": "federated (parties, aggregation, min_parties)",
             "releases": "the schedule of releases (iterations, Q, unit of privacy, label proportions ...)",
             "fixed": "a fixed noise setting (privacy.label_histogram_sigma)",
             "final_stages": "the final stages (relabel:, resample:)",
             "unit": "the unit of privacy (data.person_column, privacy.max_records_per_user, federated.unit)",
             "events": "a release's privacy event (its steps, sampling rate or records: e.g. rounds, local_steps)",
             "shares": "a share of epsilon (e.g. relabel.share, resample.share, dpga.budget_svt)",
             "groups": "which parties answer which releases (fedgen.strong)",
             "split": "which records a simulated party holds (federated.partition, alpha, party_files; seed)"}
    # a checkpoint written before these keys were fingerprinted has none of them: nothing to compare
    later = {"final_stages", "unit", "events", "shares", "groups", "split"}
    diff = [names[k] for k in names if (k in before or k not in later) and before.get(k) != now.get(k)]
    return ", ".join(diff)


def holds_a_run(run_dir: Path) -> bool:
    """The directory holds a run to resume, not to start afresh: one that spent something (`RunDir.is_started`),
    or one killed in its first step, before any checkpoint or stop file, after paying for answers. Starting
    afresh there would drop what it paid from the spend caps (`CachedGenerator.count_unrecorded_payments`).
    Every caller that chooses between `Run.create` and `Run.resume` asks this."""
    d = RunDir(run_dir)
    return d.is_started() or _paid_before_it_was_killed(d)


def _paid_before_it_was_killed(d: RunDir) -> bool:
    """The directory's plan names a run that the request cache holds paid answers of. A plan that cannot be read
    counts as a run to resume: the resume then says the checkpoint is damaged, rather than a fresh start deleting
    it and forgetting what that run paid."""
    if not d.plan.exists():
        return False
    try:
        saved = json.loads(d.plan.read_text())
    except (OSError, ValueError):
        return True
    run_id = saved.get("run_id") if isinstance(saved, dict) else None
    if not isinstance(run_id, str):
        return not isinstance(saved, dict)
    try:
        cache = open_request_cache()
        try:
            return cache.paid_by_run(run_id) > 0
        finally:
            cache.close()
    except (OSError, sqlite3.Error) as err:
        raise DpsynthError(f"the request cache {cache_dir()} cannot be read ({err}); set DPSYNTH_CACHE to a "
                           "writable directory") from err


def _paid(usage: dict[str, Usage]) -> dict[str, int]:
    """Requests each generator has paid for (answered by it, not by the request cache)."""
    return {name: u.requests - u.cached for name, u in usage.items()}


def _count_load(timings: dict[str, float], loads: list[tuple[float, float]], seconds: float) -> None:
    """Count a lazily loaded model's load as `load_models` and note when it began, so that the step timed
    around it leaves it out (`StepContext.add_time`)."""
    timings["load_models"] = timings.get("load_models", 0.0) + seconds
    loads.append((time.perf_counter() - seconds, seconds))


USAGE_AT_STOP_FORMAT = 2


def _read_usage_at_stop(path: Path) -> tuple[dict, float]:
    """(usage by generator, wall seconds) of a run stopped mid-step; a file written before 2026-11-27 holds the
    usage alone (its wall time is then the last checkpoint's)."""
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            raise ValueError("not a JSON object")
        if saved.get("format") == USAGE_AT_STOP_FORMAT and isinstance(saved.get("usage"), dict):
            return saved["usage"], float(saved["wall_seconds"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DpsynthError(f"{path}: damaged checkpoint ({err}); the run cannot be resumed") from err
    return saved, 0.0
