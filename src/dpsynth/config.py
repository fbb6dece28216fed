"""The run configuration shared by every method; each method's own section lives with the method.

A run config is YAML: the shared sections below (data, task, generators, privacy, federated)
plus one section per method, named after it (`wasp:`, `augpe:`, ...). Method sections are
validated by the method's own options model when the config is parsed
(`dpsynth.runs.config.parse_config`), so adding a method never touches this file. Every
shared default lives here. This module imports no engine code: everything may import it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from dpsynth.device import DeviceSetting
from dpsynth.embed.sentence import DEFAULT_EMBEDDER
from dpsynth.privacy.accountant import Adjacency


class Section(BaseModel):
    """A config section: unknown keys are errors (a typo never silently becomes a default)."""

    model_config = ConfigDict(extra="forbid")


class GeneratorConfig(Section):
    """One PLM. `model` is a known local name, a .gguf path, an API model name or a HF model id."""

    kind: str = Field("llama_cpp", description="backend: llama_cpp, openai, transformers, or a registered plugin")
    model: str = Field(..., description="a local name (smollm2-135m-instruct, gemma3-270m), a .gguf path, an API "
                       "model name (kind: openai) or a Hugging Face model id or directory (kind: transformers)")
    name: str | None = Field(None, description="how results and logs call it (default: the model's file stem); "
                             "unique within a run; set it for names with dots: gpt-3.5-turbo's stem is gpt-3")
    chat: bool | None = Field(None, description="instruct model (chat) or base model (completion); auto for GGUF")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the API key")
    max_concurrency: PositiveInt = Field(4, description="API generators: requests in flight at once")
    processes: PositiveInt = Field(1, description="API generators: worker processes sharing max_concurrency (a "
                                   "process spends about 1 ms of CPU a request through the SDK, 0.3 ms through the "
                                   "lean client, so it asks at most several hundred to a few thousand a second; "
                                   "raise it for fast endpoints)")
    max_retries: int = Field(5, ge=0, description="API retries per request with exponential backoff (timeouts, "
                             "429, 5xx, malformed answers)")
    timeout: float = Field(120.0, gt=0, description="seconds per API request")
    transport: Literal["auto", "sdk"] = Field(
        "auto", description="API generators: auto sends to a plain-http endpoint without a proxy through a lean "
        "client (about a quarter of the SDK's CPU a request), anything else through the OpenAI SDK; sdk always "
        "uses the SDK")
    n_ctx: PositiveInt = Field(2048, description="local llama.cpp models: context window in tokens")
    threads: PositiveInt | None = Field(
        None, description="CPU threads of a local llama.cpp model (default: every core available to this process); "
        "lower it when several runs or models share the machine's cores")
    # finite and not negative: a negative or NaN price would make every cost check pass, so max_cost would never stop
    price_per_prompt_token: float | None = Field(None, ge=0, allow_inf_nan=False, description="price of one prompt "
                                                 "token, for the cost shown and max_cost")
    price_per_completion_token: float | None = Field(None, ge=0, allow_inf_nan=False, description="price of one "
                                                     "completion token")
    max_requests: PositiveInt | None = Field(None, description="cap: paid (uncached) requests over the run")
    max_total_tokens: PositiveInt | None = Field(None, description="cap: paid prompt + completion tokens over the run")
    max_cost: PositiveFloat | None = Field(None, description="cap: cost over the run, in the prices' currency "
                                           "(needs price_per_prompt_token / price_per_completion_token)")
    requests_per_minute: PositiveFloat | None = Field(None, description="client-side rate limit (API generators)")
    tokens_per_minute: PositiveFloat | None = Field(None, description="client-side rate limit in prompt + "
                                                    "max_tokens per request (API generators)")

    @model_validator(mode="after")
    def _processes_need_an_unpaced_api(self) -> GeneratorConfig:
        if self.processes > 1 and self.kind != "openai":
            raise ValueError("processes applies to API generators (kind: openai) only")
        if self.transport != "auto" and self.kind != "openai":
            raise ValueError("transport applies to API generators (kind: openai) only")
        if self.processes > 1 and (self.requests_per_minute or self.tokens_per_minute):
            raise ValueError("client-side rate limits pace one process: set processes: 1 with requests_per_minute "
                             "or tokens_per_minute")
        return self

    @field_validator("base_url")
    @classmethod
    def _url_has_a_scheme(cls, url: str | None) -> str | None:
        if url is not None and not url.lower().startswith(("http://", "https://")):
            raise ValueError(f"base_url '{url}' needs its scheme: http://{url} or https://{url}")
        return url

    @model_validator(mode="after")
    def _cost_needs_prices(self) -> GeneratorConfig:
        priced = self.price_per_prompt_token is not None or self.price_per_completion_token is not None
        if self.max_cost is not None and not priced:
            raise ValueError("max_cost needs the generator's prices (price_per_prompt_token, "
                             "price_per_completion_token) to count the cost")
        return self

    @property
    def display_name(self) -> str:
        return self.name or Path(self.model).stem


class DataConfig(Section):
    """Private data: the user's file, or a public corpus standing in for it (demo, benchmarks)."""

    private: Path | None = Field(None, description="your labelled file (CSV, TSV, JSONL, Parquet) or a directory "
                                 "written by datasets' save_to_disk")
    hub: str | None = Field(None, description="a Hugging Face Hub dataset id (online), read with datasets")
    split: str = Field("train", description="the split of a DatasetDict directory or Hub dataset")
    in_memory: bool = Field(False, description="the records are given in Python (dpsynth.synthesize(private=...)); "
                            "a resume must give them again")
    corpus: str | None = Field(None, description="a public corpus standing in for private data (rotten_tomatoes, "
                               "trec, sms_spam: the demo and the benchmarks)")
    text_column: str = Field("text", description="the column holding each record's text")
    label_column: str = Field("label", description="the column holding each record's label")
    person_column: str | None = Field(
        None, min_length=1, description="column naming the person each record is about: the unit of privacy "
        "becomes a person, whose records are bounded to privacy.max_records_per_user before any release")
    m: PositiveInt | None = Field(None, description="with corpus: private samples drawn from its train split")
    test: Path | None = Field(None, description="real labelled test file for evaluation (never used to generate), "
                              "or corpus:NAME for a public corpus' test split; read without noise, so its scores "
                              "(metrics.json, eval.json) are outside the DP guarantee: give public texts, or keep "
                              "those files with the data holder")

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        given = [name for name, value in (("data.private", self.private), ("data.hub", self.hub),
                                          ("data.in_memory", self.in_memory or None), ("data.corpus", self.corpus))
                 if value is not None]
        if len(given) > 1:
            raise ValueError(f"give one source of private data, not {' and '.join(given)}")
        if self.corpus is not None and self.m is None:
            raise ValueError("data.m (number of private samples) is required with data.corpus")
        if self.corpus is not None and self.test is not None:  # it was ignored: the corpus' split evaluated the run
            raise ValueError("data.test is not used with data.corpus (the corpus' own test split evaluates the run): "
                             "remove data.test")
        columns = [c for c in (self.text_column, self.label_column, self.person_column) if c is not None]
        if len(set(columns)) < len(columns):  # a label column that is the text column lists every private text
            raise ValueError(f"data.text_column, data.label_column and data.person_column must name different "
                             f"columns (got {', '.join(repr(c) for c in columns)})")
        return self


    @property
    def has_source(self) -> bool:
        return self.private is not None or self.hub is not None or self.in_memory or self.corpus is not None

    @property
    def own(self) -> bool:
        """The user's own records (a file, a datasets directory, the Hub, or given in Python), not a corpus."""
        return self.has_source and self.corpus is None


