"""Data holders: charge the ledger, compute on private records, add noise, return only noisy results.

Every request names a release of the run's schedule (e.g. `("wasp.votes", 2)`); the holder
looks up its knob value, records the event on the ledger *before* computing anything
(an over-budget or repeated release is refused before private data is touched), computes,
adds noise and saves the noisy result (`ReleaseStore`) before returning it, as Opacus'
optimizer charges its accountant in a hook no caller can skip.

`CentralHolder` holds the private records in memory; `dpsynth.federated.holder` implements
the same interface by sending each request to the parties and receiving only the noisy sum.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from dpsynth.data.records import LabelledTexts
from dpsynth.embed.sentence import Embedder
from dpsynth.errors import DpsynthError
from dpsynth.finetune.request import AdapterTraining
from dpsynth.privacy.accountant import Adjacency, epsilon_tight
from dpsynth.privacy.events import (
    GaussianEvent,
    LaplaceEvent,
    PureDpEvent,
    SubsampledGaussianEvent,
)
from dpsynth.privacy.ledger import PrivacyLedger
from dpsynth.privacy.mechanisms import NoiseSource, above_threshold
from dpsynth.privacy.schedule import Release, Schedule
from dpsynth.privacy.sensitivity import vote_l1_sensitivity, vote_sensitivity
from dpsynth.private.releases import ReleaseStore
from dpsynth.voting.spec import VoteSpec, compute_votes

ReleaseKey = tuple[str, "int | None"]
StepReport = Callable[[int, float, float], None]  # (step, noisy gradient norm, epsilon spent so far)
ACCOUNTING_SHARE = 0.05  # the most of a DP-SGD release's time its progress line's accounting may take


class DataHolder(Protocol):
    """What a method may ask of the private data."""

    def noisy_votes(self, spec: VoteSpec, candidates: np.ndarray, candidate_labels: np.ndarray, *,
                    release: ReleaseKey) -> np.ndarray:
        """Votes of the private records on the candidates (`spec`), noised for `release`."""
        ...

    def noisy_label_counts(self, labels: list[str], *, release: ReleaseKey) -> np.ndarray:
        """Private record counts per label, noised for `release`."""
        ...

    def noisy_length_histogram(self, edges: list[int], *, release: ReleaseKey) -> np.ndarray:
        """Counts of private texts per length bin [edges[i], edges[i+1]) (ends clamped), noised."""
        ...

    def length_bound(self, which: str, cap: int, *, release: ReleaseKey) -> int:
        """A DP estimate of the longest ('max') or shortest ('min') private text, by sparse vector."""
        ...

    def train_adapter(self, request: AdapterTraining, *, release: ReleaseKey,
                      on_step: StepReport | None = None) -> np.ndarray:
        """A LoRA adapter trained with DP-SGD on the private records (its flat parameter vector)."""
        ...


class HolderRequests:
    """What a method's step gets: the holder's requests, and nothing else (no ledger, no store, no records).

    Each request is a plain function forwarding to the holder, so no public or private attribute of
    this object leads to the holder's state; only the noisy results come back. `on_time(key, since)` is told when
    each request began (perf_counter), once it has returned, under "training" (DP training) or "voting" (every
    other release): the time inside the holder grows with the number of private records, so the run keeps it out
    of what it shares (runs/outputs.py: PRIVATE_TIMINGS). Timed here, at the one door to the holder, no request
    a method makes can be left out (DPGA's keyword votes and length bounds once were).
    """

    __slots__ = ("noisy_votes", "noisy_label_counts", "noisy_length_histogram", "length_bound", "train_adapter")
    noisy_votes: Callable[..., np.ndarray]  # set in __init__: the holder's own requests, forwarded
    noisy_label_counts: Callable[..., np.ndarray]
    noisy_length_histogram: Callable[..., np.ndarray]
    length_bound: Callable[..., int]
    train_adapter: Callable[..., np.ndarray]

    def __init__(self, holder: DataHolder, on_time: Callable[[str, float], None] | None = None,
                 before: Callable[[], None] | None = None) -> None:
        """`before`: called before each request reaches the holder (the run makes the answers its candidates came
        from durable there: `RequestCache.sync`)."""
        for name in self.__slots__:
            key = "training" if name == "train_adapter" else "voting"
            object.__setattr__(self, name, _forward(getattr(holder, name), key, on_time, before))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("the data holder's requests cannot be replaced")


def _forward(request: Callable, key: str, on_time: Callable[[str, float], None] | None,
             before: Callable[[], None] | None = None) -> Callable:
    def call(*args, **kwargs):
        if before is not None:
            before()
        since = time.perf_counter()
        try:
            return request(*args, **kwargs)
        finally:
            if on_time is not None:
                on_time(key, since)

    call.__name__, call.__doc__ = request.__name__, request.__doc__
    return call


class ReleasingHolder:
    """The release path shared by every holder: schedule lookup, charge, compute+noise, save."""

    def __init__(self, ledger: PrivacyLedger, noise: NoiseSource, schedule: Schedule, knobs: dict[str, float],
                 store: ReleaseStore, records_per_unit: int = 1) -> None:
        """`records_per_unit`: the most records one unit of privacy holds (a person's bound k, a party's
        records), by which every sensitivity scales; the vote check below uses it."""
        self.ledger = ledger
        self.records_per_unit = records_per_unit
        self.noise = noise
        self.schedule = schedule
        self.knobs = knobs
        self.store = store
        self.diagnostics: dict[str, dict] = {}  # per release, from its noisy values only (post-processing)

    def _release(self, key: ReleaseKey, noisy: Callable[[Release, float], np.ndarray],
                 asked: dict | None = None) -> np.ndarray:
        """`asked`: the public request (`asked_about`): saved with the release, and compared when a resumed run
        asks for it again, so that a saved release never answers for other candidates than it was drawn for."""
        release = self.schedule.get(*key)
        value = self.knobs[release.knob]
        event = release.event(value) if value > 0 else None
        if release.name in self.store:  # released before a crash: never drawn or charged again
            saved = self.store.get(release.name)
            if saved is None:  # un-noised (epsilon = inf): not kept on disk, recomputed once per process (a noisy
                out = noisy(release, value)  # release saved without its values is refused when the store loads)
                self.store.keep_clean(release.name, out)
                return out
            check_same_request(release.name, self.store.asked(release.name), asked)
            return saved
        if event is None:
            self.ledger.record_non_private(release.name)  # only an epsilon = inf ledger accepts this
        else:
            self.ledger.record(event)  # raises before anything is computed if over budget or repeated
        out = noisy(release, value)
        self.store.save(release.name, event, out, asked)
        if not isinstance(event, PureDpEvent):  # a sparse-vector answer is a bound, not a noisy count
            self.diagnostics[release.name] = signal_to_noise(out, value)
        return out.copy()

    def _check_vote_charge(self, key: ReleaseKey, spec: VoteSpec) -> None:
        """Refuse votes more sensitive than their release was charged for, or sampled at another rate, before
        anything is charged or computed.

        A release's sensitivity comes from its method's schedule and the vote definition from its step: were the
        two ever to disagree (a step asking WASP's Top-Q votes on a release charged as Aug-PE's one vote), the
        noise would be calibrated for the smaller sensitivity. The same derivation the parties' own ledgers use
        (`vote_sensitivity`; `vote_l1_sensitivity` for a Laplace release) checks it here. A Poisson-subsampled
        release states its per-unit bound under add/remove (the accountant applies the adjacency), a Gaussian or
        Laplace one its sensitivity under the run's."""
        if spec.sampling_rate < 1 and self.records_per_unit > 1:
            # the mask below is drawn per record: sampling q per person is what the event would claim
            raise ValueError(f"votes subsampled at rate {spec.sampling_rate:g} sample records, not persons: they "
                             "need record-level privacy (one record per unit)")
        release = self.schedule.get(*key)
        value = self.knobs[release.knob]
        booked = release.event(value if value > 0 else 1.0)
        rate = booked.sampling_rate if isinstance(booked, SubsampledGaussianEvent) else 1.0
        if spec.sampling_rate != rate:
            raise ValueError(f"release {release.name} is accounted at sampling rate {rate:g}, the request asks "
                             f"{spec.sampling_rate:g}")
        if isinstance(booked, SubsampledGaussianEvent):
            charged = (value if value > 0 else 1.0) / booked.noise_multiplier
            adjacency = Adjacency.ADD_REMOVE
        elif isinstance(booked, (GaussianEvent, LaplaceEvent)):
            charged, adjacency = booked.sensitivity, self.ledger.adjacency
        else:
            raise TypeError(f"release {release.name}: votes need an additive noise release, not "
                            f"{type(booked).__name__}")
        sensitivity = vote_l1_sensitivity if isinstance(booked, LaplaceEvent) else vote_sensitivity
        needed = sensitivity(spec, adjacency, max_records_per_user=self.records_per_unit)
        if needed > charged * (1 + 1e-9):
            raise ValueError(f"release {release.name} is charged for sensitivity {charged:.6g}, but the votes asked "
                             f"of it ({spec.kind}) have sensitivity {needed:.6g}")

    def _noised(self, release: Release, value: float, clean: np.ndarray) -> np.ndarray:
        """clean + noise of scale `value` (the knob: a Laplace scale or a Gaussian sigma), with the
        distribution of the release's own event, from the release's stream."""
        clean = np.asarray(clean, dtype=np.float64)
        if value == 0.0:
            return clean
        event = release.event(value)
        if isinstance(event, LaplaceEvent):
            return self.noise.add(release.name, "laplace", clean, value)
        if isinstance(event, (GaussianEvent, SubsampledGaussianEvent)):
            return self.noise.add(release.name, "gaussian", clean, value)
        raise TypeError(f"release {release.name}: {type(event).__name__} is not an additive noise mechanism")

    def _step_report(self, release: Release, value: float, on_step: StepReport) -> Callable[[int, float], None]:
        """Progress of a DP-SGD release: step, noisy gradient norm (DP), and the run's epsilon so far
        (the ledger already holds the whole release; this accounts only the steps done)."""
        before = [e for e in self.ledger.events if e.name != release.name]
        event = release.event(value) if value > 0 else None
        if event is None:
            return lambda step, grad_norm: on_step(step, grad_norm, float("inf"))

        def account(steps: int) -> float:
            so_far = event.model_copy(update={"count": steps})
            return epsilon_tight([*before, so_far], self.ledger.delta, self.ledger.adjacency)

        so_far = EpsilonSoFar(account, event.count)
        return lambda step, grad_norm: on_step(step, grad_norm, so_far(step))

    def _sample_mask(self, release: Release, rate: float, n: int) -> np.ndarray:
        """Poisson subsample for a release: secret (drawn from the release's noise stream), never stored."""
        if rate >= 1.0:
            return np.ones(n, dtype=bool)
        return self.noise.stream(f"{release.name}/subsample").random(n) < rate


class EpsilonSoFar:
    """The run's epsilon after each step of a DP-SGD release, for its progress line. Accounting the steps so far
    is a PLD of a subsampled Gaussian, 0.5-1.5 s on this machine: every 10 steps, as before, that was 5% of a
    CPU's training (about 1.3 s a step) but ten times a GPU's (0.05 s a step). So it is accounted at the first step
    reported (the first of the release, or of a resumed one) and the last, and between them at most every 10 steps
    and only once the steps since the last accounting took at least (1 - ACCOUNTING_SHARE) / ACCOUNTING_SHARE
    times as long as that accounting did; the steps between show the last figure."""

    def __init__(self, account: Callable[[int], float], total: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._account, self._total, self._clock = account, total, clock
        self._step, self._epsilon, self._cost, self._since = 0, 0.0, 0.0, clock()

    def __call__(self, step: int) -> float:
        due = step - self._step >= 10 and self._clock() - self._since >= self._cost * (1 / ACCOUNTING_SHARE - 1)
        if self._step == 0 or step == self._total or due:
            start = self._clock()
            self._step, self._epsilon = step, self._account(step)
            self._since = self._clock()
            self._cost = self._since - start
        return self._epsilon


class CentralHolder(ReleasingHolder):
    """One trusted data holder with every private record in memory (never written anywhere).

    Build it with `dataset.open_central_holder`, which loads and checks the records; the embedder may load
    lazily (its first use is the first vote).
    """

    def __init__(self, private: LabelledTexts, label_names: list[str], embedder: Embedder, *,
                 persons: np.ndarray | None = None, device: str = "cpu", **kw) -> None:
        """`persons`: each record's person (0..P-1) when the unit of privacy is a person (records already
        bounded to k per person); DP-SGD then samples and clips persons, not records. `device`: where the
        votes are computed ('cuda': torch on the GPU; 'cpu': numpy/BLAS) and where DP-SGD trains."""
        super().__init__(**kw)
        self.__device = device
        self.__private = private
        self.__persons = persons
        self.__labels = private.label_ids(label_names)
        self.__embedder = embedder
        self.__embeddings: np.ndarray | None = None

    def _embeddings(self) -> np.ndarray:
        """Computed once per process, held in memory only (never cached: they are private)."""
        if self.__embeddings is None:
            self.__embeddings = self.__embedder.encode(self.__private.texts)
        return self.__embeddings

    def noisy_votes(self, spec: VoteSpec, candidates: np.ndarray, candidate_labels: np.ndarray, *,
                    release: ReleaseKey) -> np.ndarray:
        if spec.clip_per_unit and self.records_per_unit > 1 and self.__persons is None:
            raise ValueError("votes clipped per person need each record's person (data.person_column)")
        self._check_vote_charge(release, spec)

        def draw(r: Release, value: float) -> np.ndarray:
            # the clean vector (and the subsample) never leave this function; the rate was checked against the
            # release's event before it was charged (`_check_vote_charge`)
            keep = self._sample_mask(r, spec.sampling_rate, len(self.__labels))
            units = None if self.__persons is None else self.__persons[keep]
            votes = compute_votes(spec, self._embeddings()[keep], self.__labels[keep], candidates, candidate_labels,
                                  device=None if self.__device == "cpu" else self.__device, units=units)
            return self._noised(r, value, votes)

        return self._release(release, draw, asked_about(spec, candidates, candidate_labels))

    def noisy_label_counts(self, labels: list[str], *, release: ReleaseKey) -> np.ndarray:
        def draw(r: Release, value: float) -> np.ndarray:
            return self._noised(r, value, np.bincount(self.__labels, minlength=len(labels)))

        return self._release(release, draw)

    def noisy_length_histogram(self, edges: list[int], *, release: ReleaseKey) -> np.ndarray:
        def draw(r: Release, value: float) -> np.ndarray:
            return self._noised(r, value, length_histogram(self._lengths(), edges))

        return self._release(release, draw)

    def length_bound(self, which: str, cap: int, *, release: ReleaseKey) -> int:
        def draw(r: Release, value: float) -> np.ndarray:
            # value: the threshold's Laplace scale b (queries get 2b): (2 Delta / b)-DP, the release's event
            scale = value if value > 0 else None
            return np.array([svt_length_bound(self._lengths(), which, cap, scale, self.noise.laplace_sampler(r.name))])

        return int(self._release(release, draw)[0])

    def train_adapter(self, request: AdapterTraining, *, release: ReleaseKey,
                      on_step: StepReport | None = None) -> np.ndarray:
        from dpsynth.private.training import train_on_records

        booked = self.schedule.get(*release)  # checked before the release is charged, as votes are
        check_training_release(booked, self.knobs[booked.knob], request)
        if request.rounds != 1 or request.parties is not None:
            raise ValueError("federated (FedAvg) training needs a federated run")

        def draw(r: Release, value: float) -> np.ndarray:
            # secret: drawn from the release's noise stream (OS entropy unless privacy.noise_seed), never stored
            seed = self.noise.secret_seed(f"{r.name}/seed")
            report = None if on_step is None else self._step_report(r, value, on_step)
            return train_on_records(request, list(self.__private.texts), list(self.__private.labels),
                                    noise_multiplier=value, seed=seed,
                                    work_dir=self.store.work_dir(r.name, noised=value > 0),
                                    on_step=report, groups=self.__persons, device=self.__device)

        adapter = self._release(release, draw)
        self.diagnostics.pop(self.schedule.get(*release).name, None)  # weights are not counts: no signal/noise
        return adapter

    def _lengths(self) -> np.ndarray:
        return np.array([text_length(t) for t in self.__private.texts], dtype=np.int64)


def check_training_release(release: Release, value: float, request: AdapterTraining) -> None:
    """The release must be accounted as the very DP-SGD schedule the request asks for."""
    booked = release.event(value if value > 0 else 1.0)
    if not isinstance(booked, SubsampledGaussianEvent) or (booked.sampling_rate, booked.count) != (
            request.sampling_rate, request.total_steps):
        raise ValueError(f"release {release.name} is not accounted as {request.total_steps} Poisson-subsampled "
                         f"steps at rate {request.sampling_rate:g}")


def text_length(text: str) -> int:
    """Length of a text in whitespace-separated words (the unit DPGA's length metadata and prompts use)."""
    return len(text.split())


def length_histogram(lengths: np.ndarray, edges: list[int]) -> np.ndarray:
    """Counts per bin [edges[i], edges[i+1]); lengths outside the range count in the end bins.

    Every record adds exactly 1 to one bin, so the L1 (and L2) sensitivity is 1 under add/remove.
    """
    bins = len(edges) - 1
    idx = np.searchsorted(np.asarray(edges[1:-1]), lengths, side="right")
    return np.bincount(np.clip(idx, 0, bins - 1), minlength=bins).astype(np.float64)


def svt_query(lengths: np.ndarray, which: str, bound: int) -> float:
    """One query of `svt_length_bound`'s stream: minus the number of texts beyond `bound` (longer for 'max',
    shorter for 'min'). Sensitivity 1: adding or removing one text changes the count by at most one."""
    return -float(np.sum(lengths > bound) if which == "max" else np.sum(lengths < bound))


def svt_length_bound(lengths: np.ndarray, which: str, cap: int, scale: float | None,
                     rng: np.random.Generator | Callable[[float], float]) -> int:
    """AboveThreshold (papers/003 App. B.2) over the query stream of counts beyond a candidate bound.

    'max': candidates i = 0, 1, ..., cap; query -#(length > i) with threshold 0 halts at the first i
    that (noisily) no text exceeds. 'min': candidates i = cap, cap-1, ..., 0; query -#(length < i).
    Each query has sensitivity 1 per record; `scale` is the threshold's Laplace scale b (queries get
    2b), which makes the run (2 Delta / b)-DP; scale=None (epsilon = inf runs) gives the exact answer.
    """
    candidates = range(cap + 1) if which == "max" else range(cap, -1, -1)
    found = above_threshold((svt_query(lengths, which, i) for i in candidates), threshold=0.0, scale=scale, rng=rng)
    if found is None:
        return cap if which == "max" else 0
    return list(candidates)[found]


def signal_to_noise(noisy: np.ndarray, noise: float) -> dict:
    """How much of a release stands out of its noise, computed from the noisy values and the public noise
    scale only (post-processing, so it may be shown to anyone): the share of entries above 3 noise
    scales, which is about 0.1% for pure noise, and the largest entry in noise scales."""
    noisy = np.asarray(noisy, dtype=np.float64)
    if noise <= 0 or noisy.size == 0:
        return {"entries": int(noisy.size), "noise": float(noise), "above_3_noise": None, "max_over_noise": None}
    return {"entries": int(noisy.size), "noise": float(noise),
            "above_3_noise": float(np.mean(noisy > 3 * noise)), "max_over_noise": float(noisy.max() / noise)}


PROJECTION_TOLERANCE = 1e-3  # re-embedding the same texts moves a projection by about 1e-7


def asked_about(spec: VoteSpec, candidates: np.ndarray, candidate_labels: np.ndarray) -> dict:
    """A vote release's public request, compactly: the vote's settings, the candidates' labels (hashed)
    and each candidate's projections on two fixed random directions (other texts: about 0.04 apart on each).
    Candidates are synthetic or public (never private), so this may be saved. Projections, not a hash of the
    embeddings: the same texts embedded again in other batches differ in the last bits (padding), which must not
    refuse a resume."""
    x = np.asarray(candidates, dtype=np.float64)
    x = x.reshape(x.shape[0], int(np.prod(x.shape[1:]))) if x.ndim > 1 else x.reshape(-1, 1)
    directions = np.random.default_rng(0).standard_normal((x.shape[1], 2))
    directions /= np.linalg.norm(directions, axis=0)
    labels = np.asarray(candidate_labels, dtype=np.int64)
    return {"spec": spec.model_dump(mode="json"), "candidates": len(x),
            "labels": hashlib.sha256(labels.tobytes()).hexdigest(),
            "projection": np.round(x @ directions, 5).tolist()}


def _same_vote(saved: dict, now: dict) -> bool:
    """The same vote asked, by the spec's values (a request saved by an earlier version lacks fields added since,
    which take their defaults). `clip_per_unit` is left out: a run whose units hold one record each clips nothing,
    and a person-level run whose sensitivity it changed is refused by its privacy plan's fingerprint first."""
    try:
        return (VoteSpec.model_validate(saved).model_copy(update={"clip_per_unit": False})
                == VoteSpec.model_validate(now).model_copy(update={"clip_per_unit": False}))
    except ValueError:  # a damaged saved spec: compared as written
        return saved == now


def check_same_request(name: str, saved: dict | None, now: dict | None) -> None:
    """Refuse to reuse a saved release for another request than it answered: a resumed run that regenerated
    other candidates (a changed seed, generator or setting; a lost or replaced request cache) would otherwise
    select and weight its texts with votes cast on others."""
    if saved is None or now is None:  # saved before dpsynth kept the request, or a request without candidates
        return
    same = (_same_vote(saved["spec"], now["spec"]) and saved["candidates"] == now["candidates"]
            and saved["labels"] == now["labels"]
            and np.allclose(saved["projection"], now["projection"], rtol=0.0, atol=PROJECTION_TOLERANCE))
    if not same:
        raise DpsynthError(f"release {name} was drawn for other candidates than this resumed run asks about "
                           f"({saved['candidates']} then, {now['candidates']} now, or other texts): was a generation "
                           "setting, the seed or the request cache (DPSYNTH_CACHE) changed? The saved release cannot "
                           "be reused for them: restore them, or start a new run")
