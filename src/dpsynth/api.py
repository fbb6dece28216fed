"""dpsynth's Python API: `synthesize` runs (or resumes) one run and returns its result; `load_run` reads a
finished one. Both raise `DpsynthError` with the same one-line messages as the CLI.

    import dpsynth
    result = dpsynth.synthesize("config.yaml", private="my_dataset_dir", out="runs/first")
    result.to_pandas()   # the synthetic set; runs/first/ also holds synthetic.parquet and README.md (the card)

The config is a YAML path, a dict of the same shape, or a `RunConfig`; the private data is a path (file or
`datasets` directory), a pandas DataFrame or a `datasets.Dataset`. Records given in Python are held in memory
for the data holder only and never written: resuming such a run needs them again (`resume=True`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dpsynth.config import RunConfig
from dpsynth.errors import DpsynthError
from dpsynth.fs import RunDir
from dpsynth.runs.config import parse_config, read_config


@dataclass(frozen=True)
class Sample:
    """One synthetic sample. `weight`: its training weight in a weighted run (FuseGen's self-boosting weights, or
    `resample: {weights: true}`'s), None otherwise; train with it as the sample weight."""

    text: str
    label: str
    plm: str
    iteration: int
    weight: float | None = None


@dataclass(frozen=True)
class SynthesisResult:
    """A finished run: its synthetic samples, privacy report (privacy.json), metrics and directory."""

    run_dir: Path
    samples: list[Sample]
    privacy: dict[str, Any]
    metrics: dict[str, Any]

    @property
    def epsilon(self) -> float | None:
        """The epsilon spent (None: not differentially private)."""
        return self.privacy.get("epsilon")

    @property
    def delta(self) -> float:
        return float(self.privacy["delta"])

    @property
    def unit_of_privacy(self) -> str:
        return str(self.privacy["assumptions"]["unit"])

    def to_pandas(self) -> Any:
        import pandas as pd

        columns = ["text", "label", "plm", "iteration"]
        if any(s.weight is not None for s in self.samples):  # a weighted run: the weights are part of the set
            columns.append("weight")
        return pd.DataFrame([s.__dict__ for s in self.samples], columns=columns)


def synthesize(config: RunConfig | dict | str | Path, *, private: Any = None, out: str | Path | None = None,
               resume: bool = False, progress: Callable[[str, int, int], None] | None = None) -> SynthesisResult:
    """Run `config` (or resume the run in `out`) to the end and return its result.

    `private` replaces the config's private data: a path (a data file or a `datasets` directory), a pandas
    DataFrame or a `datasets.Dataset` (the config's column names apply). `progress(phase, done, total)` is
    called as the run advances.
    """
    from dpsynth.runs.engine import Run

    given = None if private is None or isinstance(private, (str, Path)) else private
    if resume:
        if out is None:
            raise DpsynthError("resume=True needs out=, the directory of the run to continue")
        if private is not None and given is None:
            raise DpsynthError("resume=True continues with the run's own data source (its config.yaml); give "
                               "private= only to hand over again records first given in Python")
        runner = Run.resume(Path(out), progress=progress, private=given)
    else:
        parsed = as_config(config, private)
        out = Path(out) if out is not None else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
        runner = Run.create(parsed, Path(out), progress=progress, private=given)
    runner.execute()
    return load_run(Path(out))


def load_run(run_dir: str | Path) -> SynthesisResult:
    """The result of a finished run directory."""
    d = RunDir(Path(run_dir))
    if not d.is_finished():
        raise DpsynthError(f"{d.root}: not a finished dpsynth run (no metrics.json, which a run writes last); "
                           f"finish it with `dpsynth run --resume {d.root}`")
    try:
        rows = [json.loads(line) for line in d.synthetic.read_text().splitlines() if line.strip()]
        return SynthesisResult(run_dir=d.root, samples=[Sample(**row) for row in rows],
                               privacy=json.loads(d.privacy.read_text()), metrics=json.loads(d.metrics.read_text()))
    except (OSError, ValueError, TypeError) as err:
        raise DpsynthError(f"{d.root}: the run's outputs cannot be read ({err}); finish or rerun it") from err


def as_config(config: RunConfig | dict | str | Path, private: Any = None) -> RunConfig:
    """The validated config, with its private data replaced by `private` (a path, or records given in
    Python) before validation, so that a config may leave its data source to the call."""
    where = str(config) if isinstance(config, (str, Path)) else "config"
    if isinstance(config, RunConfig):
        raw = config.model_dump(mode="json", exclude_none=True)
    elif isinstance(config, dict):
        raw = dict(config)
    elif isinstance(config, (str, Path)):
        raw = read_config(Path(config))
    else:
        raise DpsynthError(f"config: a {type(config).__name__}; give a YAML path, a dict or a RunConfig")
    if private is not None:
        data = {k: v for k, v in (raw.get("data") or {}).items()
                if k not in ("private", "hub", "corpus", "m", "in_memory")}
        if isinstance(private, (str, Path)):
            data["private"] = str(private)
        else:
            data["in_memory"] = True
        raw["data"] = data
    return parse_config(raw, where)