class TaskConfig(Section):
    """What the texts are, in public words: the models write from this (never from a private record). Required
    for your own data; a public corpus (data.corpus) brings its own."""

    text_kind: str = Field(..., description="short noun phrase for one text, e.g. 'customer support email'")
    labels: dict[str, str] = Field(..., min_length=1, description="label -> what it means (used in prompts)")
    description: str = Field("", description="one public sentence on what the texts look like")


class PrivacyConfig(Section):
    """The run's budget and what it protects: one ledger spends it across every release (docs/privacy.md)."""

    epsilon: float = Field(4.0, description="> 0: the run's total privacy budget (.inf: a non-private reference "
                           "run, reported as NOT DP)")
    delta: float = Field(1e-5, description="in (0, 1): the run's delta; keep it well below 1 / the number of private "
                         "records (docs/privacy.md, choosing epsilon and delta)")
    adjacency: Adjacency = Field(
        Adjacency.ADD_REMOVE, description="neighbouring datasets: add_remove (one record, or person, added or removed) "
        "or replace (one swapped for another: the sensitivities and the accounting change, docs/privacy.md)")
    max_records_per_user: PositiveInt = Field(
        1, description="k: records one person may contribute (needs data.person_column; the data holder keeps at "
        "most k of each person's records; the vote releases clip each person's summed votes and DP-SGD each "
        "person's summed gradient to one record's norm, so they cost one record's sensitivity; the count "
        "histograms (label_proportions: dp, DPGA's) that of k records)")
    label_proportions: Literal["uniform", "dp"] | dict[str, float] | None = Field(
        None, description="uniform, public proportions {label: share}, or 'dp' (noisy label counts, accounted); "
        "unset: the method's default (uniform, except DPGA and fedgen, which release their own DP label "
        "histogram: DPGA's Laplace share of dpga.budget_attributes, fedgen's profile at fedgen.profile_share)"
    )
    label_histogram_sigma: float = Field(10.0, gt=0, description="Gaussian noise of the DP label histogram of "
                                         "label_proportions 'dp' (not DPGA's or fedgen's own histograms)")
    noise_seed: int | None = Field(None, description="reproducible noise for experiments: NOT FOR RELEASE")

    @field_validator("epsilon")
    @classmethod
    def _epsilon_a_number(cls, value: float) -> float:
        # NaN passes every comparison check (nan <= 0 is False): reject it by name (inf stays: a reference run).
        if math.isnan(value):
            raise ValueError("must be a number > 0 (got NaN); give e.g. epsilon: 4.0, or .inf for a non-private run")
        return value

    @field_validator("delta")
    @classmethod
    def _delta_a_number(cls, value: float) -> float:
        if math.isnan(value):
            raise ValueError("must be a number in (0, 1) (got NaN); give e.g. delta: 1.0e-5")
        return value


