"""What a generation method is, and what one of its steps may use.

A method is a class with a config section (`Options`, its own pydantic model), a state
(`State`, saved in every checkpoint), the schedule of private releases it makes, and one
`step` per iteration. It reaches private data only through `StepContext.holder`, the data
holder, which charges the ledger, adds the noise and returns noisy results: the context
carries no private record (a test walks it to check).

    @register
    class MyMethod(Method):
        name = "mine"
        Options = MyOptions
        State = MyState
        def iterations(self) -> int: ...
        def schedule(self) -> Schedule: ...            # named releases on the run's ledger
        def step(self, ctx, state, t) -> dict: ...     # ctx.holder.noisy_votes(..., release=self.release("votes", t))
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from dpsynth.config import RunConfig, Section, records_per_unit
from dpsynth.data.records import TaskSpec
from dpsynth.llm.cache import CachedGenerator
from dpsynth.methods.generation import SyntheticSample
from dpsynth.privacy.schedule import Knob, Schedule, gaussian_releases
from dpsynth.privacy.sensitivity import histogram_sensitivity
from dpsynth.private.holder import DataHolder
from dpsynth.prompts.builder import PromptSettings
from dpsynth.voting.spec import VoteSpec

Progress = Callable[[str, int, int], None]
LABELS_RELEASE = "labels.histogram"
LABEL_SIGMA = "label_sigma"


class MethodState(BaseModel):
    """A method's progress: only synthetic text and results derived from noisy releases."""

    model_config = ConfigDict(extra="forbid")
    next_iteration: int = 0
    history: list[dict] = []
    relabelled: list[SyntheticSample] | None = None  # the final set after a `relabel:` stage
    resampled: list[SyntheticSample] | None = None  # the final set after a `resample:` stage


@dataclass(frozen=True)
class PaperFormula:
    """What a paper's own privacy analysis prescribes for the same setting, for one knob."""

    description: str
    sensitivity: float
    knob: str
    value: float | None = None  # the paper's noise for the run's target epsilon


class SamplingOptions(Section):
    """The sampling settings every generating method's section shares (a method may change a default)."""

    max_tokens: PositiveInt = Field(64, description="most new tokens a generation may write")
    temperature: float = Field(1.0, ge=0, description="0 = greedy")
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus sampling: draw from the smallest set of tokens "
                         "holding this much probability")
    max_attempts: PositiveInt = Field(3, description="re-asks for samples dropped by cleaning")

    def prompt_settings(self, max_tokens: int | None = None) -> PromptSettings:
        return PromptSettings(max_tokens=max_tokens or self.max_tokens, temperature=self.temperature, top_p=self.top_p)


OptionsT = TypeVar("OptionsT", bound=Section)
StateT = TypeVar("StateT", bound=MethodState)


def add_time(timings: dict[str, float], loads: list[tuple[float, float]], key: str, since: float) -> float:
    """Add the time since `since` to `timings[key]`, less the lazy model loads (start, seconds) that began
    meanwhile (the engine counts those as `load_models`); returns the seconds added."""
    seconds = time.perf_counter() - since - sum(took for start, took in loads if start >= since)
    timings[key] = timings.get(key, 0.0) + seconds
    return seconds


