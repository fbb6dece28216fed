"""Resource-adaptive federated generation (papers/004, Algorithm 1): strong parties fine-tune, weak parties vote.

iteration 0 (stage 1): FedAvg of local DP-SGD on the *strong* parties: `rounds` rounds of `local_steps`
             DP-Adam steps each on a LoRA adapter of the local PLM (control code = label prompt).
             One release, scoped to the strong parties' records.
iteration 1 (stages 2-3): every party's label counts plus its noise share, summed through SecAgg+
             (the profile: the run's DP label histogram), then `n` samples from the fine-tuned
             model split over labels by the noisy profile.
iteration 2 (stage 4): the *weak* parties' records cast K nearest-neighbour votes on the candidates of
             their own label (papers/004, A.2), noise shares summed through SecAgg+; per label,
             `keep` x candidates are drawn without replacement with probability proportional to the
             (clipped at 0) noisy votes (A.4). One release, scoped to the weak parties' records.

Privacy: a record is in exactly one party and every party has one public role, so the strong
group's records see training + profile and the weak group's see profile + votes. The ledger
composes each group separately (tight PLD) and reports the larger; the paper adds the parts'
epsilons by basic composition with each party's own noise. Our profile and votes carry the
noise once for the sum (SecAgg+ noise shares), the paper's once per party. Training is local
DP-SGD: each strong party adds the full noise, so its update is DP even to a curious server
that sees it alone (training rounds are plain FedAvg; secure aggregation would add no DP).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, PositiveInt

from dpsynth.config import RunConfig, records_per_unit
from dpsynth.data.records import TaskSpec
from dpsynth.errors import DpsynthError
from dpsynth.finetune.examples import control_prompt
from dpsynth.finetune.request import AdapterTraining
from dpsynth.methods.base import (
    LABEL_SIGMA,
    LABELS_RELEASE,
    TRAINS_LORA,
    Method,
    MethodState,
    SamplingOptions,
    StepContext,
)
from dpsynth.methods.dpft import LOCAL_KINDS, local_gguf_path, sample_from_adapter, train_adapter_once
from dpsynth.methods.generation import SyntheticSample, request_seed
from dpsynth.methods.registry import register
from dpsynth.privacy.events import GaussianEvent, PrivacyEvent
from dpsynth.privacy.schedule import Knob, Release, Schedule, dp_sgd_events, gaussian_releases
from dpsynth.privacy.sensitivity import histogram_sensitivity, knn_votes_sensitivity
from dpsynth.voting.spec import VoteSpec

STRONG, WEAK = "parties:strong", "parties:weak"
NOISE_MULTIPLIER, VOTE_SIGMA = "noise_multiplier", "vote_sigma"


class FedgenOptions(SamplingOptions):
    """The `fedgen:` section (defaults: papers/004 scaled to a CPU; its budget split eps_prof = eps/4)."""

    strong: float | list[int] = Field(
        0.3, description="the strong (training) parties: a share of the parties (the first round(share x L), at "
        "least 1) or a list of party ids; every other party is weak (votes only)")
    rounds: PositiveInt = Field(4, description="R: FedAvg rounds")
    local_steps: PositiveInt = Field(10, description="tau: DP-Adam steps per round at each strong party")
    sampling_rate: float = Field(0.2, gt=0, le=1, description="q: Poisson rate of each local step")
    clip_norm: float = Field(1.0, gt=0, description="per-example gradient L2 bound")
    learning_rate: float = Field(3e-3, gt=0, description="local (Adam) learning rate")
    server_learning_rate: float = Field(1.0, gt=0, description="eta: server step on the mean update")
    lora_r: PositiveInt = Field(8, description="LoRA rank of the adapter")
    lora_alpha: PositiveInt = Field(16, description="LoRA scaling alpha (the update is scaled by alpha / r)")
    max_length: int = Field(64, ge=8, description="tokens per training sequence (control prompt + text)")
    n: PositiveInt = Field(240, description="s: samples generated from the fine-tuned model (stage 3)")
    keep: float = Field(0.5, gt=0, le=1, description="r: share of each label's candidates kept by refinement")
    k: PositiveInt = Field(3, description="K: nearest candidates each weak record votes for")
    profile_share: float = Field(0.25, gt=0, lt=1, description="share of epsilon for the profile (label counts) "
                                 "when label proportions are private (the default)")
    max_tokens: PositiveInt = 60


class FedgenState(MethodState):
    adapter: str | None = None  # its hash (the adapter itself is the saved release)
    candidates: list[SyntheticSample] = []  # stage 3
    samples: list[SyntheticSample] = []  # after refinement


@register
class Fedgen(Method[FedgenOptions, FedgenState]):
    name = "fedgen"
    Options = FedgenOptions
    State = FedgenState
    needs_packages = TRAINS_LORA  # the server samples from the averaged adapter; the strong parties train
    trains_in_simulation = True
    one_generator_per_run = True
    summary = ("resource-adaptive federated generation: strong parties DP-fine-tune (FedAvg), weak parties "
               "refine by DP votes (papers/004)")

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        fed = config.federated
        if fed is None:
            raise ValueError("fedgen is federated: add a federated: section (parties, partition, ...)")
        if fed.unit != "record" or config.privacy.max_records_per_user != 1:
            raise ValueError("fedgen accounts one record per DP-SGD sample: federated.unit must be 'record' and "
                             "privacy.max_records_per_user 1")
        if config.generators[0].kind not in LOCAL_KINDS:
            raise ValueError(f"fedgen fine-tunes a local GGUF model: generators[0].kind must be one of {LOCAL_KINDS}")
        strong, weak = _roles(config)
        if len(weak) < (2 if fed.aggregation == "secagg+" else 1):
            raise ValueError(f"fedgen needs at least {2 if fed.aggregation == 'secagg+' else 1} weak parties to vote "
                             f"({len(weak)} of {fed.parties} are weak); lower fedgen.strong or add parties")

    def assumptions(self) -> dict[str, str]:
        o = self.options
        return {
            "sampler": (f"training: Poisson sampling at rate {o.sampling_rate:g} within each strong party's records, "
                        f"{o.rounds} x {o.local_steps} steps; profile and votes: every record"),
            "trust_model": ("strong parties: local DP-SGD, each adds the full noise, so its adapter update is DP even "
                            "to a server that sees it alone (training rounds are plain FedAvg); profile and weak "
                            "parties' votes: Flower SecAgg+ sums whose noise shares add up to the full sigma when the "
                            "round's threshold of parties answers; honest-but-curious server, no collusion with it"),
            "groups": ("strong and weak parties' records compose in parallel: neighbouring datasets differ by one "
                       "record at a fixed party (a party's records and role are its own, as in a real federation; "
                       "experiment splits simulate such a partition)"),
        }

    def party_groups(self) -> dict[str, tuple[int, ...]]:
        strong, weak = _roles(self.config)
        return {STRONG: strong, WEAK: weak}

    def iterations(self) -> int:
        return 3

    def planned_requests(self, labels: int) -> int:
        return self.options.n

    def min_private_records(self) -> tuple[int, str]:
        return 2, "2"

    def check_task(self, task: TaskSpec) -> None:
        local_gguf_path(self.config)
        if self.options.n < len(task.labels):
            raise DpsynthError(f"fedgen.n={self.options.n} is smaller than the number of labels; raise fedgen.n")

    def _private_profile(self) -> bool:
        return self.config.privacy.label_proportions in (None, "dp")

    def label_schedule(self) -> Schedule:
        """Stage 2: the profile is the run's DP label histogram (every party's counts), at `profile_share`."""
        if not self._private_profile():
            return Schedule((), ())
        sens = histogram_sensitivity(self.config.privacy.adjacency, max_records_per_user=records_per_unit(self.config))
        return Schedule(gaussian_releases(LABELS_RELEASE, [None], LABEL_SIGMA, sens),
                        (Knob(LABEL_SIGMA, share=self.options.profile_share,
                              description="Gaussian noise on the summed label counts of every party (the profile)"),),
                        ("profile: every party's label counts with its noise share, summed by SecAgg+",))

    def label_release(self) -> tuple[str, int | None] | None:
        return (LABELS_RELEASE, None) if self._private_profile() else None

    def schedule(self) -> Schedule:
        o, adjacency = self.options, self.config.privacy.adjacency

        training = dp_sgd_events(o.rounds * o.local_steps, o.sampling_rate, scope=STRONG)

        vote_sens = knn_votes_sensitivity(o.k, adjacency, normalized=False)

        def votes(name: str, sigma: float) -> PrivacyEvent:
            return GaussianEvent(name=name, sensitivity=vote_sens, sigma=sigma, scope=WEAK)

        return Schedule(
            (Release(self.release("training")[0], None, NOISE_MULTIPLIER, training, 1.0),
             Release(self.release("votes")[0], None, VOTE_SIGMA, votes, vote_sens)),
            (Knob(NOISE_MULTIPLIER, guess=1.0, description=(
                f"local DP-Adam noise multiplier at each strong party: {o.rounds} rounds x {o.local_steps} "
                f"Poisson-subsampled steps at rate {o.sampling_rate:g}")),
             Knob(VOTE_SIGMA, guess=5.0, description=f"Gaussian noise on the weak parties' summed {o.k}-NN votes")),
            ("strong and weak parties hold disjoint records: their releases compose in parallel (each group with "
             "the profile)", "training: local DP-SGD (each strong party adds the full noise; plain FedAvg)"))

    def training_request(self, task: TaskSpec) -> AdapterTraining:
        o = self.options
        strong, _ = _roles(self.config)
        return AdapterTraining(
            model=str(local_gguf_path(self.config)), lora_r=o.lora_r, lora_alpha=o.lora_alpha, steps=o.local_steps,
            sampling_rate=o.sampling_rate, clip_norm=o.clip_norm, learning_rate=o.learning_rate,
            max_length=o.max_length, threads=self.config.generators[0].threads, rounds=o.rounds,
            server_learning_rate=o.server_learning_rate, parties=strong, init_seed=self.config.seed,
            prompts={c: control_prompt(task.text_kind, c, task.labels[c]) for c in task.label_names})

    def step(self, ctx: StepContext, state: FedgenState, t: int) -> dict:
        o = self.options
        request = self.training_request(ctx.task)
        if t == 0:
            state.adapter = train_adapter_once(ctx, request, self.release("training"))
            return {"iteration": 0, "training": {"rounds": o.rounds, "local_steps": o.local_steps,
                                                 "sampling_rate": o.sampling_rate, "clip_norm": o.clip_norm,
                                                 "sampler": "poisson", "parties": list(request.parties or ()),
                                                 "adapter": state.adapter}}
        if t == 1:
            adapter = ctx.holder.train_adapter(request, release=self.release("training"))  # the saved release
            state.candidates, stats = sample_from_adapter(ctx, request, adapter, o, t, o.n, tag="fedgen")
            return {"iteration": 1, "generated": stats, "label_shares": ctx.label_shares}
        spec = VoteSpec(kind="rank", weights=(1.0,) * o.k)
        noisy = ctx.noisy_votes_on(state.candidates, spec, self.release("votes"),
                                   "refinement: embed + weak parties' votes")
        rng = np.random.default_rng(request_seed(self.config.seed, "fedgen.refine"))
        keep = refine(noisy, [c.label for c in state.candidates], o.keep, rng)
        state.samples = [state.candidates[i] for i in keep]
        return {"iteration": 2, "candidates": len(state.candidates), "kept": len(state.samples)}

    def final_samples(self, state: FedgenState) -> list[SyntheticSample]:
        return list(state.samples)

    def reference_sets(self, state: FedgenState) -> dict[str, list[SyntheticSample]]:
        """Stage 3 alone (every candidate), and a uniform draw of the refined set's size per label (the
        paper's Table A.14 control: is refinement better than sampling fewer at random?)."""
        if not state.candidates:
            return {}
        labels = [c.label for c in state.candidates]
        rng = np.random.default_rng(request_seed(self.config.seed, "fedgen.uniform"))
        uniform = refine(np.zeros(len(labels)), labels, self.options.keep, rng)
        return {"stage3": list(state.candidates), "stage3_uniform": [state.candidates[i] for i in uniform]}