class FederatedConfig(Section):
    """L data parties vote on their own shards; only the (securely aggregated) sum leaves them."""

    parties: int = Field(..., ge=2, description="L, number of data parties")
    partition: Literal["dirichlet", "iid", "files", "nodes"] = Field(
        "dirichlet", description="how the private set is split in experiments; 'files': one file per party "
        "(simulated on this machine); 'nodes': Flower SuperNodes on separate machines, each reading its own "
        "file (node-config data-path) - the server never loads private data (docs/federated.md)")
    alpha: float = Field(1.0, gt=0, description="Dirichlet concentration over labels (smaller = less IID)")
    party_files: list[str] | None = Field(None, description="partition 'files': one private file per party")
    aggregation: Literal["secagg+", "plain"] = Field(
        "secagg+", description="secagg+: the server sees only the sum (Flower SecAgg+), each party adds "
        "sigma/sqrt(min_parties); plain: the server sees every party's vector, so each adds the full sigma")
    min_parties: PositiveInt | None = Field(
        None, description="fewest parties a round may aggregate (SecAgg+ threshold); default: all parties. Plain "
        "aggregation ignores it: each party adds the full sigma there, so one answer is already private")
    max_records_per_party: PositiveInt = Field(
        64, description="public bound on a party's records: sets the SecAgg+ clipping range, and the "
        "sensitivity when unit is 'party'")
    unit: Literal["record", "party"] = Field("record", description="unit of privacy: one record, or one party")
    timeout: float = Field(300.0, gt=0, description="seconds to wait for the parties at each protocol stage")

    @model_validator(mode="after")
    def _checks(self) -> FederatedConfig:
        if self.min_parties is not None and self.min_parties > self.parties:
            raise ValueError(f"federated.min_parties={self.min_parties} exceeds parties={self.parties}")
        if self.partition == "files" and len(self.party_files or []) != self.parties:
            raise ValueError("federated.partition 'files' needs party_files with one file per party")
        if self.partition == "nodes" and self.aggregation == "plain":
            # a deployed party answers vote rounds only through SecAgg+ (flower_app.py): refused here, before
            # the server's ledger is charged for a round every party would refuse
            raise ValueError("federated.partition 'nodes' needs aggregation 'secagg+': deployed parties answer "
                             "vote rounds only through SecAgg+")
        return self

    @property
    def threshold(self) -> int:
        return self.min_parties or self.parties