@dataclass
class StepContext:
    """Everything a step may use. Private data is reachable only through `holder`."""

    config: RunConfig
    task: TaskSpec
    label_shares: dict[str, float]
    generators: dict[str, CachedGenerator]
    holder: DataHolder
    embed: Callable[[list[str]], np.ndarray]  # synthetic texts only (cached on disk)
    progress: Progress | None = None
    timings: dict[str, float] = field(default_factory=dict)
    files: Path | None = None  # the method's own files (post-processing of releases only), kept with checkpoints
    knobs: dict[str, float] = field(default_factory=dict)  # the calibrated noise values (public, as in plan.json)
    loads: list[tuple[float, float]] = field(default_factory=list)  # (start, seconds) of lazy model loads

    def add_time(self, key: str, since: float) -> None:
        """Add the time since `since` to `key`, less the lazy loads that began meanwhile (`loads`: the engine
        counts those as `load_models`), so that embedding, voting or evaluation time measures that work only."""
        add_time(self.timings, self.loads, key, since)

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
        out = self.embed([x.text for x in samples])
        self.add_time("embedding", t0)
        return out

    def noisy_votes_on(self, samples: list[SyntheticSample], spec: VoteSpec, release: tuple[str, int | None],
                       phase: str) -> np.ndarray:
        """The votes every voting method asks for: embed the samples (cached), ask the data holder for the
        release's noisy votes on them (its requests are timed as voting, which metrics.json leaves out), report
        the phase."""
        self.phase(phase, 0)
        emb = self.embed_synthetic(samples)
        noisy = self.holder.noisy_votes(spec, emb, self.label_ids(samples), release=release)
        self.phase(phase, 1)
        return noisy

    def label_ids(self, samples: list[SyntheticSample]) -> np.ndarray:
        labels = self.task.label_names
        return np.array([labels.index(x.label) for x in samples], dtype=np.int64)


# optional packages of the methods that train a LoRA adapter of a local GGUF model, (module, extra installing it)
TRAINS_LORA = (("torch", "local"), ("transformers", "transformers"), ("gguf", "transformers"), ("peft", "finetune"))
DP_TRAINS_LORA = (*TRAINS_LORA, ("opacus", "finetune"))  # with DP-Adam (Opacus)