def refine(noisy: np.ndarray, labels: list[str], keep: float, rng: np.random.Generator) -> list[int]:
    """Papers/004, A.4 per label: max(1, floor(keep x |label's candidates|)) indices drawn without replacement,
    each with probability proportional to its noisy vote clipped at 0 (uniform when no vote is positive).
    Post-processing of the noisy votes only."""
    chosen: list[int] = []
    for label in dict.fromkeys(labels):
        idx = np.array([i for i, y in enumerate(labels) if y == label])
        m = min(len(idx), max(1, math.floor(keep * len(idx))))
        w = np.clip(np.asarray(noisy, dtype=np.float64)[idx], 0.0, None)
        positive = int(np.count_nonzero(w))
        if positive >= m:
            picked = rng.choice(len(idx), size=m, replace=False, p=w / w.sum())
        else:  # A.4's uniform fallback once the positive weight is used up
            first = np.flatnonzero(w > 0)
            rest = rng.choice(np.flatnonzero(w == 0), size=m - positive, replace=False)
            picked = np.concatenate([rng.permutation(first), rest])
        chosen.extend(int(idx[j]) for j in picked)
    return sorted(chosen)


def _roles(config: RunConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(strong party ids, weak party ids): public, from the config."""
    fed = config.federated
    assert fed is not None
    strong_opt = config.options("fedgen").strong if "fedgen" in config.sections else FedgenOptions().strong
    if isinstance(strong_opt, list):
        strong = tuple(sorted(set(strong_opt)))
        if not strong or strong[0] < 0 or strong[-1] >= fed.parties:
            raise ValueError(f"fedgen.strong must list party ids in 0..{fed.parties - 1}, got {strong_opt}")
    else:
        if not 0 < strong_opt < 1:
            raise ValueError(f"fedgen.strong as a share must be in (0, 1), got {strong_opt}")
        strong = tuple(range(max(1, round(strong_opt * fed.parties))))
    weak = tuple(i for i in range(fed.parties) if i not in strong)
    return strong, weak