class FinalStageNoise(Section):
    """The noise of a final stage's one release: a fixed sigma, a share of epsilon, or neither (calibrated)."""

    sigma: float | None = Field(None, gt=0, description="fixed Gaussian noise on the stage's release")
    share: float | None = Field(None, gt=0, lt=1, description="share of epsilon for the stage's release (default "
                                "0.2 when another part of the run has noise to calibrate, else the whole budget)")

    @model_validator(mode="after")
    def _one_noise(self) -> FinalStageNoise:
        if self.sigma is not None and self.share is not None:
            raise ValueError("give sigma or share, not both")
        return self


class ResampleConfig(FinalStageNoise):
    """A final DP resampling stage after any method (papers/001, Algorithm 2; `dpsynth.methods.resample`)."""

    clusters: PositiveInt = Field(4, description="k-means clusters per label; each private record votes for the "
                                  "nearest of its label's centroids, so bins = clusters x labels")
    target: PositiveInt | None = Field(None, description="samples out (default: as many as the method wrote)")
    weights: bool = Field(False, description="keep every sample and give it a training weight (its bin's share of "
                          "the noisy histogram over its share of the set) instead of drawing samples: no "
                          "duplicates, no draw's variance, the same one release")

    @model_validator(mode="after")
    def _weights_keep_every_sample(self) -> ResampleConfig:
        if self.weights and self.target is not None:
            raise ValueError("resample.weights keeps every sample: remove resample.target, or weights")
        return self


class RelabelConfig(FinalStageNoise):
    """A final DP label-correction stage after any method (`dpsynth.methods.relabel`): one noisy release of the
    per-label sums of the private records' unit embeddings; samples move to the label whose centroid is nearer."""

    scoring: Literal["private", "public", "blend"] = Field(
        "private", description="private: the noisy per-label sums; public: the public label descriptions (a "
        "control, epsilon 0); blend: the same noisy sums, each label's cosine mixed with its public description's "
        "by the share of the noisy centroid that is signal")
    margin: float = Field(0.05, ge=0, description="a sample moves only when another label's centroid is nearer "
                          "than its own by more than this cosine")
    subspace: int = Field(16, ge=0, description="denoise the centroids in the span of the synthetic mean and this "
                          "many principal directions of the synthetic embeddings (0: all dimensions)")
    min_z: float = Field(2.0, ge=0, description="a sample moves only when its cosine gap is at least this many "
                         "noise standard deviations of the gap (estimated from the noisy sums; 0: no test)")

    @property
    def reads_private_records(self) -> bool:
        """Every scoring but the public control spends the one release of the private records' sums."""
        return self.scoring != "public"