class Method(ABC, Generic[OptionsT, StateT]):
    """A generation method bound to one run's config."""

    name: ClassVar[str]
    Options: ClassVar[type[Section]]
    State: ClassVar[type[MethodState]]
    uses_private_data: ClassVar[bool] = True
    one_generator_per_run: ClassVar[bool] = False  # single-PLM methods: bench runs one cell per PLM
    several_plms_hint: ClassVar[str] = ""  # how such a method can take several PLMs, if it can
    reweights_plms: ClassVar[bool] = False  # moves requests between PLMs as it runs (WASP): a dry run says so
    # optional packages it imports as it runs, (module, extra installing it): checked before a run starts
    needs_packages: ClassVar[tuple[tuple[str, str], ...]] = ()
    trains_in_simulation: ClassVar[bool] = False  # a simulated federation's parties run DP-Adam in this process
    summary: ClassVar[str] = ""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.options: Any = config.options(self.name)

    prompt_examples: ClassVar[int | str] = 0  # synthetic texts in its longest prompt (or the option naming it)

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        """Raise ValueError for settings this method cannot run (called when the config is parsed)."""
        if config.federated is not None and not cls.uses_private_data and config.resample is None:
            raise ValueError(f"{cls.name} uses no private data; it has no federated mode")
        if cls.runs_alone(config.options(cls.name)) and len(config.generators) != 1:
            raise ValueError(f"{cls.name} uses exactly one PLM (as in its paper); run it once per PLM"
                             f"{cls.several_plms_hint}")
        need = cls.context_tokens(config)
        for i, g in enumerate(config.generators):
            if g.kind == "llama_cpp" and g.n_ctx < need:
                raise ValueError(f"generators[{i}].n_ctx={g.n_ctx} is below the about {need} tokens the longest "
                                 f"prompt of {cls.name} and its answer need; raise n_ctx to at least {need}")

    @classmethod
    def reads_private_data(cls, options: Any) -> bool:
        """Whether a run of these options asks the data holder anything (a method's public control does not)."""
        return cls.uses_private_data

    @classmethod
    def runs_alone(cls, options: Any) -> bool:
        """Whether a run of these options has exactly one PLM (a bench then runs one cell per PLM)."""
        return cls.one_generator_per_run

    @classmethod
    def context_tokens(cls, config: RunConfig) -> int:
        """A generous bound on the tokens of the method's longest prompt plus its answer: the template and
        chat markup (256), the task's own words (about 2 tokens each), and each synthetic example and the
        answer at `max_tokens`. Checked before anything runs: a context too small failed after a release."""
        options = config.options(cls.name)
        max_tokens = getattr(options, "max_tokens", 64)
        examples = cls.prompt_examples if isinstance(cls.prompt_examples, int) else int(
            getattr(options, cls.prompt_examples))
        task_words = 0
        if config.task is not None:
            task_words = len(f"{config.task.text_kind} {config.task.description or ''}".split()) + max(
                (len(str(d).split()) for d in config.task.labels.values()), default=0)
        return 256 + 2 * task_words + (examples + 1) * max_tokens

    def check_task(self, task: TaskSpec) -> None:
        """Raise DpsynthError for settings that cannot work with this task (checked before anything runs)."""

    def release(self, what: str, t: int | None = None) -> tuple[str, int | None]:
        """The key of one of this method's releases, e.g. ('wasp.votes', 2)."""
        return f"{self.name}.{what}", t

    @abstractmethod
    def iterations(self) -> int: ...

    def schedule(self) -> Schedule:
        """The private releases this method makes over the whole run (none by default)."""
        return Schedule((), ())

    def label_schedule(self) -> Schedule:
        """The release of DP label proportions (`privacy.label_proportions: dp`): a Gaussian label histogram
        at the user's fixed sigma, on the run's ledger. Methods with their own label release override this."""
        p = self.config.privacy
        if p.label_proportions != "dp":
            return Schedule((), ())
        # per unit of privacy: a person's k records, or, in a federation with `unit: party`, a party's m records
        sens = histogram_sensitivity(p.adjacency, max_records_per_user=records_per_unit(self.config))
        return Schedule(
            releases=gaussian_releases(LABELS_RELEASE, [None], LABEL_SIGMA, sens),
            knobs=(Knob(LABEL_SIGMA, value=p.label_histogram_sigma,
                        description="Gaussian noise on the private label counts (privacy.label_histogram_sigma)"),),
            notes=("DP label histogram (label proportions from noisy private counts)",),
        )

    def label_release(self) -> tuple[str, int | None] | None:
        """The release the label proportions come from, if they are private (else uniform or public)."""
        return (LABELS_RELEASE, None) if self.config.privacy.label_proportions == "dp" else None

    def assumptions(self) -> dict[str, str]:
        """What the method adds to or changes in the privacy report's assumptions (e.g. its sampler)."""
        return {}

    def party_groups(self) -> dict[str, tuple[int, ...]]:
        """Federated runs: named, disjoint groups of parties (a release whose event has that scope is
        answered by that group only, and composes in parallel with the other groups'). None by default."""
        return {}

    def min_private_records(self) -> tuple[int, str]:
        """Fewest private records the method can work with, and what to change (checked by the holder)."""
        return 1, "1"

    def planned_requests(self, labels: int) -> int:
        """Generator requests the whole run asks for, before re-asks of dropped or duplicate samples (the dry
        run's estimate; `tests/test_engine.py` checks it against real runs of every method)."""
        raise NotImplementedError(f"{self.name} does not estimate its requests")

    def new_state(self) -> StateT:
        return self.State()  # type: ignore[return-value]

    def load_state(self, data: dict) -> StateT:
        return self.State.model_validate(data)  # type: ignore[return-value]

    @abstractmethod
    def step(self, ctx: StepContext, state: StateT, t: int) -> dict:
        """Run iteration t; return its record for metrics.json."""

    @abstractmethod
    def final_samples(self, state: StateT) -> list[SyntheticSample]: ...

    def reference_sets(self, state: StateT) -> dict[str, list[SyntheticSample]]:
        """Subsets evaluated next to the final set (e.g. the zero-shot samples)."""
        return {}

    def paper_formula(self, epsilon: float, delta: float) -> PaperFormula | None:
        """The paper's own noise for this setting, if it prescribes one (reported next to ours)."""
        return None
