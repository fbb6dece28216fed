"""A run's whole privacy plan from its config: what `dpsynth budget` prints is what the run pays.

The plan is the method's schedule plus the run-level releases (the DP label histogram when
label proportions are 'dp', the cluster histogram of a `resample:` stage), the delta reserved for SecAgg+
clipping, and the assumptions
the guarantee rests on. `calibrate` finds every knob for the target (epsilon, delta) on the
same accountant the ledger uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpsynth.config import RunConfig, fewest_answering, has_private_final_stage, noise_parties, records_per_unit
from dpsynth.federated.clipping import accounting_delta, clip_delta
from dpsynth.methods.base import Method, PaperFormula
from dpsynth.methods.registry import method_class
from dpsynth.methods.relabel import relabel_schedule
from dpsynth.methods.resample import resample_schedule
from dpsynth.privacy.accountant import epsilon_rdp
from dpsynth.privacy.events import SubsampledGaussianEvent
from dpsynth.privacy.ledger import Assumptions
from dpsynth.privacy.schedule import Release, Schedule


@dataclass(frozen=True)
class PrivacyPlan:
    config: RunConfig
    method: Method
    schedule: Schedule

    @property
    def epsilon(self) -> float:
        return self.config.privacy.epsilon

    @property
    def delta(self) -> float:
        return self.config.privacy.delta

    @property
    def accounting_delta(self) -> float:
        """The run's delta minus what SecAgg+ clipping may cost (federated runs only)."""
        return accounting_delta(self.config.federated, self.delta)

    @property
    def clip_delta(self) -> float:
        return clip_delta(self.config.federated, self.delta, self.epsilon)

    def calibrate(self) -> dict[str, float]:
        return self.schedule.calibrate(self.epsilon, self.accounting_delta, self.config.privacy.adjacency)

    def epsilon_of(self, knobs: dict[str, float]) -> float:
        return self.schedule.epsilon(knobs, self.accounting_delta, self.config.privacy.adjacency)

    def epsilon_rdp_of(self, knobs: dict[str, float]) -> float | None:
        return epsilon_rdp(self.schedule.events(knobs), self.accounting_delta, self.config.privacy.adjacency)

    def paper(self) -> PaperFormula | None:
        if math.isinf(self.epsilon):
            return None
        return self.method.paper_formula(self.epsilon, self.delta)

    @property
    def parties(self) -> tuple[int, int | None]:
        return noise_parties(self.config)

    def party_sigma(self, sigma: float) -> float:
        """Each party's share of a release's noise: sized for the fewest parties that may survive a round."""
        parties, fewest = self.parties
        return sigma / math.sqrt(fewest or parties)

    def _party_value(self, knob: str, value: float) -> float:
        """What each party adds for this knob: a share of the sum's noise, or (local DP-SGD) all of it."""
        uses = self.schedule.uses(knob)
        # In a federation DP-SGD runs only at the training parties (FederatedHolder.train_adapter), each adding
        # the full noise multiplier: local DP-SGD; every other release is a sum whose noise the parties share.
        if uses and all(isinstance(r.event(1.0), SubsampledGaussianEvent) for r in uses):
            return value
        group = self.method.party_groups().get(self.schedule.scope_of(knob))
        fed = self.config.federated
        assert fed is not None
        return value / math.sqrt(fewest_answering(fed, None if group is None else len(group)))

    def describe(self, knobs: dict[str, float]) -> dict:
        """The plan as the privacy report and `dpsynth budget` show it (no private value in it)."""
        parties, fewest = self.parties
        knob_rows = []
        for k in self.schedule.knobs:
            uses = self.schedule.uses(k.name)
            knob_rows.append({
                "name": k.name, "value": knobs[k.name], "description": k.description,
                "how": "fixed" if k.value is not None else f"share {k.share:g} of epsilon" if k.share else "calibrated",
                "releases": len(uses), "sensitivity": uses[0].sensitivity if uses else None,
                "sensitivity_label": sensitivity_label(uses[0] if uses else None),
                "party_value": self._party_value(k.name, knobs[k.name]) if parties > 1 else None,
            })
        out: dict = {
            "method": self.method.name,
            "releases": [r.name for r in self.schedule.releases],
            "knobs": knob_rows,
            "notes": list(self.schedule.notes),
            "parties": parties,
            "min_parties": fewest,
            "accounting_delta": self.accounting_delta,
        }
        paper = self.paper()
        if paper is not None and paper.value is not None:
            at_paper = {**knobs, paper.knob: paper.value}
            out["paper_formula"] = {"description": paper.description, "sensitivity": paper.sensitivity,
                                    "knob": paper.knob, "value": paper.value,
                                    "epsilon_of_paper_value": self.epsilon_of(at_paper)}
        return out

    def fingerprint(self) -> dict:
        """What the schedule depends on: a resumed run refuses a config that changes any of it."""
        p = self.config.privacy
        return {"epsilon": p.epsilon if math.isfinite(p.epsilon) else "inf", "delta": p.delta,
                "adjacency": p.adjacency.value,
                "releases": [[r.name, r.knob, r.sensitivity] for r in self.schedule.releases],
                "fixed": {k.name: k.value for k in self.schedule.knobs if k.value is not None},
                "federation": self._federation(), "final_stages": self.final_stages(), "unit": self._unit(),
                "events": [r.event(1.0).model_dump(mode="json") for r in self.schedule.releases],
                "shares": {k.name: k.share for k in self.schedule.knobs if k.share is not None},
                "groups": {name: list(group) for name, group in self.method.party_groups().items()},
                "split": self._split()}

    def _unit(self) -> list:
        """The unit of privacy as [kind, records it may hold]: a record, a person (data.person_column, at most
        privacy.max_records_per_user records) or a party (federated.unit). Not every release's sensitivity shows a
        change of it (DP-SGD's does not: clipping bounds a person's summed gradient whatever k is), so it is
        fingerprinted on its own: a run begun per record must not resume per person, or the other way round."""
        fed = self.config.federated
        if fed is not None and fed.unit == "party":
            return ["party", records_per_unit(self.config)]
        if fed is None and self.config.data.person_column is not None:
            return ["person", records_per_unit(self.config)]
        return ["record", 1]

    def final_stages(self) -> list[str]:
        """The stages after the method's iterations, in the order the run takes them (the engine numbers them by
        position, so a resume must find the same list; a public `relabel:` releases nothing yet is a stage)."""
        return [name for name, section in (("relabel", self.config.relabel), ("resample", self.config.resample))
                if section is not None]

    def _federation(self) -> dict | None:
        fed = self.config.federated
        if fed is None:
            return None
        return {"parties": fed.parties, "aggregation": fed.aggregation, "threshold": fed.threshold,
                "accounting_delta": self.accounting_delta}

    def _split(self) -> list | None:
        """Which records each simulated party holds, where parties form groups (fedgen: strong parties train,
        weak ones vote): a resume that moved records between parties would let a record answer for two groups
        whose releases the ledger composes in parallel. None without groups (every release asks every party, so
        which party holds a record does not matter) or when each party reads its own data (nodes)."""
        fed = self.config.federated
        if fed is None or fed.partition == "nodes" or not self.method.party_groups():
            return None
        if fed.partition == "files":
            return ["files", list(fed.party_files or [])]
        return [fed.partition, fed.alpha if fed.partition == "dirichlet" else None, self.config.seed]

    @property
    def reads_private_records(self) -> bool:
        """The data holder opens the private records at all (zero-shot and FuseGen without a private final stage
        never do)."""
        method = self.method
        return (method.reads_private_data(method.options) or method.label_release() is not None
                or has_private_final_stage(self.config))

    def assumptions(self) -> Assumptions:
        own = self.method.assumptions()
        general = self._assumptions()
        if not own:
            return general
        fields = {k: v for k, v in own.items() if k in Assumptions.model_fields}
        if "groups" in own:
            fields["unit"] = f"{general.unit}; {own['groups']}"
        return general.model_copy(update=fields)

    def _preconditions(self) -> str:
        """What the data holder checks on the private records without noise before the run starts: a finished run
        discloses that these hold (one bit each), so the guarantee is between neighbouring data sets that both
        pass them (private/dataset.py: check_private; federated/shards.py)."""
        fed = self.config.federated
        if not self.reads_private_records:
            return "none"
        if fed is not None and fed.partition == "nodes":
            return (f"each party checks without noise, before the first release, that it holds at most "
                    f"{fed.max_records_per_party} records and that its labels are among task.labels; one that fails "
                    "stops the run (flower_secagg: preflight), so a finished run discloses that every party passed")
        fewest, _ = self.method.min_private_records()
        checks = ["every private label is one of task.labels", "every task label has a private record",
                  f"at least {fewest} private record{'s' if fewest != 1 else ''}",
                  f"delta < 1/M (M < {1 / self.config.privacy.delta:g} records)"]
        if fed is not None:
            checks.append(f"no party holds more than {fed.max_records_per_party} records")
        notes = ("checked without noise before the run starts: " + "; ".join(checks) + ". A finished run discloses "
                 "that they hold; the guarantee is between neighbouring data sets that both pass them")
        if fed is not None and fed.partition in ("iid", "dirichlet"):
            notes += (". This simulation splits one pooled set among the parties by a seeded draw over all of its "
                      "records, so a record added or removed can move others between parties: what is stated per "
                      "party or per group of parties holds for a federation whose parties hold fixed data, which "
                      "the simulation stands in for")
        return notes

    def _assumptions(self) -> Assumptions:
        p, fed = self.config.privacy, self.config.federated
        kind, records = self._unit()  # a person: the data holder bounds each to k records
        unit = kind if kind == "record" else f"{kind} (<= {records} records)"
        checked = self._preconditions()
        if fed is None:
            return Assumptions(adjacency=p.adjacency, unit=unit, checked_on_private_data=checked)
        if fed.aggregation == "secagg+":
            trust = (f"{fed.parties} parties, Flower SecAgg+: the server sees only the sum of >= {fed.threshold} "
                     f"parties' votes, each noised with sigma/sqrt({fed.threshold}); honest-but-curious server, "
                     "parties follow the protocol and do not collude with it (colluders' noise shares can be "
                     "subtracted); per-party clipping and stochastic rounding before masking (see federated metrics)")
            convention = (f"run delta {p.delta:g} = {self.accounting_delta:g} (accountant) + (1 + e^eps) x "
                          f"{self.clip_delta:.4g} (probability that SecAgg+ clips a noisy vote; clipping is "
                          "per party, so it costs (1 + e^eps) times its probability)")
            return Assumptions(adjacency=p.adjacency, unit=unit, trust_model=trust, delta_convention=convention,
                               checked_on_private_data=checked)
        trust = (f"{fed.parties} parties, no secure aggregation: the server sees every party's vector, so each "
                 "party adds the full sigma (disjoint data: the composition is the same as central)")
        return Assumptions(adjacency=p.adjacency, unit=unit, trust_model=trust, checked_on_private_data=checked)