class RunConfig(BaseModel):
    """Shared sections plus method sections (extra keys, validated by the methods' options models)."""

    model_config = ConfigDict(extra="allow")
    method: str = Field("wasp", description="the method to run: its section (e.g. wasp:) holds its options")
    data: DataConfig = DataConfig()
    task: TaskConfig | None = None
    generators: list[GeneratorConfig] = Field(..., min_length=1)
    privacy: PrivacyConfig = PrivacyConfig()
    federated: FederatedConfig | None = None
    resample: ResampleConfig | None = None
    relabel: RelabelConfig | None = None
    embedder: str = Field(DEFAULT_EMBEDDER, min_length=1, description="sentence-transformers model the votes and the "
                          "evaluation embed with (a name or a directory)")
    device: DeviceSetting = Field("auto", description="where the embedder, the data holder's votes and DP-SGD, "
                                  "transformers sampling and DPO run: auto (a CUDA GPU if torch sees one), cpu or cuda")
    seed: int = Field(0, ge=0, description="public seed of the run's requests and splits (numpy needs >= 0)")
    evaluate: bool = Field(True, description="score the synthetic set on data.test (or the corpus' test split) "
                           "at the end of the run")

    @model_validator(mode="after")
    def _checks(self) -> RunConfig:
        if self.privacy.epsilon <= 0:
            raise ValueError(f"privacy.epsilon must be > 0 (got {self.privacy.epsilon})")
        if not 0 < self.privacy.delta < 1:
            raise ValueError(f"privacy.delta must be in (0, 1) (got {self.privacy.delta})")
        if self.task is None and self.data.corpus is None:
            raise ValueError("task (text_kind and labels) is required for your own data")
        per_party_files = self.federated is not None and self.federated.partition in ("files", "nodes")
        if not self.data.has_source and not per_party_files:
            raise ValueError("give data.private (your file or datasets directory), data.hub (a Hub dataset), "
                             "data.corpus (a public corpus), or federated.party_files")
        if per_party_files and self.data.has_source and self.federated is not None:
            raise ValueError(f"with federated.partition '{self.federated.partition}' the parties' files are the "
                             "private data: remove data.private / data.corpus")
        self._check_unit_of_privacy()
        names = [g.display_name for g in self.generators]
        if len(set(names)) != len(names):
            raise ValueError(f"generator names must be unique, got {names}; set name: for each")
        return self

    def _check_unit_of_privacy(self) -> None:
        """k records per person is a promise only a person column lets the data holder keep: without it, a
        person with more rows than k would get more weight than the ledger assumes."""
        person, k = self.data.person_column, self.privacy.max_records_per_user
        if person is not None and self.federated is not None:
            raise ValueError("data.person_column bounds the records of one central private file; federated runs "
                             "protect a record or a whole party (federated.unit: party)")
        if self.relabel is not None and self.federated is not None:
            raise ValueError("relabel: is a central stage (the federated parties do not answer its embedding sums); "
                             "remove relabel: or federated:")
        if self.relabel is not None and self.task is not None and len(self.task.labels) < 2:
            raise ValueError("relabel: moves samples between labels, and task.labels has one: it would spend its "
                             "budget and move nothing; remove relabel:")
        if person is not None and self.data.corpus is not None:
            raise ValueError("data.person_column needs your own file with a person column (data.private); a "
                             "public corpus has none")
        if k > 1 and person is None:
            raise ValueError(f"privacy.max_records_per_user={k} needs data.person_column: the column naming the "
                             "person of each record, so that the data holder can keep at most that many of each "
                             "person's records (without it the unit of privacy is one record)")

    @property
    def sections(self) -> dict[str, Any]:
        """Method sections by method name (validated options models once parsed)."""
        return dict(self.model_extra or {})

    def options(self, method: str | None = None) -> Any:
        """The options of `method` (default: this run's method), as its options model."""
        name = method or self.method
        value = (self.model_extra or {}).get(name)
        if value is None:
            raise KeyError(f"config has no '{name}' section; parse it with dpsynth.runs.config.parse_config")
        return value


def has_private_final_stage(config: RunConfig) -> bool:
    """A final stage that reads the private records (DP resampling, DP label correction), whatever the method."""
    return config.resample is not None or (config.relabel is not None and config.relabel.reads_private_records)


def records_per_unit(config: RunConfig) -> int:
    """Records one unit of privacy may hold: sensitivities scale by this."""
    fed = config.federated
    if fed is not None and fed.unit == "party":
        return fed.max_records_per_party
    return config.privacy.max_records_per_user


def votes_clipped_per_person(config: RunConfig) -> bool:
    """A central run whose unit is a person clips each person's summed votes to the largest norm one record's can
    have (`VoteSpec.clip_per_unit`), so its vote releases cost one record's sensitivity whatever k."""
    return config.data.person_column is not None and config.federated is None


def vote_records_per_unit(config: RunConfig) -> int:
    """Records one unit's votes weigh as in their sensitivity: one where they are clipped per person."""
    return 1 if votes_clipped_per_person(config) else records_per_unit(config)


def noise_parties(config: RunConfig) -> tuple[int, int | None]:
    """(parties, fewest parties whose noise shares must add up to the full sigma)."""
    fed = config.federated
    if fed is None:
        return 1, None
    return fed.parties, fewest_answering(fed)


def fewest_answering(config: FederatedConfig, asked: int | None = None) -> int:
    """Fewest parties whose noise shares a round of `asked` parties (None: all) may sum: the threshold, less
    the parties not asked (SecAgg+ needs at least 2); without SecAgg+ the server sees single parties, so each
    carries the full noise (1)."""
    if config.aggregation != "secagg+":
        return 1
    if asked is None or asked == config.parties:
        return config.threshold
    return max(2, config.threshold - (config.parties - asked))