def plan_privacy(config: RunConfig) -> PrivacyPlan:
    """The method's schedule plus its label-proportion release, for this config."""
    method = method_class(config.method)(config)
    schedule = method.label_schedule() + method.schedule()
    schedule = schedule + resample_schedule(config, schedule)
    return PrivacyPlan(config, method, schedule + relabel_schedule(config, schedule))


def plan_for_method(method: str, *, epsilon: float = math.inf, delta: float = 1e-5, options: dict | None = None,
                    adjacency: str = "add_remove", max_records_per_user: int = 1,
                    label_proportions: str | None = None, parties: int = 1,
                    min_parties: int | None = None, resample: dict | None = None,
                    relabel: dict | None = None) -> PrivacyPlan:
    """The plan of a run of `method` with these settings, without a data set (for `dpsynth budget`).

    epsilon = inf plans the releases without calibrating them (give the noise instead).
    """
    from dpsynth.runs.config import parse_config

    raw: dict = {
        "method": method,
        "data": ({"corpus": "(planning: no data is read)", "m": 1} if max_records_per_user == 1 else
                 {"private": "(planning: no data is read)", "person_column": "person"}),
        # two placeholder labels: relabel: refuses a one-label task, and no release's sensitivity depends on the count
        **({} if max_records_per_user == 1 else
           {"task": {"text_kind": "(planning)", "labels": {"a": "(planning)", "b": "(planning)"}}}),
        "generators": [{"model": "(planning)"}],
        method: dict(options or {}),
        "privacy": {"epsilon": epsilon, "delta": delta, "adjacency": adjacency,
                    "max_records_per_user": max_records_per_user,
                    **({"label_proportions": label_proportions} if label_proportions else {})},
    }
    if resample is not None:
        raw["resample"] = resample
    if relabel is not None:
        raw["relabel"] = relabel
    if parties > 1:
        raw["federated"] = {"parties": parties, "min_parties": min_parties, "partition": "iid",
                            "max_records_per_party": max(64, max_records_per_user)}
    return plan_privacy(parse_config(raw, "budget"))


def sensitivity_label(release: Release | None) -> str:
    """What a knob's sensitivity figure is: a Gaussian or Laplace release states its sensitivity under the run's
    adjacency; a Poisson-subsampled one (DP-SGD, DPGA's votes) states the per-unit bound under add/remove, and the
    accountant applies the adjacency to it (under replace, recomputing epsilon from that figure with the Gaussian
    convention would be wrong)."""
    if release is not None and isinstance(release.event(1.0), SubsampledGaussianEvent):
        return "per-unit bound (add/remove; the accountant applies the adjacency)"
    return "sensitivity"
